import { Cluster, Redis, ReplyError, type ClusterOptions, type RedisOptions } from 'ioredis'
import { keySlot } from './keys.js'
import { restoreFastPrototypes } from '../fast-prototypes.js'

// ioredis has just extended String (its RESP3 VerbatimString): see src/fast-prototypes.ts.
restoreFastPrototypes()

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
  readonly password?: string
  readonly tls?: boolean
  /** Default 2000. */
  readonly connectTimeoutMs?: number
  /** Batch commands issued in the same tick into one write. Default false. */
  readonly enableAutoPipelining?: boolean
  /** Receives connection errors (ioredis would otherwise print unhandled 'error' events). */
  readonly onError?: (err: Error) => void
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
    ...(opts.password !== undefined ? { password: opts.password } : {}),
    ...(opts.tls === true ? { tls: {} } : {})
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
      redisOptions: {
        ...nodeOptions,
        ...(password !== undefined ? { password } : {}),
        ...(opts.tls === true || nodes.some((n) => n.tls) ? { tls: {} } : {})
      }
    }
    const cluster = new Cluster(nodes.map(({ host, port }) => ({ host, port })), clusterOptions)
    cluster.on('node error', (err: Error) => opts.onError?.(err))
    client = cluster
  } else if (opts.sentinels !== undefined) {
    if (opts.name === undefined) throw new TypeError('createRedisClient: sentinels need the master name')
    client = new Redis({
      ...common(opts),
      sentinels: opts.sentinels.map(({ host, port }) => ({ host, port })),
      name: opts.name,
      role: 'master',
      sentinelRetryStrategy: reconnectDelayMs,
      ...(opts.tls === true ? { enableTLSForSentinelMode: true } : {})
    })
  } else {
    const url = opts.url as string
    client = new Redis(url, { ...common(opts), ...(url.startsWith('rediss:') ? { tls: {} } : {}) })
  }
  client.on('error', (err: Error) => opts.onError?.(err))
  return client
}

/** Resolves once `client` is ready for commands; rejects after `timeoutMs`. */
export async function whenReady (client: Redis | Cluster, timeoutMs = 5000): Promise<void> {
  if (client.status === 'ready') return
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
 * - cluster: the slot moved or the cluster is not serving it (MOVED, ASK, TRYAGAIN, CLUSTERDOWN);
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
// (built/utils CONNECTION_CLOSED_ERROR_MSG, the offline-queue check in Redis.sendCommand).
const CLIENT_SIDE_CONNECTION = new Set(['Connection is closed.', "Stream isn't writeable and enableOfflineQueue options is false"])

/** The code of a Redis error reply (NOSCRIPT, BUSY, MOVED...), or null when `err` is not a reply. */
export function replyCode (err: unknown): string | null {
  if (!(err instanceof ReplyError)) return null
  const message = (err as Error).message
  const space = message.indexOf(' ')
  return space === -1 ? message : message.slice(0, space)
}

/** Classifies a failed Redis call by class and code, never by searching its message. */
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
  if (CLIENT_SIDE_CONNECTION.has((err as Error).message)) return 'connection'
  return 'other'
}
