// Issue 10: concurrency leases when things die. An instance SIGKILLed while holding leases leaves
// them to expire within `redis.leaseTtl` (nobody releases them); Redis going away sends leases to
// the `onError: local` fallback, which holds 1/n of each cap per live instance.
import t from 'tap'
import { request, type ClientRequest } from 'node:http'
import { startGateway, spawnGateway } from './helpers/gateway.js'
import type { Redis } from 'ioredis'
import { startRedis, type RedisServer } from './helpers/redis.js'
import type { Teardown } from './helpers/teardown.js'
import { startUpstream } from './helpers/upstream.js'
import { burst, eventually, metric, send, statusCounts } from './helpers/ratelimit.js'

const ALICE = { headers: { 'x-user-id': 'alice' } }

t.test('SIGKILL an instance holding leases: they return within leaseTtl', async t => {
  const redis = await startRedis(t)
  const reader = redis.client()
  const up = await startUpstream(t)
  const yaml = `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s, onError: deny, leaseTtl: 2s }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}], timeouts: { response: 60s } }
routes:
  - name: dl
    pathPrefix: /
    upstream: backend
    concurrency: { user: 2 }
`
  const victim = await spawnGateway(t, yaml)
  const survivor = await startGateway(t, yaml)
  // two requests that never end hold both of alice's leases on the victim
  const held = [send(`${victim.url}/hang`, ALICE).catch(() => null), send(`${victim.url}/hang`, ALICE).catch(() => null)]
  await eventually('the victim holds 2 leases', async () => await reader.zcard('gw:lease:dl.user:alice') === 2, 5000)
  t.equal((await send(`${survivor.url}/x`, ALICE)).json?.error, 'GW_ERR_CONCURRENCY_LIMITED', 'the other instance sees the cap full')
  // held past one whole TTL: renewal keeps them
  await new Promise(resolve => setTimeout(resolve, 2500))
  t.equal((await send(`${survivor.url}/x`, ALICE)).json?.error, 'GW_ERR_CONCURRENCY_LIMITED', 'still full after a whole TTL (renewed)')

  victim.child.kill('SIGKILL')
  await victim.exited
  const killedAt = Date.now()
  await Promise.all(held)
  let admittedAfter = -1
  const refusals: unknown[] = []
  while (Date.now() - killedAt < 6000) {
    const r = await send(`${survivor.url}/x`, ALICE)
    if (r.status === 200) {
      admittedAfter = Date.now() - killedAt
      break
    }
    refusals.push(r.json?.error)
    await new Promise(resolve => setTimeout(resolve, 100))
  }
  t.ok(refusals.length > 0 && refusals.every(e => e === 'GW_ERR_CONCURRENCY_LIMITED'), `refused by the cap until the leases expired (${refusals.length} tries)`)
  t.ok(admittedAfter >= 0, `admitted again ${admittedAfter} ms after the kill`)
  // the last renewal was at most a third of the TTL before the kill: expiry within the TTL, plus
  // a margin for a loaded machine
  t.ok(admittedAfter <= 2000 + 700, `within leaseTtl (2 s) of the kill: ${admittedAfter} ms`)
  t.same(statusCounts(await burst(2, `${survivor.url}/slow?ms=200`, ALICE)), { 200: 2 }, 'both of the dead instance\'s leases came back')
})

t.test('Redis down with onError: local: each of n instances holds 1/n of the cap, and gives it back', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
redis: { url: ${redis.url}, timeout: 200ms, onError: local, expectedInstances: 2 }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: fb
    pathPrefix: /
    upstream: backend
    concurrency: { user: 4 }
`)
  t.same(statusCounts(await burst(4, `${gw.url}/slow?ms=300`, ALICE)), { 200: 4 }, 'Redis up: the whole cap of 4')
  await redis.kill()
  // the first calls fail and open the breaker; they are decided by the fallback too
  const replies = await burst(10, `${gw.url}/slow?ms=1200`, ALICE)
  t.same(statusCounts(replies), { 200: 2, 429: 8 }, 'Redis down, 2 instances: this one holds 4 / 2 = 2')
  t.equal(await metric(gw.adminUrl, 'gateway_concurrency_rejected_total', { route: 'fb', dimension: 'user', level: 'fallback' }), 8, 'refusals counted at level fallback')
  t.same(statusCounts(await burst(2, `${gw.url}/slow?ms=200`, ALICE)), { 200: 2 }, 'the fallback\'s leases came back')
})

t.test('Redis down with onError: local, a cap of 5 over 2 live instances: each holds floor(5 / 2) = 2, together never above the cap', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const yaml = `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
redis: { url: ${redis.url}, timeout: 200ms, onError: local }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}], timeouts: { response: 60s } }
routes:
  - name: odd
    pathPrefix: /
    upstream: backend
    concurrency: { user: 5 }
`
  // no expectedInstances: n = 2 comes from the heartbeat alone (every 2 s; the first instance
  // learns of the second at its next beat), and is remembered once Redis is gone
  const a = await startGateway(t, yaml)
  const b = await startGateway(t, yaml)
  const readyz = async (adminUrl: string): Promise<{ redis: { instances: number } }> =>
    await (await fetch(`${adminUrl}/readyz`)).json() as { redis: { instances: number } }
  await eventually('both instances counted', async () =>
    (await readyz(a.adminUrl)).redis.instances === 2 && (await readyz(b.adminUrl)).redis.instances === 2, 10_000, 200)
  await redis.kill()
  // requests that run until alice leaves, so each admitted one keeps its lease for the whole test
  const held: ClientRequest[] = []
  t.teardown(() => { for (const req of held) req.destroy() })
  const hold = (url: string): void => {
    const req = request(`${url}/hang`, { headers: ALICE.headers, agent: false })
    req.on('error', () => {})
    req.end()
    held.push(req)
  }
  for (const [name, gw] of [['A', a], ['B', b]] as const) {
    const before = up.log.filter(u => u === '/hang').length
    hold(gw.url)
    hold(gw.url)
    await eventually(`instance ${name}: both of its requests reached the upstream`, async () => up.log.filter(u => u === '/hang').length === before + 2, 5000)
    const third = await send(`${gw.url}/x`, ALICE)
    t.equal(third.status, 429, `instance ${name}: the third request in flight is refused (5 / 2 rounded up, 3, admitted it)`)
    t.equal(third.json?.error, 'GW_ERR_CONCURRENCY_LIMITED', `instance ${name}: refused by the cap`)
    t.equal(third.json?.limit, 'odd.concurrency.user', `instance ${name}: the route's user cap`)
    t.equal(third.headers['retry-after'], '1', `instance ${name}: Retry-After: 1`)
  }
  t.equal(up.log.filter(u => u === '/x').length, 0, 'no third request reached the upstream: 4 in flight across both instances, within the cap of 5 (6 with a share of 3 each)')
  t.equal(await metric(a.adminUrl, 'gateway_concurrency_rejected_total', { route: 'odd', dimension: 'user', level: 'fallback' }), 1, 'instance A: the refusal counted at level fallback')
  for (const req of held) req.destroy()
})

t.test('Redis down with onError: deny: a request under a concurrency limit gets 503 GW_ERR_LIMITER_UNAVAILABLE', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
redis: { url: ${redis.url}, timeout: 200ms, onError: deny }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: dn
    pathPrefix: /
    upstream: backend
    concurrency: { user: 1 }
`)
  await redis.kill()
  const r = await send(`${gw.url}/x`, ALICE)
  t.equal(r.status, 503)
  t.equal(r.json?.error, 'GW_ERR_LIMITER_UNAVAILABLE')
})

t.test('Redis down with onError: allow: the caps are skipped', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
redis: { url: ${redis.url}, timeout: 200ms, onError: allow }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: al, pathPrefix: /, upstream: backend, concurrency: { user: 1 } }
`)
  t.same(statusCounts(await burst(3, `${gw.url}/slow?ms=500`, ALICE)), { 200: 1, 429: 2 }, 'Redis up: the cap of 1 holds')
  await redis.kill()
  t.same(statusCounts(await burst(3, `${gw.url}/slow?ms=500`, ALICE)), { 200: 3 }, 'Redis down: fails open')
})

/**
 * A Redis that DEBUG SLEEP can stall (through `blocker`), and a gateway config capping each user
 * at 1 request in flight on the route `name`, falling back in process, with a 30 s leaseTtl.
 */
async function sleepyRedisBehindCap (t: Teardown, name: string, timeout: string): Promise<{ redis: RedisServer, reader: Redis, blocker: Redis, yaml: string }> {
  const redis = await startRedis(t, { args: ['--enable-debug-command', 'yes'] })
  const up = await startUpstream(t)
  const yaml = `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
redis: { url: ${redis.url}, timeout: ${timeout}, onError: local, leaseTtl: 30s }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: ${name}
    pathPrefix: /
    upstream: backend
    concurrency: { user: 1 }
`
  return { redis, reader: redis.client(), blocker: redis.client(), yaml }
}

t.test('Redis answers after the timeout: the lease it took for a call the fallback decided is given back', async t => {
  const { reader, blocker, yaml } = await sleepyRedisBehindCap(t, 'late', '100ms')
  const gw = await startGateway(t, yaml)
  t.equal((await send(`${gw.url}/warm`, ALICE)).status, 200, 'scripts loaded while Redis answers')
  // Redis stops answering for 600 ms: the gateway's call times out and the fallback admits; the
  // script runs once Redis is back and takes a lease nobody holds
  const sleeping = blocker.call('DEBUG', 'SLEEP', '0.6')
  await new Promise(resolve => setTimeout(resolve, 50))
  const during = await send(`${gw.url}/x`, ALICE)
  t.equal(during.status, 200, 'admitted by the fallback')
  await sleeping
  // the late script's lease, if any, is released within the keeper's batching (10 ms) once it lands
  const key = 'gw:lease:late.user:alice'
  let left = -1
  for (let i = 0; i < 40; i++) {
    await new Promise(resolve => setTimeout(resolve, 50))
    left = await reader.zcard(key)
    if (left === 0 && i >= 10) break
  }
  t.equal(left, 0, 'no lease left in Redis (one stayed for leaseTtl, 30 s, before: every request of alice refused meanwhile)')
})

t.test('the connection to Redis drops after Redis ran the call: the lease it took for a call the fallback decided is given back', async t => {
  const { redis, reader, blocker, yaml } = await sleepyRedisBehindCap(t, 'lost', '5s')
  const killer = redis.client()
  const watcher = redis.client()
  const gw = await startGateway(t, yaml)
  const key = 'gw:lease:lost.user:alice'
  // what Redis did to alice's lease key, in order (keyspace events of sorted sets)
  const events: string[] = []
  await reader.config('SET', 'notify-keyspace-events', 'Kz')
  await watcher.subscribe(`__keyspace@0__:${key}`)
  watcher.on('message', (_channel: string, event: string) => { events.push(event) })
  const gatewayConnections = async (): Promise<string[]> => {
    const list = await reader.call('CLIENT', 'LIST', 'TYPE', 'normal') as string
    return [...list.matchAll(/^id=(\d+) .* name=edge-gateway /gm)].map(m => m[1] as string)
  }
  t.equal((await send(`${gw.url}/warm`, ALICE)).status, 200, 'scripts loaded while Redis answers')
  await eventually('the warm-up lease released', async () => events.join() === 'zadd,zrem', 3000)
  // Redis sleeps; the gateway's limit call arrives, then the kill of the gateway's connections.
  // Redis reads them in that order when it wakes: it runs the call (taking alice's lease) and
  // closes the connection before its reply goes out. The lost answer fails the call: the fallback
  // decides the request. Should the kill be read first (the call never run), the round is redone.
  let ran = false
  for (let round = 0; round < 3 && !ran; round++) {
    const ids = await gatewayConnections()
    t.ok(ids.length > 0, 'the gateway is connected')
    events.length = 0
    const lostBefore = await metric(gw.adminUrl, 'gateway_redis_errors_total', { kind: 'connection' })
    const sleeping = blocker.call('DEBUG', 'SLEEP', '0.6')
    await new Promise(resolve => setTimeout(resolve, 50))
    const during = send(`${gw.url}/x`, ALICE)
    await new Promise(resolve => setTimeout(resolve, 200))
    const kills = Promise.all(ids.map(id => killer.call('CLIENT', 'KILL', 'ID', id)))
    await sleeping
    await kills
    t.equal((await during).status, 200, 'admitted')
    // the call failed with its connection (else its answer came, and its own release was seen)
    const lost = await metric(gw.adminUrl, 'gateway_redis_errors_total', { kind: 'connection' }) > lostBefore
    ran = lost && events[0] === 'zadd'
    if (!ran) await eventually('the gateway reconnected', async () => (await gatewayConnections()).length > 0, 5000)
  }
  t.ok(ran, 'Redis ran the call whose answer was lost with its connection (it took the lease), and the fallback decided the request')
  await eventually('the lease released', async () => await reader.zcard(key) === 0, 5000).catch(() => {})
  t.equal(await reader.zcard(key), 0, 'no lease left in Redis (one stayed for leaseTtl, 30 s, before: every request of alice refused meanwhile)')
  t.same(events, ['zadd', 'zrem'], 'taken by the lost call, then removed')
  const other = await startGateway(t, yaml)
  t.equal((await send(`${other.url}/y`, ALICE)).status, 200, 'another instance, deciding through Redis, admits alice')
})

t.test('Redis goes away while this instance holds its share in Redis: the fallback counts those requests, and admits no more', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
redis: { url: ${redis.url}, timeout: 500ms, onError: local }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: held
    pathPrefix: /
    upstream: backend
    concurrency: { user: 2 }
`)
  // alice's whole cap in flight, admitted through Redis
  const held = [send(`${gw.url}/slow?ms=4000`, ALICE), send(`${gw.url}/slow?ms=4000`, ALICE)]
  await eventually('both reached the upstream', async () => up.log.filter(u => u.startsWith('/slow?ms=4000')).length === 2, 3000)
  await redis.kill()
  const during = await burst(3, `${gw.url}/slow?ms=200`, ALICE)
  t.same(statusCounts(during), { 429: 3 }, 'one instance, Redis down: its share (2) is already held by the requests Redis admitted (2 of them were admitted on top before)')
  t.ok(during.every(r => r.json?.error === 'GW_ERR_CONCURRENCY_LIMITED' && r.headers['retry-after'] === '1'), 'refused as the cap refuses')
  t.equal(up.log.filter(u => u.startsWith('/slow?ms=200')).length, 0, 'none reached the upstream')
  t.same(statusCounts(await Promise.all(held)), { 200: 2 })
  t.same(statusCounts(await burst(2, `${gw.url}/slow?ms=200`, ALICE)), { 200: 2 }, 'once they finished, the fallback admits its whole share again (nothing of theirs left counted)')
})

t.test('a release made while Redis restarts with its data is given back once it is back: the client is not refused for a leaseTtl', async t => {
  // persisted at every write: the lease outlives the restart, as on a failed-over replica
  const redis = await startRedis(t, { args: ['--appendonly', 'yes', '--appendfsync', 'always'] })
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
redis: { url: ${redis.url}, timeout: 2s, onError: deny, leaseTtl: 10s }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: persisted
    pathPrefix: /
    upstream: backend
    concurrency: { user: 1 }
`)
  const held = send(`${gw.url}/slow?ms=1000`, ALICE)
  await eventually('the request reached the upstream', async () => up.log.some(u => u.startsWith('/slow?ms=1000')), 3000)
  await redis.kill()
  t.equal((await held).status, 200, 'it finished while Redis was down: its release could not reach Redis')
  await redis.restart()
  const restarted = Date.now()
  const answers: number[] = []
  let admittedAfter = -1
  while (Date.now() - restarted < 9000) {
    const r = await send(`${gw.url}/x`, ALICE)
    answers.push(r.status)
    if (r.status === 200) {
      admittedAfter = Date.now() - restarted
      break
    }
    await new Promise(resolve => setTimeout(resolve, 100))
  }
  // reconnecting and the breaker's probe take well under a second; the lease stayed 7 to 10 s
  t.ok(admittedAfter >= 0 && admittedAfter < 5000, `alice, with nothing in flight, admitted ${admittedAfter} ms after Redis came back (answers: ${answers.join(' ')})`)
  // the release goes out as the connection is ready, ahead of the next request's call (503s come from
  // the breaker until its probe answers, onError: deny)
  t.notOk(answers.includes(429), 'never refused by her finished request\'s lease')
})

t.test('Redis restarted empty under a request in flight: its lease is back as the connection is ready, before the instance decides another request', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  // a 30 s TTL: the regular renewal (every 10 s) comes long after this test
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
redis: { url: ${redis.url}, timeout: 2s, onError: deny, leaseTtl: 30s }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: emptied
    pathPrefix: /
    upstream: backend
    concurrency: { user: 1 }
`)
  // a request that runs until alice leaves
  const held = request(`${gw.url}/hang`, { headers: ALICE.headers, agent: false })
  held.on('error', () => {})
  held.end()
  await eventually('the request reached the upstream', async () => up.log.includes('/hang'), 3000)
  await redis.restart()
  const restarted = Date.now()
  const answers: string[] = []
  let decided: Awaited<ReturnType<typeof send>> | null = null
  // 503 while the breaker waits for its probe (onError: deny); then the cap decides
  while (Date.now() - restarted < 8000) {
    const r = await send(`${gw.url}/x`, ALICE)
    answers.push(String(r.status))
    if (r.status !== 503) {
      decided = r
      break
    }
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  t.equal(decided?.json?.error, 'GW_ERR_CONCURRENCY_LIMITED', `the cap of 1 still counts alice's request in flight (answers: ${answers.join(' ')}; admitted before, 2 in flight until the renewal 10 s later)`)
  t.equal(up.log.filter(u => u === '/x').length, 0, 'the upstream saw no second request of hers')
  held.destroy()
  await eventually('alice admitted again once she left', async () => (await send(`${gw.url}/x`, ALICE)).status === 200, 3000)
})
