// Keeps a Redis failure from becoming an outage: every call is bounded by `timeoutMs`, a circuit
// breaker stops calling a dead Redis and probes it back, and while Redis is away each limit
// follows its `onError`: `local` keeps limiting in process (the limit divided by the number of
// live gateway instances, last seen through a heartbeat key), `allow` fails open, `deny` fails
// closed with 503.
import type { LimitCheck, LimitDecision, LimitSpec, LimitStore } from './types.js'
import type { OnError } from './plan.js'
import type { Telemetry } from '../telemetry.js'

export type BreakerState = 'closed' | 'open' | 'half-open'
const BREAKER_GAUGE: Readonly<Record<BreakerState, 0 | 1 | 2>> = { closed: 0, open: 1, 'half-open': 2 }

export interface GuardedDecision {
  readonly decision: LimitDecision
  /** Which store decided: 'redis', or 'fallback' while Redis is unavailable. */
  readonly level: 'redis' | 'fallback'
  /** A limit with `onError: deny` could not be decided: answer 503. */
  readonly unavailable: boolean
}

export interface RedisGuardOptions {
  readonly store: LimitStore
  readonly fallback: LimitStore
  readonly timeoutMs: number
  /** Live gateway instances sharing the budget (from the heartbeat); at least 1. */
  readonly instances: () => number
  readonly telemetry: Telemetry
  readonly onStateChange: (state: BreakerState, reason: string) => void
  /**
   * Longest the deny cache may hold a key Redis rejected (default: the whole wait). Redis Cluster
   * decides a request's slots apart and refunds the admitting ones on a rejection, so a
   * concurrent request can be refused by units about to be refunded: that rejection is real only
   * for a round trip, yet carries the dimension's full wait.
   */
  readonly denyCacheMaxMs?: number
  /** Consecutive failures that open the breaker. */
  readonly failureThreshold?: number
  readonly openMs?: number
  readonly maxOpenMs?: number
}

const ALLOW_ALL: LimitDecision = Object.freeze({ allowed: true, remaining: -1, retryAfterMs: 0, resetMs: 0, limitingIndex: -1, delayMs: 0 })

class RedisTimeoutError extends Error {
  readonly code = 'GW_ERR_REDIS_TIMEOUT'
}

export class RedisGuard {
  private state: BreakerState = 'closed'
  private failures = 0
  private openedAt = 0
  private openFor: number
  private probing = false
  private readonly divided = new WeakMap<LimitSpec, { n: number, spec: LimitSpec }>()
  private readonly threshold: number
  /** Bound on each call; a reload that changes only `redis.timeout` updates it in place. */
  timeoutMs: number
  private readonly baseOpenMs: number
  private readonly maxOpenMs: number
  readonly denyCacheMaxMs: number

  constructor (private readonly options: RedisGuardOptions) {
    this.denyCacheMaxMs = options.denyCacheMaxMs ?? Infinity
    this.threshold = options.failureThreshold ?? 3
    this.timeoutMs = options.timeoutMs
    this.baseOpenMs = options.openMs ?? 500
    this.maxOpenMs = options.maxOpenMs ?? 5000
    this.openFor = this.baseOpenMs
  }

  get breaker (): BreakerState {
    return this.state
  }

  async decide (checks: readonly LimitCheck[], limits: readonly { readonly onError: OnError }[], requestId: string): Promise<GuardedDecision> {
    if (this.state === 'open') {
      if (Date.now() - this.openedAt < this.openFor || this.probing) return this.fallback(checks, limits, requestId)
      this.setState('half-open', 'probing Redis')
    } else if (this.state === 'half-open' && this.probing) {
      return this.fallback(checks, limits, requestId)
    }
    const probe = this.state === 'half-open'
    if (probe) this.probing = true
    const started = process.hrtime.bigint()
    try {
      const decision = await this.withTimeout(this.options.store.decide(checks, requestId))
      this.options.telemetry.redisCall(Number(process.hrtime.bigint() - started) / 1e9, true, null)
      this.failures = 0
      if (this.state !== 'closed') {
        this.openFor = this.baseOpenMs
        this.setState('closed', 'Redis answers again')
      }
      return { decision, level: 'redis', unavailable: false }
    } catch (err) {
      const kind = err instanceof RedisTimeoutError ? 'timeout' : errorKind(err)
      this.options.telemetry.redisCall(Number(process.hrtime.bigint() - started) / 1e9, false, kind)
      this.failures++
      if (probe || (this.state === 'closed' && this.failures >= this.threshold)) {
        if (probe) this.openFor = Math.min(this.maxOpenMs, this.openFor * 2)
        this.openedAt = Date.now()
        this.setState('open', `Redis ${kind}: ${(err as Error).message}`)
      }
      return this.fallback(checks, limits, requestId)
    } finally {
      if (probe) this.probing = false
    }
  }

  private setState (state: BreakerState, reason: string): void {
    if (state === this.state) return
    this.state = state
    this.options.telemetry.breakerState(BREAKER_GAUGE[state])
    this.options.onStateChange(state, reason)
  }

  private withTimeout<T> (p: Promise<T> | T): Promise<T> {
    if (!(p instanceof Promise)) return Promise.resolve(p)
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => reject(new RedisTimeoutError(`no answer within ${this.timeoutMs}ms`)), this.timeoutMs)
      p.then(v => { clearTimeout(timer); resolve(v) }, (e: unknown) => { clearTimeout(timer); reject(e) })
    })
  }

  private async fallback (checks: readonly LimitCheck[], limits: readonly { readonly onError: OnError }[], requestId: string): Promise<GuardedDecision> {
    const kept: LimitCheck[] = []
    const index: number[] = []
    const n = Math.max(1, this.options.instances())
    for (let i = 0; i < checks.length; i++) {
      const mode = limits[i]?.onError
      if (mode === 'deny') return { decision: ALLOW_ALL, level: 'fallback', unavailable: true }
      if (mode === 'allow') continue
      const check = checks[i] as LimitCheck
      kept.push({ key: check.key, cost: check.cost, spec: this.dividedSpec(check.spec, n) })
      index.push(i)
    }
    if (kept.length === 0) return { decision: ALLOW_ALL, level: 'fallback', unavailable: false }
    const d = await this.options.fallback.decide(kept, requestId)
    const decision = d.limitingIndex === -1 ? d : { ...d, limitingIndex: index[d.limitingIndex] ?? -1 }
    return { decision, level: 'fallback', unavailable: false }
  }

  // Each of n instances enforces 1/n of the budget, so together they never exceed it.
  private dividedSpec (spec: LimitSpec, n: number): LimitSpec {
    if (n === 1) return spec
    const cached = this.divided.get(spec)
    if (cached !== undefined && cached.n === n) return cached.spec
    const divided: LimitSpec = Object.freeze({
      ...spec,
      limit: Math.max(1, Math.floor(spec.limit / n)),
      burst: Math.max(1, Math.floor(spec.burst / n))
    })
    this.divided.set(spec, { n, spec: divided })
    return divided
  }
}

function errorKind (err: unknown): string {
  const msg = (err as Error | undefined)?.message ?? ''
  if (/NOSCRIPT/.test(msg)) return 'noscript'
  if (/Connection is closed|writeable|ECONNREFUSED|ECONNRESET|EPIPE/i.test(msg)) return 'connection'
  if (/CLUSTERDOWN|MOVED|ASK|TRYAGAIN/.test(msg)) return 'cluster'
  return 'other'
}
