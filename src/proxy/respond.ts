// A route's `respond`: the gateway answers every request the route admits itself, and nothing is
// forwarded (a maintenance page, a retired path's 410, a fixed robots.txt), as Kong's
// request-termination and nginx's `return` do. The answer is built once, at load: per request it
// is one writeHead with the fields the request adds (RateLimit, CORS, X-Request-Id) and one end.

export interface StaticResponse {
  readonly status: number
  /** Name, value, name, value...: Content-Type and Content-Length first, then respond.headers. */
  readonly fields: readonly string[]
  readonly body: Buffer
}

export interface RespondConfig {
  readonly status: number
  readonly body?: string | undefined
  readonly contentType?: string | undefined
  readonly headers?: Readonly<Record<string, string>> | undefined
}

export const DEFAULT_RESPOND_TYPE = 'text/plain; charset=utf-8'

export function compileStaticResponse (config: RespondConfig): StaticResponse {
  const body = Buffer.from(config.body ?? '', 'utf8')
  const fields: string[] = []
  if (body.length > 0 || config.contentType !== undefined) fields.push('content-type', config.contentType ?? DEFAULT_RESPOND_TYPE)
  // a 204 or 304 has no body and no Content-Length (RFC 9110 §8.6)
  if (config.status !== 204 && config.status !== 304) fields.push('content-length', String(body.length))
  for (const [name, value] of Object.entries(config.headers ?? {})) fields.push(name, value)
  return Object.freeze({ status: config.status, fields: Object.freeze(fields), body })
}
