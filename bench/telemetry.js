// node bench/telemetry.js [tree]: CPU µs per request of the telemetry calls alone, made the way
// one fully limited request makes them (bench/configs/gateway-shared-redis.yaml: 4 limit
// dimensions decided on Redis): inflight +1, one Redis call, 4 allowed decisions, the upstream's
// response, the request, inflight -1, all through LiveTelemetry in front of GatewayMetrics as in
// src/server.ts. `tree` (default: this one) is a gateway checkout with a built dist/, so the
// same loop can run against an older build (issue 13: before/after of the metrics cells). A tree
// whose telemetry resolves decision counters up front (decisionCounter) is driven through them,
// as its limiter does; an older one (or any, with TELEMETRY_BENCH_API=strings) through
// limitDecision(strings), its five label lookups per decision.
import { resolve } from 'node:path'
import { pathToFileURL } from 'node:url'

const tree = resolve(process.argv[2] ?? new URL('..', import.meta.url).pathname)
const REQUESTS = Number(process.env.TELEMETRY_BENCH_REQUESTS ?? 500_000)
const ROUNDS = Number(process.env.TELEMETRY_BENCH_ROUNDS ?? 5)

const { GatewayMetrics } = await import(pathToFileURL(`${tree}/dist/admin/metrics.js`).href)
const { LiveTelemetry } = await import(pathToFileURL(`${tree}/dist/admin/live-stats.js`).href)

const metrics = new GatewayMetrics({ localKeys: () => 0 })
const live = new LiveTelemetry(metrics)
const route = 'api'
const limits = [['global', 'global'], ['api', 'api.api'], ['ip', 'ip'], ['user', 'user']]
const resolved = typeof live.decisionCounter === 'function' && process.env.TELEMETRY_BENCH_API !== 'strings'
// the limiter resolves a counter once per planned limit (src/limit/limiter.ts)
const counters = resolved ? limits.map(([dimension, name]) => live.decisionCounter(route, dimension, name)) : null

function oneRequest (i) {
  live.inflight(route, 1)
  live.redisCall(0.00018 + (i & 7) * 0.00002, true, null)
  if (counters !== null) {
    for (let d = 0; d < 4; d++) counters[d].count('redis', 'allowed')
  } else {
    for (let d = 0; d < 4; d++) live.limitDecision(route, limits[d][0], limits[d][1], 'redis', 'allowed')
  }
  live.upstreamResponse('backend', 0.0004 + (i & 15) * 0.00005)
  live.request(route, 'GET', 200, 0.0008 + (i & 15) * 0.00005)
  live.inflight(route, -1)
}

// the admin page takes a frame once a second; here once per 50k requests, as at 50k req/s
function run (n) {
  const t0 = process.cpuUsage()
  for (let i = 0; i < n; i++) {
    oneRequest(i)
    if (i % 50_000 === 0) live.takeFrame()
  }
  const t = process.cpuUsage(t0)
  return (t.user + t.system) / n
}

run(50_000) // warm up: JIT and the label cells
const figures = []
for (let r = 0; r < ROUNDS; r++) figures.push(run(REQUESTS))
figures.sort((a, b) => a - b)
const text = await metrics.registry.metrics()
const decided = /gateway_ratelimit_decisions_total\{[^}]*dimension="ip"[^}]*\} (\d+)/.exec(text)?.[1]
console.log(JSON.stringify({
  tree,
  api: resolved ? 'decisionCounter' : 'limitDecision',
  requests: REQUESTS,
  usPerRequest: { min: +figures[0].toFixed(3), median: +figures[Math.floor(figures.length / 2)].toFixed(3), max: +figures[figures.length - 1].toFixed(3) },
  // a check that the loop was counted: every request's ip decision
  ipDecisionsCounted: Number(decided)
}))
