// The admin listener, on its own address: /healthz /readyz /metrics /config.
import { createServer, type Server } from 'node:http'
import type { GatewayMetrics } from './metrics.js'
import { redactConfig } from './redact.js'
import { effectiveConfig } from '../config/effective.js'
import type { Runtime } from '../config/compile.js'
import type { RedisStatus } from '../config/resources.js'

export interface AdminSource {
  readonly runtime: Runtime | null
  readonly shuttingDown: boolean
  /** Absent on listeners that do not reload themselves (the workers primary). */
  readonly lastReload?: unknown
  readonly metrics: GatewayMetrics
  redisStatus (): RedisStatus
}

/** Admin answers: pretty JSON, never cached. Also used by the workers primary's admin listener. */
export function json (res: import('node:http').ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body, null, 2)
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' })
  res.end(text)
}

export function createAdminServer (source: AdminSource): Server {
  return createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0]
    if (req.method !== 'GET' && req.method !== 'HEAD') return json(res, 405, { error: 'GW_ERR_BAD_REQUEST', message: 'admin endpoints are read-only' })
    switch (path) {
      case '/healthz':
        return json(res, 200, { status: 'ok' })
      case '/readyz': {
        const rt = source.runtime
        const redis = source.redisStatus()
        const ready = rt !== null && !source.shuttingDown
        const redisUp = redis.connected && redis.breaker === 'closed'
        const degraded = redis.configured && !redisUp
        return json(res, ready ? 200 : 503, {
          status: !ready ? (source.shuttingDown ? 'shutting_down' : 'not_ready') : degraded ? 'degraded' : 'ready',
          generation: rt?.generation ?? null,
          redis: redis.configured ? { state: redisUp ? 'up' : 'fallback', connected: redis.connected, breaker: redis.breaker, instances: redis.instances } : { state: 'not_configured' },
          // Passive health per target: an ejected target is visible here before anyone reads a log.
          upstreams: rt === null ? {} : Object.fromEntries([...rt.pools].map(([name, pool]) => [name, pool.health()]))
        })
      }
      case '/metrics':
        source.metrics.registry.metrics().then(text => {
          res.writeHead(200, { 'content-type': source.metrics.registry.contentType })
          res.end(text)
        }, (err: unknown) => json(res, 500, { error: 'metrics_failed', message: String(err) }))
        return
      case '/config': {
        const rt = source.runtime
        if (rt === null) return json(res, 503, { error: 'not_ready' })
        // the config in force: the file with every default written in, secrets redacted
        return json(res, 200, { generation: rt.generation, hash: rt.hash, file: rt.file, loadedAt: rt.loadedAt, lastReload: source.lastReload ?? null, config: redactConfig(effectiveConfig(rt.config, rt.server)) })
      }
      default:
        return json(res, 404, { error: 'GW_ERR_NOT_FOUND', message: 'admin endpoints: /healthz /readyz /metrics /config' })
    }
  })
}
