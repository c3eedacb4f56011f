import { STATUS_CODES, type ServerResponse } from 'node:http'

// One table of every error the gateway returns to a client (public and admin listeners), with its
// HTTP status. Clients match on `error` (the stable code), never on the message. Bodies are built
// by the writers below and `errorBody`, which take an ErrorCode and read this table.

/** One row of the table. */
export interface ErrorEntry {
  readonly status: number
  readonly message: string
  /**
   * What the body's `error` says when it is not the code itself: a value clients were written
   * against before the table existed (the 429's `rate_limited`), kept because it is a contract.
   */
  readonly bodyCode?: string
}

const TABLE = {
  GW_ERR_NOT_FOUND: { status: 404, message: 'no route matches this request' },
  GW_ERR_METHOD_NOT_ALLOWED: { status: 405, message: 'the route does not accept this method' },
  GW_ERR_NOT_IMPLEMENTED: { status: 501, message: 'the request uses a transfer coding the gateway does not implement' },
  GW_ERR_BAD_PATH: { status: 400, message: 'the request path is malformed' },
  GW_ERR_BAD_REQUEST: { status: 400, message: 'the request is malformed' },
  GW_ERR_BODY_TOO_LARGE: { status: 413, message: 'the request body exceeds the route limit' },
  GW_ERR_CLIENT_TIMEOUT: { status: 408, message: 'the request body stopped arriving (server.clientBodyTimeout)' },
  GW_ERR_HEADERS_TOO_LARGE: { status: 431, message: 'the request headers are too large' },
  GW_ERR_URI_TOO_LONG: { status: 414, message: 'the request target is too long (server.maxHeaderSize)' },
  GW_ERR_UNAUTHORIZED: { status: 401, message: 'missing or invalid credentials' },
  GW_ERR_IP_FORBIDDEN: { status: 403, message: 'the client address may not use this route (ipRestriction)' },
  GW_ERR_CORS_REJECTED: { status: 403, message: 'the CORS preflight asks for what the route\'s cors does not allow' },
  GW_ERR_RATE_LIMITED: { status: 429, message: 'rate limit exceeded', bodyCode: 'rate_limited' },
  GW_ERR_CONCURRENCY_LIMITED: { status: 429, message: 'too many requests in flight' },
  GW_ERR_LIMITER_UNAVAILABLE: { status: 503, message: 'the rate limiter is unavailable' },
  GW_ERR_IDENTITY_UNAVAILABLE: { status: 503, message: 'the identity provider\'s key set could not be fetched: the credential could not be checked' },
  GW_ERR_UPSTREAM_UNAVAILABLE: { status: 502, message: 'the upstream refused or reset the connection' },
  GW_ERR_UPSTREAM_DNS: { status: 502, message: 'the upstream host name did not resolve' },
  GW_ERR_UPSTREAM_BAD_RESPONSE: { status: 502, message: 'the upstream sent a response the gateway cannot relay' },
  GW_ERR_UPSTREAM_TIMEOUT: { status: 504, message: 'the upstream did not answer in time' },
  GW_ERR_NO_HEALTHY_UPSTREAM: { status: 503, message: 'no healthy upstream target' },
  GW_ERR_UPSTREAM_BUSY: { status: 503, message: 'every connection to the upstream is busy' },
  GW_ERR_OUT_OF_FILES: { status: 503, message: 'the gateway has no file descriptor left for an upstream connection' },
  GW_ERR_SHUTTING_DOWN: { status: 503, message: 'the gateway is shutting down' },
  GW_ERR_TOO_MANY_TUNNELS: { status: 503, message: 'too many open WebSocket tunnels (server.maxWebSockets)' },
  GW_ERR_CONFIG_INVALID: { status: 500, message: 'the configuration is invalid' },
  GW_ERR_NOT_READY: { status: 503, message: 'no configuration is loaded yet' },
  GW_ERR_ADMIN_BUSY: { status: 503, message: 'too many live subscribers on the admin listener' },
  GW_ERR_ADMIN_UNAUTHORIZED: { status: 401, message: 'this admin endpoint needs Authorization: Bearer <admin.token>' },
  GW_ERR_ADMIN_FORBIDDEN: { status: 403, message: 'no admin.token is configured: mutating admin endpoints are disabled' },
  GW_ERR_ADMIN_NOT_READY: { status: 503, message: 'no configuration is loaded yet', bodyCode: 'not_ready' },
  GW_ERR_METRICS_FAILED: { status: 500, message: 'the metrics could not be collected', bodyCode: 'metrics_failed' },
  GW_ERR_ADMIN_WORKERS_UNAVAILABLE: { status: 503, message: 'a worker did not answer the admin request in time (workers: N)' },
  GW_ERR_ADMIN_FAILED: { status: 500, message: 'the admin listener could not answer this request' }
} satisfies Record<string, ErrorEntry>

export type ErrorCode = keyof typeof TABLE

export const ERRORS: Readonly<Record<ErrorCode, ErrorEntry>> = Object.freeze(TABLE)

/** The `error` value of `code`'s body: the code itself, or the value its clients know it by. */
export function errorBodyCode (code: ErrorCode): string {
  return ERRORS[code].bodyCode ?? code
}

/**
 * `{ error, message, ...extra }` for `code`. `message` replaces the table's when the answer can
 * say more (which endpoint, which limit); the code, which clients match on, never changes.
 */
export function errorBody (code: ErrorCode, message?: string, extra?: Readonly<Record<string, unknown>>): Record<string, unknown> {
  return { error: errorBodyCode(code), message: message ?? ERRORS[code].message, ...extra }
}

/** An error with a stable code; `cause` keeps the underlying (undici, ioredis) error. */
export class GatewayError extends Error {
  readonly code: ErrorCode
  readonly status: number
  constructor (code: ErrorCode, message?: string, options?: { cause?: unknown }) {
    super(message ?? ERRORS[code].message, options)
    this.code = code
    this.status = ERRORS[code].status
  }
}

/**
 * Answers a client with the JSON error body every gateway error uses:
 * `{ error, message, requestId, ...extra }`. Never throws, even when headers were already sent
 * (then the response is cut, which is all that can honestly be done mid-stream).
 * Returns the body's bytes (0 when nothing could be sent): the access log's `bytesOut`.
 */
export function sendError (
  res: ServerResponse,
  code: ErrorCode,
  requestId: string,
  extra?: Readonly<Record<string, unknown>>,
  headers?: ReadonlyArray<readonly [string, string]>,
  status?: number
): number {
  return sendJson(res, status ?? ERRORS[code].status, { error: errorBodyCode(code), message: ERRORS[code].message, requestId, ...extra }, requestId, headers)
}

export function sendJson (
  res: ServerResponse,
  status: number,
  payload: unknown,
  requestId: string,
  headers?: ReadonlyArray<readonly [string, string]>
): number {
  if (res.headersSent || res.destroyed) {
    res.destroy()
    return 0
  }
  const body = JSON.stringify(payload)
  res.statusCode = status
  res.setHeader('content-type', 'application/json; charset=utf-8')
  res.setHeader('content-length', Buffer.byteLength(body))
  res.setHeader('x-request-id', requestId)
  if (headers !== undefined) for (const [name, value] of headers) res.setHeader(name, value)
  res.end(body)
  return Buffer.byteLength(body)
}

const JSON_TYPE = 'application/json; charset=utf-8'

/**
 * A JSON answer whose body is already serialized and whose extra header fields come flat (name,
 * value, ...): one writeHead with a list, no setHeader per field (the 429 of a limit, built from
 * its template at ~13k rejections/s per core; issue 13 item 5). Same bytes as sendJson.
 */
export function sendJsonText (
  res: ServerResponse,
  status: number,
  body: string,
  bytes: number,
  requestId: string,
  head: readonly string[]
): number {
  if (res.headersSent || res.destroyed) {
    res.destroy()
    return 0
  }
  const fields: Array<string | number> = ['content-type', JSON_TYPE, 'content-length', bytes, 'x-request-id', requestId]
  for (let i = 0; i < head.length; i++) fields.push(head[i] as string)
  // writeHead takes a flat list (node >= 18); typed as string[] for the header values
  res.writeHead(status, fields as string[])
  res.end(body)
  return bytes
}

/** What the raw writers need of a socket (a refused Upgrade, a request node:http could not parse). */
export interface RawSocket {
  write: (s: string) => unknown
  end: () => unknown
  destroy: () => unknown
  once: (event: 'finish', listener: () => void) => unknown
  readonly destroyed: boolean
  readonly writableFinished: boolean
}

/** How long a socket being closed may take to flush its last bytes to a client that does not read. */
export const CLOSE_GRACE_MS = 2000

/**
 * Ends the socket so what was written still goes out, then destroys it: once flushed, or after
 * CLOSE_GRACE_MS. Ending alone is not enough: node:http's sockets allow half-open connections, and
 * once a request asked for an Upgrade (or failed to parse) no server timeout watches its socket,
 * so a client that never closes its side would hold it, and its file descriptor, for good.
 */
export function closeSoon (socket: RawSocket): void {
  if (socket.destroyed) return
  if (socket.writableFinished) {
    socket.destroy()
    return
  }
  socket.once('finish', () => { socket.destroy() })
  socket.end()
  setTimeout(() => { socket.destroy() }, CLOSE_GRACE_MS).unref()
}

/**
 * sendJsonText's answer written raw on a socket (a refused Upgrade). `withBody` false: the answer
 * to a HEAD, which has no content (RFC 9110 §9.3.2), as node:http leaves it out of sendJsonText's.
 */
export function writeRawJsonText (
  socket: RawSocket,
  status: number,
  body: string,
  bytes: number,
  requestId: string,
  head: readonly string[],
  withBody = true
): number {
  if (socket.destroyed) return 0
  let raw = `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\ncontent-type: ${JSON_TYPE}\r\ncontent-length: ${bytes}\r\nx-request-id: ${requestId}\r\nconnection: close\r\n`
  for (let i = 0; i + 1 < head.length; i += 2) raw += `${head[i] as string}: ${head[i + 1] as string}\r\n`
  socket.write(withBody ? raw + '\r\n' + body : raw + '\r\n')
  closeSoon(socket)
  return withBody ? bytes : 0
}

/** The same JSON answer written raw on a socket, for requests that asked for an Upgrade. */
export function writeRawError (
  socket: RawSocket,
  status: number,
  payload: unknown,
  requestId: string,
  headers?: ReadonlyArray<readonly [string, string]>,
  withBody = true
): number {
  if (socket.destroyed) return 0
  const body = JSON.stringify(payload)
  const head: string[] = []
  if (headers !== undefined) for (const [name, value] of headers) head.push(name, value)
  return writeRawJsonText(socket, status, body, Buffer.byteLength(body), requestId, head, withBody)
}

/** sendError's body on a raw socket: a refused Upgrade, or a request node:http could not parse. */
export function writeError (
  socket: RawSocket,
  code: ErrorCode,
  requestId: string,
  extra?: Readonly<Record<string, unknown>>,
  headers?: ReadonlyArray<readonly [string, string]>,
  withBody = true
): number {
  return writeRawError(socket, ERRORS[code].status, { error: errorBodyCode(code), message: ERRORS[code].message, requestId, ...extra }, requestId, headers, withBody)
}
