// The primary's /metrics under `workers: 2` (real bin/gateway processes): a sum over the workers
// whose counters and histograms never go down, also when a worker crashes and is replaced.
import t from 'tap'
import { answering, bodies, config, replaceOne, twoWorkers, until } from './helpers/workers.js'
import { metric } from './helpers/ratelimit.js'

const requests = async (adminUrl: string): Promise<number> =>
  await metric(adminUrl, 'gateway_requests_total', { route: 'all', status_class: '2xx' })
const observed = async (adminUrl: string): Promise<number> =>
  await metric(adminUrl, 'gateway_request_duration_seconds_count', { route: 'all' })

t.test('a crashed worker does not take its counts out of the summed counters and histograms', async t => {
  const upstream = await answering(t, 'ok')
  const r = await twoWorkers(t, config(upstream))
  t.same(new Set(await bodies(r.gw.url, 40)), new Set(['200 ok']))
  const servedBy = (): Set<unknown> => new Set(r.gw.logs.filter(l => l.msg === 'request').map(l => l.pid))
  await until('both workers served some of the 40', () => servedBy().size === 2, 10_000)
  t.equal(await requests(r.adminUrl), 40, 'the scrape before the crash sums both workers')
  t.equal(await observed(r.adminUrl), 40)

  await replaceOne(r)
  // a counter that went down is read by Prometheus as a reset: rate() then counts the whole
  // surviving worker's total as new requests
  t.equal(await requests(r.adminUrl), 40, 'gateway_requests_total keeps the crashed worker\'s requests')
  t.equal(await observed(r.adminUrl), 40, 'so does the duration histogram')
  t.match(await (await fetch(`${r.adminUrl}/metrics`)).text(), /^gateway_workers_scraped 2$/m)
  t.same(new Set(await bodies(r.gw.url, 10)), new Set(['200 ok']))
  t.equal(await requests(r.adminUrl), 50, 'and counts on from there')
  t.equal(await observed(r.adminUrl), 50)
})
