// Turns the configured limits into per-route plans at load time, so a request only has to
// append its dimension value to a precomputed key base. The options are this stage's own, in
// runtime units (ms) with every default already applied: src/runtime.ts builds them from the config.
import { createHash } from 'node:crypto'
import type { AlgorithmName, LimitCheck, LimitSpec } from './types.js'
import { escapeKeyValue } from './keys.js'
import { validateLimitSpec } from './algorithms/index.js'
import { PERIOD_WINDOW_MS, zonedQuotaDelay, type QuotaPeriod } from './algorithms/calendar-quota.js'

// The scope of gateway-wide limits in their ids: "*" cannot be a route name (schema), so a route
// can never share a gateway-wide limit's keys by being named like its scope.
export const GATEWAY_SCOPE = '*'

/** 'quota' is a plan's calendar quota; 'route' is a concurrency dimension only: the route's total in flight. */
export type Dimension = 'global' | 'api' | 'ip' | 'user' | 'quota' | 'route'
export type OnError = 'local' | 'allow' | 'deny'

export interface PlannedLimit {
  /** What the 429 body and headers call this limit: "ip" (gateway-wide) or "login.ip" (route). */
  readonly name: string
  readonly dimension: Dimension
  readonly spec: LimitSpec
  readonly cost: number
  readonly shadow: boolean
  readonly status: number
  readonly onError: OnError
  /** `<keyPrefix>:<limit id>:`: the dimension value is appended per request. */
  readonly keyBase: string
  /** `"ip";q=100;w=60` for the RateLimit-Policy header (draft-ietf-httpapi-ratelimit-headers). */
  readonly policy: string
  /** global and api budgets have one key: their check is built once, not per request. */
  readonly fixedCheck: LimitCheck | null
  /** A concurrency limit (issue 10): a lease held until the response ends, not a rate. */
  readonly concurrency: boolean
}

export interface RouteLimitPlan {
  readonly enforced: readonly PlannedLimit[]
  /** Shadow limits are decided apart so that, failing, they cannot veto the enforced ones. */
  readonly shadow: readonly PlannedLimit[]
  readonly all: readonly PlannedLimit[]
}

/** One rate limit, resolved: every field given, durations in ms. */
export interface LimitRule {
  readonly algorithm: Exclude<AlgorithmName, 'calendar-quota' | 'lease'>
  readonly limit: number
  readonly windowMs: number
  /** Capacity of bucket algorithms; equals `limit` for window algorithms. */
  readonly burst: number
  /** leaky-bucket with `onLimit: delay`: the longest wait; 0 rejects instead. */
  readonly maxDelayMs: number
  readonly cost: number
  readonly shadow: boolean
  readonly status: number
  readonly onError: OnError
}

/** A plan's calendar quota (issue 9). */
export interface QuotaRule {
  readonly period: QuotaPeriod
  readonly limit: number
  readonly cost: number
  readonly status: number
  readonly onError: OnError
}

/** A plan's limits: `user` replaces the gateway-wide user limit, `routes` a route's user limit. */
export interface PlanRules {
  readonly user: LimitRule | null
  readonly quota: QuotaRule | null
  readonly routes: ReadonlyMap<string, LimitRule>
}

/** The gateway-wide part of every route's plan. */
export interface LimitPlanOptions {
  /** Prefix of every store key (`redis.keyPrefix`). */
  readonly keyPrefix: string
  /** What concurrency leases do when the store fails (`redis.onError`). */
  readonly leaseOnError: OnError
  readonly leaseTtlMs: number
  /** IANA zone of calendar quota periods; null = UTC. */
  readonly quotaTimezone: string | null
  readonly global: LimitRule | null
  readonly ip: LimitRule | null
  readonly user: LimitRule | null
  readonly concurrency: { readonly ip: number | null, readonly user: number | null }
  readonly plans: ReadonlyMap<string, PlanRules>
  /** Budget of failed identity checks per IP; null = no identity configured (nothing can fail). */
  readonly failureLimit: LimitRule | null
}

/** A route's own limits. */
export interface RouteLimitOptions {
  readonly name: string
  readonly api: LimitRule | null
  readonly ip: LimitRule | null
  readonly user: LimitRule | null
  readonly concurrency: { readonly ip: number | null, readonly user: number | null, readonly route: number | null }
}

export const EMPTY_PLAN: RouteLimitPlan = Object.freeze({ enforced: [], shadow: [], all: [] })

/** `<keyPrefix>:<limit id>:<dimension value>` from the precomputed key base. */
export function keyFor (keyBase: string, value: string): string {
  // no hash tag, braces escaped: see src/limit/keys.ts
  return keyBase + escapeKeyValue(value)
}

/** The value a limit is keyed by for one request; null = the limit does not apply (anonymous). */
export function dimensionValue (dimension: Dimension, ipKey: string, user: string | null): string | null {
  switch (dimension) {
    case 'ip': return ipKey
    case 'user':
    case 'quota': return user
    // global and api budgets are single keys: the limit id already names the route
    default: return '_'
  }
}

export function compileLimitSpec (scope: string, dimension: Dimension, limit: Pick<LimitRule, 'algorithm' | 'limit' | 'windowMs' | 'burst' | 'maxDelayMs'>): LimitSpec {
  const { algorithm, windowMs, burst, maxDelayMs } = limit
  // The id changes exactly when the state's meaning changes: a reload that keeps a limit keeps
  // its keys (and so its budget); a changed limit starts fresh under new keys.
  const digest = createHash('sha256')
    .update(`${algorithm}|${limit.limit}|${windowMs}|${burst}|${maxDelayMs}`)
    .digest('base64url')
    .slice(0, 8)
  return Object.freeze({ id: `${scope}.${dimension}.${digest}`, algorithm, limit: limit.limit, windowMs, burst, maxDelayMs })
}

function planLimit (scope: string, dimension: Dimension, limit: LimitRule, keyPrefix: string): PlannedLimit {
  const spec = compileLimitSpec(scope, dimension, limit)
  const name = scope === GATEWAY_SCOPE ? dimension : `${scope}.${dimension}`
  const keyBase = `${keyPrefix}:${spec.id}:`
  return Object.freeze({
    name,
    dimension,
    spec,
    cost: limit.cost,
    shadow: limit.shadow,
    status: limit.status,
    onError: limit.onError,
    keyBase,
    policy: `"${name}";q=${spec.limit};w=${Math.max(1, Math.ceil(spec.windowMs / 1000))}`,
    fixedCheck: dimension === 'global' || dimension === 'api' ? Object.freeze({ key: keyFor(keyBase, '_'), spec, cost: limit.cost }) : null,
    concurrency: false
  })
}

/**
 * A concurrency limit as a limit check: the lease algorithm (lua/lease.lua) with limit = the most
 * held at once and window = the lease TTL. Its key does not name the cap, so a reload that changes
 * the cap keeps counting the leases already held.
 */
function planConcurrency (options: LimitPlanOptions, scope: string, dimension: 'ip' | 'user' | 'route', max: number): PlannedLimit {
  const windowMs = options.leaseTtlMs
  const keyPrefix = options.keyPrefix
  const spec: LimitSpec = Object.freeze({ id: `${scope}.concurrency.${dimension}`, algorithm: 'lease', limit: max, windowMs, burst: max, maxDelayMs: 0 })
  const name = scope === GATEWAY_SCOPE ? `concurrency.${dimension}` : `${scope}.concurrency.${dimension}`
  const keyBase = `${keyPrefix}:lease:${scope}.${dimension}:`
  return Object.freeze({
    name,
    dimension,
    spec,
    cost: 1,
    shadow: false,
    status: 429,
    onError: options.leaseOnError,
    keyBase,
    policy: '',
    fixedCheck: dimension === 'route' ? Object.freeze({ key: keyFor(keyBase, '_'), spec, cost: 1 }) : null,
    concurrency: true
  })
}

const policyOf = (name: string, limit: number, windowMs: number): string => `"${name}";q=${limit};w=${Math.max(1, Math.ceil(windowMs / 1000))}`

/**
 * A plan's quota (issue 9): keyed by consumer and period only, so a consumer moving between plans
 * with the same period keeps what it used, and a changed quota limit keeps the period's count.
 * With `quotaTimezone` the spec carries the zone's UTC offset now and at the current period's end
 * (zonedQuotaDelay; lua/calendar-quota.lua): both are re-read at the first use in every minute, and
 * DST changes happen on whole minutes, so every decision uses the offset in force at that minute.
 */
function planQuota (options: LimitPlanOptions, plan: string, quota: QuotaRule): PlannedLimit {
  const windowMs = PERIOD_WINDOW_MS[quota.period]
  const zone = options.quotaTimezone
  const id = zone === null ? `quota.${quota.period}` : `quota.${quota.period}.${zone}`
  const specAt = (maxDelayMs: number): LimitSpec => Object.freeze({ id, algorithm: 'calendar-quota' as const, limit: quota.limit, windowMs, burst: quota.limit, maxDelayMs })
  let current = specAt(0)
  let minute = -Infinity
  const name = `${plan}:quota`
  const planned = {
    name,
    dimension: 'quota' as const,
    cost: quota.cost,
    shadow: false,
    status: quota.status,
    onError: quota.onError,
    concurrency: false,
    keyBase: `${options.keyPrefix}:${id}:`,
    policy: policyOf(name, quota.limit, windowMs),
    fixedCheck: null
  }
  if (zone === null) return Object.freeze({ ...planned, spec: current })
  Object.defineProperty(planned, 'spec', {
    enumerable: true,
    get (): LimitSpec {
      const now = Date.now()
      const m = Math.floor(now / 60_000)
      if (m !== minute) {
        minute = m
        const delay = zonedQuotaDelay(zone, windowMs, now)
        if (current.maxDelayMs !== delay) current = specAt(delay)
      }
      return current
    }
  })
  return Object.freeze(planned) as PlannedLimit
}

/**
 * The limits of `route`; with `plan`, those of that plan's consumers (issue 9): the plan's
 * `limits.user` replaces the gateway-wide user limit, `plans.<p>.routes.<route>.user` replaces the
 * route's, and the plan's quota is one more check decided in the same all-or-nothing call.
 */
export function compileRouteLimitPlan (options: LimitPlanOptions, route: RouteLimitOptions, plan?: string): RouteLimitPlan {
  const keyPrefix = options.keyPrefix
  const all: PlannedLimit[] = []
  const p = plan === undefined ? undefined : options.plans.get(plan)
  if (options.global !== null) all.push(planLimit(GATEWAY_SCOPE, 'global', options.global, keyPrefix))
  if (route.api !== null) all.push(planLimit(route.name, 'api', route.api, keyPrefix))
  if (options.ip !== null) all.push(planLimit(GATEWAY_SCOPE, 'ip', options.ip, keyPrefix))
  if (route.ip !== null) all.push(planLimit(route.name, 'ip', route.ip, keyPrefix))
  const planUser = p?.user ?? null
  if (planUser !== null && plan !== undefined) {
    // scope "free:*": ":" is in no route name, so these keys are the plan's own
    const l = planLimit(`${plan}:${GATEWAY_SCOPE}`, 'user', planUser, keyPrefix)
    all.push(Object.freeze({ ...l, name: `${plan}:user`, policy: policyOf(`${plan}:user`, l.spec.limit, l.spec.windowMs) }))
  } else if (options.user !== null) {
    all.push(planLimit(GATEWAY_SCOPE, 'user', options.user, keyPrefix))
  }
  const routeUser = p?.routes.get(route.name)
  if (routeUser !== undefined && plan !== undefined) all.push(planLimit(`${plan}:${route.name}`, 'user', routeUser, keyPrefix))
  else if (route.user !== null) all.push(planLimit(route.name, 'user', route.user, keyPrefix))
  const quota = p?.quota ?? null
  if (quota !== null && plan !== undefined) all.push(planQuota(options, plan, quota))
  // Leases last, in the same all-or-nothing call: a request refused by a rate limit takes none.
  const gateway = options.concurrency
  const own = route.concurrency
  if (gateway.ip !== null) all.push(planConcurrency(options, GATEWAY_SCOPE, 'ip', gateway.ip))
  if (gateway.user !== null) all.push(planConcurrency(options, GATEWAY_SCOPE, 'user', gateway.user))
  if (own.ip !== null) all.push(planConcurrency(options, route.name, 'ip', own.ip))
  if (own.user !== null) all.push(planConcurrency(options, route.name, 'user', own.user))
  if (own.route !== null) all.push(planConcurrency(options, route.name, 'route', own.route))
  if (all.length === 0) return EMPTY_PLAN
  return Object.freeze({
    enforced: Object.freeze(all.filter(l => !l.shadow)),
    shadow: Object.freeze(all.filter(l => l.shadow)),
    all: Object.freeze(all)
  })
}

export const FAILURE_LIMIT_NAME = 'identity.failures'

/**
 * The limits a request that failed identity is charged against, in one store call: the
 * gateway-wide `ip` limit and the failed-identity budget of its IP. Empty without identity.
 */
export function compileFailurePlan (options: LimitPlanOptions): RouteLimitPlan {
  const rule = options.failureLimit
  if (rule === null) return EMPTY_PLAN
  // Refused here, at compile time, rather than by the store on each failed credential: there it
  // answered 503 instead of 401 and, with Redis, counted toward the breaker.
  if (rule.shadow) throw new RangeError('a failure budget cannot be in shadow mode: it is what stops a client guessing credentials, so it is always enforced')
  const keyPrefix = options.keyPrefix
  const all: PlannedLimit[] = []
  if (options.ip !== null && !options.ip.shadow) all.push(planLimit(GATEWAY_SCOPE, 'ip', options.ip, keyPrefix))
  // "*identity" cannot be a route name (schema), so no route's ip limit can share these keys.
  const failures = planLimit('*identity', 'ip', rule, keyPrefix)
  const invalid = validateLimitSpec(failures.spec)
  if (invalid !== undefined) throw new RangeError(invalid)
  const capacity = failures.spec.algorithm === 'gcra' || failures.spec.algorithm === 'token-bucket' || failures.spec.algorithm === 'leaky-bucket' ? failures.spec.burst : failures.spec.limit
  if (!Number.isSafeInteger(rule.cost) || rule.cost < 1 || rule.cost > capacity) throw new RangeError(`cost ${rule.cost} must be an integer from 1 to the capacity ${capacity}`)
  all.push(Object.freeze({ ...failures, name: FAILURE_LIMIT_NAME, policy: `"${FAILURE_LIMIT_NAME}";q=${failures.spec.limit};w=${Math.max(1, Math.ceil(failures.spec.windowMs / 1000))}` }))
  return Object.freeze({ enforced: Object.freeze(all), shadow: Object.freeze([]), all: Object.freeze(all) })
}

/** Every plan's limits for `route`, by plan name: what a request of a consumer on that plan is checked against. */
export function compilePlanLimits (options: LimitPlanOptions, route: RouteLimitOptions): ReadonlyMap<string, RouteLimitPlan> {
  const out = new Map<string, RouteLimitPlan>()
  for (const plan of options.plans.keys()) out.set(plan, compileRouteLimitPlan(options, route, plan))
  return out
}

/** The limits a request on `route` is checked against: its consumer's plan's, or the route's own. */
export function limitsFor (route: { readonly limits: RouteLimitPlan, readonly planLimits: ReadonlyMap<string, RouteLimitPlan> }, plan: string | null): RouteLimitPlan {
  return plan === null ? route.limits : (route.planLimits.get(plan) ?? route.limits)
}
