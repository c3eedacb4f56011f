// /config and logs show the effective config, never its secrets.
// Besides config keys, this matches header names in route rules (`headers.request.set`): a gateway
// often injects the upstream's credentials there (`authorization`, `x-api-key`, `cookie`).
const SECRET_KEY = /pass(word)?|secret|token|privatekey|^key$|cert$|authorization|cookie|api[-_]?key/i

// scheme://userinfo@host...: the userinfo ends at the LAST "@" (WHATWG URL does the same), so a
// password containing "@" or "/" ("redis://:p@ss/w@host") is hidden whole, not up to its first "@".
const URL_WITH_USERINFO = /^([a-z][a-z0-9+.-]*:\/\/)(.*)@/is

const REDACTED = '[redacted]'

/** Redacts `value`; `key` is its own key, `parent` the key of the object holding it. */
export function redactConfig (value: unknown, key = '', parent = ''): unknown {
  if (typeof value === 'string') {
    if (SECRET_KEY.test(key)) return REDACTED
    return value.replace(URL_WITH_USERINFO, (_m, scheme: string) => `${scheme}${REDACTED}@`)
  }
  if (Array.isArray(value)) return value.map(v => redactConfig(v, key, parent))
  if (value !== null && typeof value === 'object') {
    // headers.{request,response}.set: every value is hidden, whatever the header's name. An
    // injected credential is often named after the upstream (x-upstream-auth, x-internal-key).
    if (key === 'set' && (parent === 'request' || parent === 'response')) {
      return Object.fromEntries(Object.keys(value).map(name => [name, REDACTED]))
    }
    const out: Record<string, unknown> = {}
    for (const [k, v] of Object.entries(value)) {
      // API keys are the map's keys: show how many there are, not what they are
      if (k === 'keys' && key === 'apiKeys' && v !== null && typeof v === 'object') out[k] = `[${Object.keys(v).length} keys redacted]`
      else out[k] = redactConfig(v, k, key)
    }
    return out
  }
  return value
}
