// /config and logs show the effective config, never its secrets.
// Besides config keys, this matches header names in route rules (`headers.request.set`): a gateway
// often injects the upstream's credentials there (`authorization`, `x-api-key`, `cookie`).
const SECRET_KEY = /pass(word)?|secret|token|privatekey|^key$|cert$|authorization|cookie|api[-_]?key/i

export function redactConfig (value: unknown, key = ''): unknown {
  if (typeof value === 'string') {
    if (SECRET_KEY.test(key)) return '[redacted]'
    // credentials inside URLs (redis://user:pass@host)
    return value.replace(/^([a-z][a-z0-9+.-]*:\/\/)([^@/]*)@/i, (_m, scheme: string) => `${scheme}[redacted]@`)
  }
  if (Array.isArray(value)) return value.map(v => redactConfig(v, key))
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {}
    for (const [k, v] of Object.entries(value)) {
      // API keys are the map's keys: show how many there are, not what they are
      if (k === 'keys' && key === 'apiKeys' && v !== null && typeof v === 'object') out[k] = `[${Object.keys(v).length} keys redacted]`
      else out[k] = redactConfig(v, k)
    }
    return out
  }
  return value
}
