// Is the TCP peer one of our own proxies (`trustedProxies`)? Only such a peer may hand us a request
// id or client-address headers (Forwarded, X-Real-IP, ...): from anyone else they are forgeries.
import { isIPv4 } from 'node:net'
import proxyAddr from 'proxy-addr'
import { LRUCache } from 'lru-cache'

export type TrustedPeerCheck = (socketAddress: string | undefined) => boolean

const NOBODY: TrustedPeerCheck = () => false

export function compileTrustedPeer (trustedProxies: readonly string[]): TrustedPeerCheck {
  if (trustedProxies.length === 0) return NOBODY
  // The list was validated by the client-IP resolver (located error at load); compile cannot throw here.
  const trust = proxyAddr.compile([...trustedProxies])
  // proxy-addr parses the address on every call: a keep-alive peer repeats it, so it is memoized.
  const seen = new LRUCache<string, boolean>({ max: 10_000 })
  return (socketAddress) => {
    if (socketAddress === undefined) return false
    let trusted = seen.get(socketAddress)
    if (trusted === undefined) {
      const addr = socketAddress.startsWith('::ffff:') && isIPv4(socketAddress.slice(7)) ? socketAddress.slice(7) : socketAddress
      try {
        trusted = trust(addr, 0)
      } catch {
        trusted = false
      }
      seen.set(socketAddress, trusted)
    }
    return trusted
  }
}
