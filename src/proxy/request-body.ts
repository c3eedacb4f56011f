import type { IncomingHttpHeaders } from 'node:http'

/** Whether a request carries a body: a length other than 0, or a transfer coding (RFC 9112 §6.3). */
export function hasRequestBody (headers: IncomingHttpHeaders): boolean {
  return (headers['content-length'] !== undefined && headers['content-length'] !== '0') || headers['transfer-encoding'] !== undefined
}
