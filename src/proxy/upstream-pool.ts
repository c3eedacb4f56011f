import { isIP } from 'node:net'
import { continueTolerantConnector } from './interim-responses.js'
import { Pool } from 'undici'
import { HealthChecker, initialActiveHealth, type ActiveHealth, type HealthCheckConfig, type HealthCheckListener } from './health-check.js'

/** Response timeouts or resets in a row that eject a target, when not configured. */
export const DEFAULT_CONSECUTIVE_FAILURES = 5
/** Requests that may wait for a connection, when not configured (Envoy's max_pending_requests). */
export const DEFAULT_MAX_PENDING = 1024
/** A request whose connection failed before an answer is sent once more, when that is safe (upstreams.X.retries). */
export const DEFAULT_RETRIES = 1
/** Longest a request waits for a connection, when not configured. */
export const DEFAULT_QUEUE_TIMEOUT_MS = 10_000

/** One target of an upstream as written in the config. */
export interface UpstreamTargetConfig {
  readonly url: string
  readonly weight: number
}

/** An upstream as compiled from the config; every field is already defaulted by the config layer. */
export interface UpstreamConfig {
  readonly name: string
  readonly targets: readonly UpstreamTargetConfig[]
  readonly connectTimeoutMs: number
  /** Headers timeout, and idle timeout between two chunks of the response body. */
  readonly responseTimeoutMs: number
  /** How long a target that refused a connection (or timed out connecting) is skipped. */
  readonly ejectMs: number
  readonly maxConnectionsPerTarget: number
  /** Idle keep-alive sockets are closed after this; keep it below the upstream's own keep-alive timeout. */
  readonly keepAliveTimeoutMs: number
  /** Longest pause between two reads of a response body; default responseTimeoutMs. */
  readonly idleTimeoutMs?: number
  /** Response timeouts or resets in a row after which a target is ejected (outlier detection); default 5. */
  readonly consecutiveFailures?: number
  /** Answer statuses that count as failures toward consecutiveFailures (a 503 of a target whose database is down); default none. */
  readonly failureStatuses?: readonly number[]
  /** Requests that may wait while every healthy target is at maxConnectionsPerTarget; default 1024. */
  readonly maxPending?: number
  /** Longest a request waits for a connection; default 10 s. */
  readonly queueTimeoutMs?: number
  /** Active health checks; absent: none (no probe is ever sent). */
  readonly healthCheck?: HealthCheckConfig
}

/** One target: its keep-alive undici Pool and its balancing and health state. */
export class UpstreamTarget {
  readonly url: string
  readonly origin: string
  readonly weight: number
  /** Path of the target URL without a trailing slash ('' for none), prepended to every forwarded path. */
  readonly basePath: string
  readonly secure: boolean
  /** Hostname without IPv6 brackets and port, as node:http wants them (used by the WebSocket proxy). */
  readonly hostname: string
  readonly port: number
  /** host[:port] of the target URL: the Host a health check sends unless configured. */
  readonly authority: string
  /**
   * The TLS server name (SNI, and the name the certificate is checked against) of an https
   * target named by a host name: the target's, not the client's Host, which undici and node:http
   * take otherwise (a public Host in front of https://backend.internal failed every request, and
   * each new Host reconnected). Null for an address: the Host then names the service, as before.
   */
  readonly servername: string | null
  readonly dispatcher: Pool
  /** Smooth weighted round-robin state (nginx's `current_weight`). */
  current = 0
  /**
   * Date.now() until which the target takes no traffic; 0 when it does. The one field pick()
   * tests: the end of a passive ejection, or Infinity while active health checks hold the target
   * out (then passiveUntil keeps the ejection's end for when the checks bring it back).
   */
  ejectedUntil = 0
  /** Date.now() until which passive health ejected the target (in the past once it ended). */
  passiveUntil = 0
  /** What active health checks decided (healthy, with no checks configured). */
  active: ActiveHealth = initialActiveHealth()
  /** Response timeouts and resets since the last response (outlier detection). */
  consecutiveFailures = 0
  /** Requests given this target and not finished: at maxConnectionsPerTarget the next ones wait. */
  inFlight = 0

  constructor (config: UpstreamTargetConfig, upstream: UpstreamConfig) {
    const url = new URL(config.url)
    if (url.protocol !== 'http:' && url.protocol !== 'https:') {
      throw new TypeError(`upstream ${upstream.name}: target ${config.url} must be http:// or https://`)
    }
    if (!Number.isFinite(config.weight) || config.weight < 0) {
      throw new TypeError(`upstream ${upstream.name}: target ${config.url} has an invalid weight`)
    }
    this.url = config.url
    this.origin = url.origin
    this.weight = config.weight
    this.basePath = url.pathname === '/' ? '' : url.pathname.replace(/\/+$/, '')
    this.secure = url.protocol === 'https:'
    this.hostname = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname
    this.port = url.port === '' ? (this.secure ? 443 : 80) : Number(url.port)
    this.authority = url.host
    this.servername = this.secure && isIP(this.hostname) === 0 ? this.hostname : null
    this.dispatcher = new Pool(url.origin, {
      connections: upstream.maxConnectionsPerTarget,
      connect: continueTolerantConnector(upstream.connectTimeoutMs),
      headersTimeout: upstream.responseTimeoutMs,
      bodyTimeout: upstream.idleTimeoutMs ?? upstream.responseTimeoutMs,
      keepAliveTimeout: upstream.keepAliveTimeoutMs,
      // Also caps the `Keep-Alive: timeout=` an upstream announces, so the pool never holds an
      // idle socket longer than configured.
      keepAliveMaxTimeout: upstream.keepAliveTimeoutMs
    })
  }
}

/** What active health checks decided about a target, as /readyz shows it. */
export interface TargetCheckView {
  readonly healthy: boolean
  readonly passes: number
  readonly failures: number
  /** Why the last failed probe failed ("status 503", "timeout", "connect refused"). */
  readonly lastFailure: string | null
}

/** One target as /readyz and the admin page show it. */
export interface TargetHealth {
  readonly url: string
  /** Takes traffic: neither passive health nor active checks hold it out. */
  readonly healthy: boolean
  /** Left of a passive ejection (0 when none runs). */
  readonly ejectedForMs: number
  readonly consecutiveFailures: number
  /** With health checks configured: what the probes decided. */
  readonly check?: TargetCheckView
}

function checkView (active: ActiveHealth): TargetCheckView {
  return { healthy: active.healthy, passes: active.passes, failures: active.failures, lastFailure: active.lastFailure }
}

/** Why a target was ejected: it refused connections, or it accepted them and stopped answering. */
export type EjectReason = 'connect_failure' | 'consecutive_failures'

export type EjectListener = (upstream: string, target: string, reason: EjectReason, forMs: number) => void

/** A request waiting for a connection (the forward handler). */
export interface PoolWaiter {
  /** A target with a free connection, counted in flight for this request until `release`. */
  granted (target: UpstreamTarget): void
  /** No connection within queueTimeout, or no healthy target left while it waited. */
  refused (kind: 'queue_timeout' | 'no_healthy' | 'shutting_down'): void
}

/** A place in the pool's queue, handed back to `cancel` when the request ends while waiting. */
export interface PendingRequest {
  waiter: PoolWaiter | null
  readonly timer: NodeJS.Timeout
}

/** A request that waits out its back-off before a retry asks for a connection again (retryBackoff). */
export interface BackingOffRequest extends PoolWaiter {
  /** The wait is over: ask `acquire` again. */
  backedOff (): void
}

/** A retry's place while it backs off, handed back to `cancelBackOff` when the request ends first. */
export interface BackOffPlace {
  waiter: BackingOffRequest | null
  readonly timer: NodeJS.Timeout
}

/** What `acquire` gives: a target, a place in the queue, 'full' (the queue is), or null (no healthy target). */
export type Acquired = UpstreamTarget | PendingRequest | 'full' | null

/**
 * The targets of one upstream, balanced by smooth weighted round-robin over the healthy ones,
 * with passive health: a target that cannot be connected to is ejected for `ejectMs`.
 */
export class UpstreamPool {
  readonly name: string
  readonly signature: string
  readonly config: UpstreamConfig
  readonly targets: readonly UpstreamTarget[]
  // Set on ejection, cleared lazily by pick(): keeps Date.now() off the path while all are healthy.
  #anyEjected = false
  readonly #failureThreshold: number
  readonly #failureStatuses: ReadonlySet<number>
  /** Told of every ejection (metrics, log); set by whoever owns the pool. */
  onEject: EjectListener | null = null
  readonly #maxConnections: number
  readonly #maxPending: number
  readonly #queueTimeoutMs: number
  /** Requests waiting for a connection, oldest first; a cancelled one stays (waiter null) until shifted. */
  readonly #queue: PendingRequest[] = []
  /** Requests in #queue that still wait. */
  #pending = 0
  /** The last pick(…, true) skipped a healthy target because it was at maxConnections. */
  #sawBusy = false
  #granting = false
  /** Fires when an ejected target comes back while requests wait (#scheduleWake). */
  #wake: NodeJS.Timeout | null = null
  #closed = false
  /**
   * Retries waiting out their back-off: they hold no connection, but they are this pool's to send,
   * so a retiring pool waits for them and a closing one refuses them as it refuses waiting ones.
   */
  readonly #backingOff = new Set<BackOffPlace>()
  /** What retire() waits on: the last waiting or backing-off request granted, timed out or gone. */
  #noneWaiting: (() => void) | null = null
  /** The running active health checks: from startHealthChecks() until stopHealthChecks() or close. */
  #checker: HealthChecker | null = null
  /** Told of every probe and every change of side by active health checks (metrics, log). */
  onHealthCheck: HealthCheckListener | null = null

  constructor (config: UpstreamConfig) {
    if (config.targets.length === 0) throw new TypeError(`upstream ${config.name}: no targets`)
    this.name = config.name
    this.config = config
    this.signature = upstreamSignature(config)
    this.targets = config.targets.map((target) => new UpstreamTarget(target, config))
    this.#failureThreshold = config.consecutiveFailures ?? DEFAULT_CONSECUTIVE_FAILURES
    this.#failureStatuses = new Set(config.failureStatuses)
    this.#maxConnections = config.maxConnectionsPerTarget
    this.#maxPending = config.maxPending ?? DEFAULT_MAX_PENDING
    this.#queueTimeoutMs = config.queueTimeoutMs ?? DEFAULT_QUEUE_TIMEOUT_MS
  }

  /** Requests waiting for a connection now. */
  get pending (): number {
    return this.#pending
  }

  /**
   * Requests of this upstream holding a place in the retry budget: each counted once, from its
   * first budgeted retry until an answer is relayed or it settles (src/proxy/forward.ts).
   */
  retrying = 0

  /**
   * Whether `acquire` would give a retry a target or a place in the queue now: a healthy target,
   * and a connection free or room to wait. Asked before an answer is dropped to be retried, by
   * the request that holds a connection of `holding`.
   */
  canTakeRetry (holding: UpstreamTarget | null): boolean {
    const now = Date.now()
    let healthy = false
    for (const target of this.targets) {
      if (target.ejectedUntil > now) continue
      // the retried request frees the connection it holds, for itself when nobody waits for one
      if (target.inFlight < this.#maxConnections || (target === holding && this.#pending === 0)) return true
      healthy = true
    }
    return healthy && this.#pending < this.#maxPending
  }

  /** Requests in flight, waiting for a connection or backing off: what the retry budget is a share of. Not on the path of a request that is not retried. */
  get active (): number {
    let n = this.#pending + this.#backingOff.size
    for (const target of this.targets) n += target.inFlight
    return n
  }

  /** Places in the queue, cancelled ones not yet dropped included: bounded by about 2 x pending. */
  get queuedPlaces (): number {
    return this.#queue.length
  }

  /**
   * Picks the next healthy target (nginx's smooth weighted round-robin: each pick adds every weight
   * to its target's counter, takes the highest and subtracts the total, which spreads picks evenly).
   * `exclude` skips the targets a retried request tried already. Null when no target is healthy, or,
   * with `withFreeConnection`, none has a connection to spare (then #sawBusy is set).
   */
  pick (exclude?: readonly UpstreamTarget[], withFreeConnection = false): UpstreamTarget | null {
    const targets = this.targets
    const now = this.#anyEjected ? Date.now() : 0
    let stillEjected = false
    this.#sawBusy = false
    let best: UpstreamTarget | null = null
    let total = 0
    for (let i = 0; i < targets.length; i++) {
      const target = targets[i] as UpstreamTarget
      if (target.ejectedUntil !== 0) {
        if (target.ejectedUntil > now) {
          stillEjected = true
          continue
        }
        target.ejectedUntil = 0
      }
      if (exclude !== undefined && exclude.includes(target)) continue
      if (withFreeConnection && target.inFlight >= this.#maxConnections) {
        this.#sawBusy = true
        continue
      }
      target.current += target.weight
      total += target.weight
      if (best === null || target.current > best.current) best = target
    }
    this.#anyEjected = stillEjected
    if (best !== null) best.current -= total
    return best
  }

  /**
   * A target for one request, counted in flight until `release`. While every healthy target is at
   * maxConnectionsPerTarget the request waits its turn here, not in undici's queue, where a request
   * cannot be timed out or removed before it gets a connection: at most maxPending wait, each at
   * most queueTimeoutMs (Envoy's max_pending_requests; nginx's upstream `queue`). Oldest first:
   * while requests wait, a connection that comes free is theirs, not a newcomer's.
   */
  acquire (waiter: PoolWaiter, avoid?: readonly UpstreamTarget[]): Acquired {
    if (this.#pending > 0) this.#grantWaiting()
    if (this.#pending === 0) {
      // `avoid` (the targets a retry tried already) only when another has a connection free
      const target = (avoid === undefined ? null : this.pick(avoid, true)) ?? this.pick(undefined, true)
      if (target !== null) {
        target.inFlight++
        return target
      }
      if (!this.#sawBusy) return null
    }
    if (this.#pending >= this.#maxPending) return 'full'
    // Places that timed out or were cancelled stay until shifted: a long saturation would pile them up.
    if (this.#queue.length >= 2 * this.#pending + 64) this.#dropCancelled()
    const place: PendingRequest = { waiter, timer: setTimeout(() => this.#timedOut(place), this.#queueTimeoutMs) }
    this.#queue.push(place)
    this.#pending++
    this.#scheduleWake()
    return place
  }

  /** The request ended while it waited (its client left, the gateway shut down). */
  cancel (place: PendingRequest): void {
    if (place.waiter === null) return
    place.waiter = null
    clearTimeout(place.timer)
    this.#pending--
    this.#maybeNoneWaiting()
  }

  /**
   * Holds a retry for `ms` before it asks for a connection again (retryBackoff): it holds no
   * connection meanwhile, and takes no place in the queue (maxPending, the queue's timeout).
   */
  backOff (waiter: BackingOffRequest, ms: number): BackOffPlace {
    const place: BackOffPlace = { waiter, timer: setTimeout(() => this.#backedOff(place), ms) }
    this.#backingOff.add(place)
    return place
  }

  /** The request ended while it backed off (its client left). */
  cancelBackOff (place: BackOffPlace): void {
    if (place.waiter === null) return
    place.waiter = null
    clearTimeout(place.timer)
    this.#backingOff.delete(place)
    this.#maybeNoneWaiting()
  }

  #backedOff (place: BackOffPlace): void {
    const waiter = place.waiter
    if (waiter === null) return
    place.waiter = null
    this.#backingOff.delete(place)
    // acquires first (a connection or a place in the queue): a retiring pool must not close between
    waiter.backedOff()
    this.#maybeNoneWaiting()
  }

  #maybeNoneWaiting (): void {
    if (this.#pending !== 0 || this.#backingOff.size !== 0 || this.#noneWaiting === null) return
    const resolve = this.#noneWaiting
    this.#noneWaiting = null
    resolve()
  }

  /** The request given `target` finished: its connection goes to the oldest waiting request. */
  release (target: UpstreamTarget): void {
    target.inFlight--
    if (this.#pending > 0 && !this.#closed) this.#grantWaiting()
  }

  #timedOut (place: PendingRequest): void {
    const waiter = place.waiter
    if (waiter === null) return
    this.cancel(place)
    waiter.refused('queue_timeout')
  }

  #dropCancelled (): void {
    let kept = 0
    for (const place of this.#queue) if (place.waiter !== null) this.#queue[kept++] = place
    this.#queue.length = kept
  }

  /** The oldest waiting request that still waits, taken off the queue. */
  #nextWaiter (): PoolWaiter {
    for (;;) {
      const place = this.#queue.shift() as PendingRequest
      const waiter = place.waiter
      if (waiter === null) continue
      this.cancel(place)
      return waiter
    }
  }

  #grantWaiting (): void {
    // A grant dispatches, and a dispatch can fail and release at once: the loop below goes on.
    if (this.#granting) return
    this.#granting = true
    try {
      while (this.#pending > 0) {
        const target = this.pick(undefined, true)
        if (target === null) {
          if (this.#sawBusy) break
          // Every target was ejected meanwhile: waiting longer would only delay the same 503.
          this.#nextWaiter().refused('no_healthy')
          continue
        }
        target.inFlight++
        this.#nextWaiter().granted(target)
      }
    } finally {
      this.#granting = false
    }
    this.#scheduleWake()
  }

  /**
   * Requests wait while the targets in rotation are busy and another is ejected: when that one's
   * ejection ends it takes them, without waiting for a busy target's release.
   */
  #scheduleWake (): void {
    if (this.#wake !== null || this.#pending === 0 || !this.#anyEjected) return
    let earliest = Infinity
    for (const target of this.targets) if (target.ejectedUntil !== 0 && target.ejectedUntil < earliest) earliest = target.ejectedUntil
    if (earliest === Infinity) return
    this.#wake = setTimeout(() => {
      this.#wake = null
      this.#grantWaiting()
    }, Math.max(0, earliest - Date.now()))
  }

  /** The pool is closing (shutdown, or a replaced pool past its drain): nobody waits for it any more. */
  #refuseWaiting (): void {
    this.#closed = true
    if (this.#wake !== null) clearTimeout(this.#wake)
    this.#wake = null
    while (this.#pending > 0) this.#nextWaiter().refused('shutting_down')
    for (const place of [...this.#backingOff]) {
      const waiter = place.waiter as BackingOffRequest
      this.cancelBackOff(place)
      waiter.refused('shutting_down')
    }
  }

  /**
   * Takes over the passive health of `previous`'s targets with the same URL: a reload that changes
   * an upstream's timeouts or connection settings builds a new pool, and must not put a target
   * ejected a second ago back into rotation, nor forget its run of failures.
   */
  inheritHealth (previous: UpstreamPool): void {
    for (const target of this.targets) {
      const before = previous.targets.find((t) => t.url === target.url)
      if (before === undefined) continue
      target.consecutiveFailures = before.consecutiveFailures
      if (before.passiveUntil > Date.now()) {
        target.passiveUntil = before.passiveUntil
        target.ejectedUntil = before.passiveUntil
        this.#anyEjected = true
      }
    }
  }

  /** Whether active health checks run on this pool now. */
  get checking (): boolean {
    return this.#checker !== null
  }

  /**
   * Starts the active health checks of `config.healthCheck` (none without one). Called once the
   * runtime using this pool is live (never for `gateway validate`, nor for a reload that fails).
   * `previous`: the pool of the same upstream the replaced runtime used; a target with the same
   * URL takes over what its probes decided and their runs, and `previous` stops probing.
   */
  startHealthChecks (previous: UpstreamPool | null): void {
    const config = this.config.healthCheck
    if (this.#checker !== null || config === undefined || this.#closed) return
    const handedOver = previous !== null && previous.#checker !== null
    for (const target of this.targets) {
      const before = handedOver ? previous.targets.find((t) => t.url === target.url) : undefined
      // a pool that probed before (a reload went back to its settings) holds a stale verdict: a target starts healthy
      this.#setActive(target, before === undefined ? initialActiveHealth() : { ...before.active })
    }
    previous?.stopHealthChecks()
    this.#checker = new HealthChecker(config, this.targets, (target, change) => this.#checked(target as UpstreamTarget, change), this.onHealthCheck)
    this.#checker.start()
  }

  /** Stops probing (a reload replaced or removed the upstream, or the pool closes); in-flight probes are aborted. */
  stopHealthChecks (): void {
    this.#checker?.stop()
    this.#checker = null
  }

  #setActive (target: UpstreamTarget, active: ActiveHealth): void {
    target.active = active
    this.#activeChanged(target, active.healthy ? 'up' : 'down')
  }

  /**
   * The probes took the target out or brought it back. Either way its run of failures starts
   * again, as after a passive ejection: failed() counts nothing while it is out, so a run begun
   * before the checks took it out was still there when they brought it back, and one failure
   * short of consecutiveFailures ejected it at its first failure back.
   */
  #checked (target: UpstreamTarget, change: 'down' | 'up'): void {
    target.consecutiveFailures = 0
    this.#activeChanged(target, change)
  }

  /** Folds the active verdict into ejectedUntil, the one field pick() reads. */
  #activeChanged (target: UpstreamTarget, change: 'down' | 'up'): void {
    if (change === 'down') {
      target.ejectedUntil = Infinity
      target.current = 0
      this.#anyEjected = true
      return
    }
    // back from the checks, but a passive ejection still running keeps it out until its end
    target.ejectedUntil = target.passiveUntil > Date.now() ? target.passiveUntil : 0
    // requests waiting while every other target was busy or out may take it now
    if (this.#pending > 0 && !this.#closed) this.#grantWaiting()
  }

  /** Passive health: skips the target for `ejectMs`. Called on connect refused or connect timeout. */
  eject (target: UpstreamTarget, reason: EjectReason = 'connect_failure'): void {
    target.passiveUntil = Date.now() + this.config.ejectMs
    // held out by active checks: the ejection's end is kept for when they bring it back
    if (target.ejectedUntil !== Infinity) target.ejectedUntil = target.passiveUntil
    target.current = 0
    target.consecutiveFailures = 0
    this.#anyEjected = true
    this.onEject?.(this.name, target.url, reason, this.config.ejectMs)
  }

  /**
   * Outlier detection (Envoy's consecutive_5xx, for the failures a gateway sees itself): a target
   * that accepts connections but times out or resets `consecutiveFailures` times in a row is
   * ejected like one that refuses them. A SIGSTOPped process is the case: its kernel still accepts.
   */
  failed (target: UpstreamTarget, byAnswer = false): void {
    // out of rotation already: what its requests still in flight meet counts toward nothing (it
    // left a count that ejected the target again at its first failure back)
    if (target.ejectedUntil !== 0) return
    if (++target.consecutiveFailures < this.#failureThreshold) return
    // An answer's status (failureStatuses) may be one endpoint's, asked for by one client: it
    // never takes the last target in rotation out, so no client can empty an upstream with it
    // (Envoy's max_ejection_percent; nginx ignores max_fails for a lone server).
    if (byAnswer && !this.#othersInRotation(target)) return
    this.eject(target, 'consecutive_failures')
  }

  #othersInRotation (target: UpstreamTarget): boolean {
    const now = Date.now()
    for (const other of this.targets) if (other !== target && other.ejectedUntil <= now) return true
    return false
  }

  /** A response started: the run of failures is over. */
  succeeded (target: UpstreamTarget): void {
    if (target.consecutiveFailures !== 0) target.consecutiveFailures = 0
  }

  /**
   * An answer's head came: the run of failures is over, unless failureStatuses lists its status
   * (Envoy's consecutive_5xx, nginx's max_fails with proxy_next_upstream http_503): a target
   * answering 503 to everything is ejected as one that resets, without active checks.
   */
  answered (target: UpstreamTarget, status: number): void {
    if (this.#failureStatuses.has(status)) this.failed(target, true)
    else if (target.consecutiveFailures !== 0) target.consecutiveFailures = 0
  }

  /**
   * Per target, as /readyz shows it: `healthy` (takes traffic) is false while either passive
   * health (`ejectedForMs`) or, with health checks configured, `check` says no.
   */
  health (now = Date.now()): TargetHealth[] {
    const checked = this.config.healthCheck !== undefined
    return this.targets.map(target => ({
      url: target.url,
      healthy: target.ejectedUntil <= now,
      ejectedForMs: Math.max(0, Math.min(target.ejectedUntil, target.passiveUntil) - now),
      consecutiveFailures: target.consecutiveFailures,
      ...(checked ? { check: checkView(target.active) } : {})
    }))
  }

  /**
   * Answers every waiting (or backing-off) request `503 GW_ERR_SHUTTING_DOWN` and takes no more (the shutdown's
   * deadline: they are answered before their connections are cut). Returns how many there were.
   */
  refuseWaiting (): number {
    const waiting = this.#pending + this.#backingOff.size
    this.#refuseWaiting()
    return waiting
  }

  /**
   * A pool a reload replaced: the requests still waiting for one of its connections get it (each
   * waits at most queueTimeoutMs, as before the reload), in-flight requests finish, then the
   * sockets close. close() answered the waiting ones 503 GW_ERR_SHUTTING_DOWN once the replaced
   * runtime's drain gave up (server.requestTimeout + 1 s), though the gateway was not shutting down.
   */
  async retire (): Promise<void> {
    if (this.#pending > 0 || this.#backingOff.size > 0) await new Promise<void>(resolve => { this.#noneWaiting = resolve })
    await this.close()
  }

  /** Graceful: in-flight requests finish, then the sockets close; requests still waiting get 503. */
  async close (): Promise<void> {
    this.stopHealthChecks()
    this.#refuseWaiting()
    await Promise.all(this.targets.map(async (target) => await target.dispatcher.close()))
  }

  async destroy (): Promise<void> {
    this.stopHealthChecks()
    this.#refuseWaiting()
    await Promise.all(this.targets.map(async (target) => await target.dispatcher.destroy()))
  }
}

/** Same config, same string: the reload reuses a pool (and its warm sockets) whose signature did not change. */
export function upstreamSignature (config: UpstreamConfig): string {
  return JSON.stringify([
    config.name,
    config.targets.map((target) => [target.url, target.weight]),
    config.connectTimeoutMs,
    config.responseTimeoutMs,
    config.ejectMs,
    config.maxConnectionsPerTarget,
    config.keepAliveTimeoutMs,
    config.idleTimeoutMs,
    config.consecutiveFailures,
    config.failureStatuses ?? [],
    config.maxPending,
    config.queueTimeoutMs,
    config.healthCheck ?? null
  ])
}
