import { AbstractConnector, Cluster, Redis, ReplyError, type ClusterOptions, type RedisOptions } from 'ioredis'
import type { Socket } from 'node:net'
import { connect as tlsConnect, type ConnectionOptions } from 'node:tls'
import { keySlot } from './keys.js'
import { restoreFastPrototypes } from '../fast-prototypes.js'
import { isTlsRefusalCode } from '../tls-errors.js'

// ioredis has just extended String (its RESP3 VerbatimString): see src/fast-prototypes.ts.
restoreFastPrototypes()
keepRedisSocketErrorsHandled()

/**
 * ioredis listens for a socket's 'error' once (its connectors and its client each with `once`),
 * but a TLS socket can emit two: a record that fails to decrypt is emitted as it is read
 * (ERR_SSL_DECRYPTION_FAILED_OR_BAD_RECORD_MAC), the reset that follows it through the socket's
 * destruction (ECONNRESET). The second found no listener and Node ended the gateway (seen in CI,
 * test/redis-tls-socket-errors.test.ts makes it happen). Every socket an ioredis connector opens
 * (a client's, a Cluster node's, a sentinel's) is stored in the
 * connector's `stream`: a listener for its whole life is added there. The first error still
 * reaches ioredis, which reports it and reconnects; a later one on the same dead socket adds
 * nothing to know. Installed once, on the prototype every connector shares.
 */
function keepRedisSocketErrorsHandled (): void {
  const proto: object = AbstractConnector.prototype
  if (Object.getOwnPropertyDescriptor(proto, 'stream') !== undefined) return
  const slot = Symbol('stream')
  type Holder = Record<typeof slot, Socket | undefined>
  Object.defineProperty(proto, 'stream', {
    configurable: true,
    get (this: Holder): Socket | undefined { return this[slot] },
    set (this: Holder, stream: Socket | undefined) {
      stream?.on('error', ignoreLateSocketError)
      this[slot] = stream
    }
  })
}

function ignoreLateSocketError (): void {}

// Builds the ioredis client the Redis store runs on: standalone (url), Cluster or Sentinel.
// Tuned to fail fast: the limiter wraps every call in its own timeout and falls back to a
// local store, so a command must never sit in a queue while Redis is away.

export interface RedisClientOptions {
  /** `redis://[:password@]host:port[/db]` or `rediss://…` for one server. */
  readonly url?: string
  /** Cluster seed nodes, `redis://host:port` (or `host:port`); the rest is discovered. */
  readonly cluster?: readonly string[]
  /** Sentinels watching the master named `name`. */
  readonly sentinels?: ReadonlyArray<{ readonly host: string, readonly port: number }>
  /** Sentinel master name. */
  readonly name?: string
  /** Ask the sentinels over TLS too, with `tls` (which it needs); default false: plain TCP. */
  readonly sentinelTls?: boolean
  readonly password?: string
  /** true: TLS checked against Node's default CAs; an object: TLS with a private CA, a client certificate, a name. */
  readonly tls?: boolean | RedisTlsOptions
  /** Default 2000. */
  readonly connectTimeoutMs?: number
  /** Batch commands issued in the same tick into one write. Default false. */
  readonly enableAutoPipelining?: boolean
  /** Receives connection errors (ioredis would otherwise print unhandled 'error' events). */
  readonly onError?: (err: Error) => void
}

/** TLS settings for every Redis connection, as read from the files the config names. */
export interface RedisTlsOptions {
  /** PEM: the CA certificate(s) server certificates are checked against, instead of Node's defaults. */
  readonly ca?: Buffer
  /** PEM: client certificate and its key, for a server with tls-auth-clients yes. */
  readonly cert?: Buffer
  readonly key?: Buffer
  /** The name the server certificate must hold, and SNI; default the host connected to. */
  readonly servername?: string
}

/**
 * What node:tls gets, or null for plain TCP. `on` is the connection's own say (a rediss:// URL).
 * Never rejectUnauthorized: false: a server whose certificate does not verify is not Redis to us.
 */
function tlsOptions (tls: RedisClientOptions['tls'], on: boolean): ConnectionOptions | null {
  if (tls === undefined || tls === false) return on ? {} : null
  if (tls === true) return {}
  return {
    ...(tls.ca !== undefined ? { ca: tls.ca } : {}),
    ...(tls.cert !== undefined ? { cert: tls.cert } : {}),
    ...(tls.key !== undefined ? { key: tls.key } : {}),
    ...(tls.servername !== undefined ? { servername: tls.servername } : {})
  }
}

/**
 * Reconnect delay: 25 ms doubling to a 200 ms cap, with jitter so instances do not reconnect in
 * step. The cap bounds how long a Redis that is back goes unused (issue 8: within 1 s); a
 * connection attempt to a dead local port every ~0.5 s costs next to nothing.
 */
export function reconnectDelayMs (attempt: number): number {
  return Math.min(200, 25 * 2 ** Math.min(attempt, 6)) + Math.floor(Math.random() * 50)
}

function common (opts: RedisClientOptions): RedisOptions {
  return {
    connectTimeout: opts.connectTimeoutMs ?? 2000,
    connectionName: 'edge-gateway',
    // No offline queue and no retries per request: while Redis is down a call fails at once
    // (the caller falls back) instead of waiting for a reconnect.
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    // A script whose reply was lost may have run: resending it would count the request twice.
    autoResendUnfulfilledCommands: false,
    retryStrategy: reconnectDelayMs,
    enableAutoPipelining: opts.enableAutoPipelining ?? false,
    ...(opts.password !== undefined ? { password: opts.password } : {})
  }
}

function parseNode (node: string): { host: string, port: number, password?: string, tls: boolean } {
  const url = new URL(node.includes('://') ? node : `redis://${node}`)
  return {
    host: url.hostname,
    port: url.port === '' ? 6379 : Number(url.port),
    ...(url.password !== '' ? { password: decodeURIComponent(url.password) } : {}),
    tls: url.protocol === 'rediss:'
  }
}

function withTls (tls: ConnectionOptions | null): { tls?: ConnectionOptions } {
  return tls === null ? {} : { tls }
}

export function createRedisClient (opts: RedisClientOptions): Redis | Cluster {
  const modes = [opts.url, opts.cluster, opts.sentinels].filter((m) => m !== undefined).length
  if (modes !== 1) throw new TypeError('createRedisClient: give exactly one of url, cluster, sentinels')
  let client: Redis | Cluster
  if (opts.cluster !== undefined) {
    const nodes = opts.cluster.map(parseNode)
    const { enableOfflineQueue: _q, retryStrategy: _r, ...nodeOptions } = common(opts)
    const password = opts.password ?? nodes.find((n) => n.password !== undefined)?.password
    const clusterOptions: ClusterOptions = {
      // Reads too go to masters: a replica may lag and let a client exceed its limit.
      scaleReads: 'master',
      enableOfflineQueue: false,
      enableAutoPipelining: opts.enableAutoPipelining ?? false,
      clusterRetryStrategy: reconnectDelayMs,
      // Asking a dead master for the slot map must not hold up learning of its replica's
      // promotion (default 1000 ms per attempt).
      slotsRefreshTimeout: 250,
      // A call whose node connection closed under it may have run: ioredis would send it again
      // after this delay (default 100 ms), running a limit script twice (the request counted
      // twice, a refund given twice). It fails instead, like a lost answer on a standalone Redis,
      // and the guard's fallback decides it. Redirections (MOVED, ASK, TRYAGAIN, CLUSTERDOWN),
      // which run nothing, are still followed.
      retryDelayOnFailover: 0,
      redisOptions: {
        ...nodeOptions,
        ...(password !== undefined ? { password } : {}),
        ...withTls(tlsOptions(opts.tls, nodes.some((n) => n.tls)))
      }
    }
    const cluster = new Cluster(nodes.map(({ host, port }) => ({ host, port })), clusterOptions)
    cluster.on('node error', (err: Error) => opts.onError?.(err))
    client = cluster
  } else if (opts.sentinels !== undefined) {
    if (opts.name === undefined) throw new TypeError('createRedisClient: sentinels need the master name')
    // The master (and replica) connections take the TLS settings; the sentinels themselves are
    // asked over plain TCP unless sentinelTls says they serve TLS (ioredis's sentinelTLS, which
    // its own sentinel connections use, and the +switch-master watchers).
    const tls = tlsOptions(opts.tls, false)
    if (opts.sentinelTls === true && tls === null) throw new TypeError('createRedisClient: sentinelTls needs tls')
    client = new Redis({
      ...common(opts),
      sentinels: opts.sentinels.map(({ host, port }) => ({ host, port })),
      name: opts.name,
      role: 'master',
      sentinelRetryStrategy: reconnectDelayMs,
      // A switch ends the connection to the old master (watchSwitchMaster) by ending its socket,
      // which a frozen master never closes from its side: ioredis destroys it after this long
      // (default 2000 ms), and only then connects to the new master.
      disconnectTimeout: 100,
      ...(tls !== null ? { tls, enableTLSForSentinelMode: true } : {}),
      ...(opts.sentinelTls === true && tls !== null ? { sentinelTLS: tls } : {})
    })
    watchSwitchMaster(client, opts.sentinels, opts.name, opts.sentinelTls === true ? tls : null)
  } else {
    const url = opts.url as string
    client = new Redis(url, { ...common(opts), ...withTls(tlsOptions(opts.tls, url.startsWith('rediss:'))) })
  }
  client.on('error', (err: Error) => opts.onError?.(err))
  return client
}

/**
 * Leaves the old master when a sentinel publishes `+switch-master` for `name`. Without it, a master
 * that stops answering but keeps its socket open (SIGSTOPped, a frozen VM, a network that drops
 * packets without a reset) kept the client on it after its replica was promoted: no 'ready', the
 * breaker's probes timing out, the limits on their fallback for as long as that socket lived
 * (test/faults/failover.fault.ts). ioredis's own failoverDetector does this too, but a switch
 * published while the client was already reconnecting (the old master killed) ended the client
 * for good (status 'end', never reconnected): its disconnect stops the connect under way. Here a
 * client that is connecting is left to it: it asks the sentinels for the master as it connects.
 */
function watchSwitchMaster (client: Redis, sentinels: ReadonlyArray<{ readonly host: string, readonly port: number }>, name: string, tls: ConnectionOptions | null): void {
  let lastSwitch = ''
  const watchers = sentinels.map(({ host, port }) => {
    const watcher = new Redis({
      host,
      port,
      retryStrategy: reconnectDelayMs,
      connectionName: 'edge-gateway-switch-watch',
      // subscribed once connected (below): a subscription queued while the sentinel was down was
      // dropped after ioredis's 20 attempts, and never made again (it resubscribes only to what
      // a sentinel confirmed), so gateways started before their sentinels never watched
      enableOfflineQueue: false,
      disconnectTimeout: 100,
      ...withTls(tls)
    })
    // a sentinel that is down: the others still tell, and this one is tried again
    watcher.on('error', () => {})
    watcher.on('ready', () => { watcher.subscribe('+switch-master').catch(() => {}) })
    // A connected watcher never holds the process: a client closed otherwise than by
    // closeRedisClient while it was reconnecting emits no 'end', and its watchers stay.
    watcher.on('connect', () => { (watcher as unknown as { stream?: Socket }).stream?.unref() })
    watcher.on('message', (channel: string, message: string) => {
      // "<name> <old ip> <old port> <new ip> <new port>"
      const fields = message.split(' ')
      if (channel !== '+switch-master' || fields.length !== 5 || fields[0] !== name) return
      // every sentinel publishes the switch it learns of: the first one is acted on
      if (message === lastSwitch) return
      lastSwitch = message
      // 'connect': connected but not ready, possibly to the old master named just before the switch
      if (client.status !== 'ready' && client.status !== 'connect') return
      // a client that reconnected on its own (the old master killed) may be on the new one already:
      // leaving it would cost the requests of a reconnect for nothing
      const socket = (client as unknown as { stream?: Socket }).stream
      const at = socket?.remoteAddress?.replace(/^::ffff:/, '')
      if (socket?.remotePort === Number(fields[4]) && at === fields[3]) return
      client.disconnect(true)
    })
    return watcher
  })
  const stop = (): void => { for (const watcher of watchers) watcher.disconnect() }
  client.once('end', stop)
  switchWatchers.set(client, stop)
}

const switchWatchers = new WeakMap<Redis | Cluster, () => void>()

/** Closes a client createRedisClient made, and what it made beside it (the +switch-master watchers). */
export function closeRedisClient (client: Redis | Cluster): void {
  switchWatchers.get(client)?.()
  client.disconnect()
}

/**
 * A connection error that is TLS refusing the peer (its certificate, or the handshake: a server
 * asking for a client certificate, TLS spoken to a plain port): a setting to fix, which retrying
 * never cures, unlike a refused or reset connection.
 */
export function isTlsFailure (err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code
  return typeof code === 'string' && isTlsRefusalCode(code)
}

/** The servers probeTlsFailure checks, with the TLS settings the client uses for them; empty when they are not asked over TLS. */
function probedTls (opts: RedisClientOptions): Array<{ host: string, port: number, tls: ConnectionOptions }> {
  if (opts.url !== undefined) {
    const node = parseNode(opts.url)
    const tls = tlsOptions(opts.tls, node.tls)
    return tls === null ? [] : [{ host: node.host, port: node.port, tls }]
  }
  const seeds = opts.cluster ?? []
  if (seeds.length > 0) {
    const tls = tlsOptions(opts.tls, seeds.some((n) => parseNode(n).tls))
    return tls === null ? [] : seeds.map((seed) => { const node = parseNode(seed); return { host: node.host, port: node.port, tls } })
  }
  const sentinels = opts.sentinels ?? []
  if (sentinels.length > 0 && opts.sentinelTls === true) {
    const tls = tlsOptions(opts.tls, false)
    return tls === null ? [] : sentinels.map((sentinel) => ({ host: sentinel.host, port: sentinel.port, tls }))
  }
  return []
}

/** How long a TLS 1.3 handshake's outcome is waited for after it completes, when the server sends no session ticket. */
const TLS13_VERDICT_MS = 500

/**
 * One TLS handshake with `server`: null when it succeeds (or does not end within timeoutMs), else
 * its error. Under TLS 1.3 the client's handshake completes before the server has checked the
 * client's certificate: a server with tls-auth-clients yes refuses one (or its absence) with an
 * alert after that. Nothing is written, so the server reads every byte before it closes and the
 * alert arrives: a client that has written its first commands by then gets a reset instead,
 * whichever comes first (ioredis does, so under load it reports ECONNRESET at every attempt and
 * never names the reason). A session ticket, which the server sends once it has accepted the
 * client, ends the wait early.
 */
async function handshakeFailure (server: { host: string, port: number, tls: ConnectionOptions }, timeoutMs: number): Promise<Error | null> {
  return await new Promise((resolve) => {
    const socket = tlsConnect({ ...server.tls, host: server.host, port: server.port, timeout: timeoutMs })
    let verdict: NodeJS.Timeout | undefined
    const done = (err: Error | null): void => {
      clearTimeout(verdict)
      socket.destroy()
      resolve(err)
    }
    socket.once('secureConnect', () => {
      if (socket.getProtocol() !== 'TLSv1.3') { done(null); return }
      verdict = setTimeout(() => done(null), Math.min(TLS13_VERDICT_MS, timeoutMs))
      socket.once('session', () => done(null))
      socket.once('close', () => done(null))
    })
    socket.once('timeout', () => done(null))
    // on, not once: a TLS socket can emit a second error (see keepRedisSocketErrorsHandled)
    socket.on('error', (err: Error) => done(err))
  })
}

/**
 * Why TLS to the servers the client connects to first fails, or null when it does not (or
 * without TLS there): the URL's server; the seed nodes under Cluster; the sentinels under
 * Sentinel with sentinelTls. The client's own errors do not always say: ioredis drops the errors
 * of the connections it discovers the others over (under Cluster it reports "Failed to refresh
 * slots cache" with "Connection is closed." as the reason, under Sentinel "All sentinels are
 * unreachable" with the same), and a server refusing the client's certificate under TLS 1.3 is
 * often seen as a reset (see handshakeFailure). One handshake with each, at once, with the same
 * settings names it: a refused certificate first (a first seed or sentinel that is down hid the
 * reason the others gave); else, when none of them answers, the first one's error; else null.
 */
export async function probeTlsFailure (opts: RedisClientOptions, timeoutMs = 2000): Promise<Error | null> {
  const servers = probedTls(opts)
  if (servers.length === 0) return null
  const failures = await Promise.all(servers.map(async (server) => await handshakeFailure(server, timeoutMs)))
  const refused = failures.find((err) => err !== null && isTlsFailure(err))
  if (refused !== undefined) return refused
  // one server that answers: the reason is not there (a master down behind a healthy sentinel,
  // which the client's own errors name); every one failing: the first one's is all there is
  return failures.every((err) => err !== null) ? failures[0] ?? null : null
}

/**
 * Resolves once `client` is ready for commands; rejects after `timeoutMs`. A Cluster is ready with
 * its slot map, while the connections to its masters may still be in their handshake; a call to
 * one of those fails at once (no offline queue, and no sending again 100 ms later:
 * retryDelayOnFailover 0), so this also waits, within `timeoutMs`, until every master's connection
 * is ready or has failed (a master that is down is the guard's to handle, not start-up's).
 */
export async function whenReady (client: Redis | Cluster, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  if (client.status !== 'ready') {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        client.off('ready', onReady)
        reject(new Error(`redis not ready after ${timeoutMs} ms (status ${client.status})`))
      }, timeoutMs)
      function onReady (): void {
        clearTimeout(timer)
        resolve()
      }
      client.once('ready', onReady)
    })
  }
  if (client instanceof Cluster) await mastersSettled(client, deadline)
}

/** Until each master connection of `cluster` is ready or ended, or `deadline` (Date.now()) passes. */
async function mastersSettled (cluster: Cluster, deadline: number): Promise<void> {
  const pending = cluster.nodes('master').filter((node) => node.status !== 'ready' && node.status !== 'end')
  if (pending.length === 0) return
  let timer: NodeJS.Timeout | undefined
  const cleanups: Array<() => void> = []
  await Promise.race([
    new Promise<void>((resolve) => { timer = setTimeout(resolve, Math.max(0, deadline - Date.now())) }),
    Promise.all(pending.map(async (node) => await new Promise<void>((resolve) => {
      const settled = (): void => resolve()
      node.once('ready', settled)
      node.once('end', settled)
      cleanups.push(() => { node.off('ready', settled); node.off('end', settled) })
      // a lazy connection (status wait) opens with its first command: open it now
      if (node.status === 'wait') node.connect().catch(() => {})
    })))
  ])
  clearTimeout(timer)
  for (const cleanup of cleanups) cleanup()
}

/**
 * Redis Cluster: the master serving a key's slot, from ioredis's slot map (refreshed on MOVED and
 * after a failover), and the masters serving slots now. What RedisGuard keys its breakers by.
 */
export function clusterNodes (cluster: Cluster): { nodeOf: (key: string) => string, liveNodes: () => ReadonlySet<string>, ping: (node: string) => Promise<unknown> } {
  return {
    ping: async (node) => {
      const redis = cluster.nodes('master').find((n) => `${n.options.host}:${n.options.port}` === node)
      if (redis === undefined) throw new Error(`no connection to ${node}`)
      return await redis.ping()
    },
    nodeOf: (key) => cluster.slots[keySlot(key)]?.[0] ?? 'unknown',
    // From the slot map, not the connection pool: ioredis drops a node from its pool as soon as
    // its connection ends, while the node still serves its slots until a replica takes over.
    liveNodes: () => {
      const live = new Set<string>()
      for (const owners of cluster.slots) if (owners?.[0] !== undefined) live.add(owners[0])
      return live
    }
  }
}

/**
 * What went wrong with a Redis call, as gateway_redis_errors_total{kind} counts it:
 * - timeout: the guard's own bound (code GW_ERR_REDIS_TIMEOUT);
 * - connection: no usable connection (a socket error code, or ioredis refusing to send);
 * - noscript: the server lacks the script (flushed or restarted);
 * - cluster: the slot moved or the cluster is not serving it (MOVED, ASK, TRYAGAIN, CLUSTERDOWN;
 *   ioredis following them until its redirections ran out);
 * - unavailable: the server is up but cannot run commands now (BUSY, LOADING, READONLY, MASTERDOWN);
 * - other: anything else (a script error, a bug).
 */
export type RedisErrorKind = 'timeout' | 'connection' | 'noscript' | 'cluster' | 'unavailable' | 'other'

/** The first word of a Redis error reply is its error code (https://redis.io/docs/latest/develop/reference/protocol-spec/#simple-errors). */
const REPLY_KINDS: Readonly<Record<string, RedisErrorKind>> = Object.freeze({
  NOSCRIPT: 'noscript',
  MOVED: 'cluster',
  ASK: 'cluster',
  TRYAGAIN: 'cluster',
  CLUSTERDOWN: 'cluster',
  BUSY: 'unavailable',
  LOADING: 'unavailable',
  READONLY: 'unavailable',
  MASTERDOWN: 'unavailable'
})

// ioredis rejects these without a code of its own; it matches them by these exact texts itself
// (built/utils CONNECTION_CLOSED_ERROR_MSG, the offline-queue checks in Redis.sendCommand and
// Cluster.sendCommand: a Cluster with no master connection).
const NEVER_SENT = new Set([
  "Stream isn't writeable and enableOfflineQueue options is false",
  "Cluster isn't ready and enableOfflineQueue options is false"
])
const CLIENT_SIDE_CONNECTION = new Set(['Connection is closed.', ...NEVER_SENT])
// ioredis's Cluster.handleError gives up after `maxRedirections` MOVED, ASK, TRYAGAIN or CLUSTERDOWN
// retries (failover retries after a closed connection too, which the gateway turns off) with a
// plain Error whose text starts so, the last of those errors after it
const REDIRECTIONS_EXHAUSTED = 'Too many Cluster redirections.'

/**
 * Whether Redis surely did not run a failed call: ioredis refused to send it (no connection), or
 * Redis refused it with BUSY, LOADING, READONLY or MASTERDOWN, which come before anything runs.
 * Any other failure (a lost connection, a timeout) may have come after Redis ran it. Under
 * Cluster a call may be sent more than once, but only after a redirection, which ran nothing:
 * never after its connection closed (retryDelayOnFailover 0), so its last send decides.
 */
export function neverRan (err: unknown): boolean {
  if (!(err instanceof Error)) return false
  if (NEVER_SENT.has(err.message)) return true
  return replyCode(err) !== null && classifyRedisError(err) === 'unavailable'
}

/** The code of a Redis error reply (NOSCRIPT, BUSY, MOVED...), or null when `err` is not a reply. */
export function replyCode (err: unknown): string | null {
  if (!(err instanceof ReplyError)) return null
  const message = (err as Error).message
  const space = message.indexOf(' ')
  return space === -1 ? message : message.slice(0, space)
}

/**
 * Classifies a failed Redis call by class and code, never by searching its message: only the few
 * errors ioredis raises without a code are matched, by the exact texts it builds them with.
 */
export function classifyRedisError (err: unknown): RedisErrorKind {
  if (typeof err !== 'object' || err === null) return 'other'
  const code = (err as { code?: unknown }).code
  if (code === 'GW_ERR_REDIS_TIMEOUT') return 'timeout'
  const reply = replyCode(err)
  if (reply !== null) return REPLY_KINDS[reply] ?? 'other'
  // a node:net error (ECONNREFUSED, ECONNRESET, EPIPE, ETIMEDOUT...) from the socket under ioredis
  if (typeof code === 'string' && code.startsWith('E')) return 'connection'
  const name = (err as { name?: unknown }).name
  if (name === 'MaxRetriesPerRequestError') return 'connection'
  if (name === 'ClusterAllFailedError') return 'cluster'
  const message = (err as { message?: unknown }).message
  if (typeof message !== 'string') return 'other'
  if (CLIENT_SIDE_CONNECTION.has(message)) return 'connection'
  if (message.startsWith(REDIRECTIONS_EXHAUSTED)) return 'cluster'
  return 'other'
}
