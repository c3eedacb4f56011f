// A lingering close (nginx's lingering_close): an answer that closes the connection while the
// client's body is still arriving (a refusal before the body was read: 404, 401, 429, 413, a
// request refused without its 100 Continue) is followed by reading and dropping the rest of the
// body before the socket is closed. Closed at once, the socket still has unread bytes or receives
// more, and the kernel resets the connection; the reset discards the answer in flight at the
// client, which then sees a broken connection instead of the gateway's 429.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { CLOSE_GRACE_MS } from '../errors.js'

/**
 * Reads the rest of `req`'s body and drops it while it keeps coming (lingerWhileBodyComes): then
 * `socket` is destroyed. Node dumps a body nobody read; one the forwarding was streaming (piped on,
 * paused while its upstream call waited, or counted) is its own: taken back here. The caller
 * decides what the body's end does.
 */
export function dropRestOfBody (req: IncomingMessage, socket: Socket): void {
  req.unpipe()
  req.removeAllListeners('data')
  req.resume()
  droppingBody.add(socket)
  req.once('end', () => { droppingBody.delete(socket) })
  lingerWhileBodyComes(req, socket)
}

/**
 * Connections reading and dropping the rest of a body whose request has been answered. Their
 * parse error (that rest cannot be parsed) belongs to a request answered and logged already.
 */
const droppingBody = new WeakSet<Socket>()

export function isDroppingBody (socket: Socket): boolean {
  return droppingBody.has(socket)
}

/**
 * The longest the rest of a body is read and dropped after its answer (nginx's lingering_time is
 * 30 s): a refusal is no reason to take in a whole large upload.
 */
const LINGER_MAX_MS = 10_000

/**
 * The rest of a body arriving after its answer, read and dropped (by dropRestOfBody, or by node's
 * req._dump for an answer that keeps the connection open): a body that stops for CLOSE_GRACE_MS,
 * or goes on past LINGER_MAX_MS, closes the connection, as nginx's lingering_timeout and
 * lingering_time do. A client dripping a body without end held the connection until
 * server.requestTimeout, minutes by default; a flat CLOSE_GRACE_MS from the answer cut a large
 * upload still arriving fast, and a client that reads only once its body is written never saw its
 * 413. Progress is the socket's bytes read, as node's dump emits no 'data'.
 */
function lingerWhileBodyComes (req: IncomingMessage, socket: Socket): void {
  const began = Date.now()
  let read = socket.bytesRead
  let lastRead = began
  const timer = setInterval(() => {
    const now = Date.now()
    if (socket.bytesRead !== read) {
      read = socket.bytesRead
      lastRead = now
    }
    if (now - lastRead >= CLOSE_GRACE_MS || now - began >= LINGER_MAX_MS) socket.destroy()
  }, CLOSE_GRACE_MS / 4)
  timer.unref()
  const clear = (): void => {
    clearInterval(timer)
    socket.off('close', clear)
  }
  req.once('end', clear)
  socket.once('close', clear)
}

/**
 * Called for a request with a body as it arrives. When its answer has ended the connection
 * (Connection: close) and the body is not read to its end, node's close (destroySoon: destroy once
 * the answer is flushed) waits for the body's end as well: node's parser reads the rest as the
 * answered request's body and drops it (req._dump), for as long as lingerWhileBodyComes allows.
 */
export function lingerAfterAnswer (req: IncomingMessage, res: ServerResponse): void {
  // Taken now: req.socket is null once the request is destroyed (undici did so when it streamed
  // the request itself as an upload and aborted it), and a read of it at 'finish' ended the process.
  const socket = req.socket
  // runs after node's own 'finish' listener, which detached the response and ended the socket
  res.once('finish', () => {
    if (req.complete || socket.destroyed) return
    if (!socket.writableEnded) {
      lingerWhileBodyComes(req, socket)
      return
    }
    // node's destroySoon: once('finish', this.destroy)
    socket.removeListener('finish', socket.destroy)
    dropRestOfBody(req, socket)
    req.once('end', () => {
      if (socket.writableFinished) socket.destroy()
      else socket.once('finish', () => { socket.destroy() })
    })
  })
}
