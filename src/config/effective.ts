// The config as the gateway runs it: the file with every default written in (what /config shows,
// redacted). Server and upstream settings come from compile.ts's own resolution (serverSettings,
// upstreamConfigs), so what is shown is what is in force, not a second copy of those defaults.
import type { GatewayConfig, LimitConfig } from './schema.js'
import { BUCKET_ALGORITHMS } from './schema.js'
import { serverSettings, upstreamConfigs, type ServerSettings } from './compile.js'
import { DEFAULT_FAILURE_LIMIT } from '../limit/plan.js'
import { DEFAULT_REDACT_QUERY } from '../log.js'

/** 1500 -> "1500ms", 60000 -> "1m": the schema's own duration format, exact. */
function duration (ms: number): string {
  if (ms % 3_600_000 === 0 && ms > 0) return `${ms / 3_600_000}h`
  if (ms % 60_000 === 0 && ms > 0) return `${ms / 60_000}m`
  if (ms % 1000 === 0 && ms > 0) return `${ms / 1000}s`
  return `${ms}ms`
}

function limit (l: LimitConfig, onError: string): LimitConfig {
  const algorithm = l.algorithm ?? 'gcra'
  return {
    ...l,
    algorithm,
    ...(BUCKET_ALGORITHMS.has(algorithm) ? { burst: l.burst ?? l.limit } : {}),
    cost: l.cost ?? 1,
    mode: l.mode ?? 'enforce',
    status: l.status ?? 429,
    onError: l.onError ?? (onError as LimitConfig['onError'])
  }
}

function limits<T extends Record<string, LimitConfig | undefined>> (set: T | undefined, onError: string): T | undefined {
  if (set === undefined) return undefined
  const out: Record<string, LimitConfig> = {}
  for (const [k, v] of Object.entries(set)) if (v !== undefined) out[k] = limit(v, onError)
  return out as T
}

/** `server` is the running runtime's settings when there is one (they are what is in force). */
export function effectiveConfig (c: GatewayConfig, s: ServerSettings = serverSettings(c)): GatewayConfig {
  const onError = c.redis?.onError ?? 'local'
  const upstreams = upstreamConfigs(c)
  const identity = c.identity === undefined
    ? undefined
    : {
        ...c.identity,
        required: c.identity.required ?? false,
        failureLimit: limit(c.identity.failureLimit ?? DEFAULT_FAILURE_LIMIT, onError),
        ...('jwt' in c.identity ? { jwt: { ...c.identity.jwt, claim: c.identity.jwt.claim ?? 'sub', header: c.identity.jwt.header ?? 'authorization' } } : {})
      } as GatewayConfig['identity']
  return {
    ...c,
    listen: c.listen ?? '0.0.0.0:8080',
    admin: c.admin ?? '127.0.0.1:9901',
    workers: c.workers ?? 1,
    trustedProxies: c.trustedProxies ?? [],
    ipv6Prefix: c.ipv6Prefix ?? 64,
    legacyHeaders: c.legacyHeaders ?? false,
    log: { level: c.log?.level ?? 'info', redactQuery: [...(c.log?.redactQuery ?? DEFAULT_REDACT_QUERY)] },
    server: {
      headersTimeout: duration(s.headersTimeoutMs),
      requestTimeout: duration(s.requestTimeoutMs),
      keepAliveTimeout: duration(s.keepAliveTimeoutMs),
      maxHeaderSize: s.maxHeaderSize,
      shutdownTimeout: duration(s.shutdownTimeoutMs),
      bufferBodies: s.bufferBodies,
      bufferBodiesTotal: s.bufferBodiesTotal,
      clientBodyTimeout: duration(s.clientBodyTimeoutMs),
      sendTimeout: duration(s.sendTimeoutMs)
    },
    ...(c.redis !== undefined
      ? {
          redis: {
            ...c.redis,
            tls: c.redis.tls ?? false,
            keyPrefix: c.redis.keyPrefix ?? 'gw',
            timeout: c.redis.timeout ?? '50ms',
            onError,
            expectedInstances: c.redis.expectedInstances ?? 1
          }
        }
      : {}),
    ...(identity !== undefined ? { identity } : {}),
    ...(c.tracing !== undefined ? { tracing: { ...c.tracing, serviceName: c.tracing.serviceName ?? 'edge-gateway' } } : {}),
    ...(c.local !== undefined ? { local: { ...c.local, burst: c.local.burst ?? c.local.limit, maxKeys: c.local.maxKeys ?? 100_000 } } : {}),
    ...(c.limits !== undefined ? { limits: limits(c.limits, onError) } : {}),
    upstreams: Object.fromEntries(Object.entries(c.upstreams).map(([name, up]) => {
      const u = upstreams.get(name)
      if (u === undefined) return [name, up]
      return [name, {
        targets: u.targets.map(t => ({ url: t.url, weight: t.weight })),
        timeouts: { connect: duration(u.connectTimeoutMs), response: duration(u.responseTimeoutMs), idle: duration(u.idleTimeoutMs ?? 60_000) },
        ejectFor: duration(u.ejectMs),
        consecutiveFailures: u.consecutiveFailures ?? 5,
        maxConnections: u.maxConnectionsPerTarget
      }]
    })),
    routes: c.routes.map(r => ({
      ...r,
      websocket: r.websocket ?? false,
      timeouts: { response: r.timeouts?.response ?? duration(upstreams.get(r.upstream)?.responseTimeoutMs ?? 30_000) },
      ...(r.limits !== undefined ? { limits: limits(r.limits, onError) } : {})
    }))
  }
}
