// A real 3-master Redis Cluster behind the gateway: a request's keys land on different slots,
// each slot is decided by its own script call, and a rejection in one slot refunds what the
// others recorded. Observed through HTTP: exact counts, and budgets left intact by refunds.
import t from 'tap'
import { Cluster } from 'ioredis'
import { startGateway } from './helpers/gateway.js'
import { startRedisCluster } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { burst, inNextWindow, metric, send, statusCounts, type Reply } from './helpers/ratelimit.js'
import { keySlot } from '../src/limit/keys.js'
import type { Gateway } from '../src/server.js'
import { awayFromWindowEdge } from './helpers/window-edge.js'

const cluster = await startRedisCluster(t)
const reader = new Cluster(cluster.ports.map(port => ({ host: '127.0.0.1', port })), { scaleReads: 'master' })
reader.on('error', () => {})
t.teardown(() => reader.disconnect())

/** Keys matching `pattern` on every master. */
async function keys (pattern: string): Promise<string[]> {
  const found = await Promise.all(reader.nodes('master').map(node => node.keys(pattern)))
  return found.flat()
}

async function flush (): Promise<void> {
  await Promise.all(reader.nodes('master').map(node => node.flushall()))
}

function config (upstream: string, routeLimits: string): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { cluster: [${cluster.urls.join(', ')}], timeout: 2s, onError: deny }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: c
    pathPrefix: /
    upstream: backend
    limits:
${routeLimits}
`
}

/** The key base of the route's `dimension` limit, from the running plan. */
function keyBase (gw: Gateway, dimension: string): string {
  const limit = gw.runtime?.routeList[0]?.limits.all.find(l => l.dimension === dimension)
  if (limit === undefined) throw new Error(`no ${dimension} limit`)
  return limit.keyBase
}

/** `n` user names whose user key is on a different slot than the API key. */
function usersOffSlot (gw: Gateway, prefix: string, n: number): string[] {
  const apiSlot = keySlot(keyBase(gw, 'api') + '_')
  const users: string[] = []
  for (let i = 0; users.length < n; i++) if (keySlot(keyBase(gw, 'user') + `${prefix}${i}`) !== apiSlot) users.push(`${prefix}${i}`)
  return users
}

t.test('200 concurrent requests of 20 users across slots: exactly the API limit, and the refunded user logs hold only admissions', async t => {
  await flush()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `      api: { algorithm: gcra, limit: 50, window: 1h, burst: 50 }
      user: { algorithm: sliding-window-log, limit: 1000, window: 1h }`))
  const users = usersOffSlot(gw, 'u', 20)
  const slots = new Set([keySlot(keyBase(gw, 'api') + '_'), ...users.map(u => keySlot(keyBase(gw, 'user') + u))])
  t.ok(slots.size > 10, `the request keys spread over ${slots.size} slots`)
  const replies = await burst(200, `${gw.url}/x`, i => ({ headers: { 'x-user-id': users[i % 20] as string } }))
  t.same(statusCounts(replies), { 200: 50, 429: 150 })
  t.equal(up.requests, 50)
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { level: 'fallback' }), 0, 'Redis decided everything')
  // Each rejection reaching Redis had its user slot admit and then be refunded.
  const logs = await keys(`${keyBase(gw, 'user')}*`)
  const entries = (await Promise.all(logs.map(k => reader.zcard(k)))).reduce((a, b) => a + b, 0)
  t.equal(entries, 50, 'the user logs hold the 50 admissions, nothing of the 150 rejections')
})

t.test('refunds leave the other dimension intact: users over their own limit do not spend the API budget', async t => {
  await flush()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `      api: { algorithm: fixed-window, limit: 45, window: 1h }
      user: { algorithm: sliding-window-log, limit: 1, window: 1h }`))
  // 45 >= 20 admitted + 20 units in refund at worst: no first request can hit a refund race
  const hogs = usersOffSlot(gw, 'hog-', 20)
  // The API counter is read as such below, so it stays a fixed window; being aligned on the epoch,
  // it would start afresh if the run crossed the top of the hour: not that close to it.
  await awayFromWindowEdge(3_600_000, 30_000)
  // each hog: one admitted, then one refused by its user slot after the API slot admitted it
  const pairs = await Promise.all(hogs.map(async user => {
    const first = await send(`${gw.url}/x`, { headers: { 'x-user-id': user } })
    const second = await send(`${gw.url}/x`, { headers: { 'x-user-id': user } })
    return `${first.status} ${second.status} ${String(second.json?.dimension)}`
  }))
  t.same([...new Set(pairs)], ['200 429 user'])
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { dimension: 'user', level: 'redis', result: 'rejected' }), 20, 'the 20 rejections came from Redis (each refunding its API unit)')
  const apiKey = keyBase(gw, 'api') + '_'
  t.equal(await reader.hget(apiKey, 'c'), '20', 'the API counter holds the 20 admissions only')
  const others: Reply[] = []
  for (let i = 0; i < 26; i++) others.push(await send(`${gw.url}/x`, { headers: { 'x-user-id': `other-${i}` } }))
  t.same(others.map(r => r.status), [...Array(25).fill(200), 429], 'the 25 API units left are all there for other users')
  t.equal(others[25]?.json?.dimension, 'api')
  t.equal(up.requests, 45)
})

t.test('refunds the other way: a request refused by the API leaves the user budget intact for the next window', async t => {
  await flush()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `      api: { algorithm: fixed-window, limit: 5, window: 3s }
      user: { algorithm: sliding-window-log, limit: 2, window: 1h }`))
  const [late] = usersOffSlot(gw, 'late-', 1) as [string]
  await inNextWindow(3000, 100)
  const spend = await burst(5, `${gw.url}/x`, i => ({ headers: { 'x-user-id': `spender-${i}` } }))
  t.same(statusCounts(spend), { 200: 5 })
  // The API is spent. Ten attempts at once: each one's user slot admits, its API slot refuses,
  // and the user unit is refunded. While refunds are in flight a concurrent attempt may find the
  // user budget (2) taken by units about to be refunded: that is the brief under-admission the
  // README allows, and it may even be reported as a user rejection. It must stay brief.
  const refused = await Promise.all(Array.from({ length: 10 }, () => send(`${gw.url}/x`, { headers: { 'x-user-id': late } })))
  t.same(statusCounts(refused), { 429: 10 })
  t.ok(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { level: 'redis', result: 'rejected' }) >= 1, 'at least one reached Redis')
  t.same(await keys(`${keyBase(gw, 'user')}${late}`), [], 'every refund done: nothing left in the user log')
  await inNextWindow(3000, 100)
  const later: Reply[] = []
  for (let i = 0; i < 3; i++) later.push(await send(`${gw.url}/x`, { headers: { 'x-user-id': late } }))
  t.same(later.map(r => r.status), [200, 200, 429], 'the full user budget of 2, then the user limit')
  t.equal(later[2]?.json?.dimension, 'user')
})

// Regression: in Cluster mode, units about to be refunded can make a concurrent request fail a
// dimension it would pass a moment later. That rejection carries the dimension's full wait (here
// an hour), and the deny cache used to hold the key for all of it: a brief under-admission
// became an hour-long lock-out of the user on that instance.
t.test('cluster refund race: a transient rejection does not lock the user out through the deny cache', async t => {
  await flush()
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { cluster: [${cluster.urls.join(', ')}], timeout: 2s, onError: deny }
trustedProxies: [127.0.0.1]
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: c
    pathPrefix: /
    upstream: backend
    limits:
      ip: { algorithm: sliding-window-log, limit: 1, window: 1h }
      user: { algorithm: sliding-window-log, limit: 2, window: 1h }
`)
  const userSlot = keySlot(keyBase(gw, 'user') + 'racer')
  const ips: string[] = []
  for (let i = 1; ips.length < 21; i++) {
    const ip = `198.51.100.${i}`
    if (keySlot(keyBase(gw, 'ip') + ip) !== userSlot) ips.push(ip)
  }
  // spend 20 client addresses (other users, so no rejection and nothing deny-cached)
  const spent = await Promise.all(ips.slice(0, 20).map((ip, i) => send(`${gw.url}/x`, { headers: { 'x-forwarded-for': ip, 'x-user-id': `warm-${i}` } })))
  t.same(statusCounts(spent), { 200: 20 })
  // 20 requests of one user at once, each from a spent address: every one is refused by its
  // address, and its user unit is refunded
  const refused = await Promise.all(ips.slice(0, 20).map(ip => send(`${gw.url}/x`, { headers: { 'x-forwarded-for': ip, 'x-user-id': 'racer' } })))
  t.same(statusCounts(refused), { 429: 20 })
  const byUser = refused.filter(r => r.json?.dimension === 'user').length
  t.comment(`${byUser} of 20 were reported as user rejections while refunds were in flight`)
  t.same(await keys(`${keyBase(gw, 'user')}racer`), [], 'all refunds done: the user has used nothing')
  // a moment later (the deny cache holds a Cluster rejection 250 ms at most), from a fresh
  // address, the user has the whole budget
  await new Promise(resolve => setTimeout(resolve, 1000))
  const fresh = ips[20] as string
  const after = await send(`${gw.url}/x`, { headers: { 'x-forwarded-for': fresh, 'x-user-id': 'racer' } })
  t.equal(after.status, 200, `the user is admitted (got ${after.status} ${String(after.json?.dimension)}, Retry-After ${String(after.headers['retry-after'])})`)
})
