// The levels of the limiter seen through HTTP: the shared level decides all dimensions
// all-or-nothing and never records a rejection; the deny cache answers a key the shared level
// already rejected without a Redis call; the local level sheds a flood before it reaches Redis.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { burst, count, limitCalls, inNextWindow, limitedShapeProblem, metric, send, sleep, statusCounts, type Reply } from './helpers/ratelimit.js'
import { awayFromWindowEdge } from './helpers/window-edge.js'

const redis = await startRedis(t)
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
  // The global and API counters are read as such below, so they stay fixed windows; being aligned
  // on the epoch, they would start afresh if the run crossed the top of the hour: not that close to it.
  await awayFromWindowEdge(3_600_000, 30_000)
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

t.test('rejected requests are not recorded: a slot freed by the window is granted although rejections came after it', async t => {
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
  const user = asUser('eager')
  // Only lower bounds on time below (a timer never fires early; each client time is taken after
  // the server decided), so a loaded machine cannot make this test fail, only less sharp.
  const first = await send(url, user)
  t.equal(first.status, 200, 'the first admission opens the 3 s log')
  const firstAnsweredAt = Date.now()
  await sleep(2000)
  t.same((await Promise.all([1, 2, 3, 4].map(() => send(url, user)))).map(r => r.status), [200, 200, 200, 200], '4 more, 2 s later: the log is full')
  const rejected = await send(url, user)
  t.equal(rejected.status, 429, 'the 6th within 3 s is rejected')
  t.equal(limitedShapeProblem(rejected, { dimension: 'user', limit: 'retry.user' }), null)
  // The first admission leaves the log 3 s after it was decided: its slot is free again, while the
  // rejection is 2 s younger. Had it been recorded (the seed documents' lock-out), the log
  // would hold 4 admissions + that rejection, and the client would wait until it left too.
  await sleep(Math.max(0, firstAnsweredAt + 3300 - Date.now()))
  const probe = await send(url, user)
  t.equal(probe.status, 200, 'admitted as soon as the first admission left the window')
  const next = await send(url, user)
  t.equal(next.status, 429, 'and exactly that one slot: the log holds 5 again')
  const key = (await admin.keys('gw:retry.user.*:eager'))[0] as string
  t.equal(await admin.zcard(key), 5, 'the log holds the 5 admissions of the window, no rejection')
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
  const c0 = await limitCalls(admin)
  t.same((await Promise.all([send(url, asUser('dora')), send(url, asUser('dora'))])).map(r => r.status), [200, 200])
  const first = await send(url, asUser('dora'))
  t.equal(first.status, 429)
  const c1 = await limitCalls(admin)
  t.equal(c1 - c0, 3, 'three decisions, three script calls (the measure works)')
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { level: 'redis', result: 'rejected' }), 1)

  const again: Reply[] = []
  for (let i = 0; i < 20; i++) again.push(await send(url, asUser('dora')))
  again.push(...await burst(30, url, asUser('dora')))
  t.same(statusCounts(again), { 429: 50 })
  t.equal(await limitCalls(admin) - c1, 0, 'fifty rejections, zero script calls')
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { dimension: 'user', level: 'local', result: 'rejected' }), 50, 'counted at level "local"')
  t.equal(limitedShapeProblem(again[0] as Reply, { dimension: 'user', limit: 'deny.user' }), null, 'a deny-cache answer looks like any 429')
  const retry = Number(again[0]?.headers['retry-after'])
  t.ok(retry >= 1700 && retry <= 1800, `Retry-After ${retry}: the bucket's own wait (1800 s per token), not a made-up one`)
  // another user is unaffected
  t.equal((await send(url, asUser('ed'))).status, 200)
  t.equal(await limitCalls(admin) - c1, 1)
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
  const warmedUp = Date.now()
  t.equal((await send(url, asUser('warm-up'))).status, 200)
  const c0 = await limitCalls(admin)
  const flood = await burst(150, url, asUser('flooder'))
  const seconds = (Date.now() - warmedUp) / 1000
  const admitted = count(flood, 200)
  // a 10/s bucket with 10 tokens, keyed by IP: the warm-up took one of them, so the flood finds 9
  // plus what refilled since, and gets at most the whole bucket plus what refilled while it lasted
  t.ok(admitted >= 9 && admitted <= 10 + Math.ceil(10 * seconds) + 1, `${admitted} admitted, ${seconds.toFixed(2)} s after the warm-up`)
  t.equal(count(flood, 429), 150 - admitted)
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { level: 'local', result: 'rejected', dimension: 'local' }), 150 - admitted, 'rejections counted at level "local"')
  t.equal(await limitCalls(admin) - c0, admitted, 'only what the local level let through cost a script call')
  const shed = flood.find(r => r.status === 429) as Reply
  t.equal(limitedShapeProblem(shed, { dimension: 'local', limit: 'local' }), null)
  t.equal(shed.headers['ratelimit-policy'], '"local";q=10;w=1')
  // (keyed by client IP since issue 15: another user from this address shares the flooder's bucket)
  // and the flooder's bucket refills at 10/s
  await inNextWindow(1000, 0)
  await sleep(300)
  t.equal((await send(url, asUser('flooder'))).status, 200, 'the bucket refilled')
})

// The local level used to key users and addresses in one map (and a user named like an address
// shared that address's bucket). Since issue 15 it keys by client IP only, so users have no local
// bucket at all: test/shield-auth-failures.test.ts pins that rotating X-User-Id buys nothing.
