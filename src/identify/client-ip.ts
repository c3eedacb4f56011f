import { isIPv4 } from 'node:net'
import ipaddr from 'ipaddr.js'
import { LRUCache } from 'lru-cache'
import proxyAddr from 'proxy-addr'
import { GatewayError } from '../errors.js'

// Who is the client? The TCP peer, unless the peer is one of our own proxies: then the peer's
// X-Forwarded-For says who it talked to. XFF is a de-facto header (RFC 7239 §1 describes it as
// such); each proxy appends the address it saw, so only entries written by trusted hops are
// believable, and we walk from the right until the first address that is not ours.

/** One customer site: what src/config writes in when `ipv6Prefix` is absent. */
export const DEFAULT_IPV6_PREFIX = 64

export interface ClientIpOptions {
  /** CIDRs, single addresses or proxy-addr names (`loopback`, `linklocal`, `uniquelocal`). */
  readonly trustedProxies: readonly string[]
  /** IPv6 clients are grouped by this prefix for limiting (default 64: one customer site). */
  readonly ipv6Prefix?: number
}

/** `ip` is the client address in canonical text; `key` is what limits count against. */
export interface ClientIp {
  readonly ip: string
  readonly key: string
}

export type ClientIpResolver = (socketAddress: string | undefined, xForwardedFor: string | string[] | undefined) => ClientIp

// A destroyed socket has no remoteAddress; those requests share one key rather than none.
const UNKNOWN: ClientIp = Object.freeze({ ip: 'unknown', key: 'unknown' })
// ipaddr.js and proxy-addr parse with regular expressions (1-10 µs per address), so answers are
// memoized: a keep-alive client repeats its address and XFF chain on every request. A client
// cycling addresses only misses the cache; it cannot make a request cost more than uncached.
const CACHE_ENTRIES = 10_000
const MAX_CACHED_KEY = 256
const MAPPED_V4_PREFIX = '::ffff:'

export function compileClientIpResolver (opts: ClientIpOptions): ClientIpResolver {
  const prefix = opts.ipv6Prefix ?? DEFAULT_IPV6_PREFIX
  if (!Number.isInteger(prefix) || prefix < 1 || prefix > 128) {
    throw new GatewayError('GW_ERR_CONFIG_INVALID', `ipv6Prefix must be an integer from 1 to 128, got ${prefix}`)
  }
  let trust: ((addr: string, i: number) => boolean) | null = null
  if (opts.trustedProxies.length > 0) {
    try {
      trust = proxyAddr.compile([...opts.trustedProxies])
    } catch (err) {
      throw new GatewayError('GW_ERR_CONFIG_INVALID', `trustedProxies: ${(err as Error).message}`, { cause: err })
    }
  }
  const toClient = (addr: ipaddr.IPv4 | ipaddr.IPv6): ClientIp => clientOf(addr, prefix)
  const peers = new LRUCache<string, ClientIp>({ max: CACHE_ENTRIES })
  const chains = new LRUCache<string, ClientIp>({ max: CACHE_ENTRIES })
  const trustedPeers = new LRUCache<string, boolean>({ max: CACHE_ENTRIES })

  const resolvePeer = (socketAddress: string): ClientIp => {
    // Dotted-quad IPv4, the common case, is already canonical (node:net rejects other forms).
    if (isIPv4(socketAddress)) return { ip: socketAddress, key: socketAddress }
    let client = peers.get(socketAddress)
    if (client === undefined) {
      const peer = parseSocketAddress(socketAddress)
      client = peer === null ? UNKNOWN : toClient(peer)
      peers.set(socketAddress, client)
    }
    return client
  }

  // The last chain a trusted proxy sent: a flood repeats it, and comparing two short strings is
  // cheaper than building the cache key and two LRU lookups per request.
  let lastPeer = ''
  let lastChain = ''
  let lastClient: ClientIp = UNKNOWN

  return function resolveClientIp (socketAddress, xForwardedFor) {
    if (socketAddress === undefined) return UNKNOWN
    // Without trusted proxies XFF is never read: a client cannot pick its own address.
    if (trust === null || xForwardedFor === undefined) return resolvePeer(socketAddress)
    if (xForwardedFor === lastChain && socketAddress === lastPeer) return lastClient
    let trusted = trustedPeers.get(socketAddress)
    if (trusted === undefined) {
      const peer = parseSocketAddress(socketAddress)
      trusted = peer !== null && trust(peer.toString(), 0)
      trustedPeers.set(socketAddress, trusted)
    }
    if (!trusted) return resolvePeer(socketAddress)
    // Only chains our own proxies sent get here, so the cache is not filled by arbitrary peers.
    const key = socketAddress + ' ' + (typeof xForwardedFor === 'string' ? xForwardedFor : xForwardedFor.join(','))
    let client = key.length <= MAX_CACHED_KEY ? chains.get(key) : undefined
    if (client === undefined) {
      client = walkForwardedFor(socketAddress, xForwardedFor, trust)
      if (key.length <= MAX_CACHED_KEY) chains.set(key, client)
    }
    if (typeof xForwardedFor === 'string') {
      lastPeer = socketAddress
      lastChain = xForwardedFor
      lastClient = client
    }
    return client
  }

  // Called only for a trusted peer.
  function walkForwardedFor (socketAddress: string, xForwardedFor: string | string[], trust: (addr: string, i: number) => boolean): ClientIp {
    let current = parseSocketAddress(socketAddress)
    if (current === null) return UNKNOWN
    // Node joins repeated XFF lines with ", " but the type allows an array; walk both alike.
    const lines = typeof xForwardedFor === 'string' ? null : xForwardedFor
    let lineIndex = lines === null ? 0 : lines.length - 1
    let line = lines === null ? xForwardedFor as string : (lines[lineIndex] ?? '')
    let end = line.length
    for (let hop = 1; ; hop++) {
      if (end < 0) {
        if (lines === null || --lineIndex < 0) break
        line = lines[lineIndex] as string
        end = line.length
      }
      const comma = line.lastIndexOf(',', end - 1)
      const entry = parseForwardedEntry(line.slice(comma + 1, end).trim())
      end = comma
      // Garbage was written by the hop we trust least so far: stop and keep the address that sent it.
      if (entry === null) break
      current = entry
      if (!trust(entry.toString(), hop)) break
    }
    // All hops trusted: the left-most entry is the best we know (as proxy-addr does).
    return toClient(current)
  }
}

/**
 * True when no proxy is trusted but a private, loopback or link-local peer sends X-Forwarded-For:
 * the gateway probably sits behind a proxy, and every client would share that proxy's address.
 * Pass the configured `trustedProxies`, or call it only when that list is empty.
 */
export function looksLikeMisconfiguredProxy (
  socketAddress: string | undefined,
  xForwardedFor: string | string[] | undefined,
  trustedProxies: readonly string[] = []
): boolean {
  if (trustedProxies.length > 0 || xForwardedFor === undefined || socketAddress === undefined) return false
  const peer = parseSocketAddress(socketAddress)
  if (peer === null) return false
  const range = peer.range()
  return range === 'private' || range === 'loopback' || range === 'linkLocal' || range === 'uniqueLocal'
}

// Node reports IPv4 peers of a dual-stack socket as "::ffff:1.2.3.4"; they are IPv4 clients.
function parseSocketAddress (text: string): ipaddr.IPv4 | ipaddr.IPv6 | null {
  if (text.startsWith(MAPPED_V4_PREFIX) && isIPv4(text.slice(MAPPED_V4_PREFIX.length))) {
    return ipaddr.IPv4.parse(text.slice(MAPPED_V4_PREFIX.length))
  }
  if (!ipaddr.isValid(text)) return null
  const addr = ipaddr.parse(text)
  if (addr.kind() === 'ipv6') {
    const v6 = addr as ipaddr.IPv6
    if (v6.isIPv4MappedAddress()) return v6.toIPv4Address()
    // A zone ("%eth0") names our interface, not the client.
    if (v6.zoneId !== undefined) return new ipaddr.IPv6(v6.parts)
  }
  return addr
}

// XFF entries are parsed strictly: dotted-quad IPv4 only (ipaddr.isValid also takes "0x7f.1" and
// "2130706433", forms no proxy writes), IPv6 without zone. "1.2.3.4:5678" and "[::1]:443" are
// accepted because some load balancers (Azure Application Gateway) append the client port.
function parseForwardedEntry (text: string): ipaddr.IPv4 | ipaddr.IPv6 | null {
  if (text.length === 0 || text.length > 64) return null
  let host = text
  if (host.charCodeAt(0) === 0x5b) {
    const close = host.indexOf(']')
    if (close === -1 || !isPortSuffix(host, close + 1)) return null
    host = host.slice(1, close)
  } else {
    const colon = host.indexOf(':')
    if (colon !== -1 && colon === host.lastIndexOf(':')) {
      if (!isPortSuffix(host, colon)) return null
      host = host.slice(0, colon)
    }
  }
  if (ipaddr.IPv4.isValidFourPartDecimal(host)) return ipaddr.IPv4.parse(host)
  if (host.includes('%') || !ipaddr.IPv6.isValid(host)) return null
  const v6 = ipaddr.IPv6.parse(host)
  return v6.isIPv4MappedAddress() ? v6.toIPv4Address() : v6
}

// True for "" (no port) or ":" and a port number (0-65535), starting at `at`.
function isPortSuffix (text: string, at: number): boolean {
  if (at === text.length) return true
  if (text.charCodeAt(at) !== 0x3a || text.length - at < 2 || text.length - at > 6) return false
  let port = 0
  for (let i = at + 1; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c < 0x30 || c > 0x39) return false
    port = port * 10 + c - 0x30
  }
  return port <= 65535
}

function clientOf (addr: ipaddr.IPv4 | ipaddr.IPv6, prefix: number): ClientIp {
  const ip = addr.toString()
  if (addr.kind() === 'ipv4') return { ip, key: ip }
  // One IPv6 subscriber usually holds a whole /64 (RFC 6177), so limiting single addresses would
  // let a client rotate through 2^64 keys.
  const parts = (addr as ipaddr.IPv6).parts.slice()
  for (let i = 0; i < 8; i++) {
    const keep = Math.min(16, Math.max(0, prefix - i * 16))
    parts[i] = keep === 16 ? parts[i] as number : (parts[i] as number) & (0xffff << (16 - keep)) & 0xffff
  }
  return { ip, key: new ipaddr.IPv6(parts).toString() + '/' + prefix }
}
