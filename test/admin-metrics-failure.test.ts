// A scrape whose collection fails (a metric's collect throwing) is answered with a JSON 500
// naming GW_ERR_METRICS_FAILED (error: metrics_failed): never a crash, a hung scrape or a half-written exposition, and
// the gateway serves on; the next scrape that collects is whole again.
import t from 'tap'
import { Gauge } from 'prom-client'
import { request } from 'undici'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

t.test('a metric that fails to collect: /metrics answers a JSON 500, requests are served, the next scrape is whole', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams: { b: { targets: [${up.url}] } }
routes:
  - { name: all, pathPrefix: /, upstream: b }
`)
  let failing = true
  new Gauge({
    name: 'test_collect_failing',
    help: 'collects with an error while `failing`',
    registers: [gw.metrics.registry],
    collect () { if (failing) throw new Error('the source is gone') }
  })
  const failed = await request(`${gw.adminUrl}/metrics`)
  t.equal(failed.statusCode, 500)
  t.match(failed.headers['content-type'], /^application\/json/)
  t.match(await failed.body.json(), { error: 'metrics_failed', message: /the source is gone/ })
  const served = await request(`${gw.url}/x`)
  await served.body.dump()
  t.equal(served.statusCode, 200, 'the gateway serves on')
  t.equal((await request(`${gw.adminUrl}/healthz`)).statusCode, 200)
  failing = false
  const whole = await request(`${gw.adminUrl}/metrics`)
  t.equal(whole.statusCode, 200)
  const text = await whole.body.text()
  t.match(text, /\ngateway_requests_total\{[^}]*route="all"[^}]*\} 1\n/, 'the request counted')
  t.match(text, /\ntest_collect_failing 0\n/)
})
