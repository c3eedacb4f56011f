// The admin API on the workers primary (`workers: 2`, real bin/gateway processes): GET /limits,
// DELETE /limits and GET /consumers/NAME are answered by every worker over IPC and combined,
// with Redis (one shared budget) and without (one in-process budget per worker, summed). A
// worker that does not answer gives a bounded 503, never a hang. The primary warns about a
// non-loopback admin address without a token, as a single process does.
import t from 'tap'
import { spawnGateway, type GatewayProcess } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { eventually, send, type Reply } from './helpers/ratelimit.js'
import { rawRequest } from './helpers/raw-http.js'
import { gateway } from './helpers/cli.js'

const TOKEN = 'admin-token-0123456789abcdef'
const WARNING = /admin listener binds a non-loopback address: anyone who can reach it reads/

interface PerWorker { pid: number, remaining: number, deniedMs: number, retryAfterMs: number }
interface LimitEntry { name: string, key: string, remaining: number, retryAfterMs: number, deniedMs: number, perWorker: PerWorker[] }
const entry = (r: Reply, name: string): LimitEntry => ((r.json?.limits ?? []) as LimitEntry[]).find(l => l.name === name) as LimitEntry

async function admin (url: string, method = 'GET', token?: string): Promise<Reply> {
  return await send(url, { method, headers: token === undefined ? {} : { authorization: `Bearer ${token}` } })
}

/** The primary's admin URL once both workers are ready; and the two worker pids. */
async function primaryOf (gw: GatewayProcess): Promise<{ adminUrl: string, pids: number[] }> {
  const primary = await gw.waitForLog(l => l.msg === 'gateway primary started')
  const adminUrl = `http://127.0.0.1:${primary.adminPort as number}`
  await eventually('both workers ready', async () => (await fetch(`${adminUrl}/readyz`)).status === 200, 30_000, 100)
  const pids = (): number[] => [...new Set(gw.logs.filter(l => l.msg === 'gateway started').map(l => l.pid as number))]
  await eventually('two worker processes', async () => pids().length === 2, 30_000, 100)
  return { adminUrl, pids: pids() }
}

/** Pids of the workers that answered requests with `status` (access log), from log line `from` on. */
const servedBy = (gw: GatewayProcess, status: number, from = 0): Set<number> =>
  new Set(gw.logs.slice(from).filter(l => l.msg === 'request' && l.status === status).map(l => l.pid as number))

t.test('workers + Redis: lookup shows the limited client in every worker; reset needs the token and frees it on every worker', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0, token: ${TOKEN} }
workers: 2
redis: { url: ${redis.url}, timeout: 2s }
local: { limit: 4, window: 1h }
identity:
  apiKeys: { header: x-api-key, keys: { k-bob: bob } }
consumers:
  bob: { plan: free }
plans:
  free:
    limits:
      quota: { limit: 1000, period: day }
limits:
  ip: { algorithm: sliding-window-log, limit: 3, window: 1h }
upstreams: { b: { targets: [${up.url}] } }
routes:
  - { name: api, pathPrefix: /, upstream: b }
`)
  const { adminUrl, pids } = await primaryOf(gw)
  // the admin page reads /routes once it opens: a ready primary must already have them
  const routes = await admin(`${adminUrl}/routes`)
  t.equal(routes.status, 200, 'the primary answers /routes as soon as /readyz says ready')
  t.same(((routes.json?.routes ?? []) as Array<{ name: string }>).map(r => r.name), ['api'], 'with the workers\' routes')
  t.notOk(gw.logs.some(l => WARNING.test(String(l.msg))), 'a loopback admin address is not warned about')

  // 3 admitted by the shared Redis budget, then refused on both workers (deny cache, local level)
  const statuses: number[] = []
  for (let i = 0; i < 8; i++) statuses.push((await send(`${gw.url}/x`)).status)
  t.same(statuses, [200, 200, 200, 429, 429, 429, 429, 429])
  await eventually('both workers logged a refusal', async () => servedBy(gw, 429).size === 2, 5000)

  const limitsUrl = `${adminUrl}/limits?route=api&ip=127.0.0.1`
  const read = await admin(limitsUrl)
  t.equal(read.status, 200, 'GET /limits answers on the primary')
  t.match(read.json, { route: 'api', ip: '127.0.0.1', workers: 2, combined: 'shared' })
  const ip = entry(read, 'ip')
  t.match(ip, { remaining: 0 }, 'the shared budget is spent')
  t.ok(ip.retryAfterMs > 3_500_000, `limited for about an hour (${ip.retryAfterMs} ms)`)
  t.same(ip.perWorker.map(p => p.pid).sort(), [...pids].sort(), 'each worker answered')
  t.ok(ip.perWorker.every(p => p.remaining === 0 && p.deniedMs > 0), 'every worker reads the spent budget and holds the client in its deny cache')
  t.equal(await redis.client().zcard(ip.key), 3, 'reading consumed nothing')

  const noToken = await admin(limitsUrl, 'DELETE')
  t.equal(noToken.status, 401)
  t.equal(noToken.json?.error, 'GW_ERR_ADMIN_UNAUTHORIZED')
  t.equal((await admin(limitsUrl, 'DELETE', TOKEN + 'x')).status, 401, 'a wrong token is refused')
  t.equal(await redis.client().zcard(ip.key), 3, 'nothing was reset')
  t.equal((await send(`${gw.url}/x`)).status, 429, 'the client is still refused')
  t.equal((await admin(`${adminUrl}/limits?route=nope`)).json?.message, 'unknown route "nope"', 'a bad query is the workers\' 400')
  t.equal((await admin(limitsUrl, 'PUT', TOKEN)).status, 405)

  const from = gw.logs.length
  const reset = await admin(limitsUrl, 'DELETE', TOKEN)
  t.equal(reset.status, 200)
  t.match(reset.json, { workers: 2, keysDeleted: 1, complete: true, reset: [{ name: 'ip' }, { name: 'identity.failures' }] })
  t.same((reset.json?.resetIn as number[]).sort(), [...pids].sort(), 'reset in every worker')
  t.equal(await redis.client().exists(ip.key), 0, 'the Redis key is gone')
  // a fresh shared budget of 3, and no worker keeps the client in its deny cache or local level
  const after: number[] = []
  for (let i = 0; i < 4; i++) after.push((await send(`${gw.url}/x`)).status)
  t.same(after, [200, 200, 200, 429], 'admitted again, by the shared budget')
  await eventually('the admissions were logged', async () => servedBy(gw, 200, from).size === 2, 5000)
  t.equal(servedBy(gw, 200, from).size, 2, 'both workers admit the client again')
  t.equal(gw.logs.filter(l => l.msg === 'limits reset').length, 2, 'each worker logged the reset')
  // the local level is each worker's own, with Redis too: summed, 2 x 4 tokens less the 4 taken since the reset
  const local = entry(await admin(limitsUrl), 'local')
  t.match(local, { scope: 'instance', key: 'local:127.0.0.1', remaining: 4 }, 'the local buckets, summed over the workers')
  t.same(local.perWorker.map(p => p.pid).sort(), [...pids].sort(), 'each worker\'s own bucket')
  const printed = await gateway(['limits', 'get', '--route', 'api', '--ip', '127.0.0.1', '--admin', adminUrl.slice('http://'.length)])
  t.equal(printed.code, 0, printed.stderr)
  // read against one worker's 4, it said "remaining 4/4", as if the client had a whole bucket and not half of the fleet's
  t.match(printed.stdout, /\n {2}local \(ip, token-bucket\) remaining 4\/8 over 2 worker\(s\), 4 each, reset in \d+ ms, ok {2}local:127\.0\.0\.1\n {2}ip \(ip, sliding-window-log\) remaining 0\/3,/)

  const consumer = await admin(`${adminUrl}/consumers/bob`)
  t.equal(consumer.status, 200)
  t.match(consumer.json, { consumer: 'bob', plan: 'free', quota: { limit: 1000 }, workers: 2, combined: 'shared' })

  // a worker that cannot answer (stopped): a bounded 503, never a hang
  const stopped = pids[0] as number
  process.kill(stopped, 'SIGSTOP')
  t.teardown(() => { try { process.kill(stopped, 'SIGCONT') } catch { /* gone */ } })
  const started = Date.now()
  const stuck = await admin(limitsUrl)
  const waited = Date.now() - started
  t.equal(stuck.status, 503)
  t.equal(stuck.json?.error, 'GW_ERR_ADMIN_WORKERS_UNAVAILABLE')
  t.match(stuck.json?.message, new RegExp(`1 of 2 workers answered within 3000 ms \\(no answer from pid ${stopped}`))
  // the bound is 3 s: waited out, and not much more (a loaded machine adds a few seconds at most)
  t.ok(waited >= 2900 && waited < 9000, `answered after ${waited} ms (bound 3000 ms)`)
  const partial = await admin(limitsUrl, 'DELETE', TOKEN)
  t.equal(partial.status, 503)
  t.match(partial.json?.message, new RegExp(`the reset was applied by worker \\[${pids[1] as number}\\] alone: repeat it`))
  // `gateway limits` says so with the exit code of no answer (4), not of a refusal (1)
  const cli = await gateway(['limits', 'get', '--route', 'api', '--ip', '127.0.0.1', '--admin', adminUrl.slice('http://'.length)])
  t.equal(cli.code, 4, cli.stderr)
  t.match(cli.stderr, /503 GW_ERR_ADMIN_WORKERS_UNAVAILABLE: 1 of 2 workers answered/)
  process.kill(stopped, 'SIGCONT')
  await eventually('the stopped worker answers again', async () => (await admin(limitsUrl)).status === 200, 10_000, 200)
})

t.test('workers without Redis: each worker has its own budget; lookup sums them, reset frees every worker', async t => {
  const up = await startUpstream(t)
  // no shared limits (those need Redis with workers > 1): the failed-identity budget of an IP,
  // which each worker keeps in process
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0, token: ${TOKEN} }
workers: 2
identity:
  apiKeys: { header: x-api-key, keys: { k-bob: bob } }
  failureLimit: { limit: 2, window: 1h }
upstreams: { b: { targets: [${up.url}] } }
routes:
  - { name: api, pathPrefix: /, upstream: b }
`)
  const { adminUrl, pids } = await primaryOf(gw)
  const bad = { headers: { 'x-api-key': 'wrong' } }
  const limitsUrl = `${adminUrl}/limits?route=api&ip=127.0.0.1`

  t.equal((await send(`${gw.url}/x`, bad)).status, 401)
  const one = entry(await admin(limitsUrl), 'identity.failures')
  t.equal(one.remaining, 3, 'summed: 2 + 2 budgets, one failure spent')
  t.same(one.perWorker.map(p => p.remaining).sort(), [1, 2], 'one worker spent one')

  // until both workers refuse: each has spent its own budget of 2
  for (let i = 0; i < 12 && servedBy(gw, 429).size < 2; i++) {
    await send(`${gw.url}/x`, bad)
    if (i >= 3) await new Promise(resolve => setTimeout(resolve, 50))
  }
  await eventually('both workers logged a refusal', async () => servedBy(gw, 429).size === 2, 5000)
  t.equal(servedBy(gw, 429).size, 2, 'both workers refuse the client')
  const read = await admin(limitsUrl)
  t.equal(read.status, 200)
  t.match(read.json, { workers: 2, combined: 'summed', note: /summed over the workers/ })
  const spent = entry(read, 'identity.failures')
  t.equal(spent.remaining, 0)
  t.ok(spent.retryAfterMs > 60_000, `limited for minutes (${spent.retryAfterMs} ms)`)
  t.same(spent.perWorker.map(p => p.pid).sort(), [...pids].sort())
  t.ok(spent.perWorker.every(p => p.remaining === 0), 'each worker\'s own budget is spent')

  t.equal((await admin(limitsUrl, 'DELETE')).status, 401, 'a reset without the token is refused')
  t.equal(entry(await admin(limitsUrl), 'identity.failures').remaining, 0, 'and changed nothing')
  const reset = await admin(limitsUrl, 'DELETE', TOKEN)
  t.equal(reset.status, 200)
  t.match(reset.json, { workers: 2, instances: 2, complete: true })
  t.equal(reset.json?.keysDeleted, 2, 'the budget each worker held for the client, summed over the workers')
  t.same((reset.json?.resetIn as number[]).sort(), [...pids].sort())
  const whole = entry(await admin(limitsUrl), 'identity.failures')
  t.equal(whole.remaining, 4, 'every worker has its whole budget again')
  const from = gw.logs.length
  const after: number[] = []
  for (let i = 0; i < 4; i++) after.push((await send(`${gw.url}/x`, bad)).status)
  t.same(after, [401, 401, 401, 401], 'failures are answered 401 again, not 429')
  await eventually('the 401s were logged', async () => servedBy(gw, 401, from).size === 2, 5000)
  t.equal(servedBy(gw, 401, from).size, 2, 'on both workers')
  // the primary's admin listener: a throw there ended the primary, and every worker with it
  const badEscape = await rawRequest(Number(new URL(adminUrl).port), 'GET /consumers/%zz HTTP/1.1\r\nHost: localhost\r\n')
  t.same([badEscape.status, badEscape.json?.error], [400, 'GW_ERR_BAD_REQUEST'], 'the primary answers /consumers/%zz with a 400')
  const badUrl = await rawRequest(Number(new URL(adminUrl).port), 'GET //[ HTTP/1.1\r\nHost: localhost\r\n')
  t.same([badUrl.status, badUrl.json?.error], [400, 'GW_ERR_BAD_REQUEST'], 'and GET //[')
  const longQuery = await rawRequest(Number(new URL(adminUrl).port), `GET /limits?route=${'a'.repeat(20_000)} HTTP/1.1\r\nHost: localhost\r\n`)
  t.same([longQuery.status, longQuery.json?.error], [414, 'GW_ERR_URI_TOO_LONG'], 'a query over 16 KiB: JSON, where node wrote a bare 431')
  // the same rules as a single process: read-only, and loopback Host names only on loopback
  const adminPort = Number(new URL(adminUrl).port)
  const postConfig = await rawRequest(adminPort, 'POST /config HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n')
  t.same([postConfig.status, postConfig.headers.allow, postConfig.json?.error], [405, 'GET, HEAD', 'GW_ERR_METHOD_NOT_ALLOWED'], 'POST /config: 405 (it was 200), with Allow')
  t.equal((await rawRequest(adminPort, 'POST /nope HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n')).status, 404, 'POST to a path the primary does not serve: 404')
  t.equal((await rawRequest(adminPort, 'GET /config HTTP/1.1\r\nHost: attacker.example\r\n')).status, 421, 'a rebound Host: 421')
  t.equal((await send(`${gw.url}/x`)).status, 200, 'the workers still serve')
})

t.test('the workers primary warns when its admin listener binds a non-loopback address without a token', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: 0.0.0.0:0
workers: 2
upstreams: { b: { targets: [${up.url}] } }
routes:
  - { name: api, pathPrefix: /, upstream: b }
`)
  const primary = await gw.waitForLog(l => l.msg === 'gateway primary started')
  const warning = await gw.waitForLog(l => WARNING.test(String(l.msg)))
  t.match(warning, { level: 40, admin: '0.0.0.0:0', pid: primary.pid }, 'logged by the primary, which owns the admin listener')
})
