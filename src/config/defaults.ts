// The one place where defaults are applied. Its output, the resolved config, is what the gateway
// runs and what /config shows (redacted): every key that has a default is written in, and the
// whole object is frozen, so no later stage can disagree about what an absent key meant.
import type { CompressionConfig, GatewayConfig, HealthCheckInput, LimitConfig, QuotaConfig, RedisConfig, RouteConfig } from './schema.js'
import { BUCKET_ALGORITHMS, DEFAULT_HEALTH_INTERVAL } from './schema.js'
import { parseDuration, parseSize } from './units.js'
import { DEFAULT_REDACT_QUERY } from '../log.js'
// Values a stage also falls back to when used on its own: defined there once, applied here.
import { DEFAULT_IPV6_PREFIX } from '../identify/client-ip.js'
import { DEFAULT_JWT_CLAIM, DEFAULT_JWT_HEADER } from '../identify/identity.js'
import { DEFAULT_COMPRESSED_TYPES, type CompressionOptions } from '../proxy/compression.js'
import { DEFAULT_RESPOND_TYPE } from '../proxy/respond.js'
import { DEFAULT_CONSECUTIVE_FAILURES, DEFAULT_MAX_PENDING, DEFAULT_RETRIES } from '../proxy/upstream-pool.js'
import { DEFAULT_RETRY_BUDGET, DEFAULT_RETRY_ON, MAX_BACKOFF_MS, type RetryBudget, type RetryCondition, type StatusGroup } from '../proxy/retry-policy.js'

export const DEFAULT_LISTEN = '0.0.0.0:8080'
export const DEFAULT_ADMIN = '127.0.0.1:9901'
/** Keys held in process by the local level, the deny cache and the in-process store. */
export const DEFAULT_MAX_KEYS = 100_000
export const DEFAULT_KEY_PREFIX = 'gw'
export const DEFAULT_ON_ERROR = 'local'
/** How long a connection that owes a PROXY protocol header may take to send it. */
export const DEFAULT_PROXY_PROTOCOL_TIMEOUT = '5s'
/** How long a browser may reuse a preflight's answer (routes.X.cors.maxAge). */
export const DEFAULT_CORS_MAX_AGE = '10m'
/** `redis.leaseTtl`; also the bookkeeping pace of in-process leases (which never expire). */
export const DEFAULT_LEASE_TTL = '10s'
/** What `identity.failureLimit` is when the file does not say: 10 failed checks per minute per IP. */
export const DEFAULT_FAILURE_LIMIT: LimitConfig = Object.freeze({ limit: 10, window: '1m' })

type Filled<T, K extends keyof T> = Omit<T, K> & { [P in K]-?: Exclude<T[P], undefined> }

export type ResolvedLimit = Filled<LimitConfig, 'algorithm' | 'cost' | 'mode' | 'status' | 'onError'>
export type ResolvedQuota = Filled<QuotaConfig, 'cost' | 'status' | 'onError'>
export type ResolvedRedis = Filled<RedisConfig, 'tls' | 'sentinelTls' | 'keyPrefix' | 'timeout' | 'onError' | 'autoPipelining' | 'leaseTtl' | 'expectedInstances'>
export interface ResolvedTarget { url: string, weight: number }
export interface ResolvedUpstream {
  targets: ResolvedTarget[]
  timeouts: { connect: string, response: string, idle: string, queue: string }
  ejectFor: string
  consecutiveFailures: number
  failureStatuses: Array<number | StatusGroup>
  maxConnections: number
  maxPending: number
  retries: number
  retryOn: RetryCondition[]
  retryBudget: RetryBudget
  /** Absent: a retry is sent at once. */
  retryBackoff?: ResolvedRetryBackoff
  healthCheck?: ResolvedHealthCheck
}
export interface ResolvedRetryBackoff { base: string, max: string, retryAfter?: string }
export interface ResolvedHealthCheck {
  path: string
  interval: string
  timeout: string
  unhealthyAfter: number
  healthyAfter: number
  host?: string
  expectStatus: Array<number | string>
}
/** healthCheck.timeout when not configured: 2s, or half an interval shorter than 4s (a probe ends before the next). */
export const DEFAULT_HEALTH_TIMEOUT_MS = 2000
/** healthCheck.unhealthyAfter and healthyAfter when not configured. */
export const DEFAULT_HEALTH_RUN = 2
/** healthCheck.expectStatus when not configured: what a proxy or load balancer calls a success. */
export const DEFAULT_EXPECT_STATUS = '200-399'
export interface ResolvedRouteLimits { api?: ResolvedLimit, ip?: ResolvedLimit, user?: ResolvedLimit }
/** A route's `cors` with its plain defaults written in (methods and headers: absent mirrors the preflight's). */
export type ResolvedCors = NonNullable<RouteConfig['cors']> & { exposeHeaders: string[], credentials: boolean, maxAge: string }
export type ResolvedRoute = Filled<Omit<RouteConfig, 'limits' | 'timeouts' | 'compression' | 'retryBackoff' | 'cors'>, 'websocket' | 'caseInsensitive' | 'matchTrailingSlash' | 'allowPathParams'> & {
  cors?: ResolvedCors
  timeouts: { response: string }
  /** Absent: the upstream's; false: this route's retries are sent at once. */
  retryBackoff?: ResolvedRetryBackoff | false
  /** null: the route's responses pass uncompressed. */
  compression: CompressionOptions | null
  limits?: ResolvedRouteLimits
}
type IdentityConfig = NonNullable<GatewayConfig['identity']>
type JwtConfig = Extract<IdentityConfig, { jwt: unknown }>['jwt']
export type ResolvedIdentity =
  | (Omit<Extract<IdentityConfig, { header: string }>, 'required' | 'failureLimit'> & { required: boolean, failureLimit: ResolvedLimit })
  | (Omit<Extract<IdentityConfig, { apiKeys: unknown }>, 'required' | 'failureLimit'> & { required: boolean, failureLimit: ResolvedLimit })
  | { jwt: Filled<JwtConfig, 'claim' | 'header'>, required: boolean, failureLimit: ResolvedLimit }
export interface ResolvedPlan {
  limits?: { user?: ResolvedLimit, quota?: ResolvedQuota }
  routes?: Record<string, { user: ResolvedLimit }>
}
type ServerConfig = NonNullable<GatewayConfig['server']>
/** maxConnections null: half the open-file limit, read where the runtime is compiled. */
export type ResolvedServer = Required<Omit<ServerConfig, 'bufferBodies' | 'bufferBodiesTotal' | 'maxConnections' | 'maxConnectionsPerClient'>> & { bufferBodies: number, bufferBodiesTotal: number, maxConnections: number | null, maxConnectionsPerClient: number | null }

/** gateway.yaml with every default written in (frozen). */
export type ResolvedConfig = Omit<GatewayConfig,
'listen' | 'admin' | 'workers' | 'trustedProxies' | 'ipv6Prefix' | 'legacyHeaders' | 'routing' | 'log' | 'server' | 'redis' |
'tracing' | 'identity' | 'local' | 'limits' | 'plans' | 'upstreams' | 'routes' | 'compression' | 'proxyProtocol'> & {
  listen: string
  admin: string | { listen: string, token?: string, reads: 'open' | 'token' }
  proxyProtocol?: NonNullable<GatewayConfig['proxyProtocol']> & { timeout: string }
  workers: number
  trustedProxies: string[]
  ipv6Prefix: number
  legacyHeaders: boolean
  routing: { caseInsensitive: boolean, matchTrailingSlash: boolean, allowPathParams: boolean }
  log: { level: NonNullable<NonNullable<GatewayConfig['log']>['level']>, redactQuery: string[] }
  server: ResolvedServer
  redis?: ResolvedRedis
  tracing?: { otlp: string, serviceName: string }
  identity?: ResolvedIdentity
  local?: Required<NonNullable<GatewayConfig['local']>>
  limits?: { global?: ResolvedLimit, ip?: ResolvedLimit, user?: ResolvedLimit }
  plans?: Record<string, ResolvedPlan>
  upstreams: Record<string, ResolvedUpstream>
  routes: ResolvedRoute[]
  compression?: CompressionOptions
}

function limit (l: LimitConfig, onError: ResolvedLimit['onError']): ResolvedLimit {
  const algorithm = l.algorithm ?? 'gcra'
  return {
    ...l,
    algorithm,
    ...(BUCKET_ALGORITHMS.has(algorithm) ? { burst: l.burst ?? l.limit } : {}),
    cost: l.cost ?? 1,
    mode: l.mode ?? 'enforce',
    status: l.status ?? 429,
    onError: l.onError ?? onError
  }
}

function limitSet<K extends string> (set: Partial<Record<K, LimitConfig>> | undefined, onError: ResolvedLimit['onError']): Partial<Record<K, ResolvedLimit>> | undefined {
  if (set === undefined) return undefined
  const out: Partial<Record<K, ResolvedLimit>> = {}
  for (const [k, v] of Object.entries(set) as Array<[K, LimitConfig | undefined]>) if (v !== undefined) out[k] = limit(v, onError)
  return out
}

/** A target as its origin (a path is a located error at load; an unparsable URL is kept for that check). */
function origin (url: string): string {
  try {
    return new URL(url).origin
  } catch {
    return url
  }
}

/** ms as /config shows a duration: "2s" when whole seconds, "750ms" otherwise. */
function durationText (ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`
}

function healthCheck (check: HealthCheckInput): ResolvedHealthCheck {
  const interval = check.interval ?? DEFAULT_HEALTH_INTERVAL
  const timeout = check.timeout ?? durationText(Math.min(DEFAULT_HEALTH_TIMEOUT_MS, Math.floor(parseDuration(interval) / 2)))
  return {
    path: check.path,
    interval,
    timeout,
    unhealthyAfter: check.unhealthyAfter ?? DEFAULT_HEALTH_RUN,
    healthyAfter: check.healthyAfter ?? DEFAULT_HEALTH_RUN,
    ...(check.host !== undefined ? { host: check.host } : {}),
    expectStatus: check.expectStatus === undefined ? [DEFAULT_EXPECT_STATUS] : Array.isArray(check.expectStatus) ? check.expectStatus : [check.expectStatus]
  }
}

/** retryBackoff.max when not configured: Envoy's, 10 times base (at most MAX_BACKOFF_MS). */
const DEFAULT_BACKOFF_MAX_FACTOR = 10

/** An upstream's or a route's retryBackoff as /config shows it: max filled in. */
function retryBackoff (backoff: { base: string, max?: string | undefined, retryAfter?: string | undefined }): ResolvedRetryBackoff {
  const max = backoff.max ?? durationText(Math.min(MAX_BACKOFF_MS, DEFAULT_BACKOFF_MAX_FACTOR * parseDuration(backoff.base)))
  return backoff.retryAfter === undefined ? { base: backoff.base, max } : { base: backoff.base, max, retryAfter: backoff.retryAfter }
}

function upstream (up: GatewayConfig['upstreams'][string]): ResolvedUpstream {
  return {
    targets: up.targets.map(t => typeof t === 'string' ? { url: origin(t), weight: 1 } : { url: origin(t.url), weight: t.weight ?? 1 }),
    timeouts: { connect: up.timeouts?.connect ?? '2s', response: up.timeouts?.response ?? '30s', idle: up.timeouts?.idle ?? '1m', queue: up.timeouts?.queue ?? '10s' },
    ejectFor: up.ejectFor ?? '10s',
    consecutiveFailures: up.consecutiveFailures ?? DEFAULT_CONSECUTIVE_FAILURES,
    failureStatuses: [...(up.failureStatuses ?? [])],
    maxConnections: up.maxConnections ?? 256,
    maxPending: up.maxPending ?? DEFAULT_MAX_PENDING,
    retries: up.retries ?? DEFAULT_RETRIES,
    retryOn: [...(up.retryOn ?? DEFAULT_RETRY_ON)],
    retryBudget: { percent: up.retryBudget?.percent ?? DEFAULT_RETRY_BUDGET.percent, minConcurrent: up.retryBudget?.minConcurrent ?? DEFAULT_RETRY_BUDGET.minConcurrent },
    ...(up.retryBackoff !== undefined ? { retryBackoff: retryBackoff(up.retryBackoff) } : {}),
    ...(up.healthCheck !== undefined ? { healthCheck: healthCheck(up.healthCheck) } : {})
  }
}

/**
 * The failure budget falls back to this instance's share when Redis is away, whatever
 * `redis.onError` says: under `allow` (or `deny`, whose 503 a failed identity never gave) every
 * guess got its 401 and no budget held while Redis was down. Set `failureLimit.onError` to choose.
 */
function identity (id: IdentityConfig): ResolvedIdentity {
  const common = { required: id.required ?? false, failureLimit: limit(id.failureLimit ?? DEFAULT_FAILURE_LIMIT, 'local') }
  if ('jwt' in id) return { ...id, ...common, jwt: { ...id.jwt, claim: id.jwt.claim ?? DEFAULT_JWT_CLAIM, header: id.jwt.header ?? DEFAULT_JWT_HEADER } }
  return { ...id, ...common }
}

/** `compression:` (or a route's) with every key filled, on top of `base` (the gateway-wide one). */
function compression (c: CompressionConfig | undefined, base: CompressionOptions | undefined): CompressionOptions {
  return {
    encodings: c?.encodings ?? base?.encodings ?? ['br', 'gzip'],
    // nginx's gzip_min_length is 20 bytes, Traefik's minResponseBodyBytes 1024: below a packet's
    // worth the coding's own bytes and CPU buy nothing
    minSize: c?.minSize !== undefined ? parseSize(c.minSize) : base?.minSize ?? 1024,
    types: c?.types ?? base?.types ?? [...DEFAULT_COMPRESSED_TYPES],
    // CPU per response matters at the edge: gzip 5 is within a few percent of 9's size at a
    // fraction of its time, Brotli 4 smaller than gzip 5 at about its speed (Cloudflare's choice)
    gzipLevel: c?.gzipLevel ?? base?.gzipLevel ?? 5,
    // 256 encoders: at most about 330 MB however many slow readers ask for compressed answers
    maxConcurrent: c?.maxConcurrent ?? base?.maxConcurrent ?? 256,
    brotliQuality: c?.brotliQuality ?? base?.brotliQuality ?? 4
  }
}

/** A route's compression: off, the gateway-wide one, or its own keys over the gateway-wide ones. */
function routeCompression (own: RouteConfig['compression'], gatewayWide: CompressionOptions | undefined): CompressionOptions | null {
  if (own === false) return null
  if (own === undefined) return gatewayWide ?? null
  return own === true ? gatewayWide ?? compression(undefined, undefined) : compression(own, gatewayWide)
}

/** Applies every default of gateway.yaml, once; the result is deeply frozen. */
export function applyDefaults (c: GatewayConfig): ResolvedConfig {
  const onError = c.redis?.onError ?? DEFAULT_ON_ERROR
  const gatewayCompression = c.compression === undefined ? undefined : compression(c.compression, undefined)
  const routing = {
    caseInsensitive: c.routing?.caseInsensitive ?? false,
    matchTrailingSlash: c.routing?.matchTrailingSlash ?? false,
    allowPathParams: c.routing?.allowPathParams ?? false
  }
  const upstreams = Object.fromEntries(Object.entries(c.upstreams).map(([name, up]) => [name, upstream(up)]))
  const s = c.server
  const limits = limitSet(c.limits, onError)
  const resolved: ResolvedConfig = {
    ...c,
    listen: c.listen ?? DEFAULT_LISTEN,
    admin: typeof c.admin === 'object' ? { ...c.admin, listen: c.admin.listen ?? DEFAULT_ADMIN, reads: c.admin.reads ?? 'open' } : (c.admin ?? DEFAULT_ADMIN),
    workers: c.workers ?? 1,
    trustedProxies: c.trustedProxies ?? [],
    ipv6Prefix: c.ipv6Prefix ?? DEFAULT_IPV6_PREFIX,
    legacyHeaders: c.legacyHeaders ?? false,
    routing,
    log: { level: c.log?.level ?? 'info', redactQuery: [...(c.log?.redactQuery ?? DEFAULT_REDACT_QUERY)] },
    server: {
      headersTimeout: s?.headersTimeout ?? '10s',
      requestTimeout: s?.requestTimeout ?? '5m',
      keepAliveTimeout: s?.keepAliveTimeout ?? '5s',
      maxHeaderSize: s?.maxHeaderSize ?? 16_384,
      // Envoy's default; node:http's own 2000 drops the fields beyond it silently
      maxHeadersCount: s?.maxHeadersCount ?? 100,
      shutdownTimeout: s?.shutdownTimeout ?? '10s',
      // nginx's defaults: client_body_timeout and send_timeout 60 s; bodies are buffered by default
      bufferBodies: s?.bufferBodies !== undefined ? parseSize(s.bufferBodies) : 1024 * 1024,
      bufferBodiesTotal: s?.bufferBodiesTotal !== undefined ? parseSize(s.bufferBodiesTotal) : 64 * 1024 * 1024,
      clientBodyTimeout: s?.clientBodyTimeout ?? '1m',
      sendTimeout: s?.sendTimeout ?? '1m',
      // Envoy's default idle timeout for upgraded connections; the cap keeps tunnels (which outlive
      // every request timeout) from holding every file descriptor
      websocketIdleTimeout: s?.websocketIdleTimeout ?? '5m',
      // null: half the open-file limit, read where the runtime is compiled (src/runtime.ts)
      maxConnections: s?.maxConnections ?? null,
      // null: no cap per client (nginx's limit_conn is off until configured): clients behind one NAT share an address
      maxConnectionsPerClient: s?.maxConnectionsPerClient ?? null,
      maxWebSockets: s?.maxWebSockets ?? 10_000,
      // nginx's underscores_in_headers off
      underscoresInHeaders: s?.underscoresInHeaders ?? false
    },
    upstreams,
    routes: c.routes.map(r => ({
      ...r,
      websocket: r.websocket ?? false,
      caseInsensitive: r.caseInsensitive ?? routing.caseInsensitive,
      matchTrailingSlash: r.matchTrailingSlash ?? routing.matchTrailingSlash,
      allowPathParams: r.allowPathParams ?? routing.allowPathParams,
      compression: routeCompression(r.compression, gatewayCompression),
      // the default that holds when identity is configured (a route's auth means nothing without it)
      ...(r.auth === undefined && c.identity !== undefined ? { auth: c.identity.required === true ? 'required' : 'optional' } : {}),
      ...(r.cors !== undefined ? { cors: { ...r.cors, exposeHeaders: r.cors.exposeHeaders ?? [], credentials: r.cors.credentials ?? false, maxAge: r.cors.maxAge ?? DEFAULT_CORS_MAX_AGE } } : {}),
      // the type an answer with a body is sent with (one without a body is sent without one)
      ...(r.respond !== undefined && r.respond.contentType === undefined && (r.respond.body ?? '') !== '' ? { respond: { ...r.respond, contentType: DEFAULT_RESPOND_TYPE } } : {}),
      // hasOwn: an unknown upstream named like an Object property ("constructor") is reported, not read
      timeouts: { response: r.timeouts?.response ?? (r.upstream !== undefined && Object.hasOwn(upstreams, r.upstream) ? upstreams[r.upstream]?.timeouts.response : undefined) ?? '30s' },
      ...(r.limits !== undefined ? { limits: limitSet(r.limits, onError) } : {}),
      ...(r.retryBackoff !== undefined ? { retryBackoff: r.retryBackoff === false ? false : retryBackoff(r.retryBackoff) } : {})
    })) as ResolvedRoute[]
  } as ResolvedConfig
  if (c.redis !== undefined) {
    resolved.redis = {
      ...c.redis,
      tls: c.redis.tls ?? false,
      sentinelTls: c.redis.sentinelTls ?? false,
      keyPrefix: c.redis.keyPrefix ?? DEFAULT_KEY_PREFIX,
      timeout: c.redis.timeout ?? '50ms',
      onError,
      autoPipelining: c.redis.autoPipelining ?? false,
      leaseTtl: c.redis.leaseTtl ?? DEFAULT_LEASE_TTL,
      expectedInstances: c.redis.expectedInstances ?? 1
    }
  }
  if (c.proxyProtocol !== undefined) resolved.proxyProtocol = { ...c.proxyProtocol, timeout: c.proxyProtocol.timeout ?? DEFAULT_PROXY_PROTOCOL_TIMEOUT }
  if (gatewayCompression !== undefined) resolved.compression = gatewayCompression
  if (c.identity !== undefined) resolved.identity = identity(c.identity)
  if (c.tracing !== undefined) resolved.tracing = { ...c.tracing, serviceName: c.tracing.serviceName ?? 'edge-gateway' }
  if (c.local !== undefined) resolved.local = { ...c.local, burst: c.local.burst ?? c.local.limit, maxKeys: c.local.maxKeys ?? DEFAULT_MAX_KEYS }
  if (limits !== undefined) resolved.limits = limits
  if (c.plans !== undefined) {
    resolved.plans = Object.fromEntries(Object.entries(c.plans).map(([name, p]) => {
      const plan: ResolvedPlan = {}
      if (p.limits !== undefined) {
        plan.limits = {
          ...(p.limits.user !== undefined ? { user: limit(p.limits.user, onError) } : {}),
          ...(p.limits.quota !== undefined ? { quota: { ...p.limits.quota, cost: p.limits.quota.cost ?? 1, status: p.limits.quota.status ?? 429, onError: p.limits.quota.onError ?? onError } } : {})
        }
      }
      if (p.routes !== undefined) plan.routes = Object.fromEntries(Object.entries(p.routes).map(([route, o]) => [route, { user: limit(o.user, onError) }]))
      return [name, plan]
    }))
  }
  return deepFreeze(resolved)
}

/**
 * What the limit state uses when `redis:` or `local:` is absent (and so cannot hold a default):
 * the key prefix and onError of the in-process store, its lease pace, the in-process key cap.
 */
export function limitStateOf (config: ResolvedConfig): { keyPrefix: string, onError: ResolvedLimit['onError'], leaseTtl: string, maxKeys: number } {
  return {
    keyPrefix: config.redis?.keyPrefix ?? DEFAULT_KEY_PREFIX,
    onError: config.redis?.onError ?? DEFAULT_ON_ERROR,
    leaseTtl: config.redis?.leaseTtl ?? DEFAULT_LEASE_TTL,
    maxKeys: config.local?.maxKeys ?? DEFAULT_MAX_KEYS
  }
}

/** The admin listener's address, from either form of `admin`. */
export function adminListen (config: ResolvedConfig): string {
  return typeof config.admin === 'string' ? config.admin : config.admin.listen
}

/** `admin.token`, or null when none is configured (mutating admin endpoints then answer 403). */
export function adminToken (config: ResolvedConfig): string | null {
  return typeof config.admin === 'object' ? (config.admin.token ?? null) : null
}

/**
 * The token every admin read needs (`admin.reads: token`), or null when reads are open. Health
 * checks (/healthz, /readyz) and the page's own files stay open: see src/admin/admin-server.ts.
 */
export function adminReadToken (config: ResolvedConfig): string | null {
  return typeof config.admin === 'object' && config.admin.reads === 'token' ? (config.admin.token ?? null) : null
}

export function deepFreeze<T> (value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value)
    for (const v of Object.values(value)) deepFreeze(v)
  }
  return value
}
