// tls.redirectHttp: a plain-HTTP listener beside the TLS one that answers every request with a
// redirect to the same host and path over HTTPS (nginx's `return 301 https://$host$request_uri`,
// Traefik's redirectScheme, Caddy's automatic redirect). A browser that types the bare name, or a
// link written with http://, lands on the TLS listener instead of a refused connection.
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { sendError } from '../errors.js'

/** A Host field: a name or IPv4 address, or a bracketed IPv6 address, and an optional port. */
const HOST = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?\.?)(?::\d{1,5})?$/
/** An absolute-form target (RFC 9112 §3.2.2), which a client talking to a proxy sends. */
const ABSOLUTE = /^http:\/\/([^/?#]*)([^#]*)$/i

/**
 * Where a request to `host` for `target` is sent: https://host[:port]/target, the port left out
 * when it is 443. Null when the request names no host the gateway can write into a Location
 * (none, or one that is not a host), or its target is not a path (`*`).
 */
export function httpsLocation (host: string | undefined, target: string | undefined, httpsPort: number): string | null {
  if (target === undefined) return null
  let path = target
  const absolute = ABSOLUTE.exec(target)
  if (absolute !== null) {
    // RFC 9112 §3.2.2: the target's host takes the place of the Host field
    host = absolute[1]
    // no path: the root, before a query if there is one
    path = (absolute[2] as string).startsWith('/') ? absolute[2] as string : '/' + (absolute[2] as string)
  }
  if (!path.startsWith('/') || host === undefined || !HOST.test(host)) return null
  const name = host.startsWith('[') ? host.slice(0, host.indexOf(']') + 1) : host.split(':', 1)[0] as string
  return `https://${name.toLowerCase()}${httpsPort === 443 ? '' : `:${httpsPort}`}${path}`
}

/** The listener's one handler: 308 to the HTTPS address, or 400 for a request without a usable host. */
export function createRedirectHandler (httpsPort: () => number, redirected: () => void): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const location = httpsLocation(req.headers.host, req.url, httpsPort())
    if (location === null) {
      sendError(res, 'GW_ERR_BAD_REQUEST', randomUUID(), { reason: 'the request names no host to redirect to over HTTPS (tls.redirectHttp)' })
      return
    }
    redirected()
    // 308 keeps the method and body (a POST stays a POST), where a 301 lets clients turn it into a
    // GET. A body is not read: node would read and drop it to keep the connection, up to
    // server.requestTimeout; the connection closes instead.
    const body = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined
    res.writeHead(308, body ? { location, 'content-length': 0, connection: 'close' } : { location, 'content-length': 0 })
    res.end()
  }
}
