// Metrics worth a dashboard, read from a real gateway's /metrics after real traffic, and the
// shipped Grafana dashboard and Prometheus alert rules checked against what /metrics exposes.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { parse as parseYaml } from 'yaml'
import { startGateway } from './helpers/gateway.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'
import { startRedis } from './helpers/redis.js'
import { metric, sleep } from './helpers/ratelimit.js'

const text = async (url: string): Promise<string> => await (await fetch(`${url}/metrics`)).text()

t.test('decisions carry the limit name; upstream response time, in-flight requests, target health and ejections', async t => {
  const up = await startUpstream(t)
  const dead = await refusingUrl()
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["${up.url}"] }
  dead: { targets: ["${dead}"], ejectFor: 1m }
  late: { targets: ["${up.url}"], timeouts: { response: 200ms } }
routes:
  - name: api
    pathPrefix: /api/
    stripPrefix: /api
    upstream: backend
    limits:
      ip: { algorithm: token-bucket, limit: 3, window: 1h }
  - { name: gone, pathPrefix: /gone/, upstream: dead }
  - { name: late, pathPrefix: /late/, stripPrefix: /late, upstream: late }
`)
  // a token bucket (one token per 20 min), not a fixed window: an epoch-aligned window would start
  // afresh if the run crossed the top of the hour, and admit the fourth
  const statuses: number[] = []
  for (let i = 0; i < 2; i++) statuses.push((await fetch(`${gw.url}/api/slow?ms=150`)).status)
  // one request held at the upstream while /metrics is scraped
  const held = fetch(`${gw.url}/api/slow?ms=1500`)
  let inflight = 0
  for (let i = 0; i < 100 && inflight === 0; i++) {
    inflight = await metric(gw.adminUrl, 'gateway_requests_in_flight')
    if (inflight === 0) await sleep(10)
  }
  t.equal(inflight, 1, 'the held request is in flight')
  statuses.push((await held).status)
  statuses.push((await fetch(`${gw.url}/api/x`)).status)
  t.same(statuses, [200, 200, 200, 429])
  t.equal(await metric(gw.adminUrl, 'gateway_requests_in_flight'), 0, 'nothing in flight afterwards')

  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { route: 'api', limit: 'api.ip', result: 'allowed' }), 3)
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { route: 'api', limit: 'api.ip', result: 'rejected' }), 1)

  t.equal(await metric(gw.adminUrl, 'gateway_upstream_response_duration_seconds_count', { upstream: 'backend' }), 3, 'one observation per forwarded request, none for the 429')
  const sum = await metric(gw.adminUrl, 'gateway_upstream_response_duration_seconds_sum', { upstream: 'backend' })
  t.ok(sum >= 1.8, `the upstream's own time is measured (sum ${sum} s >= 0.15 + 0.15 + 1.5)`)

  t.equal(await metric(gw.adminUrl, 'gateway_upstream_target_healthy', { upstream: 'dead', target: dead }), 1, 'healthy before any failure')
  t.equal((await fetch(`${gw.url}/gone/x`)).status, 502)
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_target_healthy', { upstream: 'dead', target: dead }), 0, 'ejected')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_ejections_total', { upstream: 'dead', target: dead, reason: 'connect_failure' }), 1)
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_response_duration_seconds_count', { upstream: 'dead' }), 1, 'the 502 of a dispatched exchange is timed too')
  t.equal((await fetch(`${gw.url}/late/hang`)).status, 504)
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_response_duration_seconds_count', { upstream: 'late' }), 1, 'and so is the 504 of one the upstream never answered')
  const late = await metric(gw.adminUrl, 'gateway_upstream_response_duration_seconds_sum', { upstream: 'late' })
  t.ok(late >= 0.19, `with its time to the timeout (${late} s, timeout 200 ms)`)
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_target_healthy', { upstream: 'backend', target: up.url }), 1)
})

t.test('/readyz reports Redis back without any request: the breaker probes on a timer', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: "${redis.url}", timeout: 100ms }
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    limits:
      ip: { limit: 1000, window: 1m }
`)
  const readyz = async (): Promise<{ status: string, redis: { state: string, breaker: string } }> =>
    await (await fetch(`${gw.adminUrl}/readyz`)).json() as { status: string, redis: { state: string, breaker: string } }
  t.match(await readyz(), { status: 'ready', redis: { state: 'up' } })
  await redis.kill()
  // traffic during the outage opens the breaker
  for (let i = 0; i < 10 && (await readyz()).redis.breaker !== 'open'; i++) await fetch(`${gw.url}/x`)
  t.match(await readyz(), { status: 'degraded', redis: { state: 'fallback', breaker: 'open' } })
  const requestsBefore = up.requests
  await redis.restart()
  let state = ''
  const deadline = Date.now() + 10_000
  while (Date.now() < deadline && state !== 'up') {
    state = (await readyz()).redis.state
    if (state !== 'up') await sleep(50)
  }
  t.equal(state, 'up', 'Redis is reported back')
  t.equal(up.requests, requestsBefore, 'no request was sent meanwhile')
  t.ok(gw.lines.some(l => l.msg === 'rate limiter back on Redis'), 'the recovery is logged')
  t.match(await readyz(), { status: 'ready', redis: { breaker: 'closed' } })
})

/** Metric names a PromQL expression reads (histogram series map back to their histogram). */
function metricsIn (expr: string): string[] {
  return [...expr.matchAll(/\bgateway_[a-z_]+/g)].map(m => m[0])
}

t.test('every metric the Grafana dashboard and the Prometheus alert rules query exists on /metrics', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const exposition = await text(gw.adminUrl)
  const exposed = new Set<string>()
  for (const m of exposition.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    const [, name, type] = m as unknown as [string, string, string]
    exposed.add(name)
    if (type === 'histogram') for (const s of ['_bucket', '_sum', '_count']) exposed.add(name + s)
  }

  const dashboard = JSON.parse(readFileSync('examples/monitoring/grafana-dashboard.json', 'utf8')) as { panels: Array<{ title: string, targets: Array<{ expr: string }> }> }
  const alerts = parseYaml(readFileSync('examples/monitoring/prometheus-alerts.yaml', 'utf8')) as { groups: Array<{ rules: Array<{ alert: string, expr: string }> }> }
  const queries: Array<[string, string]> = [
    ...dashboard.panels.flatMap(p => p.targets.map(q => [`panel "${p.title}"`, q.expr] as [string, string])),
    ...alerts.groups.flatMap(g => g.rules.map(r => [`alert ${r.alert}`, r.expr] as [string, string]))
  ]
  t.ok(queries.length >= 20, `${queries.length} queries`)
  const used = new Set<string>()
  for (const [where, expr] of queries) {
    for (const name of metricsIn(expr)) {
      used.add(name)
      t.ok(exposed.has(name), `${where}: ${name} is on /metrics`)
    }
  }
  // the dashboard is worth having only if it shows what operators asked for
  for (const name of ['gateway_ratelimit_decisions_total', 'gateway_upstream_response_duration_seconds_bucket', 'gateway_upstream_target_healthy',
    'gateway_upstream_ejections_total', 'gateway_health_checks_total', 'gateway_requests_in_flight', 'gateway_websockets_open', 'gateway_redis_breaker_state']) {
    t.ok(used.has(name), `${name} is queried`)
  }
})
