// Issue 13: the request path counts into plain number cells and prom-client only reads them when
// /metrics is scraped. Known traffic through a real gateway, then the exact series on /metrics:
// request and decision counters, an upstream error, and the request-duration histogram line by
// line against the durations the access log gave the same requests. A scrape between two bursts
// must neither reset the values nor, scraped twice, double them.
import t, { type Test } from 'tap'
import { spawnGateway, startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'
import { eventually } from './helpers/ratelimit.js'

const REQUEST_BOUNDS = ['0.001', '0.0025', '0.005', '0.01', '0.025', '0.05', '0.1', '0.25', '0.5', '1', '2.5', '5', '10', '+Inf']

interface Sample { name: string, labels: Record<string, string>, value: number }

/** Each bucket of `buckets` against durations (ms) from the access log, allowing ±1 µs of rounding. */
function checkBuckets (t: Test, buckets: Sample[], durationsMs: number[]): void {
  t.same(buckets.map(b => b.labels.le), REQUEST_BOUNDS, 'the same bucket bounds, in order')
  for (const b of buckets) {
    const bound = b.labels.le === '+Inf' ? Infinity : Number(b.labels.le) * 1000
    const surely = durationsMs.filter(ms => ms <= bound - 0.001).length
    const maybe = durationsMs.filter(ms => ms <= bound + 0.001).length
    t.ok(b.value >= surely && b.value <= maybe, `le=${b.labels.le}: ${b.value} of ${durationsMs.length} (access log: ${surely}..${maybe})`)
  }
}

async function scrape (adminUrl: string): Promise<Sample[]> {
  const text = await (await fetch(`${adminUrl}/metrics`)).text()
  const samples: Sample[] = []
  for (const line of text.split('\n')) {
    const m = /^(gateway_[a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
    if (m === null) continue
    const labels: Record<string, string> = {}
    for (const pair of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1] as string] = pair[2] as string
    samples.push({ name: m[1] as string, labels, value: Number(m[3]) })
  }
  return samples
}

/** The samples of `name` whose labels include `labels`. */
function pick (samples: Sample[], name: string, labels: Record<string, string>): Sample[] {
  return samples.filter(s => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
}

function value (samples: Sample[], name: string, labels: Record<string, string>): number {
  return pick(samples, name, labels).reduce((sum, s) => sum + s.value, 0)
}

t.test('known traffic gives exact counters and histogram lines, and scrapes neither reset nor double them', async t => {
  const up = await startUpstream(t)
  const dead = await refusingUrl()
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
limits:
  global: { algorithm: token-bucket, limit: 1000, window: 1h }
upstreams:
  backend: { targets: ["${up.url}"] }
  dead: { targets: ["${dead}"] }
routes:
  - name: api
    pathPrefix: /api/
    stripPrefix: /api
    upstream: backend
    limits:
      ip: { algorithm: token-bucket, limit: 5, window: 1h }
  - { name: gone, pathPrefix: /gone/, upstream: dead }
`)
  // token buckets, not fixed windows: an epoch-aligned window would start afresh at the top of
  // the hour and admit more than 5

  // burst 1: 4 admitted (one held 300 ms at the upstream), 1 upstream failure, 1 unmatched
  const first: number[] = []
  for (const ms of [0, 0, 0, 300]) first.push((await fetch(`${gw.url}/api/slow?ms=${ms}`)).status)
  first.push((await fetch(`${gw.url}/gone/x`)).status)
  first.push((await fetch(`${gw.url}/nowhere`)).status)
  t.same(first, [200, 200, 200, 200, 502, 404])

  const afterFirst = await scrape(gw.adminUrl)
  const again = await scrape(gw.adminUrl)
  for (const samples of [afterFirst, again]) {
    t.equal(value(samples, 'gateway_requests_total', { route: 'api', method: 'GET', status_class: '2xx' }), 4)
    t.equal(value(samples, 'gateway_requests_total', { route: 'gone', method: 'GET', status_class: '5xx' }), 1)
    t.equal(value(samples, 'gateway_requests_total', { route: '-', method: 'GET', status_class: '4xx' }), 1)
    t.equal(value(samples, 'gateway_ratelimit_decisions_total', { route: 'api', dimension: 'ip', limit: 'api.ip', result: 'allowed' }), 4)
    t.equal(value(samples, 'gateway_ratelimit_decisions_total', { route: 'api', dimension: 'global', limit: 'global', result: 'allowed' }), 4)
    t.equal(value(samples, 'gateway_upstream_errors_total', { upstream: 'dead' }), 1, 'the refused connection')
    t.equal(value(samples, 'gateway_upstream_response_duration_seconds_count', { upstream: 'backend' }), 4)
  }
  t.same(pick(again, 'gateway_ratelimit_decisions_total', { result: 'rejected' }), [], 'nothing rejected yet, and no series for it')
  t.same(pick(again, 'gateway_requests_total', { route: 'api', status_class: '4xx' }), [], 'a status class never answered has no series')
  t.equal(value(again, 'gateway_config_reloads_total', { result: 'failure' }), 0)
  t.equal(pick(again, 'gateway_config_reloads_total', { result: 'failure' }).length, 1, 'reload results are listed at 0 from the start')

  // burst 2: 1 more admitted, then the ip limit (5) refuses 3
  const second: number[] = []
  for (let i = 0; i < 4; i++) second.push((await fetch(`${gw.url}/api/slow?ms=0`)).status)
  t.same(second, [200, 429, 429, 429])

  await eventually('the access-log lines of the 10 requests', async () => gw.lines.filter(l => l.msg === 'request').length >= 10, 5000)
  const end = await scrape(gw.adminUrl)
  t.equal(value(end, 'gateway_requests_total', { route: 'api', method: 'GET', status_class: '2xx' }), 5, 'accumulated across the scrapes')
  t.equal(value(end, 'gateway_requests_total', { route: 'api', method: 'GET', status_class: '4xx' }), 3)
  t.equal(value(end, 'gateway_ratelimit_decisions_total', { route: 'api', dimension: 'ip', limit: 'api.ip', level: 'memory', result: 'allowed' }), 5)
  // the first refusal comes from the shared level, the next ones from the deny cache ('local')
  t.equal(value(end, 'gateway_ratelimit_decisions_total', { route: 'api', dimension: 'ip', limit: 'api.ip', result: 'rejected' }), 3)
  t.equal(value(end, 'gateway_ratelimit_decisions_total', { route: 'api', dimension: 'global', result: 'allowed' }), 5, 'all or nothing: a refused request takes nothing from global')
  t.equal(value(end, 'gateway_upstream_errors_total', { upstream: 'dead' }), 1, 'not counted again by a scrape')
  t.equal(value(end, 'gateway_inflight', { route: 'api' }), 0, 'a gauge touched and back at 0 is still listed')
  t.equal(pick(end, 'gateway_inflight', { route: 'api' }).length, 1)

  // The route's histogram, bucket by bucket, against the access log's durations of the same
  // requests (durationMs is the same measurement rounded to the µs: a duration within 1 µs of a
  // bound may fall either side, so such a line is allowed either count).
  const apiMs = gw.lines.filter(l => l.msg === 'request' && l.route === 'api').map(l => l.durationMs as number)
  t.equal(apiMs.length, 8, 'eight access lines for the route')
  checkBuckets(t, pick(end, 'gateway_request_duration_seconds_bucket', { route: 'api' }), apiMs)
  t.equal(value(end, 'gateway_request_duration_seconds_count', { route: 'api' }), 8)
  const sum = value(end, 'gateway_request_duration_seconds_sum', { route: 'api' })
  const logged = apiMs.reduce((a, b) => a + b, 0) / 1000
  t.ok(Math.abs(sum - logged) <= 8 * 0.0000005 + 1e-9, `sum ${sum} s is the access log's ${logged} s`)
  t.ok(value(end, 'gateway_request_duration_seconds_bucket', { route: 'api', le: '0.25' }) <= 7, 'the request held 300 ms is above 0.25 s')

  const upstream = pick(end, 'gateway_upstream_response_duration_seconds_bucket', { upstream: 'backend' })
  t.same(upstream.map(b => b.labels.le), REQUEST_BOUNDS)
  t.equal(upstream.at(-1)?.value, 5, '+Inf: the five forwarded exchanges, none for the 429s')
  t.ok((upstream.find(b => b.labels.le === '0.25')?.value ?? 5) <= 4, 'the exchange held 300 ms is above 0.25 s')
  t.ok(upstream.every((b, i) => i === 0 || b.value >= (upstream[i - 1] as Sample).value), 'cumulative buckets')
  t.equal(value(end, 'gateway_upstream_response_duration_seconds_count', { upstream: 'backend' }), 5)
  t.ok(value(end, 'gateway_upstream_response_duration_seconds_sum', { upstream: 'backend' }) >= 0.3)
})

t.test('workers: 2: the primary sums the workers\' cells, histograms included, scrape after scrape', async t => {
  const up = await startUpstream(t)
  // workers share limits through Redis (without it, workers > 1 with limits is a config error)
  const redis = await startRedis(t)
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
redis: { url: ${redis.url} }
upstreams: { backend: { targets: ["${up.url}"] } }
routes:
  - name: all
    pathPrefix: /
    upstream: backend
    limits: { api: { algorithm: token-bucket, limit: 100000, window: 1h } }
`)
  const primary = await gw.waitForLog(l => l.msg === 'gateway primary started')
  const adminUrl = `http://127.0.0.1:${primary.adminPort as number}`
  await eventually('both workers ready', async () => (await fetch(`${adminUrl}/readyz`)).status === 200, 10_000)
  await eventually('two worker processes', async () => new Set(gw.logs.filter(l => l.msg === 'gateway started').map(l => l.pid)).size === 2, 10_000)

  // connection: close, so that the primary hands the connections round-robin to both workers
  const burst = async (n: number): Promise<number[]> => await Promise.all(Array.from({ length: n }, async () => (await fetch(`${gw.url}/slow?ms=0`, { headers: { connection: 'close' } })).status))
  t.same(await burst(20), new Array(20).fill(200))
  const first = await scrape(adminUrl)
  t.equal(value(first, 'gateway_requests_total', { route: 'all', method: 'GET', status_class: '2xx' }), 20)
  t.same(await burst(20), new Array(20).fill(200))
  await scrape(adminUrl)
  const end = await scrape(adminUrl)

  const accessLines = (): Array<Record<string, unknown>> => gw.logs.filter(l => l.msg === 'request' && l.route === 'all')
  await eventually('40 access lines', async () => accessLines().length >= 40, 10_000)
  t.equal(new Set(accessLines().map(l => l.pid)).size, 2, 'both workers answered some')
  t.equal(value(end, 'gateway_requests_total', { route: 'all', method: 'GET', status_class: '2xx' }), 40, 'summed, accumulated, not doubled by the scrapes')
  // by Redis, or by the fallback while a worker's connection was still coming up: summed over levels
  t.equal(value(end, 'gateway_ratelimit_decisions_total', { route: 'all', dimension: 'api', result: 'allowed' }), 40,
    `every decision, summed: ${JSON.stringify(pick(end, 'gateway_ratelimit_decisions_total', { route: 'all' }))}`)
  checkBuckets(t, pick(end, 'gateway_request_duration_seconds_bucket', { route: 'all' }), accessLines().map(l => l.durationMs as number))
  t.equal(value(end, 'gateway_request_duration_seconds_count', { route: 'all' }), 40)
  const sum = value(end, 'gateway_request_duration_seconds_sum', { route: 'all' })
  const logged = accessLines().reduce((a, l) => a + (l.durationMs as number), 0) / 1000
  t.ok(Math.abs(sum - logged) <= 40 * 0.0000005 + 1e-9, `sum ${sum} s is the access log's ${logged} s`)
  t.equal(value(end, 'gateway_upstream_response_duration_seconds_count', { upstream: 'backend' }), 40)
  // how many Redis calls 40 decisions take is the batching's business (issue 13): only that
  // the summed histogram is whole
  const redisBuckets = pick(end, 'gateway_redis_duration_seconds_bucket', {})
  const calls = value(end, 'gateway_redis_duration_seconds_count', {})
  t.ok(calls >= 1 && calls <= 40, `${calls} Redis calls for 40 decisions`)
  t.equal(redisBuckets.at(-1)?.value, calls, '+Inf is the count')
  t.ok(redisBuckets.every((b, i) => i === 0 || b.value >= (redisBuckets[i - 1] as Sample).value), 'cumulative buckets')
})
