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
 * Reads the rest of `req`'s body and drops it, for at most CLOSE_GRACE_MS: then `socket` is
 * destroyed. Node dumps a body nobody read; one the forwarding was streaming (piped on, paused
 * while its upstream call waited, or counted) is its own: taken back here. The caller decides what
 * the body's end does; the timer returned is cleared when the socket closes.
 */
export function dropRestOfBody (req: IncomingMessage, socket: Socket): NodeJS.Timeout {
  req.unpipe()
  req.removeAllListeners('data')
  req.resume()
  droppingBody.add(socket)
  req.once('end', () => { droppingBody.delete(socket) })
  const timer = setTimeout(() => { socket.destroy() }, CLOSE_GRACE_MS)
  timer.unref()
  socket.once('close', () => { clearTimeout(timer) })
  return timer
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
 * The longest the rest of a body is read and dropped after an answer that keeps the connection
 * open (nginx's lingering_time is 30 s): a 404 is no reason to take in a whole large upload.
 */
const KEPT_BODY_MAX_MS = 10_000

/**
 * An answer that keeps the connection open (a 404 or a 501 for a body that asked no 100 Continue)
 * while the body still arrives: node reads the rest as this request's body and drops it
 * (req._dump) before it reads the next request. A body that stops for CLOSE_GRACE_MS, or goes on
 * past KEPT_BODY_MAX_MS, closes the connection (as nginx's lingering_timeout and lingering_time
 * do): a client dripping a body without end held it until server.requestTimeout, minutes by
 * default. Progress is the socket's bytes read, as node's dump emits no 'data'.
 */
function keptForRestOfBody (req: IncomingMessage, socket: Socket): void {
  const began = Date.now()
  let read = socket.bytesRead
  let lastRead = began
  const timer = setInterval(() => {
    const now = Date.now()
    if (socket.bytesRead !== read) {
      read = socket.bytesRead
      lastRead = now
    }
    if (now - lastRead >= CLOSE_GRACE_MS || now - began >= KEPT_BODY_MAX_MS) socket.destroy()
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
 * answered request's body and drops it (req._dump). A client that neither ends its body nor reads
 * the answer within CLOSE_GRACE_MS is cut then.
 */
export function lingerAfterAnswer (req: IncomingMessage, res: ServerResponse): void {
  // Taken now: req.socket is null once the request is destroyed (undici did so when it streamed
  // the request itself as an upload and aborted it), and a read of it at 'finish' ended the process.
  const socket = req.socket
  // runs after node's own 'finish' listener, which detached the response and ended the socket
  res.once('finish', () => {
    if (req.complete || socket.destroyed) return
    if (!socket.writableEnded) {
      keptForRestOfBody(req, socket)
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
