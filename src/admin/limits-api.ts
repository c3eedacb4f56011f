// The admin API of issue 9, on the admin listener:
//   GET    /limits?route=R&ip=A&user=U   every limit such a request meets, read without consuming
//   DELETE /limits?route=R&ip=A&user=U   resets them here and, over Redis pub/sub, on every instance
//                                        (&shared=true: the route's api and the global budget too)
//   GET    /consumers/NAME               plan, effective limits per route, quota used
// Mutating endpoints need `Authorization: Bearer <admin.token>`; without a configured token they
// answer 403. Reads need it with `admin.reads: token` (src/admin/admin-server.ts, refusedRead).
// The HTTP side (methods, token) is one function for every listener; what answers is a LimitsOps:
// this process's stores, or on the workers primary every worker over IPC (src/workers.ts).
import type { IncomingMessage, ServerResponse } from 'node:http'
import { createHash, timingSafeEqual } from 'node:crypto'
import { isIP } from 'node:net'
import { adminToken } from '../config/defaults.js'
import type { CompiledRoute, Runtime } from '../runtime.js'
import { ERRORS, errorBody, type ErrorCode } from '../errors.js'
import { buildChecks, denyKey } from '../limit/limiter.js'
import { keyFor, limitsFor, type PlannedLimit } from '../limit/plan.js'
import { quotaPeriodEnd } from '../limit/algorithms/calendar-quota.js'
import type { PeekResult } from '../limit/memory-store.js'
import type { ResetMessage, ResetOutcome } from '../limit/limit-admin.js'
import type { LimitCheck } from '../limit/types.js'
import type { Logger } from '../log.js'

export interface LimitsApiDeps {
  runtime (): Runtime | null
  peek (rt: Runtime, checks: readonly LimitCheck[]): Promise<PeekResult[]>
  reset (rt: Runtime, message: ResetMessage): Promise<ResetOutcome>
  readonly logger: Logger
}

type Json = (res: ServerResponse, status: number, body: unknown, headers?: Readonly<Record<string, string>>) => void

/** The first 12 hex digits of the token's SHA-256: who reset what, without logging the secret. */
export function tokenId (token: string): string {
  return createHash('sha256').update(token).digest('hex').slice(0, 12)
}

/** The token of an `Authorization: Bearer <token>` header (RFC 6750 §2.1), or null. */
export function bearerToken (req: IncomingMessage): string | null {
  const auth = req.headers.authorization
  return typeof auth === 'string' && /^bearer /i.test(auth) ? auth.slice(7).trim() : null
}

/** Compares digests, so neither the content nor the length of the token leaks through timing. */
export function tokenMatches (given: string, expected: string): boolean {
  const a = createHash('sha256').update(given).digest()
  const b = createHash('sha256').update(expected).digest()
  return timingSafeEqual(a, b)
}

/** A JSON answer of the admin API, built apart from the response so it can cross IPC. */
export interface AdminAnswer {
  readonly status: number
  readonly body: Record<string, unknown>
  readonly headers?: Readonly<Record<string, string>>
}

export function adminError (code: ErrorCode, message?: string, status?: number): AdminAnswer {
  return { status: status ?? ERRORS[code].status, body: errorBody(code, message) }
}

/** A 405 with the methods the path answers, in `Allow` (RFC 9110 §15.5.6). */
export function methodNotAllowed (path: string, allow: string): AdminAnswer {
  return { status: 405, body: errorBody('GW_ERR_METHOD_NOT_ALLOWED', `${path} answers ${allow}`), headers: { allow } }
}

/**
 * What the admin API does, given the request's query string (`route=R&ip=A&user=U`). Answered
 * from this process's stores (createLimitsOps) or, on the workers primary, by every worker.
 */
export interface LimitsOps {
  lookup (query: string): Promise<AdminAnswer>
  /** `by`: who asked (tokenId of the admin token), for the log line. */
  reset (query: string, by: string): Promise<AdminAnswer>
  consumer (name: string): Promise<AdminAnswer>
}

interface Target {
  readonly route: CompiledRoute
  readonly ip: string | null
  readonly ipKey: string | null
  readonly user: string | null
  readonly plan: string | null
  readonly limits: PlannedLimit[]
  readonly checks: LimitCheck[]
}

/** The consumer's plan as identity would resolve it (a JWT plan claim cannot be known here). */
function planOf (rt: Runtime, user: string | null): string | null {
  if (user === null) return null
  return rt.consumers.plans.get(user) ?? rt.consumers.defaultPlan
}

function target (rt: Runtime, query: URLSearchParams): Target | string {
  const routeName = query.get('route')
  if (routeName === null) return 'give ?route=NAME (and ip=ADDR, user=NAME as the request would have them)'
  const route = rt.routeList.find(r => r.name === routeName)
  if (route === undefined) return `unknown route "${routeName}"`
  const ip = query.get('ip')
  if (ip !== null && isIP(ip) === 0) return `"${ip}" is not an IP address`
  const given = query.get('user')
  if (given !== null && given.length === 0) return 'user is empty'
  const planParam = query.get('plan')
  if (planParam !== null && !rt.consumers.known.has(planParam)) return `unknown plan "${planParam}"`
  // an `auth: none` route identifies nobody: a request there meets no user limit, plan or quota
  const user = route.auth === 'none' ? null : given
  const plan = route.auth === 'none' ? null : planParam ?? planOf(rt, user)
  const ipKey = ip === null ? null : rt.resolveClientIp(ip, undefined).key
  const limits: PlannedLimit[] = []
  const checks: LimitCheck[] = []
  const add = (planned: readonly PlannedLimit[]): void => {
    // ip-keyed limits without an ip, user-keyed ones without a user: not this request's
    const kept = planned.filter(l => (l.dimension !== 'ip' || ipKey !== null))
    const built = buildChecks(kept, { route: route.name, plan: limitsFor(route, plan), ipKey: ipKey ?? '', user, requestId: 'admin' })
    built.checks.forEach((c, i) => {
      if (checks.some(k => k.key === c.key)) return
      checks.push(c)
      limits.push(built.limits[i] as PlannedLimit)
    })
  }
  add(limitsFor(route, plan).all)
  // the failed-identity budget of this IP is part of what can lock a client out
  if (ipKey !== null) add(rt.failurePlan.all)
  return { route, ip, ipKey, user, plan, limits, checks }
}

/** One limit as the admin API and the admin page show it. */
export function describeLimit (l: PlannedLimit): Record<string, unknown> {
  return {
    name: l.name,
    dimension: l.dimension,
    algorithm: l.spec.algorithm,
    limit: l.spec.limit,
    windowMs: l.spec.windowMs,
    ...(l.spec.algorithm === 'calendar-quota' ? { period: periodName(l.spec.windowMs) } : { burst: l.spec.burst }),
    cost: l.cost,
    ...(l.shadow ? { mode: 'shadow' } : {})
  }
}

/** The key of the local level's entry: a bucket of this process, named apart from Redis keys. */
const LOCAL_ENTRY_PREFIX = 'local:'

/**
 * The local level's bucket for the client's address, as a request now would find it: it runs
 * before every route's limits (a 429 whose `limit` is "local"), in this process only, so it
 * is marked `scope: "instance"` (summed over workers; never in Redis). Null without an address
 * or a local level.
 */
function localEntry (rt: Runtime, ipKey: string | null): Record<string, unknown> | null {
  const level = rt.limiter.localLevel
  if (level === null || ipKey === null) return null
  const { limit, windowMs, burst } = level.options
  const p = level.peek(ipKey, performance.now())
  return { name: 'local', dimension: 'ip', algorithm: 'token-bucket', limit, windowMs, burst, cost: 1, scope: 'instance', key: LOCAL_ENTRY_PREFIX + ipKey, remaining: p.remaining, resetMs: p.resetMs, retryAfterMs: p.retryAfterMs, deniedMs: 0 }
}

const PERIOD_NAMES: ReadonlyMap<number, string> = new Map([[3_600_000, 'hour'], [86_400_000, 'day'], [604_800_000, 'week'], [2_678_400_000, 'month']])
const periodName = (windowMs: number): string => PERIOD_NAMES.get(windowMs) ?? 'unknown'

export function createLimitsOps (deps: LimitsApiDeps): LimitsOps {
  const unavailable = (err: unknown): AdminAnswer => {
    deps.logger.warn({ err: (err as Error).message }, 'admin limits request failed')
    return adminError('GW_ERR_LIMITER_UNAVAILABLE', `the limit store did not answer: ${(err as Error).message}`)
  }
  const NOT_READY = adminError('GW_ERR_NOT_READY')
  const resolve = (query: string): { rt: Runtime, t: Target } | AdminAnswer => {
    const rt = deps.runtime()
    if (rt === null) return NOT_READY
    const t = target(rt, new URLSearchParams(query))
    return typeof t === 'string' ? adminError('GW_ERR_BAD_REQUEST', t) : { rt, t }
  }

  const lookup = async (query: string): Promise<AdminAnswer> => {
    const found = resolve(query)
    if (!('rt' in found)) return found
    const { rt, t } = found
    let peeked: PeekResult[]
    try {
      peeked = await deps.peek(rt, t.checks)
    } catch (err) {
      return unavailable(err)
    }
    const limits: Array<Record<string, unknown>> = t.limits.map((l, i) => {
      const check = t.checks[i] as LimitCheck
      const p = peeked[i] as PeekResult
      return { ...describeLimit(l), key: check.key, remaining: p.remaining, resetMs: p.resetMs, retryAfterMs: p.retryAfterMs, deniedMs: Math.ceil(rt.limiter.denied(check)) }
    })
    const local = localEntry(rt, t.ipKey)
    if (local !== null) limits.unshift(local)
    return { status: 200, body: { ...subjectOf(t), limits } }
  }

  // who an answer is about: the same four fields head a lookup and a reset
  const subjectOf = (t: { readonly route: { readonly name: string }, readonly ip: string | null, readonly user: string | null, readonly plan: string | null }): Record<string, unknown> =>
    ({ route: t.route.name, ip: t.ip, user: t.user, plan: t.plan })

  const reset = async (query: string, by: string): Promise<AdminAnswer> => {
    const found = resolve(query)
    if (!('rt' in found)) return found
    const { rt, t } = found
    const sharedParam = new URLSearchParams(query).get('shared')
    if (sharedParam !== null && sharedParam !== 'true' && sharedParam !== 'false') return adminError('GW_ERR_BAD_REQUEST', `shared is "true" or "false", got "${sharedParam}"`)
    const shared = sharedParam === 'true'
    // A concurrency lease count is the requests in flight, not a budget: reset, it would let more
    // than the cap in (a route's total cap for every client at once), and the old requests'
    // releases would then take from the new holders'. Only budgets are reset, and only the
    // client's unless `shared=true` asks for more: a `global` or `api` budget is one key shared by
    // every client, and unblocking one address (`gateway limits reset --ip A`) reset the gateway's
    // or the route's whole rate cap.
    const own = t.limits.map((l, i) => (t.checks[i] as LimitCheck).spec.algorithm !== 'lease' && (shared || (l.dimension !== 'global' && l.dimension !== 'api')))
    const budgets = t.checks.filter((_c, i) => own[i] === true)
    const message: ResetMessage = { ipKey: t.ipKey, denyKeys: budgets.map(denyKey), keys: budgets.map(c => c.key) }
    let outcome: ResetOutcome
    try {
      outcome = await deps.reset(rt, message)
    } catch (err) {
      return unavailable(err)
    }
    const done = t.limits.flatMap((l, i) => {
      const check = t.checks[i] as LimitCheck
      return own[i] === true ? [{ name: l.name, dimension: l.dimension, key: check.key }] : []
    })
    const complete = outcome.redisError === undefined
    const log = { by, route: t.route.name, ip: t.ip, user: t.user, limits: done.map(r => r.name), keysDeleted: outcome.deleted, instances: outcome.instances }
    if (complete) deps.logger.info(log, 'limits reset')
    else deps.logger.warn({ ...log, redisError: outcome.redisError }, 'limits reset in this process alone: Redis did not answer')
    return {
      status: 200,
      body: {
        ...subjectOf(t),
        reset: done,
        keysDeleted: outcome.deleted,
        localLevel: t.ipKey !== null,
        instances: outcome.instances,
        complete,
        ...(complete
          ? {}
          : { warning: `Redis did not answer (${outcome.redisError as string}): the local state and the Redis fallback were reset here, but the Redis keys may still hold the old state and other instances were not told; reset again once Redis is back` })
      }
    }
  }

  const consumer = async (name: string): Promise<AdminAnswer> => {
    const rt = deps.runtime()
    if (rt === null) return NOT_READY
    const entry = rt.consumers.plans.get(name)
    const plan = entry ?? rt.consumers.defaultPlan
    const routes: Record<string, unknown> = {}
    let quota: PlannedLimit | null = null
    for (const route of rt.routeList) {
      // an `auth: none` route identifies nobody: none of the consumer's limits apply there
      const limits = route.auth === 'none' ? [] : limitsFor(route, plan).all.filter(l => l.dimension === 'user' || l.dimension === 'quota')
      routes[route.name] = { auth: route.auth ?? (rt.config.identity?.required === true ? 'required' : 'optional'), limits: limits.map(describeLimit) }
      quota ??= limits.find(l => l.dimension === 'quota') ?? null
    }
    let quotaView: Record<string, unknown> | null = null
    if (quota !== null) {
      const check: LimitCheck = { key: keyFor(quota.keyBase, name), spec: quota.spec, cost: quota.cost }
      let p: PeekResult
      try {
        p = (await deps.peek(rt, [check]))[0] as PeekResult
      } catch (err) {
        return unavailable(err)
      }
      const end = quotaPeriodEnd(quota.spec, Date.now() * 1000)
      quotaView = { name: quota.name, limit: quota.spec.limit, period: periodName(quota.spec.windowMs), used: quota.spec.limit - p.remaining, remaining: p.remaining, resetsAt: new Date(end * 1000).toISOString(), key: check.key }
    }
    return { status: 200, body: { consumer: name, plan, planFrom: entry !== undefined ? 'consumers' : plan !== null ? 'defaultPlan' : null, routes, quota: quotaView } }
  }

  return { lookup, reset, consumer }
}

/** What the HTTP side needs besides the operations. */
export interface LimitsEndpoint {
  readonly ops: LimitsOps
  /** Why no answer can be given yet (every answer is then 503 not_ready), or null once one can. */
  notReady (): string | null
  /** The configured admin.token, or null (mutations are then refused with 403). */
  adminToken (): string | null
  readonly logger: Logger
}

/**
 * The admin API's HTTP side: paths, methods and the admin token, the same on every listener.
 * Returns false for paths it does not serve.
 */
export function serveLimitsApi (endpoint: LimitsEndpoint, json: Json): (req: IncomingMessage, res: ServerResponse) => boolean {
  const send = (res: ServerResponse, answer: AdminAnswer): void => json(res, answer.status, answer.body, answer.headers)
  const run = (res: ServerResponse, pending: Promise<AdminAnswer>): void => {
    pending.then(answer => send(res, answer), (err: unknown) => {
      endpoint.logger.warn({ err: (err as Error).message }, 'admin limits request failed')
      send(res, adminError('GW_ERR_LIMITER_UNAVAILABLE', `the limit store did not answer: ${(err as Error).message}`))
    })
  }
  return (req, res) => {
    const url = new URL(req.url ?? '/', 'http://admin')
    const path = url.pathname
    if (path !== '/limits' && !path.startsWith('/consumers/')) return false
    const notReady = endpoint.notReady()
    if (notReady !== null) {
      send(res, adminError('GW_ERR_ADMIN_NOT_READY', notReady))
      return true
    }
    // HEAD where GET is (RFC 9110 §9.3.2): the same answer, node writes no body for it
    const reads = req.method === 'GET' || req.method === 'HEAD'
    if (path === '/limits') {
      if (reads) {
        run(res, endpoint.ops.lookup(url.search))
      } else if (req.method === 'DELETE') {
        const by = authorize(req, endpoint)
        if (typeof by === 'string') run(res, endpoint.ops.reset(url.search, by))
        else send(res, by)
      } else {
        send(res, methodNotAllowed('/limits', 'GET, HEAD, DELETE'))
      }
      return true
    }
    if (!reads) {
      send(res, methodNotAllowed('/consumers/NAME', 'GET, HEAD'))
      return true
    }
    // one path segment, checked before decoding: a consumer named "acme/prod" is /consumers/acme%2Fprod
    const segment = path.slice('/consumers/'.length)
    if (segment.length === 0 || segment.includes('/')) {
      send(res, adminError('GW_ERR_NOT_FOUND', 'expected /consumers/NAME'))
      return true
    }
    let name: string
    try {
      name = decodeURIComponent(segment)
    } catch {
      send(res, adminError('GW_ERR_BAD_REQUEST', '/consumers/NAME: NAME is not valid percent-encoding'))
      return true
    }
    run(res, endpoint.ops.consumer(name))
    return true
  }
}

/** A mutation's bearer token checked: who asked (tokenId), or the refusal to send. */
function authorize (req: IncomingMessage, endpoint: LimitsEndpoint): string | AdminAnswer {
  const token = endpoint.adminToken()
  if (token === null) return adminError('GW_ERR_ADMIN_FORBIDDEN', 'no admin.token is configured: DELETE /limits is disabled (set admin: { listen, token })')
  const given = bearerToken(req)
  if (given === null || !tokenMatches(given, token)) {
    endpoint.logger.warn({ remote: req.socket.remoteAddress, path: req.url }, 'admin request refused: missing or wrong token')
    return adminError('GW_ERR_ADMIN_UNAUTHORIZED')
  }
  return tokenId(given)
}

/** The admin API of one gateway process, answered from its own stores. */
export function createLimitsApi (deps: LimitsApiDeps, json: Json): (req: IncomingMessage, res: ServerResponse) => boolean {
  return serveLimitsApi({
    ops: createLimitsOps(deps),
    notReady: () => deps.runtime() === null ? ERRORS.GW_ERR_ADMIN_NOT_READY.message : null,
    adminToken: () => {
      const rt = deps.runtime()
      return rt === null ? null : adminToken(rt.config)
    },
    logger: deps.logger
  }, json)
}
