// `gateway limits get` against `workers: 2` (real bin/gateway processes): what the operator reads
// must describe the fleet. Without Redis each worker holds its own budget of `limit` and the primary
// sums `remaining` over them (src/admin/limits-over-workers.ts).
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
