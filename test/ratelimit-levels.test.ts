// The levels of the limiter seen through HTTP: the shared level decides all dimensions
// all-or-nothing and never records a rejection; the deny cache answers a key the shared level
// already rejected without a Redis call; the local level sheds a flood before it reaches Redis.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { burst, count, evalshaCalls, inNextWindow, limitedShapeProblem, metric, send, sleep, statusCounts, type Reply } from './helpers/ratelimit.js'

const redis = await startRedis()
t.teardown(() => redis.stop())
const admin = redis.client()

const asUser = (user: string): { headers: Record<string, string> } => ({ headers: { 'x-user-id': user } })

t.test('all-or-nothing: users over their own limit consume nothing of the global and API budgets', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s, onError: deny }
identity: { header: x-user-id }
limits:
  global: { algorithm: fixed-window, limit: 50, window: 1h }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: aon
    pathPrefix: /
    upstream: backend
    limits:
      api: { algorithm: fixed-window, limit: 50, window: 1h }
      user: { algorithm: sliding-window-log, limit: 1, window: 1h }
`)
  const url = `${gw.url}/x`
  // 40 users, 40 at once, each sending 2 requests in a row: the second is over the user's own
  // limit and is the first rejection of its key, so the Lua script itself decides it (no deny
  // cache yet). Had those 40 rejections consumed global or API units, 80 > 50 would be spent
  // and some users' first request would be refused.
  const pairs = await Promise.all(Array.from({ length: 40 }, async (_, i) => {
    const first = await send(url, asUser(`hog-${i}`))
    const second = await send(url, asUser(`hog-${i}`))
    return [first.status, second.status, second.json?.dimension]
  }))
  t.same(pairs.filter(p => p[0] !== 200 || p[1] !== 429 || p[2] !== 'user'), [], 'each user: 200, then 429 by the user dimension')
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { dimension: 'user', level: 'redis', result: 'rejected' }), 40, 'all 40 rejections were decided in Redis')

  const globalKey = (await admin.keys('gw:\\*.global.*'))[0] as string
  const apiKey = (await admin.keys('gw:aon.api.*'))[0] as string
  t.equal(await admin.hget(globalKey, 'c'), '40', 'the global counter holds the 40 admissions only')
  t.equal(await admin.hget(apiKey, 'c'), '40', 'the API counter holds the 40 admissions only')
  const logs = await admin.keys('gw:aon.user.*:hog-*')
  t.equal(logs.length, 40)
  t.same([...new Set(await Promise.all(logs.map(k => admin.zcard(k))))], [1], 'every user log holds its one admission only')

  // What other users get: the 10 units left, then a global/API rejection.
  const others: Reply[] = []
  for (let i = 0; i < 11; i++) others.push(await send(url, asUser(`other-${i}`)))
  t.same(others.map(r => r.status), [...Array(10).fill(200), 429])
  const last = others[10] as Reply
  t.ok(last.json?.dimension === 'global' || last.json?.dimension === 'api', `the 51st admission is refused by a shared budget (${String(last.json?.dimension)})`)
  t.equal((await admin.keys('gw:aon.user.*:other-10')).length, 0, 'the request the shared budget refused left nothing in its user log')
  t.equal(up.requests, 50)
})

t.test('rejected requests are not recorded: a client retrying every 100 ms is admitted as soon as the window allows', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s, onError: deny }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: retry
    pathPrefix: /
    upstream: backend
    limits:
      user: { algorithm: sliding-window-log, limit: 5, window: 3s }
`)
  const url = `${gw.url}/x`
  const windowMs = 3000
  const admitted: number[] = []
  const rejected: number[] = []
  const started = Date.now()
  while (Date.now() - started < 7000) {
    const sentAt = Date.now()
    const r = await send(url, asUser('eager'))
    const doneAt = Date.now()
    if (r.status === 200) admitted.push(doneAt)
    else if (r.status === 429) rejected.push(sentAt)
    else t.fail(`unexpected ${r.status}`)
    await sleep(100)
  }
  // Had rejections been recorded, the log would stay full: the client would be refused with
  // fewer than 5 admissions in the window (the seed documents' lock-out).
  const inWindowBefore = (at: number, slack: number): number => admitted.filter(a => a > at - windowMs - slack && a <= at).length
  const unjustified = rejected.filter(at => inWindowBefore(at, 100) < 5)
  t.same(unjustified.map(at => at - started), [], 'every rejection had 5 admissions in the 3 s before it')
  const overfull = admitted.filter(at => inWindowBefore(at, -100) > 5)
  t.same(overfull.map(at => at - started), [], 'never more than 5 admissions in a 3 s window')
  t.ok(admitted.length >= 15, `${admitted.length} admissions in 7 s (5 per window, 3 windows started)`)
  t.ok(rejected.length >= 20, `${rejected.length} rejections`)
  const key = (await admin.keys('gw:retry.user.*:eager'))[0] as string
  t.ok(await admin.zcard(key) <= 5, 'the log never holds more than the admissions of one window')
})

t.test('deny cache: after a rejection by Redis, that key is rejected without any Redis call', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: deny
    pathPrefix: /
    upstream: backend
    limits:
      user: { algorithm: token-bucket, limit: 2, window: 1h, burst: 2 }
`)
  const url = `${gw.url}/x`
  // the first call on a connection loads the script with EVAL; later calls are EVALSHA
  t.equal((await send(url, asUser('warm-up'))).status, 200)
  const c0 = await evalshaCalls(admin)
  t.same((await Promise.all([send(url, asUser('dora')), send(url, asUser('dora'))])).map(r => r.status), [200, 200])
  const first = await send(url, asUser('dora'))
  t.equal(first.status, 429)
  const c1 = await evalshaCalls(admin)
  t.equal(c1 - c0, 3, 'three decisions, three script calls (the measure works)')
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { level: 'redis', result: 'rejected' }), 1)

  const again: Reply[] = []
  for (let i = 0; i < 20; i++) again.push(await send(url, asUser('dora')))
  again.push(...await burst(30, url, asUser('dora')))
  t.same(statusCounts(again), { 429: 50 })
  t.equal(await evalshaCalls(admin) - c1, 0, 'fifty rejections, zero script calls')
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { dimension: 'user', level: 'local', result: 'rejected' }), 50, 'counted at level "local"')
  t.equal(limitedShapeProblem(again[0] as Reply, { dimension: 'user', limit: 'deny.user' }), null, 'a deny-cache answer looks like any 429')
  const retry = Number(again[0]?.headers['retry-after'])
  t.ok(retry >= 1700 && retry <= 1800, `Retry-After ${retry}: the bucket's own wait (1800 s per token), not a made-up one`)
  // another user is unaffected
  t.equal((await send(url, asUser('ed'))).status, 200)
  t.equal(await evalshaCalls(admin) - c1, 1)
})

t.test('local level: a flood over local.limit is shed in process; what passes reaches Redis', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s }
identity: { header: x-user-id }
local: { limit: 10, window: 1s }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: flood
    pathPrefix: /
    upstream: backend
    limits:
      api: { algorithm: fixed-window, limit: 100000, window: 1h }
`)
  const url = `${gw.url}/x`
  t.equal((await send(url, asUser('warm-up'))).status, 200)
  const c0 = await evalshaCalls(admin)
  const started = Date.now()
  const flood = await burst(150, url, asUser('flooder'))
  const seconds = (Date.now() - started) / 1000
  const admitted = count(flood, 200)
  // a 10/s bucket with 10 tokens: 10 at once plus what refilled while the flood lasted
  t.ok(admitted >= 10 && admitted <= 10 + Math.ceil(10 * seconds) + 1, `${admitted} admitted in ${seconds.toFixed(2)} s`)
  t.equal(count(flood, 429), 150 - admitted)
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { level: 'local', result: 'rejected', dimension: 'local' }), 150 - admitted, 'rejections counted at level "local"')
  t.equal(await evalshaCalls(admin) - c0, admitted, 'only what the local level let through cost a script call')
  const shed = flood.find(r => r.status === 429) as Reply
  t.equal(limitedShapeProblem(shed, { dimension: 'local', limit: 'local' }), null)
  t.equal(shed.headers['ratelimit-policy'], '"local";q=10;w=1')
  // per client: another user is not affected by the flooder
  t.equal((await send(url, asUser('calm'))).status, 200)
  // and the flooder's bucket refills at 10/s
  await inNextWindow(1000, 0)
  await sleep(300)
  t.equal((await send(url, asUser('flooder'))).status, 200, 'the bucket refilled')
})

// Regression: the local level keyed users and client addresses in one map, so a user whose name
// reads like an address spent the local budget of the anonymous clients at that address.
t.test('local level: a user named like an address does not share that address\'s bucket', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { header: x-user-id }
local: { limit: 3, window: 1h }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: shared
    pathPrefix: /
    upstream: backend
`)
  const url = `${gw.url}/x`
  const named: number[] = []
  for (let i = 0; i < 4; i++) named.push((await send(url, asUser('127.0.0.1'))).status)
  t.same(named, [200, 200, 200, 429], 'the user "127.0.0.1" spends its own bucket')
  t.equal((await send(url)).status, 200, 'an anonymous client at 127.0.0.1 still has its bucket')
})
