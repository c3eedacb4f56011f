// The PROXY protocol (HAProxy's, versions 1 and 2): a load balancer working at the TCP level (AWS
// NLB, HAProxy in tcp mode, a Kubernetes service of type LoadBalancer) opens each connection with
// one line or block naming the client it accepted, before the client's own bytes (HTTP, or a TLS
// handshake). Behind such a balancer every connection comes from the balancer's address: without
// the header, every client would be one client to the ip limits, ipRestriction and the log.
//
// acceptProxyProtocol reads that header on the listener's connections from the peers the
// configuration names (proxyProtocol.from), before node's HTTP or TLS layer sees a byte, and
// gives the connection the client's address: what `socket.remoteAddress` reads from then on, so
// every stage (client address, X-Forwarded-For, the access log) sees the client.
import { isIPv4, isIPv6, type Server as NetServer, type Socket } from 'node:net'
import type { TLSSocket } from 'node:tls'
import ipaddr from 'ipaddr.js'

/** What the header said: the client's address, or `local` (the balancer's own connection: a health check). */
export type ProxyHeader = { readonly kind: 'proxied', readonly address: string, readonly port: number } | { readonly kind: 'local' }

export type ProxyHeaderParse =
  | { readonly state: 'incomplete' }
  | { readonly state: 'invalid', readonly reason: ProxyRefusal }
  | { readonly state: 'done', readonly header: ProxyHeader, readonly length: number }

/** Why a connection that owed a header was closed: the label of gateway_proxy_protocol_refused_total. */
export type ProxyRefusal = 'missing' | 'malformed' | 'timeout'

const V1_PREFIX = Buffer.from('PROXY ', 'latin1')
/** A version 1 line, CRLF included, is at most 107 bytes (the specification's bound). */
export const V1_MAX_LENGTH = 107
const V2_SIGNATURE = Buffer.from([0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a])
/**
 * The longest version 2 block taken: its addresses and type-length-value fields (AWS's VPC
 * endpoint id, a TLS summary) fit well within; a longer one is refused, not buffered.
 */
export const V2_MAX_LENGTH = 16 + 2048

const V2_FAMILY_PROTOCOLS: ReadonlySet<number> = new Set([0x00, 0x11, 0x12, 0x21, 0x22, 0x31, 0x32])

const INCOMPLETE: ProxyHeaderParse = Object.freeze({ state: 'incomplete' })
const LOCAL: ProxyHeader = Object.freeze({ kind: 'local' })

function invalid (reason: ProxyRefusal): ProxyHeaderParse {
  return { state: 'invalid', reason }
}

/** Whether `buf` begins as `prefix` does, as far as both go. */
function startsLike (buf: Buffer, prefix: Buffer): boolean {
  const n = Math.min(buf.length, prefix.length)
  return buf.subarray(0, n).equals(prefix.subarray(0, n))
}

/** The header at the start of `buf` (the first bytes of a connection), version 1 or 2. */
export function parseProxyHeader (buf: Buffer): ProxyHeaderParse {
  if (buf.length === 0) return INCOMPLETE
  if (startsLike(buf, V2_SIGNATURE)) return parseV2(buf)
  if (startsLike(buf, V1_PREFIX)) return parseV1(buf)
  return invalid('missing')
}

const PORT = /^(?:0|[1-9]\d{0,4})$/

function parseV1 (buf: Buffer): ProxyHeaderParse {
  const end = buf.subarray(0, V1_MAX_LENGTH).indexOf('\r\n')
  if (end === -1) return buf.length >= V1_MAX_LENGTH ? invalid('malformed') : INCOMPLETE
  const fields = buf.toString('latin1', 0, end).split(' ')
  const length = end + 2
  // UNKNOWN: the balancer could not name the client (or it is its own connection); the rest of
  // the line is to be ignored
  if (fields[1] === 'UNKNOWN') return { state: 'done', header: LOCAL, length }
  if (fields.length !== 6) return invalid('malformed')
  const [, family, source, destination, sourcePort, destinationPort] = fields as [string, string, string, string, string, string]
  const isFamily = family === 'TCP4' ? isIPv4 : family === 'TCP6' ? isIPv6 : null
  // node's isIPv6 takes a zone (fe80::1%eth0), which names an interface of the balancer's and is
  // no part of the line's address (inet_ntop's text)
  if (isFamily === null || !isFamily(source) || !isFamily(destination) || source.includes('%') || destination.includes('%')) return invalid('malformed')
  if (!PORT.test(sourcePort) || !PORT.test(destinationPort) || Number(sourcePort) > 65535 || Number(destinationPort) > 65535) return invalid('malformed')
  const address = family === 'TCP6' ? ipv6Text(ipaddr.IPv6.parse(source)) : source
  return { state: 'done', header: { kind: 'proxied', address, port: Number(sourcePort) }, length }
}

/**
 * One spelling of each address, as node writes a peer's: the ip limits key on the text. An
 * IPv4-mapped one (a dual-stack balancer's IPv4 client) as node's ::ffff:a.b.c.d, which every
 * stage reads as the IPv4 client (ipaddr's ::ffff:cb00:7114 reached X-Forwarded-For as such).
 */
function ipv6Text (address: ipaddr.IPv6): string {
  return address.isIPv4MappedAddress() ? `::ffff:${address.toIPv4Address().toString()}` : address.toString()
}

function parseV2 (buf: Buffer): ProxyHeaderParse {
  if (buf.length < 16) return INCOMPLETE
  const versionCommand = buf[12] as number
  if (versionCommand >> 4 !== 2) return invalid('malformed')
  const command = versionCommand & 0x0f
  if (command > 1) return invalid('malformed')
  const length = 16 + buf.readUInt16BE(14)
  if (length > V2_MAX_LENGTH) return invalid('malformed')
  if (buf.length < length) return INCOMPLETE
  // LOCAL: the balancer's own connection (its health check); the addresses are to be ignored
  if (command === 0) return { state: 'done', header: LOCAL, length }
  const familyProtocol = buf[13] as number
  // the specification's seven pairs (UNSPEC, or TCP or UDP over IPv4, IPv6, a Unix socket); it
  // has a receiver reject every other byte, not take it for a connection without an address
  if (!V2_FAMILY_PROTOCOLS.has(familyProtocol)) return invalid('malformed')
  const stream = (familyProtocol & 0x0f) === 1
  const family = familyProtocol >> 4
  if (stream && family === 1) {
    if (length < 16 + 12) return invalid('malformed')
    return { state: 'done', header: { kind: 'proxied', address: `${buf[16]}.${buf[17]}.${buf[18]}.${buf[19]}`, port: buf.readUInt16BE(24) }, length }
  }
  if (stream && family === 2) {
    if (length < 16 + 36) return invalid('malformed')
    const address = ipv6Text(new ipaddr.IPv6([...buf.subarray(16, 32)]))
    return { state: 'done', header: { kind: 'proxied', address, port: buf.readUInt16BE(48) }, length }
  }
  // UNSPEC, a Unix socket or a datagram: no address of the kind a TCP client has; the connection
  // keeps its peer's (the specification lets a receiver ignore what it does not know)
  return { state: 'done', header: LOCAL, length }
}

export interface ProxyProtocolPolicy {
  /** Whether a connection from this peer must open with a header. */
  readonly expects: (peer: string | undefined) => boolean
  /** Longest wait for the header's bytes before the connection is closed. */
  readonly timeoutMs: number
}

export interface ProxyProtocolHooks {
  /** The policy now (a reload may change it); null: PROXY protocol off, every connection as it comes. */
  readonly policy: () => ProxyProtocolPolicy | null
  /** A connection closed for want of a valid header. */
  readonly refused: (reason: ProxyRefusal, peer: string | undefined) => void
}

/** What the header named, as the connection's address from then on (an own property hides net.Socket's getter). */
function takeAddress (socket: Socket, header: ProxyHeader): void {
  if (header.kind === 'local') return
  Object.defineProperty(socket, 'remoteAddress', { value: header.address, configurable: true })
  Object.defineProperty(socket, 'remotePort', { value: header.port, configurable: true })
  Object.defineProperty(socket, 'remoteFamily', { value: isIPv4(header.address) ? 'IPv4' : 'IPv6', configurable: true })
}

export interface ProxyProtocolListener {
  /**
   * Closes the connections still waiting for their header, uncounted (a shutdown: none would be
   * served). Neither node's HTTP layer nor the gateway holds them yet, so neither closes them, and
   * each one's timer would keep the process up to proxyProtocol.timeout past "gateway stopped".
   */
  readonly closeWaiting: () => void
}

/**
 * Reads the PROXY header of every connection `server` accepts from a peer the policy names, then
 * hands the connection to the listeners it had (node's HTTP or TLS layer and the gateway's own),
 * with the rest of the bytes put back. Call it once every 'connection' listener is in place.
 * A connection whose header is missing, malformed or late is closed: there is no protocol to
 * answer it in. One from another peer is handed on at once, a header it sends read as HTTP (400).
 */
export function acceptProxyProtocol (server: NetServer, hooks: ProxyProtocolHooks): ProxyProtocolListener {
  const listeners = server.listeners('connection') as Array<(socket: Socket) => void>
  server.removeAllListeners('connection')
  const handOn = (socket: Socket): void => {
    for (const listener of listeners) listener.call(server, socket)
  }
  const proxied = new WeakSet<Socket>()
  // each connection still reading its header, with what closes it
  const waiting = new Map<Socket, () => void>()
  server.on('connection', (socket: Socket) => {
    // a declined upgrade hands its connection to the server again: its header was read
    if (proxied.has(socket)) return handOn(socket)
    const policy = hooks.policy()
    if (policy === null || !policy.expects(socket.remoteAddress)) return handOn(socket)
    proxied.add(socket)
    readHeader(socket, policy.timeoutMs, hooks, waiting, (header, rest) => {
      takeAddress(socket, header)
      socket.pause()
      if (rest.length > 0) socket.unshift(rest)
      handOn(socket)
      // node's HTTP layer reads on by itself once flowing; a TLS layer reads the bytes put back
      // from the paused socket (and would lose those a flowing one emitted)
      if (!('setSecureContext' in server)) socket.resume()
    })
  })
  // A TLS listener's requests see the TLS socket, wrapped around the one the header came on
  server.prependListener('secureConnection', (tls: TLSSocket) => {
    const raw = (tls as TLSSocket & { _parent?: Socket })._parent
    if (raw === undefined || !Object.hasOwn(raw, 'remoteAddress')) return
    for (const key of ['remoteAddress', 'remotePort', 'remoteFamily'] as const) {
      Object.defineProperty(tls, key, { value: raw[key], configurable: true })
    }
  })
  return {
    closeWaiting: () => { for (const leave of [...waiting.values()]) leave() }
  }
}

function readHeader (socket: Socket, timeoutMs: number, hooks: ProxyProtocolHooks, waiting: Map<Socket, () => void>, done: (header: ProxyHeader, rest: Buffer) => void): void {
  let buf: Buffer = Buffer.alloc(0)
  const peer = socket.remoteAddress
  const stop = (): void => {
    waiting.delete(socket)
    clearTimeout(timer)
    socket.off('data', onData)
    socket.off('error', leave)
    socket.off('end', leave)
  }
  const refuse = (reason: ProxyRefusal): void => {
    stop()
    hooks.refused(reason, peer)
    socket.destroy()
  }
  const onData = (chunk: Buffer): void => {
    buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk])
    const parsed = parseProxyHeader(buf)
    if (parsed.state === 'incomplete') return
    if (parsed.state === 'invalid') return refuse(parsed.reason)
    stop()
    done(parsed.header, buf.subarray(parsed.length))
  }
  // a reset, or the peer's end (node's HTTP listener keeps a connection half-open) before a
  // whole header: nothing to answer, nothing to count (a balancer's TCP health check connects
  // and leaves)
  const leave = (): void => {
    stop()
    socket.destroy()
  }
  const timer = setTimeout(() => refuse('timeout'), timeoutMs)
  waiting.set(socket, leave)
  socket.on('data', onData)
  socket.on('error', leave)
  socket.on('end', leave)
}
