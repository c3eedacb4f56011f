// CORS of a route (`cors:`), compiled at load time. The gateway answers a route's preflights itself
// and puts the Access-Control-* fields on every answer to an allowed origin, its own included: a
// browser script could not read a 429 (nor its Retry-After) or a 401 of the gateway's without them,
// and saw a network error instead. What the upstream says of CORS on such a route is dropped
// (src/runtime.ts), so one policy, the file's, holds for every answer.

export interface CorsOptions {
  /** "*", exact origins ("https://app.example.com") or "scheme://*.domain[:port]" patterns. */
  readonly origins: readonly string[]
  /** Methods a preflight may ask for; null: every method the route takes. */
  readonly methods: readonly string[] | null
  /** Request fields a preflight may ask for; null or a "*" among them: the ones it asks for. */
  readonly headers: readonly string[] | null
  /** Response fields a script may read besides the gateway's own (see GATEWAY_EXPOSED). */
  readonly exposeHeaders: readonly string[]
  readonly credentials: boolean
  readonly maxAgeS: number
}

/** A preflight's answer: its header fields, or why it is refused. */
export type PreflightAnswer = { readonly ok: true, readonly headers: readonly string[] } | { readonly ok: false, readonly reason: string }

export interface CompiledCors {
  /**
   * The Access-Control-* fields of an answer to `origin` (undefined: a request without Origin); null
   * when the route does not allow it.
   */
  fieldsFor: (origin: string | undefined) => ReadonlyArray<readonly [string, string]> | null
  /** The answer depends on Origin (not "*"): caches must keep one answer per origin (Vary: Origin). */
  readonly variesByOrigin: boolean
  preflight: (origin: string, method: string, requestHeaders: string | undefined) => PreflightAnswer
}

/**
 * What a script may always read of the gateway's answers: the limits' fields (RateLimit,
 * Retry-After and the legacy X-RateLimit-*) and the request id to quote in a support ticket.
 */
const GATEWAY_EXPOSED = ['ratelimit', 'ratelimit-policy', 'retry-after', 'x-ratelimit-limit', 'x-ratelimit-remaining', 'x-ratelimit-reset', 'x-request-id']

/** The Access-Control-* fields the gateway writes on a CORS route; an upstream's are dropped. */
export const CORS_RESPONSE_FIELDS: readonly string[] = [
  'access-control-allow-origin', 'access-control-allow-credentials', 'access-control-expose-headers',
  'access-control-allow-methods', 'access-control-allow-headers', 'access-control-max-age'
]

// A host name, or an IPv6 address in brackets (a local dev server at http://[::1]:3000)
const ORIGIN_RE = /^(https?):\/\/(\*\.)?([a-z0-9-]+(?:\.[a-z0-9-]+)*|\[[0-9a-f:.]+\])(:\d{1,5})?$/

/**
 * The method a CORS preflight asks for (an OPTIONS with Origin and one
 * Access-Control-Request-Method), or null when the request is none.
 */
export function preflightMethod (method: string | undefined, origin: string | undefined, asked: string | string[] | undefined): string | null {
  return method === 'OPTIONS' && origin !== undefined && typeof asked === 'string' ? asked : null
}

const DEFAULT_PORTS: Readonly<Record<string, string>> = { http: '80', https: '443' }

const ORIGIN_EXPECTED = 'expected "*" or an origin such as "https://app.example.com" ("https://*.example.com" for its subdomains; ":8443" for a port other than the scheme\'s default, which an origin leaves out; "http://[::1]:3000" for an IPv6 address, in its shortest form), without a path'

/** Why `value` cannot be one of `origins` (the config schema's check), or null when it can. */
export function corsOriginProblem (value: string): string | null {
  if (value === '*') return null
  const lower = value.toLowerCase()
  const m = ORIGIN_RE.exec(lower)
  if (m === null) return nonAsciiHost(lower) ?? ORIGIN_EXPECTED
  // A browser serializes an origin without its scheme's default port and without leading zeros:
  // "https://app.example.com:443" or ":08443" would never equal an Origin it sends.
  const port = m[4]?.slice(1)
  if (port !== undefined && !(/^[1-9]\d*$/.test(port) && Number(port) <= 65535 && port !== DEFAULT_PORTS[m[1] as string])) return ORIGIN_EXPECTED
  // An IPv6 address has no subdomains to match
  const wildcard = m[2] !== undefined
  if ((m[3] as string).startsWith('[') && wildcard) return ORIGIN_EXPECTED
  const sent = originBrowsersSend(lower, wildcard)
  if (sent === lower) return null
  if (sent === null) return ORIGIN_EXPECTED
  return sentAs(sent)
}

/** The problem of an origin a browser would send as `sent`. */
function sentAs (sent: string): string {
  return `a browser sends this origin as "${sent}": written otherwise it would match nothing`
}

/**
 * A host name in another script ("https://bücher.example") is sent in its ASCII form
 * ("https://xn--bcher-kva.example"): the message names it.
 */
function nonAsciiHost (origin: string): string | null {
  if (!/[^ -~]/.test(origin) || !/^https?:\/\/[^/?#@\\]+$/.test(origin)) return null
  const wildcard = origin.includes('://*.')
  const sent = originBrowsersSend(origin, wildcard)
  if (sent === null || ORIGIN_RE.exec(sent) === null || originBrowsersSend(sent, wildcard) !== sent) return null
  return sentAs(sent)
}

/**
 * `origin` as a browser sends it in Origin, or null when no browser can: the WHATWG URL parser,
 * which serializes every Origin a browser sends, rewrites an IPv6 address to its shortest form
 * ("[0:0::1]" is "[::1]") and an IPv4 address written short, in hex, octal or as one number
 * ("127.1", "0x7f.0.0.1", "127.000.000.001", "2130706433" are all "127.0.0.1"), and refuses a host
 * that ends in a number and is no address ("app.1"). A subdomain pattern is read with a label in
 * place of its "*", and given back with it.
 */
function originBrowsersSend (origin: string, wildcard: boolean): string | null {
  try {
    if (!wildcard) return new URL(origin).origin
    const sent = new URL(origin.replace('*.', 'x.')).origin
    return sent.replace('://x.', '://*.')
  } catch {
    return null
  }
}

// Fetch's header name token (RFC 9110 §5.6.2), for the names a preflight lists.
const TOKEN_RE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/

export function compileCors (o: CorsOptions): CompiledCors {
  const everyOrigin = o.origins.includes('*')
  const exact = new Set<string>()
  const wildcards: Array<{ readonly scheme: string, readonly suffix: string }> = []
  for (const origin of o.origins) {
    if (origin === '*') continue
    const lower = origin.toLowerCase()
    const m = ORIGIN_RE.exec(lower)
    if (m === null) throw new TypeError(`not an origin: ${origin}`)
    if (m[2] === undefined) exact.add(lower)
    // "https://*.example.com" takes "https://a.example.com" and "https://a.b.example.com", not the
    // domain itself, and only on its port ("https://a.example.com:8443" is another origin)
    else wildcards.push({ scheme: `${m[1] as string}://`, suffix: `.${m[3] as string}${m[4] ?? ''}` })
  }
  const allowOrigin = (origin: string): string | null => {
    // without credentials a "*" answer is the same for every origin, and cacheable as such
    if (everyOrigin) return o.credentials ? origin : '*'
    const lower = origin.toLowerCase()
    if (exact.has(lower)) return origin
    for (const w of wildcards) {
      if (!lower.startsWith(w.scheme) || !lower.endsWith(w.suffix)) continue
      const label = lower.slice(w.scheme.length, lower.length - w.suffix.length)
      if (label.length > 0 && /^[a-z0-9-]+(?:\.[a-z0-9-]+)*$/.test(label)) return origin
    }
    return null
  }
  const common: Array<readonly [string, string]> = []
  if (o.credentials) common.push(['access-control-allow-credentials', 'true'])
  common.push(['access-control-expose-headers', [...new Set([...GATEWAY_EXPOSED, ...o.exposeHeaders.map(h => h.toLowerCase())])].join(', ')])
  // "*" without credentials: the same fields for every origin, built once
  const anyFields = Object.freeze([['access-control-allow-origin', '*'] as const, ...common])
  const fieldsFor = (origin: string | undefined): ReadonlyArray<readonly [string, string]> | null => {
    // Fetch (CORS protocol and HTTP caches): a "*" policy is sent to requests without Origin too, and
    // without Vary. Else an answer cached from a navigation or an <img> (no Origin, so no field) is
    // reused for a script's fetch of the same URL, which then fails as a network error.
    if (origin === undefined) return everyOrigin && !o.credentials ? anyFields : null
    const allowed = allowOrigin(origin)
    if (allowed === null) return null
    if (allowed === '*') return anyFields
    return [['access-control-allow-origin', allowed], ...common]
  }
  const variesByOrigin = !everyOrigin || o.credentials
  const methods = o.methods === null ? null : new Set(o.methods.map(m => m.toUpperCase()))
  // "*" as nginx and Kong configs write it: no header is named "*", so taken literally it refused
  // every preflight that asks for one. It means the default, the ones asked for.
  const allowedHeaders = o.headers === null || o.headers.includes('*') ? null : new Set(o.headers.map(h => h.toLowerCase()))
  const preflight = (origin: string, method: string, requestHeaders: string | undefined): PreflightAnswer => {
    const allowed = allowOrigin(origin)
    if (allowed === null) return { ok: false, reason: `the origin ${JSON.stringify(origin)} is not allowed by the route's cors.origins` }
    // a route without methods takes every string as one: a list ("GET, DELETE") was echoed as granted
    if (!TOKEN_RE.test(method)) return { ok: false, reason: 'Access-Control-Request-Method is not a method name' }
    if (methods !== null && !methods.has(method)) return { ok: false, reason: `the method ${JSON.stringify(method)} is not in the route's cors.methods` }
    const asked: string[] = []
    if (requestHeaders !== undefined) {
      for (const part of requestHeaders.split(',')) {
        const name = part.trim().toLowerCase()
        if (name === '') continue
        if (!TOKEN_RE.test(name)) return { ok: false, reason: 'Access-Control-Request-Headers is not a list of header names' }
        if (allowedHeaders !== null && !allowedHeaders.has(name)) return { ok: false, reason: `the header ${JSON.stringify(name)} is not in the route's cors.headers` }
        asked.push(name)
      }
    }
    const fields = ['access-control-allow-origin', allowed, 'access-control-allow-methods', method]
    if (asked.length > 0) fields.push('access-control-allow-headers', asked.join(', '))
    if (o.credentials) fields.push('access-control-allow-credentials', 'true')
    fields.push('access-control-max-age', String(o.maxAgeS))
    // a cache must keep apart the preflights of other origins, methods and headers
    fields.push('vary', 'Origin, Access-Control-Request-Method, Access-Control-Request-Headers')
    return { ok: true, headers: fields }
  }
  return Object.freeze({ fieldsFor, variesByOrigin, preflight })
}
