// /config and logs show the effective config, never its secrets.
import { compileQueryRedactor, DEFAULT_REDACT_QUERY } from '../log.js'

// Besides config keys, this matches header names in route rules (`headers.request.set`): a gateway
// often injects the upstream's credentials there (`authorization`, `x-api-key`, `cookie`).
const SECRET_KEY = /pass(word)?|secret|token|privatekey|^key$|cert$|authorization|cookie|api[-_]?key/i

// scheme://userinfo@host...: the userinfo ends at the LAST "@" (WHATWG URL does the same), so a
// password containing "@" or "/" ("redis://:p@ss/w@host") is hidden whole, not up to its first "@".
const URL_WITH_USERINFO = /^([a-z][a-z0-9+.-]*:\/\/)(.*)@/is

const URL_SCHEME = /^[a-z][a-z0-9+.-]*:\/\//i

/** Whether a config key (or a header name in a route rule) names a secret, which /config hides. */
export function isSecretKey (key: string): boolean {
  return SECRET_KEY.test(key)
}

const REDACTED = '[redacted]'

/**
 * A URL's secret query values replaced by `[redacted]`; the rest byte for byte. A signed or keyed
 * URL in the config (a JWKS endpoint, an OTLP collector) is legitimate and carries its credential
 * there: the access log's default list (DEFAULT_REDACT_QUERY) applies, whatever `log.redactQuery` says.
 */
export const redactUrlQuery: (url: string) => string = compileQueryRedactor(DEFAULT_REDACT_QUERY)

/**
 * `url` as /config and error messages may quote it: userinfo and the values of secret query
 * parameters (the access log's rule, compileQueryRedactor) replaced by `[redacted]`.
 */
export function redactUrl (url: string, redactQuery: (url: string) => string = redactUrlQuery): string {
  return redactQuery(url.replace(URL_WITH_USERINFO, (_m, scheme: string) => `${scheme}${REDACTED}@`))
}

/**
 * Redacts a config for /config and logs. A URL's query is redacted under DEFAULT_REDACT_QUERY and the
 * config's own `log.redactQuery`: a parameter the operator keeps out of the access log is a secret
 * here too (an empty list there shows queries in the log, not credentials on /config).
 */
export function redactConfig (config: unknown): unknown {
  const own = (config as { log?: { redactQuery?: unknown } } | null)?.log?.redactQuery
  const extra = Array.isArray(own) ? own.filter((n): n is string => typeof n === 'string' && !DEFAULT_REDACT_QUERY.includes(n)) : []
  return redactValue(config, '', '', extra.length === 0 ? redactUrlQuery : compileQueryRedactor([...DEFAULT_REDACT_QUERY, ...extra]))
}

/** Redacts `value`; `key` is its own key, `parent` the key of the object holding it. */
function redactValue (value: unknown, key: string, parent: string, redactQuery: (url: string) => string): unknown {
  if (typeof value === 'string') {
    if (isSecretKey(key)) return REDACTED
    if (URL_SCHEME.test(value)) return redactUrl(value, redactQuery)
    // a path with a query (a health check's `path: /healthz?token=...`): its secret values too
    return value.startsWith('/') ? redactQuery(value) : value
  }
  if (Array.isArray(value)) return value.map(v => redactValue(v, key, parent, redactQuery))
  if (value !== null && typeof value === 'object') {
    // headers.{request,response}.set: every value is hidden, whatever the header's name. An
    // injected credential is often named after the upstream (x-upstream-auth, x-internal-key).
    if (key === 'set' && (parent === 'request' || parent === 'response')) {
      return Object.fromEntries(Object.keys(value).map(name => [name, REDACTED]))
    }
    // matchHeaders: a route that matches a header's value may match a shared secret
    // (x-internal-auth: ...), so its values are hidden too; `true` / `false` (present or not) stay
    if (key === 'matchHeaders') {
      return Object.fromEntries(Object.entries(value).map(([name, v]) => [name, typeof v === 'boolean' ? v : REDACTED]))
    }
    const out: Record<string, unknown> = {}
    for (const [k, v] of Object.entries(value)) {
      // API keys are the map's keys: show how many there are, not what they are
      if (k === 'keys' && key === 'apiKeys' && v !== null && typeof v === 'object') out[k] = `[${Object.keys(v).length} keys redacted]`
      else out[k] = redactValue(v, k, key, redactQuery)
    }
    return out
  }
  return value
}
