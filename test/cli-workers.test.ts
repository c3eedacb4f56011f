// `gateway limits get` and `gateway explain` for `workers: 2` (real bin/gateway processes): what
// the operator reads must describe the fleet. Without Redis each worker holds its own budget of
// `limit` and the primary sums `remaining` over them (src/admin/limits-over-workers.ts); the local
// level is a bucket per worker whatever the store.
import t from 'tap'
import { twoWorkers, until } from './helpers/workers.js'
import { startUpstream } from './helpers/upstream.js'
import { gateway } from './helpers/cli.js'

t.test('workers: 2 without Redis: the summed remaining is read against the summed budget', async t => {
  const up = await startUpstream(t)
  const r = await twoWorkers(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
identity:
  apiKeys: { header: x-api-key, keys: { k-bob: bob } }
  failureLimit: { limit: 2, window: 1h }
upstreams: { b: { targets: [${up.url}] } }
routes:
  - { name: api, pathPrefix: /, upstream: b }
`)
  const get = async (): Promise<string> => {
    const run = await gateway(['limits', 'get', '--route', 'api', '--ip', '127.0.0.1', '--admin', r.adminUrl.slice('http://'.length)])
    t.equal(run.code, 0, run.stderr)
    return run.stdout
  }
  // it read "remaining 4/2": the two workers' budgets summed, printed against one worker's limit
  t.match(await get(), /\n {2}identity\.failures \(ip, gcra\) remaining 4\/4 over 2 worker\(s\), 2 each, reset in 0 ms, ok {2}gw:/)
  // bad keys on new connections, which the primary hands to both workers, until neither has budget left
  await until('both workers refuse the client', async () => {
    await fetch(`${r.gw.url}/x`, { headers: { 'x-api-key': 'wrong', connection: 'close' } })
    return /remaining 0\/4/.test(await get())
  })
  // a refused request fills that worker's deny cache
  t.equal((await fetch(`${r.gw.url}/x`, { headers: { 'x-api-key': 'wrong', connection: 'close' } })).status, 429)
  t.match(await get(), /remaining 0\/4 over 2 worker\(s\), 2 each, reset in \d+ ms, limited, retry in \d+ ms, deny-cached \d+ ms in a worker {2}gw:/)
})

t.test('workers: 2: explain says the local level is a bucket per worker, as the fleet admits', async t => {
  const up = await startUpstream(t)
  const r = await twoWorkers(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
local: { limit: 3, window: 1h }
upstreams: { b: { targets: [${up.url}] } }
routes:
  - { name: api, pathPrefix: /, upstream: b }
`)
  const explained = await gateway(['explain', '-c', r.gw.file, 'GET', '/x'])
  t.equal(explained.code, 0, explained.stderr)
  // it read "(in process)", as if the client had 3 requests: the fleet lets it through more
  t.match(explained.stdout, /^local: +token bucket 3\/1h burst 3 per client "127\.0\.0\.1" \(in process: each of the 2 workers holds its own bucket\)$/m)
  let admitted = 0
  for (let i = 0; i < 8; i++) {
    // a new connection each: the primary hands them to the workers in turn
    if ((await fetch(`${r.gw.url}/x`, { headers: { connection: 'close' } })).status === 200) admitted++
  }
  t.ok(admitted > 3, `the fleet admitted ${admitted} of 8, more than one bucket's 3`)
})

t.test('workers: 2: while the primary drains, /limits says the gateway is shutting down, not that no config is loaded', async t => {
  const up = await startUpstream(t)
  const r = await twoWorkers(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
server: { shutdownTimeout: 10s }
upstreams: { b: { targets: [${up.url}] } }
routes:
  - { name: api, pathPrefix: /, upstream: b }
`)
  const before = await fetch(`${r.adminUrl}/limits?route=api&ip=127.0.0.1`)
  t.equal(before.status, 200, 'answered while serving')
  const held = fetch(`${r.gw.url}/slow?ms=2000`).then(res => res.status)
  await until('the held request reached the upstream', () => up.log.length > 0)
  r.gw.child.kill('SIGTERM')
  await until('the primary drains', async () => (await fetch(`${r.adminUrl}/readyz`)).status === 503)
  // the body says why, as a single process's does: it said "ready" with its 503
  t.equal(((await (await fetch(`${r.adminUrl}/readyz`)).json()) as { status: string }).status, 'shutting_down')
  const during = await fetch(`${r.adminUrl}/limits?route=api&ip=127.0.0.1`)
  t.equal(during.status, 503)
  t.match(await during.json(), { error: 'not_ready', message: 'the gateway is shutting down' })
  t.equal(await held, 200, 'the held request is answered')
  t.equal(await r.gw.exited, 0)
})
