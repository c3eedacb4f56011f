// The limiting pipeline of one request, in order: the local level (in-process token bucket per
// client), the deny cache (keys the shared level already rejected), then every shared limit that
// applies, decided all-or-nothing in one call of the shared level (in process or Redis: the
// limiter does not know which, see SharedLevel in ./types.ts).
import type { LimitCheck, SharedDecision, SharedLevel } from './types.js'
import { ERRORS, errorBodyCode } from '../errors.js'
import { FAILURE_LIMIT_NAME, dimensionValue, keyFor, type PlannedLimit, type RouteLimitPlan } from './plan.js'
import type { DenyCache, LocalLevel } from './local-level.js'
import type { DecisionCounter, Telemetry } from '../telemetry.js'
import { quotaPeriodEnd } from './algorithms/calendar-quota.js'
import { followsWallClock } from './algorithms/index.js'
import type { HeldLease, LeaseKeeper } from './concurrency.js'

export type HeaderList = Array<[string, string]>

export type LimitVerdict =
  | { readonly kind: 'allow', readonly headers: HeaderList | null, readonly delayMs: number, readonly lease: HeldLease | null }
  | RejectVerdict
  | { readonly kind: 'unavailable' }

export interface RejectBody {
  /** From the error table (src/errors.ts): `rate_limited` for a rate, GW_ERR_CONCURRENCY_LIMITED for a lease. */
  readonly error: string
  readonly message: string
  readonly dimension: string
  readonly limit: string
  readonly retryAfterMs: number
}

/**
 * A 429: the limit's template, the client's wait in whole ms (the body's `retryAfterMs`) and the
 * header fields of this answer, flat (name, value, name, value...) as `res.writeHead` takes them.
 * The writers use those; `status`, `body` and `headers` describe the same answer as values.
 */
export class RejectVerdict {
  readonly kind = 'reject'
  constructor (readonly template: RejectTemplate, readonly retryAfterMs: number, readonly head: readonly string[]) {}

  get status (): number { return this.template.status }

  /** The body without its requestId. */
  get body (): RejectBody {
    const body = JSON.parse(this.template.body(this.retryAfterMs, '')) as RejectBody & { requestId?: string }
    delete body.requestId
    return body
  }

  get headers (): HeaderList {
    const pairs: HeaderList = []
    for (let i = 0; i + 1 < this.head.length; i += 2) pairs.push([this.head[i] as string, this.head[i + 1] as string])
    return pairs
  }
}

/** Most Retry-After values a template keeps a built header list for (one per whole second). */
const CACHED_HEADS = 64

/**
 * What a limit's 429 says whatever the request, built once per limit and limiter (issue 13 item 5:
 * a rejection costs at most 25 µs, so its answer is not re-serialized per request). The body is
 * `{ error, message, dimension, limit, retryAfterMs, requestId }`: only the last two vary.
 */
export class RejectTemplate {
  readonly status: number
  readonly dimension: string
  /** The limit's name as the body gives it (`ip`, `login.ip`, `local`). */
  readonly limit: string
  /** The body up to the value of `retryAfterMs`. */
  private readonly bodyStart: string
  /** UTF-8 bytes of the body beyond one per character (a limit name outside ASCII). */
  private readonly wideBytes: number
  private readonly heads: Array<readonly string[] | undefined> = []

  constructor (
    status: number, error: string, message: string, dimension: string, limit: string,
    private readonly quota: number, private readonly policy: string, private readonly legacyHeaders: boolean,
    /** Headers every answer of this template carries instead of RateLimit/Retry-After (a lease's Retry-After: 1). */
    private readonly fixedHead: readonly string[] | null = null
  ) {
    this.status = status
    this.dimension = dimension
    this.limit = limit
    this.bodyStart = JSON.stringify({ error, message, dimension, limit }).slice(0, -1) + ',"retryAfterMs":'
    this.wideBytes = Buffer.byteLength(this.bodyStart) - this.bodyStart.length
  }

  /**
   * The JSON body. `requestId` needs no escaping: it is a UUID or passed REQUEST_ID_RE
   * (src/request-record.ts), whose characters JSON leaves as they are.
   */
  body (retryAfterMs: number, requestId: string): string {
    return this.bodyStart + retryAfterMs + ',"requestId":"' + requestId + '"}'
  }

  /** Bytes of `body` (content-length, the access log's bytesOut). */
  bytesOf (body: string): number {
    return body.length + this.wideBytes
  }

  /**
   * RateLimit-Policy, RateLimit (r remaining, t seconds to reset), the legacy X-RateLimit-* when
   * configured, then Retry-After. A list for r = 0 and t = Retry-After (every local and deny-cache
   * rejection) is built once per second value and shared, never edited.
   */
  head (r: number, t: number, retryAfterS: number): readonly string[] {
    if (this.fixedHead !== null) return this.fixedHead
    const cacheable = r === 0 && t === retryAfterS && retryAfterS < CACHED_HEADS
    if (cacheable) {
      const cached = this.heads[retryAfterS]
      if (cached !== undefined) return cached
    }
    const head = ['ratelimit-policy', this.policy, 'ratelimit', `"${this.limit}";r=${r};t=${t}`]
    if (this.legacyHeaders) head.push('x-ratelimit-limit', String(this.quota), 'x-ratelimit-remaining', String(r), 'x-ratelimit-reset', String(t))
    head.push('retry-after', String(retryAfterS))
    if (cacheable) this.heads[retryAfterS] = Object.freeze(head)
    return head
  }
}

export interface LimitRequest {
  readonly route: string
  readonly plan: RouteLimitPlan
  /** Client address key (IPv6 grouped by prefix). */
  readonly ipKey: string
  readonly user: string | null
  readonly requestId: string
}

export interface LimiterOptions {
  readonly local: LocalLevel | null
  readonly deny: DenyCache
  /** Decides the shared limits: in process (`createInProcessLevel`) or Redis (`RedisGuard`). */
  readonly shared: SharedLevel
  readonly legacyHeaders: boolean
  readonly telemetry: Telemetry
  /** Releases and renews concurrency leases; null when no limit can take one. */
  readonly leases?: LeaseKeeper | null
}

const LOCAL_LIMIT = 'local'
const RATE_LIMITED = errorBodyCode('GW_ERR_RATE_LIMITED')
const CONCURRENCY_LIMITED = errorBodyCode('GW_ERR_CONCURRENCY_LIMITED')

export class Limiter {
  // Each planned limit's counter per route, resolved on first use, then a decision is counted
  // without a label lookup. Per route: the identity-failure plan's limits are one set shared by
  // every route. Planned limits live as long as this limiter (one runtime).
  private readonly counters = new WeakMap<PlannedLimit, Map<string, DecisionCounter>>()
  /** Each planned limit's 429, built on its first rejection. */
  private readonly templates = new WeakMap<PlannedLimit, RejectTemplate>()
  private readonly localTemplate: RejectTemplate | null
  /** The local level's rejection counter per route name (`-` for a request with no route). */
  private readonly localCounters = new Map<string, DecisionCounter>()

  constructor (private readonly options: LimiterOptions) {
    const local = options.local
    this.localTemplate = local === null ? null : new RejectTemplate(429, RATE_LIMITED, ERRORS.GW_ERR_RATE_LIMITED.message, 'local', LOCAL_LIMIT, local.options.limit, local.policy, options.legacyHeaders)
  }

  /** The local level, for the admin API's lookup (its bucket read without taking a token). */
  get localLevel (): LocalLevel | null {
    return this.options.local
  }

  private templateOf (l: PlannedLimit): RejectTemplate {
    let template = this.templates.get(l)
    if (template === undefined) {
      template = l.concurrency
        ? new RejectTemplate(ERRORS.GW_ERR_CONCURRENCY_LIMITED.status, CONCURRENCY_LIMITED, ERRORS.GW_ERR_CONCURRENCY_LIMITED.message, l.dimension, l.name, l.spec.limit, l.policy, false, CONCURRENCY_HEAD)
        : new RejectTemplate(l.status, RATE_LIMITED, ERRORS.GW_ERR_RATE_LIMITED.message, l.dimension, l.name, l.spec.limit, l.policy, this.options.legacyHeaders)
      this.templates.set(l, template)
    }
    return template
  }

  private counterOf (route: string, l: PlannedLimit): DecisionCounter {
    let byRoute = this.counters.get(l)
    if (byRoute === undefined) this.counters.set(l, byRoute = new Map())
    let counter = byRoute.get(route)
    if (counter === undefined) byRoute.set(route, counter = this.options.telemetry.decisionCounter(route, l.dimension, l.name))
    return counter
  }

  /**
   * The local level, keyed by client IP only: it runs before identity (a user header is the
   * client's word until verified, and rotating it must not buy a fresh bucket) and before a 404
   * or 400 is answered, so floods of any kind are shed without verification work. Null = pass.
   */
  local (ipKey: string, route: string): LimitVerdict | null {
    const local = this.options.local
    if (local === null) return null
    const wait = local.take(ipKey, performance.now())
    if (wait === 0) return null
    let counter = this.localCounters.get(route)
    if (counter === undefined) this.localCounters.set(route, counter = this.options.telemetry.decisionCounter(route, 'local', LOCAL_LIMIT))
    counter.count('local', 'rejected')
    return reject(this.localTemplate as RejectTemplate, wait, 0, wait)
  }

  /** ms left on this instance's deny-cache entry for `check` (admin API), 0 when none. */
  denied (check: LimitCheck): number {
    return this.options.deny.remaining(denyKey(check), performance.now(), Date.now())
  }

  /** Synchronous unless the shared level has to ask Redis: the in-process path allocates no Promise. */
  check (req: LimitRequest): LimitVerdict | Promise<LimitVerdict> {
    const { deny } = this.options
    // monotonic: a wall-clock step back must not freeze refills (the stores measure rates on it too)
    const now = performance.now()
    // A quota's refusal is held on both clocks and ends at the earlier deadline (DenyCache,
    // WallDeadline): the wall clock ends it after a host suspend, which the monotonic clock does
    // not count; the monotonic one after a step back of this host's wall clock, which the store's
    // (Redis TIME) did not take.
    const wall = Date.now()
    const plan = req.plan
    if (plan.all.length === 0) return ALLOW_NO_HEADERS

    const { checks, limits } = buildChecks(plan.enforced, req)
    // nobody denied lately (DenyCache.quietAt): no key to look up
    if (!deny.quietAt(now)) {
      const held = this.heldIn(req.route, checks, limits, now, wall)
      if (held !== null) return held
    }
    if (checks.length === 0) {
      if (plan.shadow.length > 0) void this.decideShadow(req)
      return ALLOW_NO_HEADERS
    }

    // releases first: see LeaseKeeper.flushReleases (nothing waits when no lease is held in Redis)
    this.options.leases?.flushReleases()
    const decided = this.options.shared.decide(checks, limits, req.requestId)
    if (decided instanceof Promise) return decided.then(d => this.conclude(req, checks, limits, d, now, wall))
    return this.conclude(req, checks, limits, decided, now, wall)
  }

  /**
   * The deny cache's refusal of one of `plan`'s limits for this client, or null; decides nothing
   * else. Read before identity for the failure budget: an IP that spent it is refused whatever
   * credential it sends, so a right guess answers as a wrong one does (a 429, where it was a 200
   * that told a key-guesser the key) and a guess costs no verification.
   */
  heldRefusal (route: string, plan: RouteLimitPlan, ipKey: string, requestId: string): RejectVerdict | null {
    const now = performance.now()
    if (this.options.deny.quietAt(now)) return null
    const req: LimitRequest = { route, plan, ipKey, user: null, requestId }
    const { checks, limits } = buildChecks(plan.enforced, req)
    return this.heldIn(route, checks, limits, now, Date.now())
  }

  private heldIn (route: string, checks: readonly LimitCheck[], limits: readonly PlannedLimit[], now: number, wall: number): RejectVerdict | null {
    for (let i = 0; i < checks.length; i++) {
      // leases are never in the deny cache: a lease comes back whenever its request ends
      if ((limits[i] as PlannedLimit).concurrency) continue
      const left = this.options.deny.remaining(denyKey(checks[i] as LimitCheck), now, wall)
      if (left > 0) {
        const l = limits[i] as PlannedLimit
        this.counterOf(route, l).count('local', 'rejected')
        return reject(this.templateOf(l), left, 0, left)
      }
    }
    return null
  }

  /** Gives back the leases of a request whose response (or WebSocket) closed. Idempotent. */
  release (lease: HeldLease): void {
    this.options.leases?.release(lease)
  }

  private conclude (req: LimitRequest, checks: LimitCheck[], limits: PlannedLimit[], shared: SharedDecision, now: number, wall: number): LimitVerdict {
    if (shared.unavailable) return UNAVAILABLE
    const { decision, level } = shared
    const { deny, telemetry } = this.options
    const route = req.route
    const deciding = limits[decision.limitingIndex]
    if (!decision.allowed) {
      const l = deciding as PlannedLimit
      // A lease can come back at any moment: never in the deny cache, always Retry-After: 1.
      if (l.concurrency) {
        telemetry.concurrencyRejected(route, l.dimension, level)
        return new RejectVerdict(this.templateOf(l), 1000, CONCURRENCY_HEAD)
      }
      this.counterOf(route, l).count(level, 'rejected')
      // The fallback store is in process already: caching its rejections saves nothing and would
      // outlive Redis's recovery, holding a client to this instance's share of the budget. The
      // failure budget's are cached all the same: heldRefusal reads them before identity, so
      // that a right guess is refused as the wrong ones are while Redis is away too.
      if (decision.retryAfterMs > 0 && (level !== 'fallback' || l.name === FAILURE_LIMIT_NAME)) {
        // A Redis Cluster rejection may be a refund race (RedisGuardOptions.denyCacheMaxMs):
        // cached whole, it would lock the client out for the full wait.
        const check = checks[decision.limitingIndex] as LimitCheck
        const holdMs = Math.min(decision.retryAfterMs, this.options.shared.denyCacheMaxMs)
        // a rate's entry stays a plain monotonic number (no allocation); a quota's also ends on the wall clock
        if (followsWallClock(check.spec)) deny.add(denyKey(check), now + holdMs, wall + holdMs)
        else deny.add(denyKey(check), now + holdMs)
      }
      // -1 ("never": the cost is above what the limit can ever hold, e.g. a fallback share):
      // a whole window is the most honest wait to advertise.
      const retry = decision.retryAfterMs > 0 ? decision.retryAfterMs : l.spec.windowMs
      return reject(this.templateOf(l), retry, decision.remaining, decision.resetMs)
    }
    let leaseKeys: string[] | null = null
    for (let i = 0; i < limits.length; i++) {
      const l = limits[i] as PlannedLimit
      if (l.concurrency) (leaseKeys ??= []).push((checks[i] as LimitCheck).key)
      else this.counterOf(route, l).count(level, 'allowed')
    }
    // only admitted requests count against shadow limits, as they would if they were enforced
    if (req.plan.shadow.length > 0) void this.decideShadow(req)
    // An admitted lease reports an unbounded remaining (lua/lease.lua): it decides only when no
    // rate limit applies, and then there is no rate to describe.
    const headers = deciding === undefined || deciding.concurrency ? null : this.headers(deciding.policy, deciding.name, deciding.spec.limit, decision.remaining, decision.resetMs)
    if (headers !== null && deciding?.dimension !== 'quota' && decision.remainings !== undefined) appendQuota(headers, limits, decision.remainings)
    let lease: HeldLease | null = null
    if (leaseKeys !== null) {
      lease = { keys: leaseKeys, member: shared.leaseId, level, units: shared.share, released: false, heldAt: -1 }
      this.options.leases?.hold(lease)
    }
    return { kind: 'allow', headers, delayMs: decision.delayMs, lease }
  }

  // Shadow limits are counted and reported, never enforced: decided after the enforced ones
  // admitted the request, in a call of their own so that running out can veto no request. Each
  // is decided alone: decided together, all-or-nothing, the tightest one's refusals were counted
  // as refusals of every other and left them uncharged, so a limit on trial beside a tighter one
  // showed rejections it would never make.
  private async decideShadow (req: LimitRequest): Promise<void> {
    const { checks, limits } = buildChecks(req.plan.shadow, req)
    await Promise.all(checks.map(async (check, i) => {
      const l = limits[i] as PlannedLimit
      try {
        const { decision, level } = await this.options.shared.decide([check], [l], `${req.requestId}:shadow:${i}`)
        this.counterOf(req.route, l).count(level, decision.allowed ? 'allowed' : 'shadow')
      } catch {
        // a shadow limit never affects the request
      }
    }))
  }

  // draft-ietf-httpapi-ratelimit-headers: RateLimit-Policy names the quota, RateLimit carries the
  // remaining units (r) and seconds until the quota resets (t) for the tightest applying limit.
  private headers (policy: string, name: string, limit: number, remaining: number, resetMs: number): HeaderList {
    const r = Math.max(0, remaining)
    const t = Math.max(0, Math.ceil(resetMs / 1000))
    const headers: HeaderList = [
      ['ratelimit-policy', policy],
      ['ratelimit', `"${name}";r=${r};t=${t}`]
    ]
    if (this.options.legacyHeaders) {
      headers.push(['x-ratelimit-limit', String(limit)], ['x-ratelimit-remaining', String(r)], ['x-ratelimit-reset', String(t)])
    }
    return headers
  }
}

const ALLOW_NO_HEADERS: LimitVerdict = Object.freeze({ kind: 'allow', headers: null, delayMs: 0, lease: null })

// A concurrency refusal: Retry-After: 1 (a lease can come back at any moment), no RateLimit fields.
const CONCURRENCY_HEAD: readonly string[] = Object.freeze(['retry-after', '1'])

/** A rate limit's 429 for a wait of `retryAfterMs` (fractional: waits are measured on performance.now()). */
function reject (template: RejectTemplate, retryAfterMs: number, remaining: number, resetMs: number): RejectVerdict {
  const retryAfterS = Math.max(1, Math.ceil(retryAfterMs / 1000))
  const head = template.head(Math.max(0, remaining), Math.max(0, Math.ceil(resetMs / 1000)), retryAfterS)
  // the local level and the deny cache measure waits on performance.now(): a client gets whole ms
  return new RejectVerdict(template, Math.max(1, Math.ceil(retryAfterMs)), head)
}
const UNAVAILABLE: LimitVerdict = Object.freeze({ kind: 'unavailable' })

/**
 * A rejection holds for one (key, cost): the key names the limit's parameters but not its cost,
 * so a reload that changes only the cost must not keep the lockout the old cost earned. A quota's
 * key names only the consumer and period (its count follows the consumer across plans), so its
 * rejection also holds for that quota's limit only: a consumer moved to a larger plan is not kept
 * out until the period ends.
 */
export function denyKey (check: LimitCheck): string {
  // The cost and the quota's limit go in front of the key, whose end is the client's own value
  // (a user id): behind it, the user "bob#2" at cost 1 and "bob" at cost 2 shared one entry, and a
  // reload that changed the cost locked "bob" out with "bob#2"'s refusal. A key never starts with
  // '@' or '#' (it starts with the configured prefix and the limit's id).
  const key = check.spec.algorithm === 'calendar-quota' ? `@${check.spec.limit}|${check.key}` : check.key
  return check.cost === 1 ? key : `#${check.cost}|${key}`
}

/**
 * A plan's quota beside the tightest limit (issue 9): both headers are lists
 * (draft-ietf-httpapi-ratelimit-headers), so a client sees its daily or monthly budget too.
 */
function appendQuota (headers: HeaderList, limits: readonly PlannedLimit[], remainings: readonly number[]): void {
  for (let i = limits.length - 1; i >= 0; i--) {
    const l = limits[i] as PlannedLimit
    if (l.dimension !== 'quota') continue
    const remaining = remainings[i]
    if (remaining === undefined || remaining < 0) return
    // one clock reading for the period and the wait: two could fall on both sides of its start
    const nowMs = Date.now()
    const t = Math.max(0, quotaPeriodEnd(l.spec, nowMs * 1000) - Math.floor(nowMs / 1000))
    ;(headers[0] as [string, string])[1] += `, ${l.policy}`
    ;(headers[1] as [string, string])[1] += `, "${l.name}";r=${remaining};t=${t}`
    return
  }
}

/** The checks that apply to this request: a `user` limit is skipped for anonymous requests. */
export function buildChecks (planned: readonly PlannedLimit[], req: LimitRequest): { checks: LimitCheck[], limits: PlannedLimit[] } {
  // Sized once and trimmed when a limit is skipped, walked by index: grown by push from empty, and
  // with for...of over the frozen plan (V8's array iterator builtin), they cost (f) about 600
  // instructions per request (bench/README.md, twenty-first session).
  const n = planned.length
  const checks: LimitCheck[] = new Array(n)
  const limits: PlannedLimit[] = new Array(n)
  let used = 0
  for (let i = 0; i < n; i++) {
    const l = planned[i] as PlannedLimit
    if (l.fixedCheck !== null) {
      checks[used] = l.fixedCheck
    } else {
      const value = dimensionValue(l.dimension, req.ipKey, req.user)
      if (value === null) continue
      checks[used] = { key: keyFor(l.keyBase, value), spec: l.spec, cost: l.cost }
    }
    limits[used++] = l
  }
  if (used < n) {
    checks.length = used
    limits.length = used
  }
  return { checks, limits }
}
