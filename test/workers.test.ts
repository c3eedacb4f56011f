// `workers: N`: worker processes share the listener; the primary aggregates metrics, relays
// SIGHUP and drains everything on SIGTERM.
import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { writeFileSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { join } from 'node:path'
import { childEnv, spawnGateway } from './helpers/gateway.js'
import { tempDir } from './helpers/teardown.js'
import { startRedis } from './helpers/redis.js'
import { eventually } from './helpers/ratelimit.js'

t.test('two workers serve one listener; metrics aggregate; SIGHUP reaches both; SIGTERM exits 0', async t => {
  // /slow answers after 1.5 s: a request kept in flight across SIGTERM
  const upstream = createServer((req, res) => {
    if (req.url === '/slow') setTimeout(() => res.end('slow ok'), 1500).unref()
    else res.end('ok')
  })
  let slowArrived = false
  upstream.on('request', (req) => { if (req.url === '/slow') slowArrived = true })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(() => upstream.close())
  const target = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`
  // workers share limits through Redis (without it, workers > 1 with limits is a config error)
  const redis = await startRedis(t)
  // exact counts: 2 s, not the default 50 ms (startRedis in test/helpers/redis.ts says why)
  const yaml = (limit: number): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
redis: { url: ${redis.url}, timeout: 2s }
upstreams: { b: { targets: [${target}] } }
routes:
  - { name: slow, path: /slow, upstream: b }
  - name: all
    pathPrefix: /
    upstream: b
    limits: { api: { algorithm: token-bucket, limit: ${limit}, window: 1h } }
`
  // token buckets, not fixed windows: an epoch-aligned window would start afresh if the run crossed
  // the top of the hour, between the spent budget of 45 and the 20 refusals after the crash (45 per
  // hour: one token per 80 s comes back)
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
  // each worker writes its access lines in batches (up to 100 ms later): wait for all N
  const accessLines = (): Array<Record<string, unknown>> => gw.logs.filter(l => l.msg === 'request')
  await eventually(`${N} access lines`, async () => accessLines().length >= N, 10_000)
  t.equal(accessLines().length, N, 'one access line per request')
  t.equal(new Set(accessLines().map(l => l.pid)).size, 2, 'requests were spread over both workers')

  // a config change reaches every worker
  writeFileSync(gw.file, yaml(45))
  gw.child.kill('SIGHUP')
  for (let i = 0; i < 100 && gw.logs.filter(l => l.msg === 'configuration reloaded').length < 2; i++) await new Promise(resolve => setTimeout(resolve, 100))
  t.equal(gw.logs.filter(l => l.msg === 'configuration reloaded').length, 2, 'both workers reloaded')
  // the changed limit starts fresh and both workers draw on one Redis budget of 45
  const after = await Promise.all(Array.from({ length: 60 }, async () => (await fetch(`${gw.url}/y`, { headers: { connection: 'close' } })).status))
  t.equal(after.filter(s => s === 200).length, 45, 'exactly the shared budget admitted across both workers')
  t.equal(after.filter(s => s === 429).length, 15)

  // a crashed worker is replaced, and the pair keeps serving
  const victim = [...workerPids()][0] as number
  process.kill(victim, 'SIGKILL')
  await gw.waitForLog(l => l.msg === 'worker exited; starting a new one' && l.worker === victim)
  for (let i = 0; i < 100 && workerPids().size < 3; i++) await new Promise(resolve => setTimeout(resolve, 100))
  t.equal(workerPids().size, 3, 'a new worker process started in place of the crashed one')
  const replaced = await Promise.all(Array.from({ length: 20 }, async () => (await fetch(`${gw.url}/z`, { headers: { connection: 'close' } })).status))
  t.same(replaced, new Array(20).fill(429), 'requests are answered after the crash, and the new worker sees the spent shared budget')

  // SIGTERM with a slow request in flight on a worker: it completes, then everything exits 0
  const slow = fetch(`${gw.url}/slow`, { headers: { connection: 'close' } }).then(async r => ({ status: r.status, body: await r.text() }))
  for (let i = 0; i < 1000 && !slowArrived; i++) await new Promise(resolve => setTimeout(resolve, 10))
  t.ok(slowArrived, 'the slow request reached the upstream before SIGTERM')
  gw.child.kill('SIGTERM')
  t.same(await slow, { status: 200, body: 'slow ok' }, 'the in-flight request finished during the drain')
  t.equal(await gw.exited, 0)
  const stopped = gw.logs.filter(l => l.msg === 'gateway stopped').length
  t.equal(stopped, 2, 'both live workers drained and stopped')
})

t.test('workers > 1 without Redis: plans are refused like limits (each worker would grant the whole plan)', async t => {
  const dir = tempDir(t, 'gw-workers-plans')
  const file = join(dir, 'gateway.yaml')
  const yaml = (redis: string): string => `workers: 2
${redis}identity: { header: x-user-id }
defaultPlan: free
plans:
  free:
    limits:
      quota: { limit: 1000, period: day }
upstreams: { b: { targets: [http://127.0.0.1:1] } }
routes:
  - { name: api, pathPrefix: /, upstream: b }
`
  writeFileSync(file, yaml(''))
  const refused = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', file], { encoding: 'utf8', env: childEnv() })
  t.equal(refused.status, 1)
  t.match(refused.stderr, /gateway\.yaml:1:10 workers: workers > 1 needs "redis:" for the shared limits/)
  writeFileSync(file, yaml('redis: { url: redis://127.0.0.1:6379 }\n'))
  const accepted = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', file], { encoding: 'utf8', env: childEnv() })
  t.equal(accepted.status, 0, accepted.stderr)
})
