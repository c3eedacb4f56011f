// Redis failing under a running gateway (README "When Redis fails"): a killed, paused or
// restarted redis-server, and SCRIPT FLUSH. What a client sees: never a 500; `onError: local`
// keeps limiting, `allow` fails open, `deny` answers 503 GW_ERR_LIMITER_UNAVAILABLE; /readyz
// shows the fallback; once Redis is back, decisions are made by Redis again.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis, type RedisServer } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { burst, count, eventually, limitedShapeProblem, metric, send, sleep, statusCounts, type Reply } from './helpers/ratelimit.js'

interface Readyz { status: string, redis: { state: string, breaker: string | null, instances: number } }

const readyz = async (adminUrl: string): Promise<Readyz> => await (await fetch(`${adminUrl}/readyz`)).json() as Readyz

function config (upstream: string, redis: RedisServer, onError: string, limits = '      user: { algorithm: sliding-window-log, limit: 5, window: 1m }'): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
redis: { url: ${redis.url}, timeout: 500ms, onError: ${onError} }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: r
    pathPrefix: /
    upstream: backend
    limits:
${limits}
`
}

/** The breaker state named by the last switch logged. */
function degradedBreaker (lines: ReadonlyArray<Record<string, unknown>>): unknown {
  return lines.filter(l => l.breaker !== undefined).at(-1)?.breaker
}

/** `n` requests one after another as `user`. */
async function sequence (n: number, url: string, user: string): Promise<Reply[]> {
  const replies: Reply[] = []
  for (let i = 0; i < n; i++) replies.push(await send(url, { headers: { 'x-user-id': user } }))
  return replies
}

const decisions = (adminUrl: string, labels: Record<string, string>): Promise<number> =>
  metric(adminUrl, 'gateway_ratelimit_decisions_total', labels)

t.test('onError local: a killed Redis never yields a 500, limits keep rejecting in process, /readyz shows the fallback; a restart brings Redis back', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, redis, 'local'))
  const url = `${gw.url}/x`

  const before = await sequence(7, url, 'alice')
  t.same(before.map(r => r.status), [200, 200, 200, 200, 200, 429, 429], 'Redis decides: 5 then 429')
  t.equal(await decisions(gw.adminUrl, { level: 'redis', result: 'rejected' }), 1, 'one rejection by Redis (the next came from the deny cache)')
  t.equal((await readyz(gw.adminUrl)).redis.state, 'up')

  // Kill Redis while 100 requests of 20 users are in flight, 10 at a time.
  const during: Reply[] = []
  let next = 0
  const worker = async (): Promise<void> => {
    while (next < 100) {
      const i = next++
      during.push(await send(url, { headers: { 'x-user-id': `mid-${i % 20}` } }))
    }
  }
  const redisBeforeKill = await decisions(gw.adminUrl, { level: 'redis' })
  const workers = Promise.all(Array.from({ length: 10 }, worker))
  // killed once 30 have been answered, so the kill lands among requests in flight
  while (during.length < 30) await sleep(5)
  await redis.kill()
  await workers
  const unexpected = during.filter(r => r.status !== 200 && r.status !== 429)
  t.same(unexpected.map(r => `${r.status} ${r.text}`), [], 'only 200 and 429 while Redis died under load')
  t.equal(during.length, 100, 'every request answered')
  t.ok(await decisions(gw.adminUrl, { level: 'redis' }) - redisBeforeKill >= 30, 'the first of them decided by Redis')
  t.ok(await decisions(gw.adminUrl, { level: 'fallback' }) >= 1, 'the rest by the fallback')
  t.ok(await metric(gw.adminUrl, 'gateway_redis_errors_total') >= 1, 'Redis calls failed under them: requests crossed the kill')

  // A fresh user: the fallback keeps the limit (one instance: the whole budget).
  const after = await sequence(8, url, 'bob')
  t.same(after.map(r => r.status), [200, 200, 200, 200, 200, 429, 429, 429], 'the fallback still rejects after the budget')
  t.equal(limitedShapeProblem(after[5] as Reply, { dimension: 'user', limit: 'r.user' }), null, 'a well-formed 429')
  t.ok(await decisions(gw.adminUrl, { level: 'fallback', result: 'rejected' }) >= 1, 'rejections counted at level "fallback"')
  t.ok(await decisions(gw.adminUrl, { level: 'fallback', result: 'allowed' }) >= 5, 'admissions counted at level "fallback"')
  const degraded = await readyz(gw.adminUrl)
  t.equal(degraded.status, 'degraded')
  t.equal(degraded.redis.state, 'fallback')
  t.not(degraded.redis.breaker, 'closed')
  t.ok(await metric(gw.adminUrl, 'gateway_redis_breaker_state') >= 1, 'breaker gauge open or half-open')
  t.ok(await metric(gw.adminUrl, 'gateway_redis_errors_total') >= 1, 'Redis errors counted')

  // The breaker's probe pause grows: 0.25 s after opening, then 0.5 s, 1 s, and stays at 1 s (the
  // cap keeps recovery within about a second of Redis coming back). Traffic every 50 ms and the
  // breaker's own probe timer give it a probe as soon as a pause ends; four probes show three pauses.
  const switches = (breaker: string): Array<Record<string, unknown>> =>
    gw.lines.filter(l => l.msg === 'rate limiter falling back: Redis unavailable' && l.breaker === breaker)
  let user = 0
  await eventually('four probes of the dead Redis', async () => {
    await send(url, { headers: { 'x-user-id': `dead-${user++}` } })
    return switches('half-open').length >= 4
  }, 20_000, 50)
  const probes = switches('half-open').map(l => Date.parse(String(l.time)))
  const pauses = probes.slice(1).map((at, i) => at - (probes[i] as number))
  // From the server's own log clock: lower bounds (a constant pause gives ~250 ms each), and the
  // cap (an uncapped pause would be 2 s by the third).
  const [p0, p1, p2] = pauses as [number, number, number]
  t.ok(p0 >= 495 && p1 >= 995, `pauses between probes grow: ${pauses.join(', ')} ms`)
  t.ok(p2 >= 995 && p2 < 1900, `the pause stays at its 1 s cap: ${p2} ms`)
  // Logged once per switch, never per request: the first opening, then one line per failed
  // probe (half-open) and one per re-opening.
  const opened = switches('open').length
  const probed = switches('half-open').length
  t.equal(opened, probed + (degradedBreaker(gw.lines) === 'open' ? 1 : 0), `opened ${opened} times: once, then once per failed probe`)
  t.equal(gw.lines.filter(l => l.msg === 'rate limiter falling back: Redis unavailable').length, opened + probed, 'no other fallback line')

  // Back: the breaker probes (0.25 s, doubling up to 1 s; at once on reconnect) and closes; Redis decides again.
  await redis.restart()
  const redisBefore = await decisions(gw.adminUrl, { level: 'redis' })
  let probe = 0
  await eventually('decisions by Redis again', async () => {
    // a new user each time: one user would soon be over the fallback budget and deny-cached
    await send(url, { headers: { 'x-user-id': `probe-${probe++}` } })
    return await decisions(gw.adminUrl, { level: 'redis' }) > redisBefore
  }, 20_000, 200).catch((err: unknown) => {
    t.fail(String(err), { logs: gw.lines.filter(l => l.msg !== 'request') })
  })
  t.equal((await readyz(gw.adminUrl)).status, 'ready')
  t.equal((await readyz(gw.adminUrl)).redis.state, 'up')
  t.equal(await metric(gw.adminUrl, 'gateway_redis_breaker_state'), 0)
  t.ok(gw.lines.some(l => l.msg === 'rate limiter back on Redis'), 'the recovery was logged')
  const fallbackBefore = await decisions(gw.adminUrl, { level: 'fallback' })
  const resumed = await sequence(7, url, 'carol')
  t.same(resumed.map(r => r.status), [200, 200, 200, 200, 200, 429, 429], 'limiting resumes through Redis')
  t.equal(await decisions(gw.adminUrl, { level: 'fallback' }), fallbackBefore, 'nothing more decided by the fallback')
  const keys = await redis.client().keys('gw:r.user.*:carol')
  t.equal(keys.length, 1, 'carol\'s state lives in the restarted Redis')
})

t.test('onError allow: with Redis dead every request passes; never a 500', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, redis, 'allow'))
  const url = `${gw.url}/x`
  t.same((await sequence(6, url, 'alice')).map(r => r.status), [200, 200, 200, 200, 200, 429])
  await redis.kill()
  const replies = await sequence(20, url, 'dave')
  t.same(statusCounts(replies), { 200: 20 }, 'a limit of 5 is skipped while Redis is away')
  const concurrent = await burst(50, url, { headers: { 'x-user-id': 'erin' } })
  t.same(statusCounts(concurrent), { 200: 50 })
  t.equal((await readyz(gw.adminUrl)).redis.state, 'fallback')
})

t.test('onError deny: with Redis dead the limited route answers 503 GW_ERR_LIMITER_UNAVAILABLE; never a 500', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, redis, 'deny'))
  const url = `${gw.url}/x`
  t.same((await sequence(3, url, 'alice')).map(r => r.status), [200, 200, 200])
  const upstreamBefore = up.requests
  await redis.kill()
  const replies = await burst(30, url, { headers: { 'x-user-id': 'frank' } })
  t.same(statusCounts(replies), { 503: 30 })
  const body = (replies[0] as Reply).json
  t.equal(body?.error, 'GW_ERR_LIMITER_UNAVAILABLE')
  t.type(body?.requestId, 'string')
  t.equal(up.requests, upstreamBefore, 'nothing reached the upstream')
  // an anonymous request has no user limit to decide: it is not denied
  t.equal((await send(url)).status, 200, 'a request no limit applies to still passes')
  t.equal((await readyz(gw.adminUrl)).redis.state, 'fallback')
})

t.test('per-limit onError: allow, deny and local on one route while Redis is dead', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const routes = (name: string, onError: string): string => `  - name: ${name}
    path: /${name}
    upstream: backend
    limits:
      api: { algorithm: token-bucket, limit: 3, window: 1h, onError: ${onError} }
`
  // a token bucket (one token per 20 min), not a fixed window: an epoch-aligned window would start
  // afresh if the run crossed the top of the hour
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 500ms }
upstreams:
  backend: { targets: [${up.url}] }
routes:
${routes('local', 'local')}${routes('allow', 'allow')}${routes('deny', 'deny')}`)
  await redis.kill()
  const local = await Promise.all(Array.from({ length: 6 }, () => send(`${gw.url}/local`)))
  const allow = await Promise.all(Array.from({ length: 6 }, () => send(`${gw.url}/allow`)))
  const deny = await Promise.all(Array.from({ length: 6 }, () => send(`${gw.url}/deny`)))
  t.same(statusCounts(local), { 200: 3, 429: 3 }, 'local: limited in process')
  t.same(statusCounts(allow), { 200: 6 }, 'allow: fails open')
  t.same(statusCounts(deny), { 503: 6 }, 'deny: fails closed')
})

t.test('onError local with two instances: each keeps half the budget, together within the limit', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const yaml = config(up.url, redis, 'local', '      user: { algorithm: sliding-window-log, limit: 10, window: 1m }')
  const a = await startGateway(t, yaml)
  const b = await startGateway(t, yaml)
  // heartbeats every 2 s: wait until both instances know there are two
  await eventually('both instances counted', async () =>
    (await readyz(a.adminUrl)).redis.instances === 2 && (await readyz(b.adminUrl)).redis.instances === 2, 10_000, 200)
  await redis.kill()
  const fromA = await sequence(8, `${a.url}/x`, 'gina')
  const fromB = await sequence(8, `${b.url}/x`, 'gina')
  t.equal(count(fromA, 200), 5, 'instance A: 10 / 2')
  t.equal(count(fromB, 200), 5, 'instance B: 10 / 2')
  t.equal(count(fromA, 200) + count(fromB, 200), 10, 'together: the limit')
})

t.test('a paused Redis (CLIENT PAUSE) costs at most the timeout, and decisions fall back instead of waiting', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, redis, 'local').replace('timeout: 500ms', 'timeout: 100ms'))
  const url = `${gw.url}/x`
  t.equal((await send(url, { headers: { 'x-user-id': 'warmup' } })).status, 200)
  const admin = redis.client()
  await admin.call('CLIENT', 'PAUSE', '3000', 'ALL')
  const started = Date.now()
  const replies = await sequence(8, url, 'henry')
  const tookMs = Date.now() - started
  t.same(replies.map(r => r.status), [200, 200, 200, 200, 200, 429, 429, 429], 'the fallback limits while Redis hangs')
  // 3 timeouts open the breaker, the rest skip Redis: far less than the 3 s pause
  t.ok(tookMs < 2000, `8 requests took ${tookMs} ms with Redis paused for 3 s`)
  t.ok(await metric(gw.adminUrl, 'gateway_redis_errors_total', { kind: 'timeout' }) >= 1, 'timeouts counted')
  t.equal((await readyz(gw.adminUrl)).redis.state, 'fallback')
})

t.test('SCRIPT FLUSH: NOSCRIPT recovers by itself and decisions stay exact', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, redis, 'deny'))
  const url = `${gw.url}/x`
  t.same((await sequence(6, url, 'ivan')).map(r => r.status), [200, 200, 200, 200, 200, 429])
  const admin = redis.client()
  t.equal(await admin.script('FLUSH'), 'OK')
  const replies = await sequence(7, url, 'judy')
  t.same(replies.map(r => r.status), [200, 200, 200, 200, 200, 429, 429], 'decided by Redis, exactly, right after the flush')
  // concurrent requests after a second flush: every one still decided correctly
  await admin.script('FLUSH')
  const concurrent = await burst(20, url, { headers: { 'x-user-id': 'kim' } })
  t.same(statusCounts(concurrent), { 200: 5, 429: 15 })
  t.equal(await decisions(gw.adminUrl, { level: 'fallback' }), 0, 'no decision fell back')
  t.equal(await metric(gw.adminUrl, 'gateway_redis_errors_total'), 0, 'no failed Redis call')
})
