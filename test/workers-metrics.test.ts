// The primary's /metrics under `workers: 2` (real bin/gateway processes): a sum over the workers
// whose counters and histograms never go down, also when a worker crashes and is replaced.
import t from 'tap'
import { writeFileSync } from 'node:fs'
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

t.test('gateway_config_reloads_total counts each SIGHUP once: an accepted file once, not once per worker, and a rejected one', async t => {
  const upstream = await answering(t, 'ok')
  const r = await twoWorkers(t, config(upstream))
  const verdicts = async (n: number): Promise<void> => await until(`reload verdict ${n}`, async () => {
    const c = await (await fetch(`${r.adminUrl}/config`)).json() as { lastReload: { attempt: number } | null, reloadPending: boolean }
    return c.lastReload?.attempt === n && !c.reloadPending
  })
  const reloads = async (result: string): Promise<number> => await metric(r.adminUrl, 'gateway_config_reloads_total', { result })
  t.equal(await reloads('success'), 0)
  t.equal(await reloads('failure'), 0)

  writeFileSync(r.gw.file, config(upstream).replace('name: all', 'name: every'))
  r.gw.child.kill('SIGHUP')
  await verdicts(1)
  await until('both workers reloaded', () => r.gw.logs.filter(l => l.msg === 'configuration reloaded').length === 2)
  t.equal(await reloads('success'), 1, 'one accepted reload (each worker applying it is not another)')

  writeFileSync(r.gw.file, config(upstream).replace('upstream: b', 'upstream: nowhere'))
  r.gw.child.kill('SIGHUP')
  await verdicts(2)
  // the primary rejects the file and hands it to no worker: only the primary knows of it
  t.equal(await reloads('failure'), 1, 'the rejected reload is counted (alert GatewayReloadFailed fires)')
  t.equal(await reloads('success'), 1)
})
