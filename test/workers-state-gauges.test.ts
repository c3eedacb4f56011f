// README (Workers): the primary's /metrics sums the workers', but "gateway_config_generation is the
// workers' highest" and "gateway_upstream_target_healthy their lowest": a target one worker ejected
// reads 0, so an alert on it fires although the other workers still send it traffic. The tests of
// test/workers-lifecycle.test.ts and test/workers-health-check.test.ts see every worker agree (both
// 1, both 0), where the lowest, the highest and the sum's clamp cannot be told apart.
import t from 'tap'
import { AggregatorRegistry } from 'prom-client'
import { GatewayMetrics } from '../src/admin/metrics.js'
import { twoWorkers } from './helpers/workers.js'
import { metric } from './helpers/ratelimit.js'
import { startUpstream } from './helpers/upstream.js'

t.test('workers: 2: a target one worker ejected and the other did not reads 0 on the primary\'s /metrics', async t => {
  // /reset resets the connection without answering: with consecutiveFailures 1, one such request
  // ejects the target in the worker that forwarded it (retries: 0, so no second attempt)
  const up = await startUpstream(t)
  const url = up.url
  const r = await twoWorkers(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
upstreams:
  b: { targets: [${url}], consecutiveFailures: 1, ejectFor: 10m, retries: 0 }
routes:
  - { name: all, pathPrefix: /, upstream: b }
`)
  const [a, b] = r.workerPids()
  t.equal(await metric(r.adminUrl, 'gateway_upstream_target_healthy', { upstream: 'b', target: url }), 1, 'before: healthy on both workers')

  // one request, on a connection of its own: one worker forwards it and ejects the target
  const res = await fetch(`${r.gw.url}/reset`, { headers: { connection: 'close' } })
  t.equal(res.status, 502, 'the reset is answered 502')
  await res.text()
  const ejected = await r.gw.waitForLog(l => l.msg === 'upstream target ejected')
  const ejecter = ejected.pid as number
  t.ok(ejecter === a || ejecter === b, `ejected by worker ${ejecter}`)
  // the primary asks the workers on each scrape; a second ejection, which would make this no
  // test of the lowest, would show here within this wait
  await new Promise(resolve => setTimeout(resolve, 1000))
  t.same(r.gw.logs.filter(l => l.msg === 'upstream target ejected').map(l => l.pid), [ejecter], 'one worker ejected it, the other still counts it in')
  t.equal(await metric(r.adminUrl, 'gateway_upstream_target_healthy', { upstream: 'b', target: url }), 0, 'the primary shows it out: the lowest of 0 and 1')
  t.equal(await metric(r.adminUrl, 'gateway_upstream_target_healthy', { upstream: 'b', target: url }), 0, 'on every scrape')
})

t.test('the workers\' registries as the primary sums them: generation is the highest, target health the lowest', async t => {
  const older = new GatewayMetrics({ localKeys: () => 0, targets: () => [{ upstream: 'b', target: 'http://x', healthy: true }] })
  const newer = new GatewayMetrics({ localKeys: () => 0, targets: () => [{ upstream: 'b', target: 'http://x', healthy: false }] })
  older.generation.set(2)
  newer.generation.set(3)
  for (const order of [[older, newer], [newer, older]]) {
    const parts = await Promise.all(order.map(async m => await m.registry.getMetricsAsJSON()))
    const text = await AggregatorRegistry.aggregate(parts).metrics()
    t.match(text, /^gateway_config_generation 3$/m, 'one worker at 2, one at 3: 3')
    t.match(text, /^gateway_upstream_target_healthy\{upstream="b",target="http:\/\/x"\} 0$/m, 'one worker 1, one 0: 0')
  }
})
