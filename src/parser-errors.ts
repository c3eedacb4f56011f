// What a request node:http could not parse is answered with, on the public listener
// (src/server.ts) and the admin listeners (src/admin/admin-shield.ts): always JSON from the error
// table, never node's bare 400 or 431.
import type { Socket } from 'node:net'
import { errorBody, writeRawError, type ErrorCode } from './errors.js'

/**
 * The client closed its side mid-request (EOF inside a body) or reset: nobody is left to read an
 * answer, and the socket is destroyed instead.
 */
export function clientLeft (err: NodeJS.ErrnoException): boolean {
  return err.code === 'HPE_INVALID_EOF_STATE' || err.code === 'ECONNRESET'
}

/** The message of a 400 for a head node:http could not parse: its parser's code, or what it means. */
function parserErrorMessage (code: string): string {
  if (code === '') return 'bad request'
  // "PRI * HTTP/2.0": a client speaking HTTP/2 without asking first (prior knowledge, h2c)
  if (code === 'HPE_PAUSED_H2_UPGRADE') return 'HTTP/2 with prior knowledge is not served: this listener speaks HTTP/1.1'
  return code
}

/**
 * Whether a head overflowed server.maxHeaderSize within its request line (a long target): a 414,
 * as nginx answers, where the fields' overflow is a 431. node reports one overflow for both; the
 * read it failed in (`rawPacket`) tells them apart when it is the connection's first, starts a
 * request (a method and a space) and holds no line end before where the parser stopped
 * (`bytesParsed`). A line that came over several reads, or behind a request on a kept-alive
 * connection, or over TLS (whose bytes read are the records'), is still a 431.
 */
function requestLineOverflowed (err: Error, socket: Socket): boolean {
  const { rawPacket: raw, bytesParsed: stop } = err as { rawPacket?: unknown, bytesParsed?: unknown }
  // the connection's first read: a later one may continue a field whose value holds "WORD "
  if (!Buffer.isBuffer(raw) || typeof stop !== 'number' || socket.bytesRead !== raw.length) return false
  const lineEnd = raw.indexOf(10)
  if (lineEnd !== -1 && lineEnd < stop) return false
  let i = 0
  // A-Z: every registered method is upper-case letters (and node's parser takes no other)
  while (i < raw.length && i < 24 && (raw[i] as number) >= 0x41 && (raw[i] as number) <= 0x5a) i++
  return i > 0 && raw[i] === 0x20
}

/**
 * The status and code for node's parser error `err`: 431 for oversized headers (RFC 6585 §5), 414
 * when the request line alone overflowed, 408 for a head not received within headersTimeout or
 * requestTimeout (GW_ERR_BAD_REQUEST, README error table), else 400.
 */
export function parserErrorAnswer (err: NodeJS.ErrnoException, socket: Socket): [number, ErrorCode] {
  const code = err.code ?? ''
  if (code === 'HPE_HEADER_OVERFLOW') return requestLineOverflowed(err, socket) ? [414, 'GW_ERR_URI_TOO_LONG'] : [431, 'GW_ERR_HEADERS_TOO_LARGE']
  return code === 'ERR_HTTP_REQUEST_TIMEOUT' ? [408, 'GW_ERR_BAD_REQUEST'] : [400, 'GW_ERR_BAD_REQUEST']
}

/** The answer parserErrorAnswer chose, written raw with its request id; the connection then closes. */
export function writeParserError (socket: Socket, status: number, error: ErrorCode, parserCode: string, requestId: string): void {
  // a 414's own message says it all; the others name the parser's code
  writeRawError(socket, status, errorBody(error, status === 414 ? undefined : parserErrorMessage(parserCode), { requestId }), requestId)
}
