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

const LF = 0x0a
const CR = 0x0d
const DIGITS = [0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39]
// "HTTP/1.x 1dd" and the byte after the status code ("HTTP/1.1 103 ", "HTTP/1.1 100\r"): enough
// bytes to tell a 100, another interim response and every other answer. Each position lists the
// bytes allowed there.
const INTERIM_PREFIX: ReadonlyArray<readonly number[]> = [...'HTTP/1.'].map(c => [c.charCodeAt(0)])
  .concat([[0x30, 0x31], [0x20], [0x31], DIGITS, DIGITS, [0x20, CR, LF]])
const PREFIX_LENGTH = INTERIM_PREFIX.length
// The most a 100 head (or an interim head before one) may hold before it is handed to undici's
// parser, which refuses a head past its own limit (the same: node's maxHeaderSize, undici's
// default). Held without a bound, a head that never ended grew by every read, and each read copied
// all of it again.
const MAX_HELD = maxHeaderSize

/**
 * What the head starting at `at` in `buf` is: a `100 Continue` ('continue'), another interim
 * response undici is to see ('interim': 102, 103, any 1xx but 101), anything else ('other': a
 * final response, a 101, bytes that are no HTTP/1.x), or 'maybe' while every byte so far matches
 * and there are fewer than PREFIX_LENGTH. Compared byte by byte: it runs on every response, where a
 * decoded string and a regex match would allocate twice.
 */
function headKind (buf: Buffer, at: number): 'continue' | 'interim' | 'other' | 'maybe' {
  const n = Math.min(buf.length - at, PREFIX_LENGTH)
  for (let i = 0; i < n; i++) if (!(INTERIM_PREFIX[i] as readonly number[]).includes(buf[at + i] as number)) return 'other'
  if (n < PREFIX_LENGTH) return 'maybe'
  if (buf[at + 10] !== 0x30) return 'interim'
  const last = buf[at + 11]
  return last === 0x30 ? 'continue' : last === 0x31 ? 'other' : 'interim'
}

/**
 * The end of the head starting at `from` (the index past its empty line), or -1 while it has not
 * ended: the first line end followed by an empty line, where a line end is CRLF or a bare LF
 * (RFC 9112 §2.2 lets a recipient take a bare LF for one): "\n\n", "\n\r\n", "\r\n\n" or
 * "\r\n\r\n", whichever comes first. The first "\r\n\r\n" alone was not enough: a 100 head ended by
 * "\n\n" ran on into the final response's head, and the final response's body (text an attacker
 * may choose) was taken for the response. A bare CR ends no line (RFC 9112 §2.2). A head undici
 * is to parse (a 103) with a bare LF in it is refused by undici's parser, which takes CRLF only,
 * before it reaches the bytes after this end.
 */
function headEnd (buf: Buffer, from: number): number {
  for (let lf = buf.indexOf(LF, from); lf !== -1; lf = buf.indexOf(LF, lf + 1)) {
    const next = buf[lf + 1]
    if (next === LF) return lf + 2
    if (next === undefined) return -1
    if (next === CR) {
      const after = buf[lf + 2]
      if (after === LF) return lf + 3
      if (after === undefined) return -1
    }
  }
  return -1
}

/** `rest` after the interim heads passed on before it, if any. */
function after (passed: Buffer[] | null, rest: Buffer): Buffer {
  return passed === null ? rest : Buffer.concat([...passed, rest])
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
 * Makes `socket.read()` skip `100 Continue` heads before each final response: at its start, and
 * after the other interim responses (`103 Early Hints`, `102 Processing`), whose heads are handed
 * to undici unchanged (a 100 after a 103 reached undici, which destroyed the connection: a 502
 * counted as a reset, and the request sent again). The filtering read is the socket's `read` from a
 * request's head until the first bytes of a head that is neither tell it apart; then the stream's
 * own `read` is put back, so the reads of a response body and undici's last read of each turn (the
 * one that returns null) go straight to the stream.
 */
export function dropContinueResponses (socket: Socket): void {
  // Bytes read at a head's start that cannot be told from a 100 (or an interim head) yet, or a
  // head not ended yet. Held here, not put back with unshift(): unshift emits 'readable' at once,
  // undici reads the same bytes again, and a short first read ("HTTP/1.1 " then the rest 50 ms
  // later, or "ERROR\r\n" from a server of another protocol) spun the event loop for good.
  let held: Buffer | null = null
  const read = socket.read
  const filteringRead = function (this: Socket, size?: number): unknown {
    let chunk = read.call(this, size) as Buffer | string | null
    if (chunk === null || typeof chunk === 'string') return chunk
    if (held !== null) {
      chunk = Buffer.concat([held, chunk])
      held = null
    }
    // Interim heads read, for undici, in the order they came; null on the common path (the first
    // head is final), which allocates nothing.
    let passed: Buffer[] | null = null
    let at = 0
    for (;;) {
      const kind = headKind(chunk, at)
      if (kind === 'other') {
        socket.read = read
        return after(passed, at === 0 ? chunk : chunk.subarray(at))
      }
      // a 100 or an interim head, whole or not yet: wait for the next 'readable' with what was read
      const end = kind === 'maybe' ? -1 : headEnd(chunk, at)
      if (end === -1) {
        if (chunk.length - at > MAX_HELD) {
          socket.read = read
          return after(passed, chunk.subarray(at))
        }
        held = at === 0 ? chunk : chunk.subarray(at)
        return passed === null ? null : Buffer.concat(passed)
      }
      if (kind === 'interim') (passed ??= []).push(chunk.subarray(at, end))
      at = end
      if (at === chunk.length) {
        const next = read.call(this, size) as Buffer | null
        if (next === null) return passed === null ? null : Buffer.concat(passed)
        chunk = next
        at = 0
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
