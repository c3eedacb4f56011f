// `workers: N`: worker processes share the listener; the primary aggregates metrics, relays
// SIGHUP and drains everything on SIGTERM.
import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { writeFileSync } from 'node:fs'
import { spawnGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'

t.test('two workers serve one listener; metrics aggregate; SIGHUP reaches both; SIGTERM exits 0', async t => {
  const upstream = createServer((_req, res) => res.end('ok'))
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(() => upstream.close())
  const target = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`
  // workers share limits through Redis (without it, workers > 1 with limits is a config error)
  const redis = await startRedis()
  t.teardown(() => redis.stop())
  const yaml = (limit: number): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
redis: { url: ${redis.url} }
upstreams: { b: { targets: [${target}] } }
routes:
  - name: all
    pathPrefix: /
    upstream: b
    limits: { api: { algorithm: fixed-window, limit: ${limit}, window: 1h } }
`
  const gw = await spawnGateway(t, yaml(100000))
  const primary = await gw.waitForLog(l => l.msg === 'gateway primary started')
  const adminUrl = `http://127.0.0.1:${primary.adminPort as number}`
  // both workers report ready to the primary
  for (let i = 0; i < 100; i++) {
    if ((await fetch(`${adminUrl}/readyz`)).status === 200) break
    await new Promise(resolve => setTimeout(resolve, 100))
  }
  t.equal((await fetch(`${adminUrl}/readyz`)).status, 200)
  const workerPids = (): Set<unknown> => new Set(gw.logs.filter(l => l.msg === 'gateway started').map(l => l.pid))
  for (let i = 0; i < 100 && workerPids().size < 2; i++) await new Promise(resolve => setTimeout(resolve, 100))
  t.equal(workerPids().size, 2, 'two worker processes started')

  const N = 40
  const statuses = await Promise.all(Array.from({ length: N }, async () => (await fetch(`${gw.url}/x`, { headers: { connection: 'close' } })).status))
  t.same(statuses, new Array(N).fill(200))
  const metrics = await (await fetch(`${adminUrl}/metrics`)).text()
  t.match(metrics, new RegExp(`gateway_requests_total\\{route="all",method="GET",status_class="2xx"\\} ${N}\\b`), 'the primary sums both workers')
  const servedBy = new Set(gw.logs.filter(l => l.msg === 'request').map(l => l.pid))
  t.equal(servedBy.size, 2, 'requests were spread over both workers')

  // a config change reaches every worker
  writeFileSync(gw.file, yaml(45))
  gw.child.kill('SIGHUP')
  for (let i = 0; i < 100 && gw.logs.filter(l => l.msg === 'configuration reloaded').length < 2; i++) await new Promise(resolve => setTimeout(resolve, 100))
  t.equal(gw.logs.filter(l => l.msg === 'configuration reloaded').length, 2, 'both workers reloaded')
  // the changed limit starts fresh and both workers draw on one Redis budget of 45
  const after = await Promise.all(Array.from({ length: 60 }, async () => (await fetch(`${gw.url}/y`, { headers: { connection: 'close' } })).status))
  t.equal(after.filter(s => s === 200).length, 45, 'exactly the shared budget admitted across both workers')
  t.equal(after.filter(s => s === 429).length, 15)

  gw.child.kill('SIGTERM')
  t.equal(await gw.exited, 0)
})
