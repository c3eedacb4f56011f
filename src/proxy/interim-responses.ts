// undici (7.x) destroys the connection when an upstream sends `100 Continue` the gateway did not
// ask for ("bad response"), so the client got a 502 although the final response followed
// (issue 15 item 10). RFC 9110 §15.2: a client must accept 1xx responses it did not expect. The
// gateway never sends `Expect` upstream, so a 100 carries nothing: it is dropped on the socket,
// before undici's parser, where a response can only start after a request was written (undici
// does not pipeline: one request per connection at a time).
import type { Socket } from 'node:net'
import { buildConnector } from 'undici'

const HEAD_END = Buffer.from('\r\n\r\n')
const REQUEST_LINE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+ [^ ]+ HTTP\/1\.1\r\n/
// "HTTP/1.x 100 " or "HTTP/1.x 100\r": enough bytes to tell a 100 from any other status.
const PREFIX_LENGTH = 13
const HTTP_1_DOT = Buffer.from('HTTP/1.')

// Compared byte by byte: it runs on every response, where a decoded string and a regex match
// would allocate twice.
function isContinue (buf: Buffer): boolean {
  for (let i = 0; i < HTTP_1_DOT.length; i++) if (buf[i] !== HTTP_1_DOT[i]) return false
  return (buf[7] === 0x30 || buf[7] === 0x31) && buf[8] === 0x20 && buf[9] === 0x31 && buf[10] === 0x30 && buf[11] === 0x30 &&
    (buf[12] === 0x20 || buf[12] === 0x0d)
}

/** Makes `socket.read()` skip `100 Continue` heads at the start of each response. */
export function dropContinueResponses (socket: Socket): void {
  let atResponseStart = false
  // Named parameters, not a rest array and apply: this runs on every write to every upstream.
  const write = socket.write as (this: Socket, data: unknown, encoding?: unknown, callback?: unknown) => boolean
  socket.write = function (this: Socket, data: unknown, encoding?: unknown, callback?: unknown): boolean {
    // Only a request head (undici writes it as one latin1 string) starts a new exchange; body
    // chunks must not, or the middle of an early response would be inspected.
    if (typeof data === 'string' && REQUEST_LINE.test(data)) atResponseStart = true
    return write.call(this, data, encoding, callback)
  } as Socket['write']
  const read = socket.read
  socket.read = function (this: Socket, size?: number): unknown {
    let chunk = read.call(this, size) as Buffer | string | null
    if (!atResponseStart || chunk === null || typeof chunk === 'string') return chunk
    for (;;) {
      if (chunk.length < PREFIX_LENGTH) {
        // Too short to decide: put it back until more arrives ('readable' fires again).
        this.unshift(chunk)
        return null
      }
      if (!isContinue(chunk)) {
        atResponseStart = false
        return chunk
      }
      const end = chunk.indexOf(HEAD_END)
      if (end === -1) {
        this.unshift(chunk)
        return null
      }
      chunk = chunk.subarray(end + HEAD_END.length)
      if (chunk.length === 0) return read.call(this, size) ?? null
    }
  } as Socket['read']
}

/** undici's own connector (same timeout), with `dropContinueResponses` on every socket (TLS too). */
export function continueTolerantConnector (connectTimeoutMs: number): buildConnector.connector {
  const connect = buildConnector({ timeout: connectTimeoutMs })
  return (options, callback) => connect(options, (...args) => {
    const [err, socket] = args
    if (err === null && socket !== null) dropContinueResponses(socket as Socket)
    callback(...args)
  })
}
