// Which client addresses may use a route (`ipRestriction`, gateway-wide and per route): the
// client's address as resolved from the peer and trusted proxies (client-ip.ts), never a header
// the client wrote, so X-Forwarded-For from an untrusted peer cannot open a restricted route.
import { LRUCache } from 'lru-cache'
import proxyAddr from 'proxy-addr'

/** One `ipRestriction`: addresses or CIDRs (or loopback, linklocal, uniquelocal). */
export interface IpRestriction {
  /** Only these may pass; null = everyone not denied. */
  readonly allow: readonly string[] | null
  /** These never pass, even when `allow` lists a range holding them. */
  readonly deny: readonly string[]
}

/** True when the client address may use the route. */
export type AddressCheck = (clientIp: string) => boolean

// A keep-alive client repeats its address; proxy-addr parses it with regular expressions on every
// call. Bounded: a client cycling addresses only misses the cache.
const CACHE_ENTRIES = 4096

/**
 * One check for every restriction that applies (the gateway's and the route's): an address passes
 * when each of them lets it. Null when none applies, so a route without one tests nothing.
 * The ranges were validated with the config; proxy-addr throws only on what validation refuses.
 */
export function compileIpRestriction (restrictions: ReadonlyArray<IpRestriction | null>): AddressCheck | null {
  const lists = restrictions.filter((r): r is IpRestriction => r !== null).map(compileOne)
  if (lists.length === 0) return null
  const seen = new LRUCache<string, boolean>({ max: CACHE_ENTRIES })
  return clientIp => {
    let passes = seen.get(clientIp)
    if (passes === undefined) {
      passes = lists.every(admits => admits(clientIp))
      seen.set(clientIp, passes)
    }
    return passes
  }
}

function compileOne (r: IpRestriction): AddressCheck {
  const allow = r.allow === null ? null : proxyAddr.compile([...r.allow])
  const deny = r.deny.length === 0 ? null : proxyAddr.compile([...r.deny])
  return clientIp => {
    // An address that is none ("unknown": the socket was gone before the request was read) is in
    // no range: refused by an allow list, let through by a deny list alone.
    if (deny !== null && inRange(deny, clientIp)) return false
    return allow === null || inRange(allow, clientIp)
  }
}

function inRange (ranges: (addr: string, i: number) => boolean, clientIp: string): boolean {
  try {
    return ranges(clientIp, 0)
  } catch {
    return false
  }
}
