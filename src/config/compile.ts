// Builds the frozen runtime a request looks things up in: route table, forward plans, limiter
// plans, upstream pools. Long-lived resources (pools, stores, the Redis client, local buckets)
// come from a ResourceCache so a reload that leaves them unchanged keeps them: no reconnect
// storm, no fresh budget for everyone.
import type { GatewayConfig, RouteConfig } from './schema.js'
import type { LoadedConfig } from './load.js'
import { durationOr, parseDuration, parseSize } from './units.js'
import { compileRouteTable, type RoutePattern, type RouteTable } from '../router/route-table.js'
import { compileClientIpResolver } from '../identify/client-ip.js'
import { compileTrustedPeer, type TrustedPeerCheck } from '../proxy/trusted-peer.js'
import { compileIdentity, type ConsumerDirectory, type IdentityResolver } from '../identify/identity.js'
import { UpstreamPool, type UpstreamConfig } from '../proxy/upstream-pool.js'
import { createForwardPlan, type BodyHandling, type ForwardPlan, type TunnelHandling, type HeaderRules } from '../proxy/forward.js'
import { compileFailurePlan, compilePlanLimits, compileRouteLimitPlan, type RouteLimitPlan } from '../limit/plan.js'
import { Limiter } from '../limit/limiter.js'
import { createInProcessLevel } from '../limit/memory-store.js'
import type { ResourceCache } from './resources.js'
import type { Telemetry } from '../telemetry.js'
import { compileQueryRedactor } from '../log.js'
import type { RequestTracer } from '../tracing.js'

export interface CompiledRoute {
  readonly name: string
  readonly host?: string
  readonly path?: string
  readonly pathPrefix?: string
  readonly methods?: readonly string[]
  readonly websocket: boolean
  /** ";" (path parameters) may appear in the path; otherwise such a request gets 400. */
  readonly allowPathParams: boolean
  readonly upstream: string
  readonly forward: ForwardPlan
  readonly limits: RouteLimitPlan
  /** The limits of each plan's consumers on this route (issue 9); `limitsFor` picks one. */
  readonly planLimits: ReadonlyMap<string, RouteLimitPlan>
  /** `auth` of the route; null = `identity.required` decides. */
  readonly auth: 'required' | 'optional' | 'none' | null
}

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
  readonly maxWebSockets: number
}

export interface Runtime {
  readonly generation: number
  readonly file: string
  readonly hash: string
  readonly loadedAt: string
  readonly config: GatewayConfig
  readonly routes: RouteTable<CompiledRoute>
  readonly routeList: readonly CompiledRoute[]
  readonly pools: ReadonlyMap<string, UpstreamPool>
  readonly limiter: Limiter
  readonly resolveClientIp: ReturnType<typeof compileClientIpResolver>
  /** The peer is in trustedProxies: its X-Request-Id and client-address headers are kept. */
  readonly isTrustedPeer: TrustedPeerCheck
  readonly identity: IdentityResolver
  /** consumers, defaultPlan and plan names, as identity resolves them (the admin API reads it too). */
  readonly consumers: ConsumerDirectory
  /** What a request that failed identity is charged against (gateway ip limit + identity.failureLimit). */
  readonly failurePlan: RouteLimitPlan
  readonly server: ServerSettings
  readonly trustedProxiesEmpty: boolean
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

export function serverSettings (config: GatewayConfig): ServerSettings {
  const s = config.server
  return Object.freeze({
    headersTimeoutMs: durationOr(s?.headersTimeout, 10_000),
    requestTimeoutMs: durationOr(s?.requestTimeout, 300_000),
    keepAliveTimeoutMs: durationOr(s?.keepAliveTimeout, 5_000),
    maxHeaderSize: s?.maxHeaderSize ?? 16_384,
    // Envoy's default; node:http's own 2000 drops the fields beyond it silently
    maxHeadersCount: s?.maxHeadersCount ?? 100,
    shutdownTimeoutMs: durationOr(s?.shutdownTimeout, 10_000),
    // nginx's defaults: client_body_timeout and send_timeout 60 s; bodies are buffered by default
    bufferBodies: s?.bufferBodies !== undefined ? parseSize(s.bufferBodies) : 1024 * 1024,
    bufferBodiesTotal: s?.bufferBodiesTotal !== undefined ? parseSize(s.bufferBodiesTotal) : 64 * 1024 * 1024,
    clientBodyTimeoutMs: durationOr(s?.clientBodyTimeout, 60_000),
    sendTimeoutMs: durationOr(s?.sendTimeout, 60_000),
    // Envoy's default idle timeout for upgraded connections; the cap keeps tunnels (which outlive
    // any request timeout) from holding every file descriptor
    websocketIdleTimeoutMs: durationOr(s?.websocketIdleTimeout, 300_000),
    maxWebSockets: s?.maxWebSockets ?? 10_000
  })
}

export function upstreamConfigs (config: GatewayConfig): Map<string, UpstreamConfig> {
  const out = new Map<string, UpstreamConfig>()
  for (const [name, up] of Object.entries(config.upstreams)) {
    out.set(name, Object.freeze({
      name,
      targets: Object.freeze(up.targets.map(t => typeof t === 'string'
        ? { url: new URL(t).origin, weight: 1 }
        : { url: new URL(t.url).origin, weight: t.weight ?? 1 })),
      connectTimeoutMs: durationOr(up.timeouts?.connect, 2_000),
      responseTimeoutMs: durationOr(up.timeouts?.response, 30_000),
      idleTimeoutMs: durationOr(up.timeouts?.idle, 60_000),
      consecutiveFailures: up.consecutiveFailures ?? 5,
      ejectMs: durationOr(up.ejectFor, 10_000),
      maxConnectionsPerTarget: up.maxConnections ?? 256,
      keepAliveTimeoutMs: 4_000
    }))
  }
  return out
}

function headerRules (rules: { set?: Record<string, string>, remove?: string[] } | undefined): HeaderRules {
  return Object.freeze({
    set: Object.freeze(Object.entries(rules?.set ?? {}).map(([k, v]) => Object.freeze([k.toLowerCase(), v] as const))),
    remove: Object.freeze((rules?.remove ?? []).map(h => h.toLowerCase()))
  })
}

/** The matching part of a route, in the form the route table indexes (lowercase host, uppercase methods). */
function routePattern (route: RouteConfig, defaults: GatewayConfig['routing']): RoutePattern {
  return {
    name: route.name,
    caseInsensitive: route.caseInsensitive ?? defaults?.caseInsensitive ?? false,
    matchTrailingSlash: route.matchTrailingSlash ?? defaults?.matchTrailingSlash ?? false,
    ...(route.host !== undefined ? { host: route.host.toLowerCase() } : {}),
    ...(route.path !== undefined ? { path: route.path } : {}),
    ...(route.pathPrefix !== undefined ? { pathPrefix: route.pathPrefix } : {}),
    ...(route.methods !== undefined ? { methods: Object.freeze(route.methods.map(m => m.toUpperCase())) } : {})
  }
}

/**
 * What compiling would reject beyond the located checks (route table, address lists, identity
 * keys), without opening pools or connections: `gateway validate` runs it, like `nginx -t`.
 */
export async function checkCompiles (config: GatewayConfig): Promise<void> {
  compileRouteTable(config.routes.map(r => routePattern(r, config.routing)))
  compileClientIpResolver({ trustedProxies: config.trustedProxies ?? [], ipv6Prefix: config.ipv6Prefix ?? 64 })
  await compileIdentity(config.identity, consumerDirectory(config))
}

/** `consumers`, `defaultPlan` and `plans` in the form identity resolution looks them up. */
export function consumerDirectory (config: GatewayConfig): ConsumerDirectory {
  return Object.freeze({
    plans: new Map(Object.entries(config.consumers ?? {}).map(([name, c]) => [name, c.plan])),
    defaultPlan: config.defaultPlan ?? null,
    known: new Set(Object.keys(config.plans ?? {}))
  })
}

function compileRoute (config: GatewayConfig, route: RouteConfig, pool: UpstreamPool, upstream: UpstreamConfig, body: BodyHandling & TunnelHandling): CompiledRoute {
  const forward = createForwardPlan({
    ...body,
    pool,
    idleTimeoutMs: upstream.idleTimeoutMs,
    stripPrefix: route.stripPrefix ?? null,
    responseTimeoutMs: route.timeouts?.response !== undefined ? parseDuration(route.timeouts.response) : upstream.responseTimeoutMs,
    maxBodySize: route.maxBodySize !== undefined ? parseSize(route.maxBodySize) : Infinity,
    requestHeaders: headerRules(route.headers?.request),
    responseHeaders: headerRules(route.headers?.response)
  })
  return Object.freeze({
    ...routePattern(route, config.routing),
    websocket: route.websocket === true,
    allowPathParams: route.allowPathParams ?? config.routing?.allowPathParams ?? false,
    upstream: route.upstream,
    forward,
    limits: compileRouteLimitPlan(config, route),
    planLimits: compilePlanLimits(config, route),
    auth: route.auth ?? null
  })
}

export async function compileRuntime (
  loaded: LoadedConfig,
  generation: number,
  resources: ResourceCache,
  telemetry: Telemetry
): Promise<Runtime> {
  const { config } = loaded
  const upstreams = upstreamConfigs(config)
  const pools = new Map<string, UpstreamPool>()
  for (const [name, up] of upstreams) pools.set(name, resources.pool(up, telemetry))

  const server = serverSettings(config)
  const body: BodyHandling & TunnelHandling = {
    websocketIdleTimeoutMs: server.websocketIdleTimeoutMs,
    maxWebSockets: server.maxWebSockets,
    bufferBodies: server.bufferBodies,
    bodyBudget: resources.bodyBudget(server.bufferBodiesTotal),
    clientBodyTimeoutMs: server.clientBodyTimeoutMs,
    sendTimeoutMs: server.sendTimeoutMs
  }
  const routeList = config.routes.map(r => {
    const up = upstreams.get(r.upstream) as UpstreamConfig
    return compileRoute(config, r, pools.get(r.upstream) as UpstreamPool, up, body)
  })
  const limiter = new Limiter({
    local: resources.localLevel(config),
    deny: resources.denyCache(config),
    shared: config.redis === undefined ? createInProcessLevel(resources.memoryStore(config)) : resources.redisGuard(config, telemetry),
    legacyHeaders: config.legacyHeaders === true,
    telemetry,
    leases: resources.leaseKeeper(config)
  })
  const consumers = consumerDirectory(config)
  const identity = await compileIdentity(config.identity, consumers)
  await resources.redisReady(config)
  return Object.freeze({
    generation,
    file: loaded.file,
    hash: loaded.hash,
    loadedAt: new Date().toISOString(),
    config,
    routes: compileRouteTable(routeList),
    routeList: Object.freeze(routeList),
    pools,
    limiter,
    resolveClientIp: compileClientIpResolver({ trustedProxies: config.trustedProxies ?? [], ipv6Prefix: config.ipv6Prefix ?? 64 }),
    isTrustedPeer: compileTrustedPeer(config.trustedProxies ?? []),
    identity,
    consumers,
    failurePlan: compileFailurePlan(config),
    server,
    trustedProxiesEmpty: (config.trustedProxies ?? []).length === 0,
    activity: { inflight: 0 },
    redactQuery: compileQueryRedactor(config.log?.redactQuery),
    tracer: resources.tracer(config)
  })
}
