// The assembler: turns the resolved config (src/config: read, substituted, validated, defaulted)
// into the frozen runtime a request looks things up in, by calling each stage's own factory with
// options in the stage's own terms: route table (src/router), client IP and identity
// (src/identify), limiter plans (src/limit), forward plans and pools (src/proxy). The stages import
// nothing from src/config; this module is where the two meet.
//
// Long-lived resources (pools, stores, the Redis client, local buckets) come from a ResourceCache
// so a reload that leaves them unchanged keeps them. Compiling changes nothing a running runtime
// uses: what must change on shared objects is applied by `commit`, once the runtime is swapped in.
// A stage that rejects its options becomes a located problem (`file:line:col key.path: message`),
// all of them reported together, like the schema's.
import { readFileSync } from 'node:fs'
import { createSecureContext } from 'node:tls'
import { X509Certificate } from 'node:crypto'
import { notFound, readFailure } from './read-bounded.js'
import { ConfigError, fileReader, type ConfigProblem, type KeyPath, type LoadedConfig } from './config/load.js'
import type { ResolvedConfig, ResolvedHealthCheck, ResolvedLimit, ResolvedRoute, ResolvedUpstream } from './config/defaults.js'
import { limitStateOf } from './config/defaults.js'
import { parseDuration, parseSize } from './config/units.js'
import { compileRouteTable, unreachableRoutes, type HeaderCondition, type RoutePattern, type RouteTable } from './router/route-table.js'
import { compileClientIpResolver, type ClientIpResolver } from './identify/client-ip.js'
import { compileIpRestriction, type AddressCheck, type IpRestriction } from './identify/ip-restriction.js'
import { compileTrustedPeer, type TrustedPeerCheck } from './proxy/trusted-peer.js'
import type { ProxyProtocolPolicy } from './identify/proxy-protocol.js'
import type { ClientCapPolicy } from './proxy/connection-cap.js'
import { compileIdentity, type ConsumerDirectory, type IdentityConfig, type IdentityResolver } from './identify/identity.js'
import { ApiKeyFileError } from './identify/api-key-file.js'
import { DEFAULT_RETRIES, UpstreamPool, type UpstreamConfig } from './proxy/upstream-pool.js'
import { compileRetryPolicy, expandStatuses, type RetryPolicy } from './proxy/retry-policy.js'
import type { HealthCheckConfig } from './proxy/health-check.js'
import { compileStaticResponse, type StaticResponse } from './proxy/respond.js'
import { compileCompression } from './proxy/compression.js'
import { compileCors, CORS_RESPONSE_FIELDS, type CompiledCors } from './router/cors.js'
import { createForwardPlan, type BodyHandling, type ForwardPlan, type TunnelHandling, type HeaderRules } from './proxy/forward.js'
import {
  compileFailurePlan, compilePlanLimits, compileRouteLimitPlan,
  type LimitPlanOptions, type LimitRule, type PlanRules, type RouteLimitOptions, type RouteLimitPlan
} from './limit/plan.js'
import { Limiter } from './limit/limiter.js'
import type { RedisTlsOptions } from './limit/redis-client.js'
import { createInProcessLevel } from './limit/memory-store.js'
import { ResourceCache } from './runtime-resources.js'
import { NOOP_TELEMETRY, type Telemetry } from './telemetry.js'
import { compileQueryRedactor, createLogger } from './log.js'
import type { RequestTracer } from './tracing.js'

/** What every route holds, whether it forwards or answers itself. */
interface RouteCommon {
  readonly name: string
  readonly host?: string
  readonly path?: string
  readonly pathPrefix?: string
  readonly methods?: readonly string[]
  readonly matchHeaders?: readonly HeaderCondition[]
  readonly caseInsensitive: boolean
  readonly matchTrailingSlash: boolean
  /** ";" (path parameters) may appear in the path; otherwise such a request gets 400. */
  readonly allowPathParams: boolean
  readonly limits: RouteLimitPlan
  /** The limits of each plan's consumers on this route (issue 9); `limitsFor` picks one. */
  readonly planLimits: ReadonlyMap<string, RouteLimitPlan>
  /** `auth` of the route; null = `identity.required` decides. */
  readonly auth: 'required' | 'optional' | 'none' | null
  /** `cors` of the route: its preflights answered by the gateway; null without. */
  readonly cors: CompiledCors | null
  /** The route's own `ipRestriction`; null without. The gateway-wide one, Runtime.ipAllowed, is asked first. */
  readonly ipAllowed: AddressCheck | null
}

/** A route that forwards to its upstream (`upstream`). */
export interface ForwardingRoute extends RouteCommon {
  readonly upstream: string
  readonly forward: ForwardPlan
  readonly respond: null
  readonly websocket: boolean
}

/** A route that answers itself (`respond`): nothing forwarded, never a WebSocket route. */
export interface RespondingRoute extends RouteCommon {
  readonly upstream: null
  readonly forward: null
  readonly respond: StaticResponse
  readonly websocket: false
}

/** `respond !== null` (or `websocket`) tells which: TypeScript narrows on either. */
export type CompiledRoute = ForwardingRoute | RespondingRoute

export interface ServerSettings {
  readonly headersTimeoutMs: number
  readonly requestTimeoutMs: number
  readonly keepAliveTimeoutMs: number
  readonly maxHeaderSize: number
  readonly maxHeadersCount: number
  readonly shutdownTimeoutMs: number
  readonly bufferBodies: number
  readonly bufferBodiesTotal: number
  readonly clientBodyTimeoutMs: number
  readonly sendTimeoutMs: number
  readonly websocketIdleTimeoutMs: number
  /** Client connections held at once; one more is closed as it arrives (src/proxy/connection-cap.ts). */
  readonly maxConnections: number
  /** Client connections one client address holds at once; null: no cap (src/proxy/connection-cap.ts). */
  readonly maxConnectionsPerClient: number | null
  readonly maxWebSockets: number
  readonly underscoresInHeaders: boolean
}

/** `tls.cert` and `tls.key` as read (and checked to form a pair) when the runtime was compiled. */
export interface TlsFiles {
  readonly cert: Buffer
  readonly key: Buffer
}

export interface Runtime {
  readonly generation: number
  readonly file: string
  readonly hash: string
  readonly loadedAt: string
  readonly config: ResolvedConfig
  readonly routes: RouteTable<CompiledRoute>
  /**
   * The routes a CORS preflight is routed among (without the conditions, which it does not carry):
   * a route with matchHeaders and no cors is left out, since the script's call may well not meet
   * them (a canary for testers), and it kept the preflight from the cors route behind it.
   */
  readonly preflightRoutes: RouteTable<CompiledRoute>
  readonly routeList: readonly CompiledRoute[]
  /**
   * The gateway-wide `ipRestriction`; null when unset. Asked before a route's own, and of what no
   * route answers (404, 405), whose answer would tell which paths exist.
   */
  readonly ipAllowed: AddressCheck | null
  /** Located warnings about a file that loads: routes no request can reach. */
  readonly warnings: readonly ConfigProblem[]
  readonly pools: ReadonlyMap<string, UpstreamPool>
  readonly limiter: Limiter
  readonly resolveClientIp: ClientIpResolver
  /** The peer is in trustedProxies: its X-Request-Id and client-address headers are kept. */
  readonly isTrustedPeer: TrustedPeerCheck
  readonly identity: IdentityResolver
  /** consumers, defaultPlan and plan names, as identity resolves them (the admin API reads it too). */
  readonly consumers: ConsumerDirectory
  /** What a request that failed identity is charged against (gateway ip limit + identity.failureLimit). */
  readonly failurePlan: RouteLimitPlan
  readonly server: ServerSettings
  /**
   * server.maxConnectionsPerClient and whom it counts: the client address as the ip limits key it
   * (an IPv6 client by ipv6Prefix); a trusted proxy's connections carry many clients and are not counted.
   */
  readonly clientConnections: ClientCapPolicy
  /** Who must open a connection with a PROXY protocol header; null: nobody (proxyProtocol unset). */
  readonly proxyProtocol: ProxyProtocolPolicy | null
  readonly trustedProxiesEmpty: boolean
  /** null: plain HTTP. */
  readonly tls: TlsFiles | null
  /**
   * Requests that started on this runtime and have not finished: a reload closes the pools
   * only this runtime used once it reaches 0 (admitted requests may not have dispatched yet).
   */
  readonly activity: { inflight: number }
  /** The access log's path with the values of `log.redactQuery` parameters replaced. */
  readonly redactQuery: (path: string) => string
  /** W3C trace context for every request; spans exported when `tracing.otlp` is set. */
  readonly tracer: RequestTracer
}

/** A runtime compiled aside, and what swapping it in changes on shared objects. */
export interface PreparedRuntime {
  readonly runtime: Runtime
  /** Applies the new settings to objects the previous runtime shares (Redis timeout, body budget). */
  commit (): void
}

export function serverSettings (config: ResolvedConfig): ServerSettings {
  const s = config.server
  return Object.freeze({
    headersTimeoutMs: parseDuration(s.headersTimeout),
    requestTimeoutMs: parseDuration(s.requestTimeout),
    keepAliveTimeoutMs: parseDuration(s.keepAliveTimeout),
    maxHeaderSize: s.maxHeaderSize,
    maxHeadersCount: s.maxHeadersCount,
    shutdownTimeoutMs: parseDuration(s.shutdownTimeout),
    bufferBodies: s.bufferBodies,
    bufferBodiesTotal: s.bufferBodiesTotal,
    clientBodyTimeoutMs: parseDuration(s.clientBodyTimeout),
    sendTimeoutMs: parseDuration(s.sendTimeout),
    websocketIdleTimeoutMs: parseDuration(s.websocketIdleTimeout),
    maxConnections: s.maxConnections ?? defaultMaxConnections(),
    maxConnectionsPerClient: s.maxConnectionsPerClient,
    maxWebSockets: s.maxWebSockets,
    underscoresInHeaders: s.underscoresInHeaders
  })
}

/** Where the open-file limit cannot be read (not Linux) or has none. */
const FALLBACK_MAX_CONNECTIONS = 10_000

/**
 * Half the open-file limit (node raises its soft limit to the hard one as it starts): the client
 * connections that exhaust it took every descriptor an upstream connection, a Redis reconnect or
 * a log reopen needs, and the gateway answered no one while it held them all.
 */
export function defaultMaxConnections (): number {
  let text: string
  try {
    text = readFileSync('/proc/self/limits', 'latin1')
  } catch {
    return FALLBACK_MAX_CONNECTIONS
  }
  const soft = Number(/^Max open files\s+(\d+)/m.exec(text)?.[1] ?? NaN)
  return Number.isFinite(soft) ? Math.max(1, Math.floor(soft / 2)) : FALLBACK_MAX_CONNECTIONS
}

function upstreamConfig (config: ResolvedConfig, name: string): UpstreamConfig {
  const up = config.upstreams[name]
  if (up === undefined) throw new Error(`unknown upstream "${name}"`)
  return Object.freeze({
    name,
    targets: Object.freeze(up.targets.map(t => Object.freeze({ url: t.url, weight: t.weight }))),
    connectTimeoutMs: parseDuration(up.timeouts.connect),
    responseTimeoutMs: parseDuration(up.timeouts.response),
    idleTimeoutMs: parseDuration(up.timeouts.idle),
    consecutiveFailures: up.consecutiveFailures,
    failureStatuses: Object.freeze(expandStatuses(up.failureStatuses)),
    ejectMs: parseDuration(up.ejectFor),
    maxConnectionsPerTarget: up.maxConnections,
    maxPending: up.maxPending,
    queueTimeoutMs: parseDuration(up.timeouts.queue),
    keepAliveTimeoutMs: 4_000,
    ...(up.healthCheck !== undefined ? { healthCheck: healthCheckConfig(up.healthCheck) } : {})
  })
}

/**
 * The route's retries: its own `retries`, `retryOn` and `retryBackoff` over its upstream's (Envoy's retry policy is
 * a route's too), the upstream's budget; a reload changes them for the requests that follow.
 */
function retryPolicy (up: ResolvedUpstream | undefined, route: ResolvedRoute): RetryPolicy {
  const backoff = route.retryBackoff ?? up?.retryBackoff
  const backoffMs = backoff === undefined || backoff === false ? null : { baseMs: parseDuration(backoff.base), maxMs: parseDuration(backoff.max), retryAfterMs: backoff.retryAfter === undefined ? null : parseDuration(backoff.retryAfter) }
  if (up === undefined) return compileRetryPolicy(route.retries ?? DEFAULT_RETRIES, route.retryOn, undefined, backoffMs)
  return compileRetryPolicy(route.retries ?? up.retries, route.retryOn ?? up.retryOn, up.retryBudget, backoffMs)
}

function healthCheckConfig (check: ResolvedHealthCheck): HealthCheckConfig {
  return Object.freeze({
    path: check.path,
    intervalMs: parseDuration(check.interval),
    timeoutMs: parseDuration(check.timeout),
    unhealthyAfter: check.unhealthyAfter,
    healthyAfter: check.healthyAfter,
    host: check.host ?? null,
    expectStatus: Object.freeze(check.expectStatus.map(statusRange))
  })
}

/** 204 -> [204, 204]; "200-399" -> [200, 399] (the schema checked the shape). */
function statusRange (spec: number | string): readonly [number, number] {
  if (typeof spec === 'number') return Object.freeze([spec, spec] as const)
  const [low, high] = spec.split('-').map(Number) as [number, number]
  return Object.freeze([low, high] as const)
}

function headerRules (rules: { set?: Record<string, string>, remove?: string[] } | undefined): HeaderRules {
  return Object.freeze({
    set: Object.freeze(Object.entries(rules?.set ?? {}).map(([k, v]) => Object.freeze([k.toLowerCase(), v] as const))),
    remove: Object.freeze((rules?.remove ?? []).map(h => h.toLowerCase()))
  })
}

/**
 * A CORS route's response rules: the upstream's Access-Control-* fields dropped (the gateway writes
 * them for an allowed origin), and `Vary: Origin` added beside the upstream's own Vary when the
 * answer depends on the origin.
 */
function withCorsFields (rules: HeaderRules, cors: CompiledCors | null): HeaderRules {
  if (cors === null) return rules
  return Object.freeze({
    set: rules.set,
    remove: Object.freeze([...rules.remove, ...CORS_RESPONSE_FIELDS]),
    ...(cors.variesByOrigin ? { append: Object.freeze([Object.freeze(['vary', 'Origin'] as const)]) } : {})
  })
}

function ipRestrictionOf (r: { allow?: string[], deny?: string[] } | undefined): IpRestriction | null {
  return r === undefined ? null : { allow: r.allow ?? null, deny: r.deny ?? [] }
}

/** The matching part of a route, in the form the route table indexes (lowercase host, uppercase methods). */
function routePattern (route: ResolvedRoute): RoutePattern & { readonly caseInsensitive: boolean, readonly matchTrailingSlash: boolean } {
  return {
    name: route.name,
    caseInsensitive: route.caseInsensitive,
    matchTrailingSlash: route.matchTrailingSlash,
    ...(route.host !== undefined ? { host: route.host.toLowerCase() } : {}),
    ...(route.path !== undefined ? { path: route.path } : {}),
    ...(route.pathPrefix !== undefined ? { pathPrefix: route.pathPrefix } : {}),
    ...(route.methods !== undefined ? { methods: Object.freeze(route.methods.map(m => m.toUpperCase())) } : {}),
    ...(route.matchHeaders !== undefined ? { matchHeaders: Object.freeze(Object.entries(route.matchHeaders).map(headerCondition)) } : {})
  }
}

function headerCondition ([name, wanted]: [string, string | string[] | boolean]): HeaderCondition {
  return Object.freeze({
    name: name.toLowerCase(),
    present: wanted !== false,
    values: typeof wanted === 'boolean' ? null : Object.freeze(typeof wanted === 'string' ? [wanted] : [...wanted])
  })
}

/** A limit of the config in the limit stage's terms. */
export function limitRule (l: ResolvedLimit): LimitRule {
  const bucket = l.algorithm === 'gcra' || l.algorithm === 'token-bucket' || l.algorithm === 'leaky-bucket'
  return Object.freeze({
    algorithm: l.algorithm,
    limit: l.limit,
    windowMs: parseDuration(l.window),
    burst: bucket ? (l.burst ?? l.limit) : l.limit,
    maxDelayMs: l.onLimit === 'delay' && l.maxDelay !== undefined ? parseDuration(l.maxDelay) : 0,
    cost: l.cost,
    shadow: l.mode === 'shadow',
    status: l.status,
    onError: l.onError
  })
}

const ruleOrNull = (l: ResolvedLimit | undefined): LimitRule | null => l === undefined ? null : limitRule(l)

/** The gateway-wide limit settings every route's plan starts from. */
export function limitPlanOptions (config: ResolvedConfig): LimitPlanOptions {
  const plans = new Map<string, PlanRules>()
  for (const [name, p] of Object.entries(config.plans ?? {})) {
    const quota = p.limits?.quota
    plans.set(name, Object.freeze({
      user: ruleOrNull(p.limits?.user),
      quota: quota === undefined ? null : Object.freeze({ period: quota.period, limit: quota.limit, cost: quota.cost, status: quota.status, onError: quota.onError }),
      routes: new Map(Object.entries(p.routes ?? {}).map(([route, o]) => [route, limitRule(o.user)]))
    }))
  }
  const state = limitStateOf(config)
  return Object.freeze({
    keyPrefix: state.keyPrefix,
    leaseOnError: state.onError,
    leaseTtlMs: parseDuration(state.leaseTtl),
    quotaTimezone: config.quotaTimezone ?? null,
    global: ruleOrNull(config.limits?.global),
    ip: ruleOrNull(config.limits?.ip),
    user: ruleOrNull(config.limits?.user),
    concurrency: Object.freeze({ ip: config.concurrency?.ip ?? null, user: config.concurrency?.user ?? null }),
    plans,
    failureLimit: config.identity === undefined ? null : limitRule(config.identity.failureLimit)
  })
}

export function routeLimitOptions (route: ResolvedRoute): RouteLimitOptions {
  return Object.freeze({
    name: route.name,
    api: ruleOrNull(route.limits?.api),
    ip: ruleOrNull(route.limits?.ip),
    user: ruleOrNull(route.limits?.user),
    concurrency: Object.freeze({ ip: route.concurrency?.ip ?? null, user: route.concurrency?.user ?? null, route: route.concurrency?.route ?? null })
  })
}

/** The limits of `route` (for the consumers of `plan`) as the runtime compiles them. */
export function routeLimitPlan (config: ResolvedConfig, route: ResolvedRoute, plan?: string): RouteLimitPlan {
  return compileRouteLimitPlan(limitPlanOptions(config), routeLimitOptions(route), plan)
}

/** `consumers`, `defaultPlan` and `plans` in the form identity resolution looks them up. */
export function consumerDirectory (config: ResolvedConfig): ConsumerDirectory {
  return Object.freeze({
    plans: new Map(Object.entries(config.consumers ?? {}).map(([name, c]) => [name, c.plan])),
    defaultPlan: config.defaultPlan ?? null,
    known: new Set(Object.keys(config.plans ?? {}))
  })
}

/** The identity stage's options: the config's, less what only the limit stage reads. */
function identityOptions (config: ResolvedConfig): IdentityConfig | undefined {
  const id = config.identity
  if (id === undefined) return undefined
  if ('header' in id) return { header: id.header, required: id.required }
  if ('apiKeys' in id) return { apiKeys: id.apiKeys, required: id.required }
  return { jwt: id.jwt, required: id.required }
}

/**
 * Collects located problems: a stage that throws while compiling is reported at the key path of
 * the options it was given, and compiling goes on so that every problem is reported at once.
 */
class Problems {
  readonly list: ConfigProblem[] = []
  constructor (private readonly loaded: LoadedConfig) {}

  at (path: KeyPath, err: unknown, strip = ''): void {
    if (err instanceof ConfigError || err instanceof ApiKeyFileError) {
      this.list.push(...err.problems)
      return
    }
    let message = err instanceof Error ? err.message : String(err)
    if (strip !== '' && message.startsWith(strip)) message = message.slice(strip.length)
    this.list.push(this.loaded.problemAt(path, message))
  }

  try<T> (path: KeyPath, build: () => T, strip?: string): T | null {
    try {
      return build()
    } catch (err) {
      this.at(path, err, strip)
      return null
    }
  }

  async tryAsync<T> (path: KeyPath, build: () => Promise<T>, strip?: string): Promise<T | null> {
    try {
      return await build()
    } catch (err) {
      this.at(path, err, strip)
      return null
    }
  }
}

/** The route table, with each route's host, path and methods checked alone first to locate a refusal. */
function compileRoutes (problems: Problems, patterns: ReadonlyArray<RoutePattern>): void {
  patterns.forEach((pattern, i) => {
    for (const field of ['host', 'path', 'pathPrefix', 'methods'] as const) {
      if (pattern[field] === undefined) continue
      // the route table names a route "routes[0] (name)" in its messages: here it is the only one
      problems.try(['routes', i, field], () => compileRouteTable([{ name: pattern.name, [field]: pattern[field] }]), `routes[0] (${pattern.name}): `)
    }
  })
  if (problems.list.length === 0) problems.try(['routes'], () => compileRouteTable(patterns))
}

/** The file `file` the config names at `path`, or null with the problem recorded there. */
async function readConfigFile (problems: Problems, path: KeyPath, file: string, readFile: (path: string) => Promise<Buffer>): Promise<Buffer | null> {
  return await problems.tryAsync(path, async () => {
    try {
      return await readFile(file)
    } catch (err) {
      // A key pasted where its file's path goes ("${TLS_KEY}") is no path: never quoted
      if (/-----BEGIN|[\r\n]/.test(file)) throw new Error('expected the path of a PEM file, not its text (which is not quoted here): write the text to a file and give its path', { cause: err })
      throw new Error(notFound(err) ? `file not found: ${file}` : `cannot read ${file}: ${readFailure(err)}`, { cause: err })
    }
  })
}

async function readTls (problems: Problems, config: ResolvedConfig, readFile: (path: string) => Promise<Buffer>): Promise<TlsFiles | null> {
  const tls = config.tls
  if (tls === undefined) return null
  const cert = await readConfigFile(problems, ['tls', 'cert'], tls.cert, readFile)
  const key = await readConfigFile(problems, ['tls', 'key'], tls.key, readFile)
  if (cert === null || key === null) return null
  // What the listener would refuse at start or on SIGHUP (not PEM, key not matching the cert)
  return problems.try(['tls'], () => {
    try {
      createSecureContext({ cert, key })
    } catch (err) {
      throw new Error(`cert and key cannot be used together: ${(err as Error).message}`, { cause: err })
    }
    return Object.freeze({ cert, key })
  })
}

/**
 * `redis.tls` with the files it names read and checked now: a CA file that is missing or not a
 * certificate would otherwise surface only as every Redis handshake failing, limits on the fallback.
 * null when a file was refused (the problem is recorded).
 */
async function readRedisTls (problems: Problems, config: ResolvedConfig, readFile: (path: string) => Promise<Buffer>): Promise<boolean | RedisTlsOptions | null> {
  const tls = config.redis?.tls
  if (tls === undefined || typeof tls === 'boolean') return tls ?? false
  const at = ['redis', 'tls']
  const ca = tls.ca === undefined ? undefined : await readConfigFile(problems, [...at, 'ca'], tls.ca, readFile)
  const cert = tls.cert === undefined ? undefined : await readConfigFile(problems, [...at, 'cert'], tls.cert, readFile)
  const key = tls.key === undefined ? undefined : await readConfigFile(problems, [...at, 'key'], tls.key, readFile)
  if (ca === null || cert === null || key === null) return null
  // createSecureContext accepts a ca that holds no certificate at all (and then trusts nothing):
  // parsing it says so at load time
  if (ca !== undefined && problems.try([...at, 'ca'], () => checkCa(ca, tls.ca as string)) === null) return null
  if (cert !== undefined && key !== undefined) {
    const paired = problems.try(at, () => {
      try {
        createSecureContext({ cert, key })
      } catch (err) {
        throw new Error(`cert and key cannot be used together: ${(err as Error).message}`, { cause: err })
      }
      return true
    })
    if (paired === null) return null
  }
  return Object.freeze({
    ...(ca !== undefined ? { ca } : {}),
    ...(cert !== undefined ? { cert } : {}),
    ...(key !== undefined ? { key } : {}),
    ...(tls.servername !== undefined ? { servername: tls.servername } : {})
  })
}

/** The first certificate of `ca` (Node reads the others when it connects), or a thrown reason. */
function checkCa (ca: Buffer, file: string): X509Certificate {
  if (!ca.includes('-----BEGIN CERTIFICATE-----')) throw new Error(`${file} holds no PEM certificate (-----BEGIN CERTIFICATE-----)`)
  try {
    return new X509Certificate(ca)
  } catch (err) {
    throw new Error(`${file} is not a PEM certificate: ${(err as Error).message}`, { cause: err })
  }
}

/**
 * Compiles `loaded` into a runtime, aside: throws ConfigError with every located problem, and
 * changes nothing the running runtime uses until `commit` (see PreparedRuntime).
 */
export async function compileRuntime (
  loaded: LoadedConfig,
  generation: number,
  resources: ResourceCache,
  telemetry: Telemetry
): Promise<PreparedRuntime> {
  const { config } = loaded
  const problems = new Problems(loaded)

  const patterns = config.routes.map(routePattern)
  compileRoutes(problems, patterns)
  config.trustedProxies.forEach((p, i) => problems.try(['trustedProxies', i], () => compileClientIpResolver({ trustedProxies: [p], ipv6Prefix: config.ipv6Prefix })))
  const resolveClientIp = problems.try(['trustedProxies'], () => compileClientIpResolver({ trustedProxies: config.trustedProxies, ipv6Prefix: config.ipv6Prefix }))
  const consumers = consumerDirectory(config)
  const identityMode = config.identity === undefined ? [] : ['header' in config.identity ? 'header' : 'apiKeys' in config.identity ? 'apiKeys' : 'jwt']
  const readNamed = fileReader(loaded)
  const identity = await problems.tryAsync(['identity', ...identityMode], async () => await compileIdentity(identityOptions(config), consumers, { headerFromTrustedPeersOnly: config.trustedProxies.length > 0, warmJwks: !resources.offline, readFile: readNamed }), 'identity: ')
  const tls = await readTls(problems, config, readNamed)
  const redisTls = await readRedisTls(problems, config, readNamed)

  const server = serverSettings(config)
  const body: BodyHandling & TunnelHandling = {
    websocketIdleTimeoutMs: server.websocketIdleTimeoutMs,
    maxWebSockets: server.maxWebSockets,
    bufferBodies: server.bufferBodies,
    bodyBudget: resources.bodyBudget(),
    clientBodyTimeoutMs: server.clientBodyTimeoutMs,
    sendTimeoutMs: server.sendTimeoutMs
  }
  const pools = new Map<string, UpstreamPool>()
  const upstreams = new Map<string, UpstreamConfig>()
  for (const name of Object.keys(config.upstreams)) {
    const up = upstreamConfig(config, name)
    const pool = problems.try(['upstreams', name], () => resources.pool(up, telemetry))
    if (pool !== null) {
      pools.set(name, pool)
      upstreams.set(name, up)
    }
  }
  const limitOptions = limitPlanOptions(config)
  const routeList: CompiledRoute[] = []
  const gatewayIpAllowed = compileIpRestriction([ipRestrictionOf(config.ipRestriction)])
  config.routes.forEach((route, i) => {
    const upstreamName = route.upstream ?? null
    const pool = upstreamName === null ? null : pools.get(upstreamName)
    const up = upstreamName === null ? null : upstreams.get(upstreamName)
    if (pool === undefined || up === undefined) return
    const cors = route.cors === undefined ? null : compileCors({
      origins: route.cors.origins,
      methods: route.cors.methods ?? null,
      headers: route.cors.headers ?? null,
      exposeHeaders: route.cors.exposeHeaders,
      credentials: route.cors.credentials,
      maxAgeS: Math.floor(parseDuration(route.cors.maxAge) / 1000)
    })
    if (cors !== null) {
      const ruled: Array<[KeyPath, string]> = [
        ...Object.keys(route.headers?.response?.set ?? {}).map((name): [KeyPath, string] => [['routes', i, 'headers', 'response', 'set', name], name]),
        ...(route.headers?.response?.remove ?? []).map((name, j): [KeyPath, string] => [['routes', i, 'headers', 'response', 'remove', j], name])
      ]
      for (const [path, name] of ruled) {
        if (CORS_RESPONSE_FIELDS.includes(name.toLowerCase())) problems.at(path, `${name} is written by the route's cors for the origins it allows: a header rule cannot set or remove it`)
      }
    }
    const forward = pool === null || up === null || upstreamName === null ? null : problems.try(['routes', i, 'headers'], () => createForwardPlan({
      ...body,
      pool,
      idleTimeoutMs: up.idleTimeoutMs ?? up.responseTimeoutMs,
      retry: retryPolicy(config.upstreams[upstreamName], route),
      stripPrefix: route.stripPrefix ?? null,
      underscoresInHeaders: server.underscoresInHeaders,
      responseTimeoutMs: parseDuration(route.timeouts.response),
      maxBodySize: route.maxBodySize !== undefined ? parseSize(route.maxBodySize) : Infinity,
      requestHeaders: headerRules(route.headers?.request),
      responseHeaders: withCorsFields(headerRules(route.headers?.response), cors),
      compression: route.compression === null ? null : compileCompression(route.compression)
    }))
    const own = routeLimitOptions(route)
    const limits = problems.try(['routes', i, 'limits'], () => ({ limits: compileRouteLimitPlan(limitOptions, own), planLimits: compilePlanLimits(limitOptions, own) }))
    const respond = route.respond === undefined ? null : compileStaticResponse(route.respond)
    // load.ts lets a route have one of upstream and respond, and websocket only with upstream
    const target = respond !== null
      ? { upstream: null, forward: null, respond, websocket: false as const }
      : forward !== null && upstreamName !== null ? { upstream: upstreamName, forward, respond: null, websocket: route.websocket } : null
    if (target === null || limits === null) return
    routeList.push(Object.freeze({
      ...(patterns[i] as RoutePattern & { caseInsensitive: boolean, matchTrailingSlash: boolean }),
      ...target,
      allowPathParams: route.allowPathParams,
      limits: limits.limits,
      planLimits: limits.planLimits,
      auth: route.auth ?? null,
      cors,
      // the route's list alone (its address cache is some 70 KB from the start): the gateway-wide
      // one is asked of every request first, and a copy of it per route held 135 MB for 2000 routes
      ipAllowed: route.ipRestriction === undefined ? null : compileIpRestriction([ipRestrictionOf(route.ipRestriction)])
    }))
  })
  const failurePlan = problems.try(['identity', 'failureLimit'], () => compileFailurePlan(limitOptions))
  if (problems.list.length > 0 || resolveClientIp === null || identity === null || failurePlan === null || redisTls === null) {
    throw new ConfigError(problems.list)
  }

  // Nothing below can refuse the config: only now are shared resources asked for.
  resources.useRedisTls(config, redisTls)
  const inProcess = resources.inProcess(config)
  const limiter = new Limiter({
    local: resources.localLevel(config),
    deny: resources.denyCache(config),
    shared: inProcess ? createInProcessLevel(resources.memoryStore(config)) : resources.redisGuard(config, telemetry),
    legacyHeaders: config.legacyHeaders,
    telemetry,
    leases: resources.leaseKeeper(config)
  })
  await resources.redisReady(config)
  const isTrustedPeer = compileTrustedPeer(config.trustedProxies)
  const runtime: Runtime = Object.freeze({
    generation,
    file: loaded.file,
    hash: loaded.hash,
    loadedAt: new Date().toISOString(),
    config,
    routes: compileRouteTable(routeList),
    preflightRoutes: compileRouteTable(routeList.filter(r => r.cors !== null || r.matchHeaders === undefined || r.matchHeaders.length === 0)),
    routeList: Object.freeze(routeList),
    ipAllowed: gatewayIpAllowed,
    warnings: Object.freeze(unreachableRoutes(patterns).map(u => loaded.problemAt(['routes', u.index, u.field], u.reason))),
    pools,
    limiter,
    resolveClientIp,
    isTrustedPeer,
    identity,
    consumers,
    failurePlan,
    server,
    clientConnections: Object.freeze({
      max: server.maxConnectionsPerClient,
      clientKey: (peer: string | undefined) => peer === undefined || isTrustedPeer(peer) ? null : resolveClientIp(peer, undefined).key
    }),
    proxyProtocol: config.proxyProtocol === undefined ? null : Object.freeze({ expects: compileTrustedPeer(config.proxyProtocol.from), timeoutMs: parseDuration(config.proxyProtocol.timeout) }),
    trustedProxiesEmpty: config.trustedProxies.length === 0,
    tls,
    activity: { inflight: 0 },
    redactQuery: compileQueryRedactor(config.log.redactQuery),
    tracer: resources.tracer(config)
  })
  return Object.freeze({ runtime, commit: () => resources.commit(config, pools.values()) })
}

/**
 * The runtime the live gateway would compile from `loaded`, compiled offline (no Redis
 * connection, no span exporter): `gateway validate` runs every check the gateway would, and
 * `gateway explain` asks the same route table, identity and plans. `close` releases it.
 */
export async function compileOffline (loaded: LoadedConfig): Promise<{ runtime: Runtime, close: () => Promise<void> }> {
  const resources = new ResourceCache(createLogger('silent'), true)
  try {
    const { runtime } = await compileRuntime(loaded, 0, resources, NOOP_TELEMETRY)
    return { runtime, close: async () => { await resources.closeAll() } }
  } catch (err) {
    await resources.closeAll()
    throw err
  }
}

/**
 * `gateway validate`: every problem the gateway would refuse `loaded` for, located (thrown), and
 * its warnings (returned); nothing is opened.
 */
export async function checkRuntime (loaded: LoadedConfig): Promise<readonly ConfigProblem[]> {
  const { runtime, close } = await compileOffline(loaded)
  await close()
  return runtime.warnings
}
