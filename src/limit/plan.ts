// Turns the limits of gateway.yaml into per-route plans at load time, so a request only has to
// append its dimension value to a precomputed key base.
import { createHash } from 'node:crypto'
import type { LimitConfig, GatewayConfig, QuotaConfig, RouteConfig } from '../config/schema.js'
import { BUCKET_ALGORITHMS } from '../config/schema.js'
import { parseDuration } from '../config/units.js'
import type { AlgorithmName, LimitCheck, LimitSpec } from './types.js'
import { escapeKeyValue } from './keys.js'
import { PERIOD_WINDOW_MS } from './algorithms/calendar-quota.js'

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

export function compileLimitSpec (scope: string, dimension: Dimension, limit: LimitConfig): LimitSpec {
  const algorithm: AlgorithmName = limit.algorithm ?? 'gcra'
  const windowMs = parseDuration(limit.window)
  const burst = BUCKET_ALGORITHMS.has(algorithm) ? (limit.burst ?? limit.limit) : limit.limit
  const maxDelayMs = limit.onLimit === 'delay' && limit.maxDelay !== undefined ? parseDuration(limit.maxDelay) : 0
  // The id changes exactly when the state's meaning changes: a reload that keeps a limit keeps
  // its keys (and so its budget); a changed limit starts fresh under new keys.
  const digest = createHash('sha256')
    .update(`${algorithm}|${limit.limit}|${windowMs}|${burst}|${maxDelayMs}`)
    .digest('base64url')
    .slice(0, 8)
  return Object.freeze({ id: `${scope}.${dimension}.${digest}`, algorithm, limit: limit.limit, windowMs, burst, maxDelayMs })
}

function planLimit (
  config: GatewayConfig,
  scope: string,
  dimension: Dimension,
  limit: LimitConfig,
  keyPrefix: string
): PlannedLimit {
  const spec = compileLimitSpec(scope, dimension, limit)
  const name = scope === GATEWAY_SCOPE ? dimension : `${scope}.${dimension}`
  const onError = limit.onError ?? config.redis?.onError ?? 'local'
  const keyBase = `${keyPrefix}:${spec.id}:`
  return Object.freeze({
    name,
    dimension,
    spec,
    cost: limit.cost ?? 1,
    shadow: limit.mode === 'shadow',
    status: limit.status ?? 429,
    onError,
    keyBase,
    policy: `"${name}";q=${spec.limit};w=${Math.max(1, Math.ceil(spec.windowMs / 1000))}`,
    fixedCheck: dimension === 'global' || dimension === 'api' ? Object.freeze({ key: keyFor(keyBase, '_'), spec, cost: limit.cost ?? 1 }) : null,
    concurrency: false
  })
}

/** The lease TTL when `redis.leaseTtl` is not given (and in process, where leases never expire). */
export const DEFAULT_LEASE_TTL_MS = 10_000

/**
 * A concurrency limit as a limit check: the lease algorithm (lua/lease.lua) with limit = the most
 * held at once and window = the lease TTL. Its key does not name the cap, so a reload that changes
 * the cap keeps counting the leases already held.
 */
function planConcurrency (config: GatewayConfig, scope: string, dimension: 'ip' | 'user' | 'route', max: number, keyPrefix: string): PlannedLimit {
  const windowMs = config.redis?.leaseTtl !== undefined ? parseDuration(config.redis.leaseTtl) : DEFAULT_LEASE_TTL_MS
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
    onError: config.redis?.onError ?? 'local',
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
 */
function planQuota (config: GatewayConfig, plan: string, quota: QuotaConfig, keyPrefix: string): PlannedLimit {
  const windowMs = PERIOD_WINDOW_MS[quota.period]
  const spec = Object.freeze({ id: `quota.${quota.period}`, algorithm: 'calendar-quota' as const, limit: quota.limit, windowMs, burst: quota.limit, maxDelayMs: 0 })
  const name = `${plan}:quota`
  return Object.freeze({
    name,
    dimension: 'quota',
    spec,
    cost: quota.cost ?? 1,
    shadow: false,
    status: quota.status ?? 429,
    onError: quota.onError ?? config.redis?.onError ?? 'local',
    concurrency: false,
    keyBase: `${keyPrefix}:${spec.id}:`,
    policy: policyOf(name, quota.limit, windowMs),
    fixedCheck: null
  })
}

/**
 * The limits of `route`; with `plan`, those of that plan's consumers (issue 9): the plan's
 * `limits.user` replaces the gateway-wide user limit, `plans.<p>.routes.<route>.user` replaces the
 * route's, and the plan's quota is one more check decided in the same all-or-nothing call.
 */
export function compileRouteLimitPlan (config: GatewayConfig, route: RouteConfig, plan?: string): RouteLimitPlan {
  const keyPrefix = config.redis?.keyPrefix ?? 'gw'
  const all: PlannedLimit[] = []
  const top = config.limits
  const p = plan === undefined ? undefined : config.plans?.[plan]
  if (top?.global !== undefined) all.push(planLimit(config, GATEWAY_SCOPE, 'global', top.global, keyPrefix))
  if (route.limits?.api !== undefined) all.push(planLimit(config, route.name, 'api', route.limits.api, keyPrefix))
  if (top?.ip !== undefined) all.push(planLimit(config, GATEWAY_SCOPE, 'ip', top.ip, keyPrefix))
  if (route.limits?.ip !== undefined) all.push(planLimit(config, route.name, 'ip', route.limits.ip, keyPrefix))
  const planUser = p?.limits?.user
  if (planUser !== undefined && plan !== undefined) {
    // scope "free:*": ":" is in no route name, so these keys are the plan's own
    const l = planLimit(config, `${plan}:${GATEWAY_SCOPE}`, 'user', planUser, keyPrefix)
    all.push(Object.freeze({ ...l, name: `${plan}:user`, policy: policyOf(`${plan}:user`, l.spec.limit, l.spec.windowMs) }))
  } else if (top?.user !== undefined) {
    all.push(planLimit(config, GATEWAY_SCOPE, 'user', top.user, keyPrefix))
  }
  const routeUser = p?.routes?.[route.name]?.user
  if (routeUser !== undefined && plan !== undefined) all.push(planLimit(config, `${plan}:${route.name}`, 'user', routeUser, keyPrefix))
  else if (route.limits?.user !== undefined) all.push(planLimit(config, route.name, 'user', route.limits.user, keyPrefix))
  const quota = p?.limits?.quota
  if (quota !== undefined && plan !== undefined) all.push(planQuota(config, plan, quota, keyPrefix))
  // Leases last, in the same all-or-nothing call: a request refused by a rate limit takes none.
  const gateway = config.concurrency
  const own = route.concurrency
  if (gateway?.ip !== undefined) all.push(planConcurrency(config, GATEWAY_SCOPE, 'ip', gateway.ip, keyPrefix))
  if (gateway?.user !== undefined) all.push(planConcurrency(config, GATEWAY_SCOPE, 'user', gateway.user, keyPrefix))
  if (own?.ip !== undefined) all.push(planConcurrency(config, route.name, 'ip', own.ip, keyPrefix))
  if (own?.user !== undefined) all.push(planConcurrency(config, route.name, 'user', own.user, keyPrefix))
  if (own?.route !== undefined) all.push(planConcurrency(config, route.name, 'route', own.route, keyPrefix))
  if (all.length === 0) return EMPTY_PLAN
  return Object.freeze({
    enforced: Object.freeze(all.filter(l => !l.shadow)),
    shadow: Object.freeze(all.filter(l => l.shadow)),
    all: Object.freeze(all)
  })
}

/** What `identity.failureLimit` is when the file does not say: 10 failed checks per minute per IP. */
export const DEFAULT_FAILURE_LIMIT: LimitConfig = Object.freeze({ limit: 10, window: '1m' })
export const FAILURE_LIMIT_NAME = 'identity.failures'

/**
 * The limits a request that failed identity is charged against, in one store call: the
 * gateway-wide `ip` limit and the failed-identity budget of its IP. Empty without identity.
 */
export function compileFailurePlan (config: GatewayConfig): RouteLimitPlan {
  const identity = config.identity
  if (identity === undefined) return EMPTY_PLAN
  const keyPrefix = config.redis?.keyPrefix ?? 'gw'
  const all: PlannedLimit[] = []
  if (config.limits?.ip !== undefined && config.limits.ip.mode !== 'shadow') all.push(planLimit(config, GATEWAY_SCOPE, 'ip', config.limits.ip, keyPrefix))
  // "*identity" cannot be a route name (schema), so no route's ip limit can share these keys.
  const failures = planLimit(config, '*identity', 'ip', { ...(identity.failureLimit ?? DEFAULT_FAILURE_LIMIT), mode: 'enforce' }, keyPrefix)
  all.push(Object.freeze({ ...failures, name: FAILURE_LIMIT_NAME, policy: `"${FAILURE_LIMIT_NAME}";q=${failures.spec.limit};w=${Math.max(1, Math.ceil(failures.spec.windowMs / 1000))}` }))
  return Object.freeze({ enforced: Object.freeze(all), shadow: Object.freeze([]), all: Object.freeze(all) })
}

/** Every plan's limits for `route`, by plan name: what a request of a consumer on that plan is checked against. */
export function compilePlanLimits (config: GatewayConfig, route: RouteConfig): ReadonlyMap<string, RouteLimitPlan> {
  const out = new Map<string, RouteLimitPlan>()
  for (const plan of Object.keys(config.plans ?? {})) out.set(plan, compileRouteLimitPlan(config, route, plan))
  return out
}

/** The limits a request on `route` is checked against: its consumer's plan's, or the route's own. */
export function limitsFor (route: { readonly limits: RouteLimitPlan, readonly planLimits: ReadonlyMap<string, RouteLimitPlan> }, plan: string | null): RouteLimitPlan {
  return plan === null ? route.limits : (route.planLimits.get(plan) ?? route.limits)
}
