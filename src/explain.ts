// `gateway explain`: what the gateway would do with one request, without starting it: the route
// that matches and each limit that applies, with its algorithm, parameters and Redis key.
import type { GatewayConfig } from './config/schema.js'
import { compileRouteTable } from './router/route-table.js'
import { normalizePath } from './router/normalize-path.js'
import { compileClientIpResolver } from './identify/client-ip.js'
import { compileRouteLimitPlan, dimensionValue, keyFor } from './limit/plan.js'

export interface ExplainRequest {
  readonly method: string
  readonly url: string
  readonly ip: string
  readonly user: string | null
  readonly headers: readonly string[]
}

function userFromHeaders (config: GatewayConfig, headers: Map<string, string>): string | null {
  const id = config.identity
  if (id === undefined) return null
  if ('header' in id) return headers.get(id.header.toLowerCase()) ?? null
  if ('apiKeys' in id) {
    const key = headers.get(id.apiKeys.header.toLowerCase())
    return key === undefined ? null : ((id.apiKeys.keys ?? {})[key] ?? null)
  }
  return null
}

export async function explain (config: GatewayConfig, req: ExplainRequest): Promise<string> {
  const url = new URL(req.url, 'http://localhost')
  const headers = new Map<string, string>()
  for (const h of req.headers) {
    const i = h.indexOf(':')
    if (i > 0) headers.set(h.slice(0, i).trim().toLowerCase(), h.slice(i + 1).trim())
  }
  const lines: string[] = []
  const normalized = normalizePath(url.pathname)
  if (!normalized.ok) return `400 GW_ERR_BAD_PATH: ${normalized.reason}\n`
  const table = compileRouteTable(config.routes)
  const host = headers.get('host') ?? url.hostname
  const route = table.match(host === 'localhost' && !req.url.startsWith('http') ? '' : host.toLowerCase(), req.method.toUpperCase(), normalized.path)
  lines.push(`request: ${req.method.toUpperCase()} ${normalized.path}${url.search} (host "${host}")`)
  if (route === null) return lines.concat('route:   none -> 404 GW_ERR_NOT_FOUND', '').join('\n')
  lines.push(`route:   ${route.name} -> upstream ${route.upstream}${route.websocket === true ? ' (websocket)' : ''}`)
  const client = compileClientIpResolver({ trustedProxies: config.trustedProxies ?? [], ipv6Prefix: config.ipv6Prefix ?? 64 })(req.ip, headers.get('x-forwarded-for'))
  const user = req.user ?? userFromHeaders(config, headers)
  lines.push(`client:  ip ${client.ip} (limit key ${client.key}), user ${user ?? '(anonymous)'}`)
  if (config.local !== undefined) {
    lines.push(`local:   token bucket ${config.local.limit}/${config.local.window} burst ${config.local.burst ?? config.local.limit} per client "${user ?? client.key}" (in process)`)
  }
  const plan = compileRouteLimitPlan(config, route)
  const store = config.redis === undefined ? 'in process' : 'redis'
  if (plan.all.length === 0) lines.push('limits:  none')
  for (const l of plan.all) {
    const value = dimensionValue(l.dimension, client.key, user)
    const s = l.spec
    const params = `limit ${s.limit} per ${s.windowMs}ms` + (s.burst !== s.limit ? `, burst ${s.burst}` : '') + (l.cost !== 1 ? `, cost ${l.cost}` : '') + (s.maxDelayMs > 0 ? `, delay up to ${s.maxDelayMs}ms` : '')
    const key = value === null ? '(skipped: anonymous request)' : keyFor(l.keyBase, value)
    lines.push(`limit:   ${l.name} [${l.dimension}] ${s.algorithm}: ${params}${l.shadow ? ' (shadow)' : ''}; ${store} key ${key}; onError ${l.onError}; rejects with ${l.status}`)
  }
  return lines.join('\n') + '\n'
}
