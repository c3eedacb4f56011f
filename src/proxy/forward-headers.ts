import type { IncomingMessage } from 'node:http'
import { HOP_BY_HOP, connectionTokens, isChunkedOnly } from './hop-by-hop.js'

/** Route header rules; names are lowercase. `set` replaces any header of that name. */
export interface HeaderRules {
  readonly set: readonly (readonly [string, string])[]
  readonly remove: readonly string[]
  /** Response fields added beside the upstream's of the same name (a list field: `Vary`). */
  readonly append?: readonly (readonly [string, string])[]
}

/** What a route does to headers, compiled once: the per-request loops only test set membership. */
export interface CompiledHeaders {
  /** Request fields never copied from the client: hop-by-hop, the ones we set, the ones rules remove or set. */
  readonly requestDrop: ReadonlySet<string>
  /** Flat [name, value, ...] appended to every upstream request. */
  readonly requestSet: readonly string[]
  readonly forwardedFor: boolean
  readonly forwardedProto: boolean
  readonly forwardedHost: boolean
  readonly requestId: boolean
  /** A rule sets or removes Host: the client's is not passed (removed, undici sends the target's). */
  readonly hostRuled: boolean
  /** Client fields whose names hold "_" are dropped (server.underscoresInHeaders false, the default). */
  readonly dropUnderscoreNames: boolean
  readonly responseDrop: ReadonlySet<string>
  /**
   * 1 at each length a name of `responseDrop` has (index MAX_NAME_LENGTH: longer names). A field
   * whose name has another length is relayed without being lower-cased and looked up: that costs
   * a new string and its hash, for every field of every response.
   */
  readonly responseDropLengths: Uint8Array
  readonly responseSet: readonly string[]
  /**
   * Flat [name, value, ...] added to every response, the upstream's fields of that name kept; left
   * out when one of them lists the value already.
   */
  readonly responseAppend: readonly string[]
  readonly echoRequestId: boolean
}

const FORWARDED_FOR = 'x-forwarded-for'
const FORWARDED_PROTO = 'x-forwarded-proto'
const FORWARDED_HOST = 'x-forwarded-host'
const REQUEST_ID = 'x-request-id'
/** The most fields an upstream's response head may have (node:http's default maxHeadersCount). */
export const MAX_RESPONSE_FIELDS = 2000
// Names this long or longer share the last slot of responseDropLengths.
const MAX_NAME_LENGTH = 64

export function compileHeaders (request: HeaderRules, response: HeaderRules, underscoresInHeaders = false): CompiledHeaders {
  const requestRuled = new Set<string>([...request.remove, ...request.set.map(([name]) => name)])
  const requestDrop = new Set<string>([
    ...HOP_BY_HOP,
    // Node already answered `100 Continue` itself; undici refuses to send `Expect` (NotSupportedError).
    'expect',
    // Host is passed first and explicitly, so a duplicate can never reach undici.
    'host',
    FORWARDED_FOR, FORWARDED_PROTO, FORWARDED_HOST, REQUEST_ID,
    ...requestRuled
  ])
  const responseDrop = new Set<string>([
    ...HOP_BY_HOP,
    // The gateway's request id wins over whatever the upstream echoed.
    REQUEST_ID,
    ...response.remove,
    ...response.set.map(([name]) => name)
  ])
  const responseDropLengths = new Uint8Array(MAX_NAME_LENGTH + 1)
  for (const name of responseDrop) responseDropLengths[Math.min(name.length, MAX_NAME_LENGTH)] = 1
  return Object.freeze({
    requestDrop,
    requestSet: Object.freeze(request.set.flat()),
    forwardedFor: !requestRuled.has(FORWARDED_FOR),
    forwardedProto: !requestRuled.has(FORWARDED_PROTO),
    forwardedHost: !requestRuled.has(FORWARDED_HOST),
    requestId: !requestRuled.has(REQUEST_ID),
    hostRuled: requestRuled.has('host'),
    dropUnderscoreNames: !underscoresInHeaders,
    responseDrop,
    responseDropLengths,
    responseSet: Object.freeze(response.set.flat()),
    responseAppend: Object.freeze((response.append ?? []).flat()),
    echoRequestId: !response.remove.includes(REQUEST_ID) && !response.set.some(([name]) => name === REQUEST_ID)
  })
}

export interface ForwardedValues {
  readonly requestId: string
  readonly clientIp: string
  readonly proto: 'http' | 'https'
  /** The peer is one of trustedProxies; absent = not trusted. */
  readonly trustedPeer?: boolean
}

// Headers upstreams (and their frameworks) read as the client's address, the scheme, port or
// prefix it used, or the original URL (request-ip reads X-Client-IP first, Spring builds links from
// X-Forwarded-Prefix, Rails takes X-Forwarded-Ssl as https, IIS and Symfony route on X-Original-URL).
// The gateway sets none of them, so from a client that is not our proxy they are forgeries:
// removed (RFC 7239 §8.1: Forwarded from an untrusted hop must not be believed).
const CLIENT_FORGEABLE: ReadonlySet<string> = new Set([
  'forwarded', 'x-real-ip', 'true-client-ip', 'x-client-ip', 'cf-connecting-ip', 'fastly-client-ip', 'x-cluster-client-ip',
  'x-forwarded-port', 'x-forwarded-prefix', 'x-forwarded-server', 'x-forwarded-scheme', 'x-forwarded-ssl', 'front-end-https',
  'x-original-url', 'x-rewrite-url'
])

/**
 * The flat [name, value, ...] list sent upstream. `Host` passes through unchanged, the client's
 * hop-by-hop fields are dropped and the X-Forwarded-* fields and X-Request-Id are set.
 */
export function upstreamRequestHeaders (req: IncomingMessage, plan: CompiledHeaders, ctx: ForwardedValues): string[] {
  const incoming = req.headers
  const drop = plan.requestDrop
  const tokens = incoming.connection === undefined ? null : connectionTokens(incoming.connection)
  // a Set: a client may list thousands of names in Connection (each field would scan them all)
  const named = tokens === null || tokens.length === 0 ? null : new Set(tokens)
  const host = incoming.host
  const out: string[] = host === undefined || plan.hostRuled ? [] : ['host', host]
  const untrusted = ctx.trustedPeer !== true
  for (const name in incoming) {
    if (drop.has(name) || (named !== null && named.has(name))) continue
    if (untrusted && CLIENT_FORGEABLE.has(name)) continue
    // CGI, WSGI, PHP and others read X_Forwarded_For as X-Forwarded-For (both HTTP_X_FORWARDED_FOR):
    // passed, it would get past every field above that the gateway drops or sets, and past the
    // credentials it reads (an API key the gateway never saw, a user id it did not charge)
    if (plan.dropUnderscoreNames && name.includes('_')) continue
    const value = incoming[name]
    if (typeof value === 'string') out.push(name, value)
    else if (value !== undefined) for (const item of value) out.push(name, item)
  }
  if (plan.forwardedFor) {
    const previous = untrusted ? undefined : incoming[FORWARDED_FOR]
    // Each hop appends the address it got the request from (RFC 7239 §5.2 does the same for
    // Forwarded), to a chain our own proxies built: with one, that is the peer, which differs from
    // ctx.clientIp (appending the client again would lose the proxy). A chain from anyone else is
    // made up (an upstream reading its left-most entry would believe it): the client starts it.
    out.push(FORWARDED_FOR, previous === undefined ? ctx.clientIp : `${previous}, ${peerAddress(req, ctx.clientIp)}`)
  }
  if (plan.forwardedProto) {
    // A TLS-terminating balancer among trustedProxies knows the client's scheme; the gateway does not.
    const given = untrusted ? undefined : incoming[FORWARDED_PROTO]
    out.push(FORWARDED_PROTO, given === 'https' || given === 'http' ? given : ctx.proto)
  }
  if (plan.forwardedHost) {
    const given = untrusted ? undefined : incoming[FORWARDED_HOST]
    const forwardedHost = typeof given === 'string' && given !== '' ? given : host
    if (forwardedHost !== undefined) out.push(FORWARDED_HOST, forwardedHost)
  }
  if (plan.requestId) out.push(REQUEST_ID, ctx.requestId)
  for (let i = 0; i < plan.requestSet.length; i++) out.push(plan.requestSet[i] as string)
  return out
}

/**
 * The flat [name, value, ...] list answered to the client, from the upstream's raw header bytes.
 * Raw bytes decoded as latin1 pass through byte for byte (node:http writes header strings as
 * latin1), where undici's parsed object would decode UTF-8 and node:http would then reject it.
 * Null when the response cannot be relayed: a transfer coding other than one `chunked`
 * (`isChunkedOnly`; a gzip would be lost, and the client would get compressed bytes unlabelled),
 * or more than MAX_RESPONSE_FIELDS fields.
 */
export function clientResponseHeaders (
  raw: readonly (Buffer | string)[],
  plan: CompiledHeaders,
  requestId: string,
  extra: readonly (readonly [string, string])[] | undefined
): string[] | null {
  const drop = plan.responseDrop
  const dropLengths = plan.responseDropLengths
  // node:http's own bound on the fields of a message it reads (maxHeadersCount); undici's bounds
  // their bytes alone (16 KiB of names and values), so 16,000 empty fields passed, cost 70 ms to
  // relay and stalled every other request meanwhile
  if (raw.length > MAX_RESPONSE_FIELDS * 2) return null
  let named: Set<string> | null = null
  let out: string[] = []
  let codings = 0
  for (let i = 0; i < raw.length; i += 2) {
    const name = latin1(raw[i] as Buffer | string)
    // Lower-casing keeps a latin1 name's length: a name no dropped or replaced name is as long as
    // is relayed as it is.
    const length = name.length
    if (dropLengths[length < MAX_NAME_LENGTH ? length : MAX_NAME_LENGTH] === 1 || (extra !== undefined && hasNameOfLength(extra, length))) {
      const lower = name.toLowerCase()
      if (drop.has(lower)) {
        if (lower === 'connection') {
          const tokens = connectionTokens(latin1(raw[i + 1] as Buffer | string))
          if (tokens.length > 0) {
            named ??= new Set()
            for (const token of tokens) named.add(token)
          }
        } else if (lower === 'transfer-encoding') {
          // A second field is a second coding, even when both say chunked (RFC 9112 §6.1).
          if (++codings > 1 || !isChunkedOnly(latin1(raw[i + 1] as Buffer | string))) return null
        }
        continue
      }
      if (extra !== undefined && isExtra(extra, lower)) continue
    }
    out.push(name, latin1(raw[i + 1] as Buffer | string))
  }
  // Fields named by `Connection` may come before it: filtered once it is known, which is rare.
  if (named !== null) out = withoutNamed(out, named)
  for (let i = 0; i < plan.responseSet.length; i++) out.push(plan.responseSet[i] as string)
  for (let i = 0; i < plan.responseAppend.length; i += 2) {
    const name = plan.responseAppend[i] as string
    const member = plan.responseAppend[i + 1] as string
    // an upstream whose CORS middleware says Vary: Origin already would get it twice
    if (!listsMember(out, name, member)) out.push(name, member)
  }
  if (extra !== undefined) for (const [name, value] of extra) out.push(name, value)
  if (plan.echoRequestId) out.push(REQUEST_ID, requestId)
  return out
}

const CONTENT_LENGTH: ReadonlySet<string> = new Set(['content-length'])

/** `headers` (name, value, ...) without Content-Length. */
export const withoutContentLength = (headers: string[]): string[] => withoutNamed(headers, CONTENT_LENGTH)

// A Set: an upstream's Connection may name thousands of fields (each field would scan them all)
function withoutNamed (headers: string[], named: ReadonlySet<string>): string[] {
  const out: string[] = []
  for (let i = 0; i < headers.length; i += 2) {
    if (!named.has((headers[i] as string).toLowerCase())) out.push(headers[i] as string, headers[i + 1] as string)
  }
  return out
}

/** A field `name` of the flat list names `member` (or "*", which covers it), case-insensitively. */
export function listsMember (fields: readonly string[], name: string, member: string): boolean {
  const wanted = member.toLowerCase()
  for (let i = 0; i < fields.length; i += 2) {
    const field = fields[i] as string
    if (field.length !== name.length || field.toLowerCase() !== name) continue
    for (const part of (fields[i + 1] as string).split(',')) {
      const item = part.trim().toLowerCase()
      if (item === wanted || item === '*') return true
    }
  }
  return false
}

// The gateway's own headers (e.g. RateLimit-*) replace an upstream's header of the same name.
// Their names are written in lower case where they are made (src/limit/limiter.ts).
function hasNameOfLength (extra: readonly (readonly [string, string])[], length: number): boolean {
  for (let i = 0; i < extra.length; i++) if ((extra[i] as readonly [string, string])[0].length === length) return true
  return false
}

function isExtra (extra: readonly (readonly [string, string])[], lower: string): boolean {
  for (let i = 0; i < extra.length; i++) if ((extra[i] as readonly [string, string])[0] === lower) return true
  return false
}

function peerAddress (req: IncomingMessage, fallback: string): string {
  const address = req.socket.remoteAddress
  if (address === undefined) return fallback
  // A dual-stack listener reports IPv4 peers as IPv4-mapped IPv6 (::ffff:a.b.c.d).
  return address.startsWith('::ffff:') && address.includes('.') ? address.slice(7) : address
}

function latin1 (value: Buffer | string): string {
  return typeof value === 'string' ? value : value.toString('latin1')
}
