// Keeps a Redis failure from becoming an outage: every call is bounded by `timeoutMs`, a circuit
// breaker stops calling a dead Redis and probes it back, and while Redis is away each limit
// follows its `onError`: `local` keeps limiting in process, `allow` fails open, `deny` fails
// closed with 503.
//
// The `local` fallback (issue 8): n instances share the budget, so each takes 1/n of it. Rather
// than dividing the limit (which rounds, can make a valid limit invalid and changes the units a
// bucket's state is kept in), every unit admitted in the fallback costs n units of the unchanged
// limit: exact shares, the same state units whatever n is, and a request whose cost x n exceeds
// the whole limit is refused while Redis is away (with n instances and limit < n that is the only
// way the fleet can stay within the limit). Each key starts from what Redis last said was left of
// it (divided the same way), not from a whole budget, and what the fallback admitted is written
// back to Redis (a debt) as soon as Redis answers again, so the rest of the window accounts for it.
import { LRUCache } from 'lru-cache'
import { MAX_EXACT } from './algorithms/index.js'
import { createMemoryStore, type MemoryStore } from './memory-store.js'
import { classifyRedisError, neverRan } from './redis-client.js'
import { ChargeError, SlotGroupError, type FailedGroups } from './redis-store.js'
import { LRU_CALL } from './lru.js'
import type { LimitCheck, LimitDecision, LimitSpec, LimitStore, SharedDecision, SharedLevel } from './types.js'
import type { OnError } from './plan.js'
import type { Telemetry } from '../telemetry.js'

export type BreakerState = 'closed' | 'open' | 'half-open'
const BREAKER_GAUGE: Readonly<Record<BreakerState, 0 | 1 | 2>> = { closed: 0, open: 1, 'half-open': 2 }

/** The guard's answers: 'redis', or 'fallback' while Redis is unavailable. */
export type GuardedDecision = SharedDecision & { readonly level: 'redis' | 'fallback' }

/**
 * A decision with every check's remaining, the id the call recorded under, and (Redis Cluster) a
 * check of each slot group that failed beside the rejection that is the answer.
 */
interface DetailedAnswer {
  readonly decision: LimitDecision
  readonly remainings: readonly number[]
  readonly callId?: string
  readonly failed?: FailedGroups
}

/** What the store answers a decision with: detailed or not. */
type StoreAnswer = DetailedAnswer | LimitDecision

/** The probes a decision made are over, whatever its outcome: the next request may probe again. */
function endProbes (probes: readonly Breaker[] | null): void {
  if (probes !== null) for (const b of probes) b.probing = false
}

/** What the guard needs of the Redis store: deciding, and writing a fallback's debt back. */
export interface GuardedStore extends LimitStore {
  decideDetailed?(checks: readonly LimitCheck[], requestId: string): Promise<DetailedAnswer>
  /** The id of the call just made (its leases' member); '' or absent when unknown. */
  readonly lastCallId?: string
  charge?(checks: readonly LimitCheck[]): Promise<void>
}

export interface RedisGuardOptions {
  readonly store: GuardedStore
  /** Keys the fallback may hold (the in-process store's and the learned remainings' bound). */
  readonly fallbackMaxKeys: number
  readonly timeoutMs: number
  /** Live gateway instances sharing the budget (from the heartbeat); at least 1. */
  readonly instances: () => number
  /**
   * Floor of the instance count the fallback divides by (`redis.expectedInstances`): an instance
   * started while Redis is down has never seen the others and would otherwise count 1.
   */
  readonly expectedInstances?: number
  /**
   * Redis Cluster: the master currently serving `key` (its slot's owner). Each gets its own
   * breaker, so a dead master sends only its own slots to the fallback and probes go to it.
   */
  readonly nodeOf?: (key: string) => string
  /** Redis Cluster: the masters serving slots now; breakers of other nodes (failed over) are ignored. */
  readonly liveNodes?: () => ReadonlySet<string>
  /**
   * A cheap call (PING) to `node` ('*' without Cluster) the guard makes on a timer while its
   * breaker is open, so that it closes, and the fallback's debt is written back, even when no
   * request comes to probe.
   */
  readonly ping?: (node: string) => Promise<unknown>
  /** Tests only: the fallback store's clock in µs (default: monotonic). */
  readonly fallbackNowUs?: () => number
  /** A debt's write-back failed (Redis failed again): it is kept and written with a later answer. */
  readonly onDebtError?: (err: unknown, keys: number) => void
  /**
   * Debts dropped unwritten: their window passed before Redis took them (charged then, they would
   * refuse requests of a later window), or more keys owed than `fallbackMaxKeys`.
   */
  readonly onDebtDropped?: (keys: number) => void
  /**
   * An outage ended having admitted requests it could not record as debt (more keys owed than
   * `fallbackMaxKeys`): Redis never counts them. Reported once per outage, not per request.
   */
  readonly onDebtOverflow?: (admissions: number) => void
  /**
   * Redis took concurrency leases for a call the fallback decided instead (it answered after the
   * timeout, or its answer failed afterwards): nobody holds them, so they are given back
   * (`keys` without the key prefix, `member` the call's id), or they would refuse requests of
   * that client for a whole leaseTtl.
   */
  readonly onLateLeases?: (keys: readonly string[], member: string) => void
  /**
   * Leases this instance holds in Redis under `key` (without the key prefix): requests it admitted
   * through Redis that still run. The fallback counts them in the instance's share of a cap.
   */
  readonly leasesHeld?: (key: string) => number
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

/**
 * Retry-After of a fallback refusal whose cost the instance's share can never hold: it lasts only
 * until Redis is back, which the breaker probes for within a second.
 */
const FALLBACK_RETRY_MS = 1000

interface Learned {
  readonly spec: LimitSpec
  remaining: number
  atMs: number
  /** Until then `remaining` caps what Redis reports: other instances' debts may not have landed yet. */
  holdUntil: number
}

/** How long after an outage the estimate caps Redis's answers: every instance's debt has landed by then. */
const DEBT_SETTLE_MS = 1000

interface Debt {
  readonly spec: LimitSpec
  units: number
  /** Date.now() of its last unit: a window later the debt describes no live budget. */
  lastAt: number
}

/** How long a failed write-back waits before an answer from Redis may retry it (the breaker's base back-off). */
const DEBT_RETRY_MS = 250

/** One stretch of fallback decisions, from the first one to Redis answering again. */
interface Outage {
  readonly debt: Map<string, Debt>
  readonly seeded: Set<string>
  /** Admissions not recorded as debt: `debt` already held `fallbackMaxKeys` other keys. */
  overflow: number
}

const ALLOW_ALL: LimitDecision = Object.freeze({ allowed: true, remaining: -1, retryAfterMs: 0, resetMs: 0, limitingIndex: -1, delayMs: 0 })

/** Calls listed before the list of calls in flight is swept between timer firings. */
const SWEEP_MIN = 4096

/** A Redis call waiting for its answer or its deadline (see RedisGuard.expireCalls). */
interface PendingCall {
  readonly deadline: number
  /** Dropped when the call settles: the list keeps a settled call until the next sweep, and
   * holding its promise that long made V8 promote each request's whole graph (issue 13). */
  reject: ((err: unknown) => void) | null
}

class RedisTimeoutError extends Error {
  readonly code = 'GW_ERR_REDIS_TIMEOUT'
}

const WORST: readonly BreakerState[] = ['open', 'half-open', 'closed']

/** One circuit breaker: per Redis Cluster master, or one for a standalone/Sentinel Redis. */
class Breaker {
  state: BreakerState = 'closed'
  failures = 0
  openedAt = 0
  openFor: number
  probing = false
  constructor (readonly node: string, baseOpenMs: number) {
    this.openFor = baseOpenMs
  }
}

export class RedisGuard implements SharedLevel {
  /** Keyed by node ('*' without Cluster). A master's breaker only sends its own slots to the fallback. */
  private readonly breakers = new Map<string, Breaker>()
  private readonly fallbackStore: MemoryStore
  /** Each key's remaining as Redis last reported it: where the fallback starts from. */
  private readonly learned: LRUCache<string, Learned>
  private outage: Outage | null = null
  /**
   * Debts whose write-back failed (Redis failed again right after answering): written with a later
   * answer, once every breaker is closed, until their window has passed. Without this, a Redis
   * that flaps lets each outage's admissions go uncounted.
   */
  private readonly unpaid = new Map<string, Debt>()
  /** Date.now() before which no retry of `unpaid` starts (a write-back failed just before). */
  private unpaidRetryAt = 0
  private readonly maxKeys: number
  private readonly threshold: number
  /** Bound on each call; a reload that changes only `redis.timeout` updates it in place. */
  timeoutMs: number
  /** `redis.expectedInstances`; updated in place by a reload. */
  expectedInstances: number
  private readonly baseOpenMs: number
  private readonly maxOpenMs: number
  private worst: BreakerState = 'closed'
  private pinger: NodeJS.Timeout | null = null
  private readonly pending: PendingCall[] = []
  private deadlineTimer: NodeJS.Timeout | null = null
  private timerDue = Infinity
  private sweepAt = SWEEP_MIN
  /** The one breaker of a standalone or Sentinel Redis, as the list decide() walks. */
  private soleBreaker: readonly Breaker[] | null = null
  readonly denyCacheMaxMs: number

  constructor (private readonly options: RedisGuardOptions) {
    this.denyCacheMaxMs = options.denyCacheMaxMs ?? Infinity
    this.threshold = options.failureThreshold ?? 3
    this.timeoutMs = options.timeoutMs
    this.expectedInstances = options.expectedInstances ?? 1
    // Short and capped at 1 s: a Redis that is back must be used again within a second
    // (the probe on the client's 'ready' event usually comes sooner, see probeNow).
    this.baseOpenMs = options.openMs ?? 250
    this.maxOpenMs = options.maxOpenMs ?? 1000
    this.maxKeys = options.fallbackMaxKeys
    this.fallbackStore = createMemoryStore({ maxKeys: this.maxKeys, ...(options.fallbackNowUs !== undefined ? { now: options.fallbackNowUs } : {}) })
    this.learned = new LRUCache({ max: this.maxKeys })
  }

  /** Each node's breaker ('*' without Cluster), for /readyz and the admin page. */
  breakerStates (): Array<{ node: string, state: BreakerState }> {
    this.recomputeWorst() // drops the breakers of masters that no longer serve slots
    return [...this.breakers.values()].map(b => ({ node: b.node, state: b.state }))
  }

  /** The worst state among the breakers (open if any node is open). */
  get breaker (): BreakerState {
    return this.recomputeWorst()
  }

  // A master that failed over keeps its open breaker (nothing routes to it any more): it no
  // longer counts once it serves no slot.
  private recomputeWorst (): BreakerState {
    const live = this.options.liveNodes?.()
    let worst: BreakerState = 'closed'
    for (const [node, b] of this.breakers) {
      if (live !== undefined && !live.has(node)) {
        if (b.state !== 'closed' && !b.probing) this.breakers.delete(node)
        continue
      }
      if (WORST.indexOf(b.state) < WORST.indexOf(worst)) worst = b.state
    }
    if (worst !== this.worst) {
      this.worst = worst
      this.options.telemetry.breakerState(BREAKER_GAUGE[worst])
    }
    return worst
  }

  /** Instances the fallback divides each budget among. */
  get instances (): number {
    return Math.max(1, this.expectedInstances, this.options.instances())
  }

  /**
   * Redis is reachable again (the client's 'ready', Sentinel's switch to a new master, Cluster's
   * slot map refreshed): the next request to each open node probes it at once instead of
   * waiting out the breaker's back-off.
   */
  probeNow (): void {
    for (const b of this.breakers.values()) if (b.state === 'open') b.openedAt = 0
  }

  private breakerOf (node: string): Breaker {
    let b = this.breakers.get(node)
    if (b === undefined) {
      // Cluster nodes come and go with failovers: forget closed breakers of departed nodes.
      if (this.breakers.size >= 64) for (const [k, v] of this.breakers) if (v.state === 'closed') this.breakers.delete(k)
      this.breakers.set(node, b = new Breaker(node, this.baseOpenMs))
    }
    return b
  }

  /** The breakers of the nodes holding `checks` (one for a standalone or Sentinel Redis). */
  private breakersFor (checks: readonly LimitCheck[]): readonly Breaker[] {
    const nodeOf = this.options.nodeOf
    if (nodeOf === undefined) return (this.soleBreaker ??= [this.breakerOf('*')])
    const list: Breaker[] = []
    for (const c of checks) {
      const b = this.breakerOf(nodeOf(c.key))
      if (!list.includes(b)) list.push(b)
    }
    return list
  }

  /**
   * A plain promise chain, not an async function: one frame and two promises fewer per request
   * on the hot path (issue 13). Synchronous throws of the store are failures like rejections.
   */
  decide (checks: readonly LimitCheck[], limits: readonly { readonly onError: OnError }[], requestId: string): Promise<GuardedDecision> {
    const involved = this.breakersFor(checks)
    const now = Date.now()
    // A request touching an open node is decided by the fallback whole (all or nothing stays
    // simple); one whose nodes are all closed, or due for a probe, goes to Redis.
    for (const b of involved) {
      if (b.state === 'closed') continue
      if (b.probing || now - b.openedAt < b.openFor) return Promise.resolve(this.fallback(checks, limits, requestId))
    }
    let probes: Breaker[] | null = null
    for (const b of involved) {
      if (b.state === 'closed') continue
      b.probing = true
      ;(probes ??= []).push(b)
      this.setState(b, 'half-open', 'probing Redis')
    }
    const started = performance.now()
    // A throw of the store, its rejection, or a throw after its answer (a state-change listener,
    // the debt's write-back): each is a failure answered by the fallback, as in one try block.
    let raw: Promise<StoreAnswer> | StoreAnswer | null = null
    let callId = ''
    const fail = (err: unknown): GuardedDecision => {
      if (raw instanceof Promise) this.giveBackLateLeases(raw, checks, callId)
      if (callersFault(err)) {
        // Redis was not asked: the breaker learns nothing, and the fallback would refuse the same
        // checks. The decision fails (the pipeline answers 503) and the next request probes again.
        endProbes(probes)
        throw err
      }
      return this.failed(err, started, involved, probes, checks, limits, requestId)
    }
    let asked: Promise<StoreAnswer>
    try {
      const store = this.options.store
      raw = store.decideDetailed !== undefined ? store.decideDetailed(checks, requestId) : store.decide(checks, requestId)
      callId = store.lastCallId ?? ''
      asked = this.withTimeout<StoreAnswer>(raw)
    } catch (err) {
      // a promise, so that a throw of fail() rejects it as the asynchronous path does
      return new Promise(resolve => { resolve(fail(err)) })
    }
    return asked.then((answer) => {
      try {
        return this.answered(answer, started, involved, probes, checks)
      } catch (err) {
        return fail(err)
      }
    }, fail)
  }

  /**
   * The fallback decided this call: leases Redis took for it go back, those of a late answer and
   * those of an answer lost with its connection (Redis may have run the call before the loss; a
   * release of a lease never taken removes nothing). Without the latter, a lease nobody held
   * refused its client for a whole leaseTtl after a connection reset. A call Redis surely did not
   * run (never sent, refused BUSY) asks for no release, so a refusing Redis is not sent one per call.
   */
  private giveBackLateLeases (raw: Promise<StoreAnswer>, checks: readonly LimitCheck[], callId: string): void {
    const onLate = this.options.onLateLeases
    if (onLate === undefined) return
    const leaseKeys = leaseKeysOf(checks)
    if (leaseKeys === null) return
    raw.then((answer) => {
      if ('decision' in answer && answer.decision.allowed && answer.callId !== undefined && answer.callId !== '') onLate(leaseKeys, answer.callId)
    }, (err: unknown) => {
      if (callId !== '' && !callersFault(err) && mayHaveRun(err)) onLate(leaseKeys, callId)
    })
  }

  private releaseLeases (checks: readonly LimitCheck[], callId: string): void {
    const keys = this.options.onLateLeases !== undefined ? leaseKeysOf(checks) : null
    if (keys !== null) this.options.onLateLeases?.(keys, callId)
  }

  private answered (answer: StoreAnswer, started: number, involved: readonly Breaker[], probes: Breaker[] | null, checks: readonly LimitCheck[]): GuardedDecision {
    let decision: LimitDecision
    let leaseId = ''
    // Redis Cluster: masters that failed while another one's rejection is the answer
    let down: Set<Breaker> | null = null
    if ('decision' in answer) {
      decision = answer.decision
      leaseId = answer.callId ?? ''
      this.learn(checks, answer.remainings)
      if (answer.failed !== undefined) {
        down = this.partlyFailed(answer.failed, classifyRedisError(answer.failed.reason), involved, probes, checks)
        // A failed group's call may have run, taking its leases, before its answer was lost; the
        // request is refused, so nobody holds them: without this they refused the client for a
        // whole leaseTtl.
        if (leaseId !== '' && answer.failed.reasons.some(mayHaveRun)) this.releaseLeases(checks, leaseId)
      }
    } else {
      decision = answer
    }
    this.options.telemetry.redisCall((performance.now() - started) / 1e3, true, null)
    for (const b of involved) if (down?.has(b) !== true) this.countAnswer(b)
    if (this.outage !== null) {
      if (this.worst === 'closed' || this.recomputeWorst() === 'closed') this.endOutage()
      else this.settleKeys(this.outage, down === null ? checks : checks.filter((c) => !(down as Set<Breaker>).has(this.breakerOf(this.nodeOf(c.key)))))
    }
    if (this.unpaid.size > 0) this.retryUnpaid()
    endProbes(probes)
    return { decision, level: 'redis', unavailable: false, leaseId, share: 1 }
  }

  private failed (err: unknown, started: number, involved: readonly Breaker[], probes: Breaker[] | null, checks: readonly LimitCheck[], limits: readonly { readonly onError: OnError }[], requestId: string): GuardedDecision {
    // Redis Cluster: only the slot groups that failed say their masters did; the others answered
    // (without this, a request spanning a dead master and healthy ones opened every breaker).
    const groups = err instanceof SlotGroupError ? err : null
    const reason = groups !== null ? groups.reason : err
    const kind = classifyRedisError(reason)
    this.options.telemetry.redisCall((performance.now() - started) / 1e3, false, kind)
    if (groups === null) {
      for (const b of involved) this.countFailure(b, probes, kind, reason)
    } else {
      const down = this.partlyFailed({ checks: groups.failed, reason }, kind, involved, probes, checks)
      for (const b of involved) if (!down.has(b)) this.countAnswer(b)
    }
    const fallback = this.fallback(checks, limits, requestId)
    endProbes(probes)
    return fallback
  }

  /** `b`'s node answered: its failures start over and an open breaker closes. */
  private countAnswer (b: Breaker): void {
    b.failures = 0
    if (b.state !== 'closed') {
      b.openFor = this.baseOpenMs
      this.setState(b, 'closed', 'Redis answers again')
    }
  }

  /** One failure of `b`'s node: opens it at the threshold, or again when it was probing. */
  private countFailure (b: Breaker, probes: Breaker[] | null, kind: string, err: unknown): void {
    b.failures++
    const probe = probes !== null && probes.includes(b)
    if (probe || (b.state === 'closed' && b.failures >= this.threshold)) {
      if (probe) b.openFor = Math.min(this.maxOpenMs, b.openFor * 2)
      b.openedAt = Date.now()
      this.setState(b, 'open', `Redis ${kind}: ${err instanceof Error ? err.message : String(err)}`)
    }
  }

  // Redis Cluster: some slot groups failed, beside a rejection that is the answer or failing the
  // decision. Their masters did not answer: counted as failures (a probe through one must not
  // close its breaker, end the outage and send its keys' debts to a dead master). Returns them.
  private partlyFailed (failed: Pick<FailedGroups, 'checks' | 'reason'>, kind: string, involved: readonly Breaker[], probes: Breaker[] | null, checks: readonly LimitCheck[]): Set<Breaker> {
    const down = new Set<Breaker>()
    for (const i of failed.checks) {
      const b = this.breakerOf(this.nodeOf((checks[i] as LimitCheck).key))
      if (down.has(b) || !involved.includes(b)) continue
      down.add(b)
      this.countFailure(b, probes, kind, failed.reason)
    }
    return down
  }

  private nodeOf (key: string): string {
    return this.options.nodeOf?.(key) ?? '*'
  }

  private setState (b: Breaker, state: BreakerState, reason: string): void {
    if (state === b.state) return
    b.state = state
    this.recomputeWorst()
    if (state === 'open') this.startPinger()
    this.options.onStateChange(state, b.node === '*' ? reason : `${b.node}: ${reason}`)
  }

  // Probes without traffic: every 250 ms while a breaker is open, PING (standalone, Sentinel) or
  // look for a new slot map (Cluster: a failed-over master's breaker no longer counts).
  private startPinger (): void {
    if (this.pinger !== null) return
    this.pinger = setInterval(() => { void this.tick() }, 250)
    this.pinger.unref()
  }

  private async tick (): Promise<void> {
    const ping = this.options.ping
    if (ping !== undefined) {
      await Promise.all([...this.breakers.values()].map(async (b) => {
        if (b.state !== 'open' || b.probing) return
        b.probing = true
        // The next probe waits for this one's answer or failure, not for its timeout: a Redis
        // stalled but connected answers no PING and fails none, and one every 250 ms piled up in
        // the client for as long as the stall lasted. A late answer does not close the breaker
        // (it came past redis.timeout); the probe after it does.
        // (a ping that throws instead of rejecting must not leave the breaker probing for good)
        const probe = Promise.resolve(b.node).then(ping)
        const settled = (): void => { b.probing = false }
        probe.then(settled, settled)
        try {
          await this.withTimeout(probe)
          b.failures = 0
          b.openFor = this.baseOpenMs
          this.setState(b, 'closed', 'Redis answers again')
        } catch {
          // still away: requests keep probing on their own schedule too
        }
      }))
    }
    if (this.recomputeWorst() === 'closed') {
      if (this.outage !== null) this.endOutage()
      if (this.pinger !== null) clearInterval(this.pinger)
      this.pinger = null
    }
  }

  /** Stops the probe timer (the client is being closed). */
  close (): void {
    if (this.pinger !== null) clearInterval(this.pinger)
    this.pinger = null
    if (this.deadlineTimer !== null) clearTimeout(this.deadlineTimer)
    this.deadlineTimer = null
    this.timerDue = Infinity
  }

  private withTimeout<T> (p: Promise<T> | T): Promise<T> {
    if (!(p instanceof Promise)) return Promise.resolve(p)
    return new Promise<T>((resolve, reject) => {
      const call: PendingCall = { deadline: performance.now() + this.timeoutMs, reject }
      // settled calls are forgotten when the timer fires; with a long timeout under heavy traffic
      // that is many calls later, so the list is also swept when it has doubled
      if (this.pending.push(call) >= this.sweepAt) this.expireCalls()
      // a reload may shorten the timeout: then this call's deadline comes before the armed one
      if (call.deadline < this.timerDue) this.armDeadlineTimer(call.deadline)
      p.then(v => { call.reject = null; resolve(v) }, (e: unknown) => { call.reject = null; reject(e) })
    })
  }

  // One timer for every call in flight instead of one per call (a setTimeout and clearTimeout per
  // request showed in the profile, issue 13). When it fires it rejects the calls past their
  // deadline, forgets the settled ones and waits for the earliest deadline left.
  private armDeadlineTimer (due: number): void {
    if (this.deadlineTimer !== null) clearTimeout(this.deadlineTimer)
    this.timerDue = due
    // Expired after an I/O phase that starts once the timer has fired, not in the timer phase:
    // after an event-loop stall (a GC pause, a burst of work) timers run before the replies that
    // arrived meanwhile are read, and those calls would time out although Redis answered in time,
    // opening the breaker. One immediate is not enough: the check phase it runs in may hold the
    // stall itself (another immediate before it, or the poll callbacks just before), and no read
    // comes between that stall and the expiry. An immediate queued from an immediate runs in the
    // next loop iteration, after its poll phase (test/limit-guard-deadlines.test.ts).
    this.deadlineTimer = setTimeout(() => { setImmediate(() => { setImmediate(() => { this.expireCalls() }) }) }, Math.max(1, Math.ceil(due - performance.now())))
    this.deadlineTimer.unref()
  }

  private expireCalls (): void {
    if (this.deadlineTimer !== null) clearTimeout(this.deadlineTimer)
    this.deadlineTimer = null
    this.timerDue = Infinity
    const now = performance.now()
    let next = Infinity
    let kept = 0
    const pending = this.pending
    for (let i = 0; i < pending.length; i++) {
      const call = pending[i] as PendingCall
      const reject = call.reject
      if (reject === null) continue
      if (call.deadline <= now) {
        call.reject = null
        reject(new RedisTimeoutError(`no answer within ${this.timeoutMs}ms`))
        continue
      }
      if (call.deadline < next) next = call.deadline
      pending[kept++] = call
    }
    pending.length = kept
    this.sweepAt = Math.max(SWEEP_MIN, 2 * kept)
    if (kept > 0) this.armDeadlineTimer(next)
  }

  private learn (checks: readonly LimitCheck[], remainings: readonly number[]): void {
    const atMs = Date.now()
    for (let i = 0; i < checks.length; i++) {
      let remaining = remainings[i] as number
      if (remaining < 0) continue
      const check = checks[i] as LimitCheck
      // a lease's fallback never starts from Redis's count (see seed)
      if (check.spec.algorithm === 'lease') continue
      const known = this.learned.get(check.key, LRU_CALL)
      if (known === undefined || !sameLimit(known.spec, check.spec)) {
        this.learned.set(check.key, { spec: check.spec, remaining, atMs, holdUntil: 0 }, LRU_CALL)
        continue
      }
      // updated in place: the get above already made it the most recent entry, and a set per
      // check per request was a visible share of the Redis path's CPU (issue 13)
      if (known.holdUntil > atMs) remaining = Math.min(remaining, known.remaining)
      else known.holdUntil = 0
      known.remaining = remaining
      known.atMs = atMs
    }
  }

  // Redis answers again: write back what the fallback admitted, and count it in what was learned
  // until Redis's answers include it. The other instances' fallbacks are assumed to have admitted
  // as much as this one (each had the same share), and for a second that estimate caps what
  // Redis reports, which may not include their debts yet: otherwise the next outage (a pause that
  // repeats) would start again from a remaining that is no longer there.
  private endOutage (): void {
    const outage = this.outage as Outage
    this.outage = null
    this.fallbackStore.clearBudgets()
    if (outage.overflow > 0) this.options.onDebtOverflow?.(outage.overflow)
    this.settle([...outage.debt])
  }

  // Redis answered for these keys while the outage goes on elsewhere (another Cluster master is
  // still down): settle their debt now, and let a later fallback start again from Redis's answer
  // rather than from fallback state that misses what Redis admitted in between.
  private settleKeys (outage: Outage, checks: readonly LimitCheck[]): void {
    const owed: Array<[string, Debt]> = []
    for (const check of checks) {
      if (!outage.seeded.delete(check.key)) continue
      this.fallbackStore.forget(check.key)
      const debt = outage.debt.get(check.key)
      if (debt === undefined) continue
      outage.debt.delete(check.key)
      owed.push([check.key, debt])
    }
    if (owed.length > 0) this.settle(owed)
  }

  private settle (owed: ReadonlyArray<readonly [string, Debt]>): void {
    if (owed.length === 0) return
    const n = this.instances
    const now = Date.now()
    const holdUntil = now + DEBT_SETTLE_MS
    for (const [key, debt] of owed) {
      const known = this.learned.get(key)
      if (known !== undefined && sameLimit(known.spec, debt.spec) && now - known.atMs < debt.spec.windowMs) {
        known.remaining = Math.max(0, known.remaining - debt.units * n)
        known.holdUntil = holdUntil
        continue
      }
      // Redis never answered for this key in its window (a new client, or Redis refusing the
      // script while PING answers): what the fleet's fallbacks admitted is all that is known of it.
      // Without this, a Redis that flaps starts each outage from a whole share: one per flap.
      this.learned.set(key, { spec: debt.spec, remaining: Math.max(0, capacity(debt.spec) - debt.units * n), atMs: now, holdUntil }, LRU_CALL)
    }
    this.writeBack(owed)
  }

  /** Charges `owed` to Redis; what fails is kept in `unpaid` for a later answer. */
  private writeBack (owed: ReadonlyArray<readonly [string, Debt]>): void {
    const charge = this.options.store.charge
    if (charge === undefined) return
    const checks = owed.map(([key, debt]): LimitCheck => ({ key, spec: debt.spec, cost: debt.units }))
    // A throw of the store is a failure like a rejection: the debt is kept either way.
    new Promise<void>((resolve) => { resolve(charge.call(this.options.store, checks)) }).catch((err: unknown) => {
      this.unpaidRetryAt = Date.now() + DEBT_RETRY_MS
      // Only the pieces that failed are kept: a piece that landed would be charged twice. A piece
      // that failed part-way (a script error after some keys: Redis keeps the writes before it),
      // or whose reply was lost, is charged again whole: under-admission, never over.
      const unwritten = err instanceof ChargeError ? new Set(err.unwritten.map(c => c.key)) : null
      let dropped = 0
      let kept = 0
      for (const [key, debt] of owed) {
        if (unwritten !== null && !unwritten.has(key)) continue
        if (addDebt(this.unpaid, this.maxKeys, key, debt.spec, debt.units, debt.lastAt)) kept++
        else dropped++
      }
      this.options.onDebtError?.(err instanceof ChargeError ? err.reason : err, kept)
      if (dropped > 0) this.options.onDebtDropped?.(dropped)
    })
  }

  // Called with each answer from Redis while debts wait: none while a breaker is open (its node
  // would fail it again) and none within DEBT_RETRY_MS of a failure. A retry takes all that is
  // owed, so a debt is in one write-back at a time; only a failure puts it back.
  private retryUnpaid (): void {
    if (this.worst !== 'closed') return
    const now = Date.now()
    if (now < this.unpaidRetryAt) return
    const owed: Array<[string, Debt]> = []
    let expired = 0
    for (const [key, debt] of this.unpaid) {
      // Past its window the budget it was owed to has renewed: charged, it would refuse requests of
      // a later window. Kept until then even when part of it is older (under-admitting, never over).
      if (now - debt.lastAt >= debt.spec.windowMs) expired++
      else owed.push([key, debt])
    }
    this.unpaid.clear()
    if (expired > 0) this.options.onDebtDropped?.(expired)
    if (owed.length > 0) this.writeBack(owed)
  }

  private fallback (checks: readonly LimitCheck[], limits: readonly { readonly onError: OnError }[], requestId: string): GuardedDecision {
    const kept: LimitCheck[] = []
    const index: number[] = []
    const n = this.instances
    // Units of a lease check counted for this instance's leases held in Redis, given back once decided
    let lent: Array<readonly [string, number]> | null = null
    for (let i = 0; i < checks.length; i++) {
      const mode = limits[i]?.onError
      if (mode === 'deny') return { decision: ALLOW_ALL, level: 'fallback', unavailable: true, leaseId: '', share: n }
      if (mode === 'allow') continue
      const check = checks[i] as LimitCheck
      let cost = shareCost(check, n)
      // The requests this instance admitted through Redis still run when Redis goes away: each
      // holds a place in the instance's share as the fallback's own leases do. Uncounted, an
      // instance that held its whole share in Redis admitted that share again on top of it.
      const inRedis = check.spec.algorithm === 'lease' ? (this.options.leasesHeld?.(check.key) ?? 0) : 0
      if (inRedis > 0) {
        const counted = Math.min(cost * (inRedis + 1), capacity(check.spec) + 1, MAX_EXACT)
        ;(lent ??= []).push([check.key, counted - cost])
        cost = counted
      }
      kept.push({ key: check.key, spec: check.spec, cost })
      index.push(i)
    }
    if (kept.length === 0) return { decision: ALLOW_ALL, level: 'fallback', unavailable: false, leaseId: '', share: n }
    const outage = this.outage ??= { debt: new Map(), seeded: new Set(), overflow: 0 }
    for (const check of kept) this.seed(outage, check)
    const d = this.fallbackStore.decide(kept, requestId)
    if (d.allowed) {
      for (const i of index) this.owe(outage, checks[i] as LimitCheck)
      // the Redis leases are given back to Redis: the fallback keeps only this request's share
      if (lent !== null) for (const [key, units] of lent) this.fallbackStore.release(key, units)
    }
    const decision: LimitDecision = {
      ...d,
      // per check of the request (not of `kept`), in units of the whole limit (the quota's header)
      ...(d.remainings !== undefined ? { remainings: wholeRemainings(d.remainings, index, checks.length, n) } : {}),
      // In units of the whole limit again (each instance holds 1/n of it).
      remaining: Math.floor(d.remaining / n),
      // "never" only while Redis is away and this instance's share is too small for the cost.
      retryAfterMs: d.retryAfterMs < 0 ? Math.min(FALLBACK_RETRY_MS, (kept[d.limitingIndex] as LimitCheck).spec.windowMs) : d.retryAfterMs,
      limitingIndex: d.limitingIndex === -1 ? -1 : index[d.limitingIndex] ?? -1
    }
    return { decision, level: 'fallback', unavailable: false, leaseId: '', share: n }
  }

  /**
   * Gives back a concurrency lease the fallback granted (`units` = its share when taken). The
   * fallback keeps counting the leases it granted until they are given back, across outages
   * (endOutage keeps them): forgotten, a lease finishing in a later outage would free one granted
   * there. Redis never counts them: until they finish, a client can have them on top of its cap
   * in Redis, a brief over-admission right after an outage.
   */
  releaseFallback (key: string, units: number): void {
    this.fallbackStore.release(key, units)
  }

  /**
   * Admin reset (DELETE /limits) of these keys: the fallback forgets their state, the remaining it
   * learned from Redis (a later outage would start from it) and its debt for them (written back,
   * it would spend the fresh budget again once Redis answers).
   */
  forgetFallback (keys: readonly string[]): void {
    for (const key of keys) {
      this.fallbackStore.forget(key)
      this.learned.delete(key)
      this.outage?.debt.delete(key)
      this.unpaid.delete(key)
    }
  }

  // The first time an outage meets a key, its fallback state starts from what Redis last said was
  // left of it: the fleet had R of capacity C left, so this instance's share is R / n, which in
  // fallback units (n per unit) is R, i.e. C - R units are already spent.
  private seed (outage: Outage, check: LimitCheck): void {
    // Leases are not a budget spent over a window: one in flight in Redis is released to Redis
    // (or expires there), so the fallback counts the leases it grants itself and, while deciding,
    // this instance's held in Redis (fallback), never the fleet's count Redis last reported.
    if (check.spec.algorithm === 'lease') return
    if (outage.seeded.has(check.key)) return
    if (outage.seeded.size < this.maxKeys) outage.seeded.add(check.key)
    const known = this.learned.get(check.key)
    if (known === undefined || !sameLimit(known.spec, check.spec) || Date.now() - known.atMs >= check.spec.windowMs) return
    const spent = capacity(check.spec) - known.remaining
    if (spent > 0) this.fallbackStore.decide([{ key: check.key, spec: check.spec, cost: spent }], 'seed')
  }

  private owe (outage: Outage, check: LimitCheck): void {
    if (check.spec.algorithm === 'lease') return
    if (!addDebt(outage.debt, this.maxKeys, check.key, check.spec, check.cost, Date.now())) outage.overflow++
  }
}

/**
 * An error of the request, not of Redis: the store refuses checks it cannot decide (a spec out of
 * its bounds, a cost above MAX_EXACT, one key twice: assertDecidable's RangeError) before it calls
 * Redis. Counted as a Redis failure, three such requests opened the breaker for every request.
 */
function callersFault (err: unknown): boolean {
  return err instanceof RangeError
}

/** The keys of the concurrency leases among `checks`, or null when there are none. */
function leaseKeysOf (checks: readonly LimitCheck[]): string[] | null {
  let keys: string[] | null = null
  for (const c of checks) if (c.spec.algorithm === 'lease') (keys ??= []).push(c.key)
  return keys
}

/**
 * Whether Redis may have run a failed call (and taken its leases). Under Cluster a call of several
 * slot groups may have run in one group and never been sent in another: every group's failure
 * must say it ran nothing, not the first group's alone.
 */
export function mayHaveRun (err: unknown): boolean {
  if (err instanceof SlotGroupError) return err.reasons.some(mayHaveRun)
  return !neverRan(err)
}

/**
 * Whether two specs are one limit. Not by identity: a reload compiles every limit again, and an
 * unchanged limit must keep what the guard holds for its keys (a debt, a remaining learned from
 * Redis) through a reload during an outage. The id changes exactly when the parameters do.
 */
function sameLimit (a: LimitSpec, b: LimitSpec): boolean {
  return a === b || a.id === b.id
}

/**
 * Adds `units` owed for `key` (its last one admitted at `lastAt`) to `debts`, which holds at most
 * `maxKeys` keys; false when it is full and the debt is dropped. A key owed under another spec
 * (a reload changed the limit) is replaced: the old units belong to a budget no longer used.
 */
function addDebt (debts: Map<string, Debt>, maxKeys: number, key: string, spec: LimitSpec, units: number, lastAt: number): boolean {
  const debt = debts.get(key)
  if (debt !== undefined && sameLimit(debt.spec, spec)) {
    debt.units += units
    debt.lastAt = Math.max(debt.lastAt, lastAt)
    return true
  }
  if (debt === undefined && debts.size >= maxKeys) return false
  debts.set(key, { spec, units, lastAt })
  return true
}

/**
 * The fallback's remainings (over the checks it decided, in its units of n per unit) as the
 * request's: -1 for a check it skipped (`onError: allow`), in units of the whole limit.
 */
function wholeRemainings (kept: readonly number[], index: readonly number[], checks: number, n: number): number[] {
  const out: number[] = new Array<number>(checks).fill(-1)
  for (let j = 0; j < kept.length; j++) out[index[j] as number] = Math.floor((kept[j] as number) / n)
  return out
}

/** What a full budget holds: the bucket for bucket algorithms, the limit for window ones. */
function capacity (spec: LimitSpec): number {
  return spec.algorithm === 'gcra' || spec.algorithm === 'token-bucket' || spec.algorithm === 'leaky-bucket' ? spec.burst : spec.limit
}

/**
 * A check's cost in the fallback of one of n instances: n units of the unchanged limit per unit,
 * so each instance holds exactly 1/n of every budget. Capped just above the capacity, which is
 * already "never" and keeps the product exact.
 */
export function shareCost (check: LimitCheck, n: number): number {
  if (n === 1) return check.cost
  return Math.min(check.cost * n, capacity(check.spec) + 1, MAX_EXACT)
}
