// undici (7.x) destroys the connection when an upstream sends `100 Continue` the gateway did not
// ask for ("bad response"), so the client got a 502 although the final response followed
// (issue 15 item 10). RFC 9110 §15.2: a client must accept 1xx responses it did not expect. The
// gateway never sends `Expect` upstream, so a 100 carries nothing: it is dropped on the socket,
// before undici's parser, where a response can only start after a request was written (undici
// does not pipeline: one request per connection at a time).
import { maxHeaderSize } from 'node:http'
import type { Socket } from 'node:net'
import { buildConnector, errors as undiciErrors } from 'undici'
import { resetIsNoEnd } from './upstream-resets.js'

const HEAD_END = Buffer.from('\r\n\r\n')
// "HTTP/1.x 100 " or "HTTP/1.x 100\r": enough bytes to tell a 100 from every other status. Each
// position lists the bytes allowed there.
const CONTINUE_PREFIX: ReadonlyArray<readonly number[]> = [...'HTTP/1.'].map(c => [c.charCodeAt(0)])
  .concat([[0x30, 0x31], [0x20], [0x31], [0x30], [0x30], [0x20, 0x0d]])
const PREFIX_LENGTH = CONTINUE_PREFIX.length
// The most a 100 head may hold before it is handed to undici's parser, which refuses a head past
// its own limit (the same: node's maxHeaderSize, undici's default). Held without a bound, a head
// that never ended grew by every read, and each read copied all of it again.
const MAX_HELD = maxHeaderSize

/**
 * Whether `buf` starts a `100 Continue` head: 'yes', 'no', or 'maybe' while every byte so far
 * matches and there are fewer than PREFIX_LENGTH. Compared byte by byte: it runs on every
 * response, where a decoded string and a regex match would allocate twice.
 */
function continueHead (buf: Buffer): 'yes' | 'no' | 'maybe' {
  const n = Math.min(buf.length, PREFIX_LENGTH)
  for (let i = 0; i < n; i++) if (!(CONTINUE_PREFIX[i] as readonly number[]).includes(buf[i] as number)) return 'no'
  return n < PREFIX_LENGTH ? 'maybe' : 'yes'
}

/**
 * Whether undici's string write starts a request. undici writes a request head as one latin1
 * string starting with the method, which node:http's parser (llhttp) takes in upper case letters
 * only; its other string writes are chunk framing, starting with CR or a hex digit in lower case
 * (lib/dispatcher/client-h1.js). One character code, where a regex over the request line cost a
 * match per request.
 */
function startsRequest (data: string): boolean {
  const c = data.charCodeAt(0)
  return c >= 0x41 && c <= 0x5a
}

/**
 * Makes `socket.read()` skip `100 Continue` heads at the start of each response. The filtering
 * read is the socket's `read` from a request's head until the response's first bytes tell a 100
 * from the rest; then the stream's own `read` is put back, so the reads of a response body and
 * undici's last read of each turn (the one that returns null) go straight to the stream.
 */
export function dropContinueResponses (socket: Socket): void {
  // Bytes read at a response's start that cannot be told from a 100 yet. Held here, not put back
  // with unshift(): unshift emits 'readable' at once, undici reads the same bytes again, and a
  // short first read ("HTTP/1.1 " then the rest 50 ms later, or "ERROR\r\n" from a server of
  // another protocol) spun the event loop for good.
  let held: Buffer | null = null
  const read = socket.read
  const filteringRead = function (this: Socket, size?: number): unknown {
    let chunk = read.call(this, size) as Buffer | string | null
    if (chunk === null || typeof chunk === 'string') return chunk
    if (held !== null) {
      chunk = Buffer.concat([held, chunk])
      held = null
    }
    for (;;) {
      const head = continueHead(chunk)
      if (head === 'no') {
        socket.read = read
        return chunk
      }
      // a 100 head, whole or not yet: wait for the next 'readable' with what was read
      const end = head === 'yes' ? chunk.indexOf(HEAD_END) : -1
      if (end === -1) {
        if (chunk.length > MAX_HELD) {
          socket.read = read
          return chunk
        }
        held = chunk
        return null
      }
      chunk = chunk.subarray(end + HEAD_END.length)
      if (chunk.length === 0) {
        const next = read.call(this, size) as Buffer | null
        if (next === null) return null
        chunk = next
      }
    }
  } as Socket['read']
  // Named parameters, not a rest array and apply: this runs on every write to every upstream.
  const write = socket.write as (this: Socket, data: unknown, encoding?: unknown, callback?: unknown) => boolean
  socket.write = function (this: Socket, data: unknown, encoding?: unknown, callback?: unknown): boolean {
    // Only a request head starts a new exchange; body chunks must not, or the middle of an early
    // response would be inspected.
    if (typeof data === 'string' && startsRequest(data)) socket.read = filteringRead
    return write.call(this, data, encoding, callback)
  } as Socket['write']
}

/** undici's connector returns the socket it connects, though its types say it returns nothing. */
type SocketReturningConnector = (options: buildConnector.Options, callback: buildConnector.Callback) => Socket

/**
 * undici's own connector, with `dropContinueResponses` on every socket (TLS too), and its connect
 * timeout kept to the millisecond. undici keeps it on timers that tick every half second, so a
 * `timeouts.connect: 100ms` gave up after 0.5-1 s. At the deadline the socket is destroyed with
 * undici's own ConnectTimeoutError, which undici's error listener reports, once: a socket left to
 * undici's timer stayed half-open while the pool's next connect began, so a target slow to accept
 * held more than maxConnections of them.
 */
export function continueTolerantConnector (connectTimeoutMs: number): buildConnector.connector {
  const connect = buildConnector({ timeout: connectTimeoutMs }) as unknown as SocketReturningConnector
  return (options, callback) => {
    let socket: Socket | undefined
    const deadline = setTimeout(() => {
      // destroyed with undici's own error: its error listener reports the failure, once
      socket?.destroy(new undiciErrors.ConnectTimeoutError(`Connect Timeout Error (attempted address: ${options.hostname}:${options.port}, timeout: ${connectTimeoutMs}ms)`))
    }, connectTimeoutMs)
    try {
      socket = connect(options, (...args) => {
        clearTimeout(deadline)
        const [err, connected] = args
        if (err === null) {
          dropContinueResponses(connected as Socket)
          resetIsNoEnd(connected as Socket)
        }
        callback(...args)
      })
    } catch (err) {
      clearTimeout(deadline)
      throw err
    }
  }
}
