// Hop-by-hop fields describe one connection, not the message, so a proxy must not forward them
// (RFC 9110 §7.6.1): `Connection`, every field it names, and the fields below.
// `Proxy-Connection` is not standard but old clients still send it (RFC 9110 §7.6.1 names it too).
export const HOP_BY_HOP: readonly string[] = Object.freeze([
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade'
])

const NONE: readonly string[] = Object.freeze([])

/**
 * One `Transfer-Encoding` value that says `chunked` and nothing else (any case, spaces around):
 * the only coding node:http decodes on requests and undici on responses, both re-applying it on
 * the way out. Any other coding would be passed on decoded wrongly, so it is refused either way.
 */
export function isChunkedOnly (value: string): boolean {
  return value.trim().toLowerCase() === 'chunked'
}

/**
 * The field names listed in a `Connection` header value, lowercased. Only called when the header is
 * present, which modern HTTP/1.1 clients and upstreams rarely send.
 */
export function connectionTokens (value: string | string[]): readonly string[] {
  const joined = typeof value === 'string' ? value : value.join(',')
  // Nearly every message says just `keep-alive` or `close`: no field is named, nothing to split.
  if (joined.length <= 10) {
    const lower = joined.toLowerCase()
    if (lower === 'keep-alive' || lower === 'close') return NONE
  }
  const tokens: string[] = []
  for (const token of joined.split(',')) {
    const name = token.trim().toLowerCase()
    if (name !== '' && name !== 'close' && name !== 'keep-alive') tokens.push(name)
  }
  return tokens
}

/** The field an answer adds when the connection must close after it (its framing cannot be trusted, or a body is left unread). */
export const CONNECTION_CLOSE: ReadonlyArray<readonly [string, string]> = Object.freeze([Object.freeze(['connection', 'close'] as const)])
