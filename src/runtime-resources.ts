// Long-lived things a runtime uses, keyed by the config that shapes them. A reload asks for them
// again; whatever config did not change comes back as the same object (connections and limiter
// state survive), and `sweep` closes what the live runtime no longer uses.
//
// Asking never changes an object a running runtime uses: settings that may change on a reload
// (the Redis timeout, the lease TTL, the body budget) are applied by `commit`, which the gateway
// calls only once the new runtime compiled completely and is swapped in (a reload is a transaction).
import { parseDuration } from './config/units.js'
import { limitStateOf, type ResolvedConfig, type ResolvedRedis } from './config/defaults.js'
import { UpstreamPool, upstreamSignature, type UpstreamConfig } from './proxy/upstream-pool.js'
import { BodyBudget } from './proxy/body-budget.js'
import { LocalLevel, DenyCache } from './limit/local-level.js'
import { createMemoryStore, type MemoryStore } from './limit/memory-store.js'
import { createRedisStore } from './limit/redis-store.js'
import { createHash } from 'node:crypto'
import { closeRedisClient, clusterNodes, createRedisClient, isTlsFailure, probeTlsFailure, whenReady, type RedisClientOptions, type RedisTlsOptions } from './limit/redis-client.js'
import { InstanceHeartbeat } from './limit/heartbeat.js'
import { RedisGuard, type BreakerState } from './limit/redis-guard.js'
import { LeaseKeeper } from './limit/concurrency.js'
import type { LimitStore } from './limit/types.js'
import type { Telemetry } from './telemetry.js'
import type { Logger } from './log.js'
import { PROPAGATING_TRACER, type RequestTracer } from './tracing.js'
import { createOtlpTracer, type OtlpTracer } from './otlp.js'
import { Cluster, type Redis } from 'ioredis'
import { ResetBus, deleteRedisKeys, peekRedis, type ResetMessage, type ResetOutcome } from './limit/limit-admin.js'
import type { PeekResult } from './limit/memory-store.js'
import type { LimitCheck } from './limit/types.js'

// Under Redis Cluster a rejection may come from units a concurrent request is about to refund
// (src/limit/redis-store.ts): remember it this long at most, so that under-admission stays brief
// while a key hammered by one client still costs at most a few Redis calls a second.
const CLUSTER_DENY_CACHE_MAX_MS = 250

// While Redis fails with errors other than TLS's, how often a handshake of our own asks whether TLS is why.
const TLS_PROBE_INTERVAL_MS = 10_000

interface RedisBundle {
  readonly client: Redis | Cluster
  readonly store: LimitStore
  readonly heartbeat: InstanceHeartbeat
  readonly guard: RedisGuard
  readonly bus: ResetBus
  readonly leases: LeaseKeeper
  /** The client's last connection error, for the start-up warning: null once it is ready. */
  readonly lastError: () => string | null
  /** Why a TLS handshake with the servers the client connects to first fails (see probeTlsFailure); a refused one is warned of. */
  readonly tlsFailure: () => Promise<Error | null>
}

export interface RedisStatus {
  readonly configured: boolean
  /** The client's connection is up (an idle gateway learns of a dead Redis before any request fails). */
  readonly connected: boolean
  readonly breaker: BreakerState | null
  /** Per node under Cluster (each master has its own breaker); one entry '*' otherwise. */
  readonly nodes?: ReadonlyArray<{ node: string, state: BreakerState }>
  readonly instances: number
}

export class ResourceCache {
  private readonly pools = new Map<string, UpstreamPool>()
  private readonly locals = new Map<string, LocalLevel>()
  private memory: { readonly store: MemoryStore, readonly maxKeys: number, readonly leases: LeaseKeeper } | null = null
  private readonly denies = new Map<string, DenyCache>()
  private readonly redis = new Map<string, RedisBundle>()
  /**
   * `redis.tls` of a config as its files were read when it was compiled (useRedisTls), and their
   * digest: a reload that finds a CA or client certificate changed on disk opens a new connection.
   */
  private readonly redisTlsOf = new WeakMap<ResolvedRedis, { readonly tls: boolean | RedisTlsOptions, readonly digest: string }>()
  /** Span exporters by collector: kept across reloads that do not change `tracing`. */
  private readonly tracers = new Map<string, OtlpTracer>()

  /** One per gateway, across reloads: a reload must not hand out a second full budget. */
  private readonly bodies = new BodyBudget(0)

  /**
   * `offline`: for `gateway validate` and `gateway explain`, which compile a runtime without
   * serving: no Redis connection, no span exporter (the shared level runs in process).
   */
  constructor (private readonly logger: Logger, readonly offline = false) {}

  /** The gateway-wide body budget; its size is `server.bufferBodiesTotal` from `commit` on. */
  bodyBudget (): BodyBudget {
    return this.bodies
  }

  /**
   * Applies what `config` sets on objects shared with the running runtime. Called once the
   * runtime compiled from `config` is swapped in, never before: a rejected reload changes nothing.
   */
  commit (config: ResolvedConfig, livePools: Iterable<UpstreamPool> = []): void {
    this.bodies.limit = config.server.bufferBodiesTotal
    this.checkHealthOf(livePools)
    const r = config.redis
    if (r === undefined) return
    const bundle = this.redis.get(this.redisKey(r))
    if (bundle === undefined) return
    bundle.leases.ttlMs = parseDuration(r.leaseTtl)
    bundle.guard.expectedInstances = r.expectedInstances
    bundle.guard.timeoutMs = parseDuration(r.timeout)
  }

  /**
   * Active health checks run on the live runtime's pools only: a pool a reload replaced hands
   * what its probes decided to its successor (same upstream) and stops probing, and so does a
   * pool of an upstream the reload removed. Never offline (`gateway validate` sends no probe).
   */
  private checkHealthOf (livePools: Iterable<UpstreamPool>): void {
    if (this.offline) return
    const live = new Set(livePools)
    for (const pool of live) {
      if (pool.checking) continue
      let previous: UpstreamPool | null = null
      for (const other of this.pools.values()) if (other !== pool && other.name === pool.name && other.checking && !live.has(other)) previous = other
      pool.startHealthChecks(previous)
    }
    for (const pool of this.pools.values()) if (!live.has(pool)) pool.stopHealthChecks()
  }

  /** The TLS settings `config`'s Redis connection uses, its files read: before a Redis resource is asked for. */
  useRedisTls (config: ResolvedConfig, tls: boolean | RedisTlsOptions): void {
    if (config.redis === undefined) return
    this.redisTlsOf.set(config.redis, { tls, digest: tlsDigest(tls) })
  }

  /** What identifies a Redis connection (see redisConnectionKey), with the TLS files' contents. */
  private redisKey (r: ResolvedRedis): string {
    return redisConnectionKey(r, this.redisTlsOf.get(r)?.digest ?? '')
  }

  /** Whether the shared limits are decided in process: no `redis:`, or compiled offline. */
  inProcess (config: ResolvedConfig): boolean {
    return config.redis === undefined || this.offline
  }

  pool (config: UpstreamConfig, telemetry?: Telemetry): UpstreamPool {
    const key = upstreamSignature(config)
    let pool = this.pools.get(key)
    if (pool === undefined) {
      pool = new UpstreamPool(config)
      // the pool of this upstream the running config uses (its settings changed): its targets' health carries over
      for (const other of this.pools.values()) if (other.name === config.name) pool.inheritHealth(other)
      this.pools.set(key, pool)
      pool.onEject = (upstream, target, reason, forMs) => {
        telemetry?.upstreamEjection(upstream, target, reason)
        this.logger.warn({ upstream, target, reason, ejectForMs: forMs }, 'upstream target ejected')
      }
      const upstream = config.name
      pool.onHealthCheck = {
        probed: (target, failure) => telemetry?.healthCheck(upstream, target, failure === null ? 'pass' : 'fail'),
        changed: (target, healthy, reason) => {
          if (healthy) this.logger.info({ upstream, target }, 'upstream target healthy again')
          else this.logger.warn({ upstream, target, reason }, 'upstream target unhealthy')
        }
      }
    }
    return pool
  }

  tracer (config: ResolvedConfig): RequestTracer {
    const t = config.tracing
    if (t === undefined || this.offline) return PROPAGATING_TRACER
    const key = tracerKey(config) as string
    let tracer = this.tracers.get(key)
    if (tracer === undefined) this.tracers.set(key, tracer = createOtlpTracer(t.otlp, t.serviceName))
    return tracer
  }

  localLevel (config: ResolvedConfig): LocalLevel | null {
    const l = config.local
    if (l === undefined) return null
    const options = { limit: l.limit, windowMs: parseDuration(l.window), burst: l.burst, maxKeys: l.maxKeys }
    const key = JSON.stringify(options)
    let level = this.locals.get(key)
    if (level === undefined) this.locals.set(key, level = new LocalLevel(options))
    return level
  }

  /**
   * Keys the shared level rejected. A new Redis endpoint starts a new cache: rejections decided by
   * another store say nothing about this one.
   */
  denyCache (config: ResolvedConfig): DenyCache {
    const key = denyCacheKey(config, config.redis === undefined ? null : this.redisKey(config.redis))
    let deny = this.denies.get(key)
    if (deny === undefined) this.denies.set(key, deny = new DenyCache(limitStateOf(config).maxKeys))
    return deny
  }

  /**
   * The in-process shared store. It holds every client's budget, so it survives reloads whole:
   * a changed `local.maxKeys` is applied at the next restart rather than by starting everyone
   * over with a fresh budget.
   */
  memoryStore (config: ResolvedConfig): MemoryStore {
    const max = limitStateOf(config).maxKeys
    if (this.memory !== null) {
      if (this.memory.maxKeys !== max) this.logger.warn({ maxKeys: this.memory.maxKeys, requested: max }, 'local.maxKeys of the in-process limit store changes at the next restart')
      return this.memory.store
    }
    const store = createMemoryStore({ maxKeys: max })
    this.memory = { store, maxKeys: max, leases: new LeaseKeeper({ memory: store, ttlMs: parseDuration(limitStateOf(config).leaseTtl) }) }
    return this.memory.store
  }

  /** Who releases and renews concurrency leases: the Redis connection's keeper, or the in-process one. */
  leaseKeeper (config: ResolvedConfig): LeaseKeeper {
    if (this.inProcess(config) || config.redis === undefined) {
      this.memoryStore(config)
      return (this.memory as { readonly leases: LeaseKeeper }).leases
    }
    const bundle = this.redis.get(this.redisKey(config.redis))
    if (bundle === undefined) throw new Error('leaseKeeper before redisGuard')
    return bundle.leases
  }

  redisGuard (config: ResolvedConfig, telemetry: Telemetry): RedisGuard {
    const r = config.redis
    if (r === undefined) throw new Error('redisGuard without redis config')
    const key = this.redisKey(r)
    let bundle = this.redis.get(key)
    if (bundle === undefined) {
      const keyPrefix = r.keyPrefix
      const tls = this.redisTlsOf.get(r)?.tls ?? (typeof r.tls === 'boolean' ? r.tls : null)
      if (tls === null) throw new Error('redisGuard before useRedisTls: the redis.tls files were not read')
      let lastError: string | null = null
      // A refused certificate or handshake is a setting to fix, not a blip: warned of once per
      // distinct reason until the connection is ready, where other errors (retried every ~0.2 s
      // while Redis is down) stay at debug.
      let tlsWarned: string | null = null
      const warnTls = (err: Error): void => {
        if (tlsWarned === err.message) return
        tlsWarned = err.message
        this.logger.warn({ err: err.message, code: (err as NodeJS.ErrnoException).code }, 'Redis TLS handshake failed (check redis.tls: ca, servername, cert and key): limits follow onError until it succeeds')
      }
      // Other errors may be a refused certificate whose alert the client never read (a reset:
      // see probeTlsFailure): a handshake of our own names it, at most one every 10 s.
      let probedAt = -Infinity
      const probeTls = async (): Promise<Error | null> => {
        probedAt = performance.now()
        const failure = await probeTlsFailure(clientOptions)
        if (failure !== null && isTlsFailure(failure) && bundle?.client.status !== 'ready') warnTls(failure)
        return failure
      }
      const clientOptions: RedisClientOptions = {
        ...(r.url !== undefined ? { url: r.url } : {}),
        ...(r.cluster !== undefined ? { cluster: r.cluster } : {}),
        ...(r.sentinels !== undefined ? { sentinels: r.sentinels.map(hp => ({ host: hp.slice(0, hp.lastIndexOf(':')), port: Number(hp.slice(hp.lastIndexOf(':') + 1)) })) } : {}),
        ...(r.name !== undefined ? { name: r.name } : {}),
        sentinelTls: r.sentinelTls,
        ...(r.password !== undefined ? { password: r.password } : {}),
        tls,
        enableAutoPipelining: r.autoPipelining,
        onError: (err: Error) => {
          lastError = telling(lastError, err.message)
          if (isTlsFailure(err)) {
            warnTls(err)
            return
          }
          this.logger.debug({ err: err.message }, 'redis client error')
          if (tlsWarned === null && performance.now() - probedAt > TLS_PROBE_INTERVAL_MS) void probeTls()
        }
      }
      const client = createRedisClient(clientOptions)
      const heartbeat = new InstanceHeartbeat(client, `${keyPrefix}:instances`)
      heartbeat.start()
      const store = createRedisStore({
        client,
        markerPrefix: keyPrefix,
        onBackgroundError: (err) => { this.logger.debug({ err: (err as Error).message }, 'redis cluster refund failed') },
        onFunctionsRefused: (err) => { this.logger.info({ err: (err as Error).message }, 'Redis refused the gateway\'s function library: limits run as scripts (EVALSHA), which costs Redis more per call') }
      })
      const guard = new RedisGuard({
        store,
        fallbackMaxKeys: limitStateOf(config).maxKeys,
        // a new connection: nothing running uses it yet, so its settings are given here
        timeoutMs: parseDuration(r.timeout),
        expectedInstances: r.expectedInstances,
        ...(client instanceof Cluster ? clusterNodes(client) : { ping: () => client.ping() }),
        // a call the fallback decided whose leases Redis took late: given back like every other release
        onLateLeases: (keys, member) => { bundle?.leases.release({ keys: [...keys], member, level: 'redis', units: 1, released: false, heldAt: -1 }) },
        // requests admitted through Redis still in flight take their place in the fallback's share
        leasesHeld: (key) => bundle?.leases.heldFor(key) ?? 0,
        onDebtError: (err, keys) => { this.logger.warn({ err: (err as Error).message, keys }, 'could not write the fallback\'s admissions back to Redis: kept, and written with a later answer') },
        onDebtOverflow: (admissions) => { this.logger.warn({ admissions, maxKeys: limitStateOf(config).maxKeys }, 'fallback admissions of keys beyond local.maxKeys were not recorded, and Redis never counts them') },
        onDebtDropped: (keys) => { this.logger.warn({ keys }, 'dropped fallback admissions never written back to Redis (their window passed, or too many keys owed)') },
        ...(r.cluster !== undefined ? { denyCacheMaxMs: CLUSTER_DENY_CACHE_MAX_MS } : {}),
        instances: () => heartbeat.instances,
        telemetry,
        onStateChange: (state, reason) => {
          if (state === 'open' && client instanceof Cluster) refreshSlotsWhileOpen(client, () => guard.breaker)
          // logged once per switch, not per request
          if (state === 'closed') this.logger.info({ breaker: state, reason }, 'rate limiter back on Redis')
          else this.logger.warn({ breaker: state, reason, instances: bundle?.guard.instances ?? heartbeat.instances }, 'rate limiter falling back: Redis unavailable')
        }
      })
      // Reachable again (reconnected, or Sentinel handed over a new master): probe at once and
      // announce this instance, so recovery takes well under a second rather than a back-off.
      client.on('ready', () => {
        lastError = null
        tlsWarned = null
        guard.probeNow()
        void heartbeat.beat()
      })
      // Cluster: a new slot map may name a promoted replica for a dead master's slots. ioredis
      // emits 'refresh' after every refresh, changed or not (every 200 ms while a breaker is open,
      // refreshSlotsWhileOpen): probing on each would undo the breaker's back-off and cost a
      // request the timeout five times a second, so only a changed set of masters probes.
      if (client instanceof Cluster) {
        let masters = slotMasters(client)
        client.on('refresh', () => {
          const now = slotMasters(client)
          if (now === masters) return
          masters = now
          guard.probeNow()
        })
      }
      const bus = new ResetBus(client, `${keyPrefix}:admin:reset`, (m) => this.applyReset(m), (err) => { this.logger.debug({ err: err.message }, 'redis reset subscriber error') })
      bus.start()
      const leases = new LeaseKeeper({
        redis: { client, guard, store },
        ttlMs: parseDuration(r.leaseTtl),
        onError: (err, what) => { this.logger.debug({ err: (err as Error).message, what }, 'concurrency lease call failed: the lease expires within leaseTtl') }
      })
      this.redis.set(key, bundle = { client, store, heartbeat, guard, bus, leases, lastError: () => lastError, tlsFailure: probeTls })
    }
    // An existing connection keeps its settings until `commit`: the running runtime uses it.
    return bundle.guard
  }

  /**
   * Waits (bounded) for the Redis connection so the first requests are decided by Redis rather
   * than by the fallback; a Redis that is down at start-up is logged, not fatal.
   */
  async redisReady (config: ResolvedConfig, timeoutMs = 2000): Promise<void> {
    if (this.inProcess(config) || config.redis === undefined) return
    const bundle = this.redis.get(this.redisKey(config.redis))
    if (bundle === undefined) return
    try {
      await whenReady(bundle.client, timeoutMs)
      await bundle.heartbeat.beat()
    } catch (err) {
      // why it is not: "not ready after 2000 ms" alone sends an operator looking in the wrong place;
      // a handshake of our own names a TLS refusal, the client's last error anything else
      const tls = await bundle.tlsFailure()
      this.logger.warn({ err: (err as Error).message, cause: tls?.message ?? bundle.lastError() }, 'Redis is not reachable yet: limits follow onError until it is')
    }
  }

  redisStatus (config: ResolvedConfig): RedisStatus {
    if (config.redis === undefined) return { configured: false, connected: false, breaker: null, instances: 1 }
    const bundle = this.redis.get(this.redisKey(config.redis))
    return { configured: true, connected: bundle?.client.status === 'ready', breaker: bundle?.guard.breaker ?? null, nodes: bundle?.guard.breakerStates() ?? [], instances: bundle?.guard.instances ?? 1 }
  }

  /** Every limit of `checks` read without consuming (admin GET /limits). */
  async peekLimits (config: ResolvedConfig, checks: readonly LimitCheck[]): Promise<PeekResult[]> {
    if (config.redis === undefined) return this.memoryStore(config).peek(checks)
    const bundle = this.redis.get(this.redisKey(config.redis))
    if (bundle === undefined) throw new Error('Redis is not connected')
    return await peekRedis(bundle.client, checks)
  }

  /**
   * Resets a client's limits (admin DELETE /limits): deletes the keys in the shared store, then
   * has every instance (over Redis pub/sub) drop its local bucket and deny-cache entries for them.
   * Resolves with the keys that existed and the instances that received the reset.
   */
  async resetLimits (config: ResolvedConfig, message: ResetMessage): Promise<ResetOutcome> {
    // Local state first: while Redis is away the fallback is what limits the client, and the
    // reset must free it then too (the answer says that Redis itself was not reset).
    const forgotten = this.applyReset(message)
    // in process, the keys this process held state for (a client never seen has none)
    if (config.redis === undefined) return { deleted: forgotten, instances: 1 }
    const bundle = this.redis.get(this.redisKey(config.redis))
    if (bundle === undefined) return { deleted: null, instances: null, redisError: 'Redis is not connected' }
    try {
      const deleted = await deleteRedisKeys(bundle.client, message.keys)
      // again once the keys are gone: a rejection decided meanwhile may have refilled the deny cache,
      // and the answer must not depend on our own subscriber's delivery
      this.applyReset(message)
      const instances = await bundle.bus.publish(message)
      return { deleted, instances }
    } catch (err) {
      return { deleted: null, instances: null, redisError: (err as Error).message }
    }
  }

  /** Drops local state for one client: local-level bucket, deny-cache entries, in-process keys. */
  applyReset (message: ResetMessage): number {
    if (message.ipKey !== null) for (const level of this.locals.values()) level.forget(message.ipKey)
    for (const deny of this.denies.values()) for (const k of message.denyKeys) deny.forget(k)
    let forgotten = 0
    if (this.memory !== null) for (const k of message.keys) if (this.memory.store.forget(k)) forgotten++
    for (const bundle of this.redis.values()) bundle.guard.forgetFallback(message.keys)
    this.logger.debug({ ipKey: message.ipKey, keys: message.keys.length }, 'local limit state reset')
    return forgotten
  }

  localKeys (): number {
    let n = 0
    for (const l of this.locals.values()) n += l.size
    return n
  }

  /**
   * Closes whatever `config` no longer uses (pools drain their in-flight requests first).
   * `draining`: the configs of replaced runtimes that still have requests in flight; their Redis
   * connections stay, like their pools.
   */
  async sweep (config: ResolvedConfig, livePools: Iterable<UpstreamPool>, draining: readonly ResolvedConfig[] = []): Promise<void> {
    const keep = new Set(livePools)
    const closing: Promise<unknown>[] = []
    for (const [key, pool] of this.pools) {
      if (!keep.has(pool)) {
        this.pools.delete(key)
        closing.push(pool.retire())
      }
    }
    const liveLocal = this.localLevel(config)
    for (const [key, level] of this.locals) if (level !== liveLocal) this.locals.delete(key)
    const liveDeny = denyCacheKey(config, config.redis === undefined ? null : this.redisKey(config.redis))
    for (const key of this.denies.keys()) if (key !== liveDeny) this.denies.delete(key)
    if (this.memory !== null && !this.inProcess(config)) {
      closing.push(this.memory.store.close())
      this.memory = null
    }
    // A replaced config's requests still in flight end their spans on its tracer: shut down, it
    // would drop them (the upstream's spans would then name a parent never exported).
    const usedTracers = new Set([config, ...draining].map(tracerKey))
    for (const [key, tracer] of this.tracers) {
      if (!usedTracers.has(key)) {
        this.tracers.delete(key)
        closing.push(tracer.shutdown())
      }
    }
    const usedRedis = new Set<string>()
    for (const c of [config, ...draining]) if (!this.inProcess(c) && c.redis !== undefined) usedRedis.add(this.redisKey(c.redis))
    for (const [key, bundle] of this.redis) {
      if (!usedRedis.has(key)) {
        this.redis.delete(key)
        closing.push(this.retireRedis(bundle))
      }
    }
    await Promise.allSettled(closing)
  }

  /** Connections no runtime uses now that still hold leases (open WebSockets, long requests). */
  private readonly retiringRedis = new Set<RedisBundle>()

  /**
   * Closes a connection no runtime uses. Leases it holds in Redis (a WebSocket opened before a
   * reload that changed the password or autoPipelining) are still renewed and released through it
   * until the last one is given back: closing at once would give them back while their requests
   * run, and the cap would admit more. Its heartbeat and reset subscription stop at once: it is
   * no longer an instance of its own.
   */
  private async retireRedis (bundle: RedisBundle): Promise<void> {
    if (bundle.leases.heldInRedis > 0) {
      this.retiringRedis.add(bundle)
      bundle.bus.stop()
      await bundle.heartbeat.stop()
      this.logger.info({ leases: bundle.leases.heldInRedis }, 'a replaced Redis connection stays open until the leases it holds are released')
      await bundle.leases.whenNoneHeld()
      // closeAll may have closed it meanwhile (shutdown)
      if (!this.retiringRedis.delete(bundle)) return
    }
    await closeRedis(bundle)
  }

  async closeAll (): Promise<void> {
    const closing: Promise<unknown>[] = []
    for (const pool of this.pools.values()) closing.push(pool.close())
    if (this.memory !== null) closing.push(this.memory.store.close())
    for (const bundle of this.redis.values()) closing.push(closeRedis(bundle))
    for (const bundle of this.retiringRedis) closing.push(closeRedis(bundle))
    this.retiringRedis.clear()
    // buffered spans are exported before the gateway stops
    for (const tracer of this.tracers.values()) closing.push(tracer.shutdown())
    this.tracers.clear()
    this.pools.clear()
    this.memory = null
    this.redis.clear()
    await Promise.allSettled(closing)
  }
}

/**
 * What identifies a Redis connection: a reload that changes only `timeout` or `onError` keeps the
 * client, its breaker state and its heartbeat (onError is read per limit from the plan).
 */
function redisConnectionKey (r: ResolvedRedis, tlsDigest: string): string {
  return JSON.stringify([r.url, r.cluster, r.sentinels, r.name, r.sentinelTls, r.password, r.tls, tlsDigest, r.keyPrefix, r.autoPipelining])
}

/** The masters serving slots in ioredis's slot map, as one comparable string. */
function slotMasters (cluster: Cluster): string {
  return [...clusterNodes(cluster).liveNodes()].sort().join(',')
}

const SLOT_REFRESH_MS = 200
const refreshing = new WeakSet<Cluster>()

/**
 * While a Cluster master's breaker is open, ask for the slot map every 200 ms: ioredis refreshes
 * it on errors or every 5 s, and the breaker keeps requests (hence errors) away from the dead
 * master, so a promoted replica would otherwise go unnoticed for seconds.
 */
function refreshSlotsWhileOpen (cluster: Cluster, breaker: () => string): void {
  if (refreshing.has(cluster)) return
  refreshing.add(cluster)
  const timer = setInterval(() => {
    if (breaker() === 'closed' || cluster.status === 'end') {
      clearInterval(timer)
      refreshing.delete(cluster)
      return
    }
    cluster.refreshSlotsCache()
  }, SLOT_REFRESH_MS)
  timer.unref()
}

function denyCacheKey (config: ResolvedConfig, redisKey: string | null): string {
  return JSON.stringify([limitStateOf(config).maxKeys, redisKey])
}

/** sha256 of the TLS files and name a connection uses ('' without files): never the files themselves in a key. */
function tlsDigest (tls: boolean | RedisTlsOptions): string {
  if (typeof tls === 'boolean') return ''
  const hash = createHash('sha256')
  for (const part of [tls.ca, tls.cert, tls.key]) hash.update(part === undefined ? '-' : `${part.length}:`).update(part ?? '')
  hash.update(tls.servername ?? '')
  return hash.digest('hex')
}

async function closeRedis (bundle: RedisBundle): Promise<void> {
  bundle.bus.stop()
  // together: against a stalled Redis each waits out its own bound (1 s), and one after the other
  // they held the exit twice as long
  await Promise.all([bundle.leases.close(), bundle.heartbeat.stop()])
  bundle.guard.close()
  await bundle.store.close()
  closeRedisClient(bundle.client)
}

function tracerKey (config: ResolvedConfig): string | null {
  const t = config.tracing
  return t === undefined ? null : JSON.stringify([t.otlp, t.serviceName])
}

/**
 * The Redis client error to give as the reason Redis is not reachable: the later one, unless it
 * is one of ioredis's summaries ("Connection is closed.", "All sentinels are unreachable ... Last
 * error: Connection is closed."), which say nothing an operator can act on. One of them replaced
 * the master's refusal when a sentinel was slowed past the timeout on a loaded machine. Any other
 * later error (WRONGPASS once Redis is back, a failover's new master not resolving) is the news.
 */
export function telling (earlier: string | null, later: string): string {
  return earlier !== null && IOREDIS_SUMMARY.test(later) ? earlier : later
}

const IOREDIS_SUMMARY = /^(?:Connection is closed\.?|All sentinels are unreachable\b.*)$/s
