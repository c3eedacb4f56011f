// Lease releases and renewals are sent without waiting for an answer (src/limit/concurrency.ts).
// A Redis that is stalled but still connected (CLIENT PAUSE here; SIGSTOP, a long script) answers
// nothing and fails nothing, so without a bound they would pile up in the client for as long as
// the stall lasts. Real redis-server, the gateway's own client, guard and keeper.
import t from 'tap'
import type { Cluster } from 'ioredis'
import { busyRedis, nodeClient, startRedis, startRedisCluster } from './helpers/redis.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { clusterNodes, createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { LeaseKeeper, MAX_WAITING_SENDS, type HeldLease } from '../src/limit/concurrency.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'
import type { LimitSpec } from '../src/limit/types.js'
import type { Teardown } from './helpers/teardown.js'

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** A redis-server of its own, the gateway's client and guard, and a keeper that records what it reports. */
async function reportingKeeper (t: Teardown, ttlMs: number): Promise<{ redis: Awaited<ReturnType<typeof startRedis>>, keeper: LeaseKeeper, errors: string[] }> {
  const redis = await startRedis(t)
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const guard = new RedisGuard({ store: createRedisStore({ client }), fallbackMaxKeys: 100, timeoutMs: 100, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {} })
  t.teardown(() => guard.close())
  const errors: string[] = []
  const keeper = new LeaseKeeper({ redis: { client, guard }, ttlMs, onError: (err, what) => errors.push(`${what}: ${(err as Error).message}`) })
  t.teardown(() => keeper.close(100))
  return { redis, keeper, errors }
}

t.test('Redis paused: lease calls waiting for it stay bounded, the rest are dropped and reported; all settle when it resumes', async t => {
  const { redis, keeper, errors } = await reportingKeeper(t, 10_000)
  await redis.client().call('CLIENT', 'PAUSE', '2500', 'ALL')
  let mostWaiting = 0
  // one release every 12 ms for 1.8 s: each goes out in a call of its own (10 ms batching)
  for (let i = 0; i < 150; i++) {
    const lease: HeldLease = { keys: [`lease:{u${i}}`], member: `m${i}`, level: 'redis', units: 1, released: false, heldAt: -1 }
    keeper.hold(lease)
    keeper.release(lease)
    await sleep(12)
    mostWaiting = Math.max(mostWaiting, keeper.waiting)
  }
  t.equal(mostWaiting, MAX_WAITING_SENDS, `at most ${MAX_WAITING_SENDS} sends waited for the paused Redis`)
  t.ok(keeper.dropped > 0, `the rest were dropped (${keeper.dropped})`)
  t.equal(errors.filter((e) => e.includes('lease releases already wait for Redis')).length, keeper.dropped, 'each drop reported, saying the leases expire within leaseTtl')
  for (let i = 0; i < 200 && keeper.waiting > 0; i++) await sleep(25)
  t.equal(keeper.waiting, 0, 'every call sent was answered once Redis resumed')
})

t.test('Redis paused while releases fill their bound: the renewal rounds of a request still running still go out', async t => {
  // renewed every 200 ms
  const { redis, keeper, errors } = await reportingKeeper(t, 600)
  const key = 'gw:lease:r.user:carol'
  const reader = redis.client()
  // a request that runs through the whole stall
  const running: HeldLease = { keys: [key], member: 'carol-1', level: 'redis', units: 1, released: false, heldAt: -1 }
  keeper.hold(running)
  await sleep(300)
  t.not(await reader.zscore(key, 'carol-1'), null, 'its lease is renewed into Redis')
  const pausedAt = Date.now()
  await reader.call('CLIENT', 'PAUSE', '5000', 'ALL')
  // other requests end, one every 12 ms, until their release sends have filled their bound (about
  // 0.8 s), then on for 0.6 s: renewal rounds (every 200 ms) meanwhile find the releases' bound full
  let filledAt = 0
  for (let i = 0; Date.now() - pausedAt < 4000 && (filledAt === 0 || Date.now() - filledAt < 600); i++) {
    const lease: HeldLease = { keys: [`lease:{u${i}}`], member: `m${i}`, level: 'redis', units: 1, released: false, heldAt: -1 }
    keeper.hold(lease)
    keeper.release(lease)
    await sleep(12)
    if (filledAt === 0 && errors.some((e) => e.includes('lease releases already wait for Redis'))) filledAt = Date.now()
  }
  t.ok(filledAt > 0, 'releases past their bound were dropped')
  t.same(errors.filter((e) => e.includes('renewals')), [], 'no renewal round was dropped')
  for (let i = 0; i < 300 && keeper.waiting > 0; i++) await sleep(25)
  t.equal(keeper.waiting, 0, 'every call sent was answered once Redis resumed')
})

/** A redis-server of its own, the gateway's client, a store deciding one call per check, and a guard. */
async function leaseStore (t: Teardown): Promise<{ client: ReturnType<typeof createRedisClient>, reader: ReturnType<Awaited<ReturnType<typeof startRedis>>['client']>, store: ReturnType<typeof createRedisStore>, guard: RedisGuard }> {
  const redis = await startRedis(t)
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const store = createRedisStore({ client, maxBatch: 1 })
  const guard = new RedisGuard({ store, fallbackMaxKeys: 100, timeoutMs: 1000, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {} })
  t.teardown(() => guard.close())
  return { client, reader: redis.client(), store, guard }
}

t.test('instances with different leaseTtl: a short lease taken, renewed and released never expires a longer one', async t => {
  const { client, reader, store, guard } = await leaseStore(t)
  const lease = (ttlMs: number): LimitSpec => Object.freeze({ id: 'r.concurrency.user', algorithm: 'lease', limit: 2, windowMs: ttlMs, burst: 2, maxDelayMs: 0 })
  const key = 'gw:lease:r.user:alice'
  // instance A (leaseTtl 30 s) and instance B (leaseTtl 2 s, a rolling change) each admit one request
  const a = await store.decideDetailed([{ key, spec: lease(30_000), cost: 1 }], 'A')
  const b = await store.decideDetailed([{ key, spec: lease(2000), cost: 1 }], 'B')
  t.ok(a.decision.allowed && b.decision.allowed)
  const keeperB = new LeaseKeeper({ redis: { client, guard }, ttlMs: 2000 })
  t.teardown(() => keeperB.close(100))
  const held: HeldLease = { keys: [key], member: b.callId, level: 'redis', units: 1, released: false, heldAt: -1 }
  keeperB.hold(held)
  await sleep(1000) // B renews its lease (every 667 ms) under its 2 s TTL
  t.ok(keeperB.calls >= 1, 'B renewed')
  keeperB.release(held)
  await sleep(2500)
  t.not(await reader.zscore(key, a.callId), null, 'A\'s lease, 30 s ahead, is still in Redis')
  t.equal(await reader.zcard(key), 1)
  const c = await store.decideDetailed([{ key, spec: lease(30_000), cost: 1 }], 'C')
  const d = await store.decideDetailed([{ key, spec: lease(30_000), cost: 1 }], 'D')
  t.same([c.decision.allowed, d.decision.allowed], [true, false], 'cap 2 with A in flight: one more, not two')
})

t.test('a held lease Redis lost (restarted empty) is added again by its next renewal: the cap counts it while its request runs', async t => {
  const { client, reader, store, guard } = await leaseStore(t)
  const spec: LimitSpec = Object.freeze({ id: 'w.concurrency.user', algorithm: 'lease', limit: 1, windowMs: 1500, burst: 1, maxDelayMs: 0 })
  const key = 'gw:lease:w.user:carol'
  const keeper = new LeaseKeeper({ redis: { client, guard }, ttlMs: 1500 })
  t.teardown(() => keeper.close(100))
  const taken = await store.decideDetailed([{ key, spec, cost: 1 }], 'ws')
  t.ok(taken.decision.allowed, 'carol opens her one WebSocket')
  keeper.hold({ keys: [key], member: taken.callId, level: 'redis', units: 1, released: false, heldAt: -1 })
  await reader.flushall() // what a Redis restarted without persistence holds
  t.equal(await reader.zcard(key), 0)
  await sleep(800) // renewals every 500 ms
  t.equal(await reader.zcard(key), 1, 'the renewal put the lease back')
  const second = await store.decideDetailed([{ key, spec, cost: 1 }], 'ws2')
  t.notOk(second.decision.allowed, 'a second WebSocket is refused by the cap of 1')
})

t.test('a release riding with a limit call the connection dropped is sent again once Redis is back: the lease does not stay for its leaseTtl', async t => {
  // persisted at every write: the lease outlives the restart, as on a failed-over replica
  const redis = await startRedis(t, { args: ['--appendonly', 'yes', '--appendfsync', 'always'] })
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const store = createRedisStore({ client })
  const guard = new RedisGuard({ store, fallbackMaxKeys: 100, timeoutMs: 1000, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {} })
  t.teardown(() => guard.close())
  const keeper = new LeaseKeeper({ redis: { client, guard, store }, ttlMs: 30_000 })
  t.teardown(() => keeper.close(100))
  const key = 'gw:lease:r.user:alice'
  const spec: LimitSpec = Object.freeze({ id: 'r.concurrency.user', algorithm: 'lease', limit: 1, windowMs: 30_000, burst: 1, maxDelayMs: 0 })
  const taken = await store.decideDetailed([{ key, spec, cost: 1 }], 'alice-1')
  t.ok(taken.decision.allowed, 'alice holds her one lease')
  const reader = redis.client()
  t.equal(await reader.zcard(key), 1)
  // Redis stalls; alice's request ends, and bob's limit call of the same turn carries her release
  await reader.call('CLIENT', 'PAUSE', '5000', 'ALL')
  const held: HeldLease = { keys: [key], member: taken.callId, level: 'redis', units: 1, released: false, heldAt: -1 }
  keeper.hold(held)
  keeper.release(held)
  const gcra: LimitSpec = Object.freeze({ id: 'r.user', algorithm: 'gcra', limit: 100, windowMs: 1000, burst: 100, maxDelayMs: 0 })
  const bob = store.decide([{ key: 'gw:r.user:bob', spec: gcra, cost: 1 }], 'bob-1').then(() => 'decided', (err: unknown) => (err as Error).message)
  await sleep(50)
  t.equal(keeper.carried, 1, 'the release rode with bob\'s call')
  t.equal(keeper.calls, 0, 'no release call of its own')
  // the server dies with the call unanswered, and comes back with its data
  await redis.kill()
  t.not(await bob, 'decided', 'bob\'s call failed with its connection')
  await redis.restart()
  const restarted = Date.now()
  const check = redis.client()
  let left = -1
  while (Date.now() - restarted < 8000) {
    left = await check.zcard(key).catch(() => -1)
    if (left === 0) break
    await sleep(50)
  }
  t.equal(left, 0, `alice's lease was given back ${Date.now() - restarted} ms after Redis came back (30 s TTL)`)
})

/** The gateway's guard on `client`, recording the releases it asks for ("keys member"). */
function releasingGuard (t: Teardown, client: ReturnType<typeof createRedisClient>, nodeOf?: (key: string) => string): { guard: RedisGuard, released: string[] } {
  const released: string[] = []
  const guard = new RedisGuard({
    store: createRedisStore({ client }),
    fallbackMaxKeys: 100,
    timeoutMs: 5000,
    instances: () => 1,
    telemetry: NOOP_TELEMETRY,
    onStateChange: () => {},
    onLateLeases: (keys, member) => { released.push(`${keys.join()} ${member}`) },
    ...(nodeOf !== undefined ? { nodeOf } : {})
  })
  t.teardown(() => guard.close())
  return { guard, released }
}

/** Decides one request of `user` under a concurrency cap of 1 (limit id `family`) through `guard`. */
function leaseDecider (guard: RedisGuard, family: string, user: string): (requestId: string) => ReturnType<RedisGuard['decide']> {
  const spec: LimitSpec = Object.freeze({ id: `${family}.concurrency.user`, algorithm: 'lease', limit: 1, windowMs: 10_000, burst: 1, maxDelayMs: 0 })
  const check = [{ key: `lease:${family}:${user}`, spec, cost: 1 }]
  const LOCAL = [{ onError: 'local' as const }]
  return async (requestId) => await guard.decide(check, LOCAL, requestId)
}

/** A redis-server of its own and the gateway's client on it. */
async function connectedRedis (t: Teardown): Promise<{ redis: Awaited<ReturnType<typeof startRedis>>, client: ReturnType<typeof createRedisClient> }> {
  const redis = await startRedis(t)
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  return { redis, client }
}

t.test('a call the fallback decided: its lease is released when Redis may have run it, not when the call was never sent', async t => {
  const { redis, client } = await connectedRedis(t)
  const { guard, released } = releasingGuard(t, client)
  const decide = leaseDecider(guard, 'n', 'dave')
  // sent, then its connection is lost before an answer: Redis may have run it
  redis.freeze()
  const inFlight = decide('lost')
  await sleep(100)
  await redis.kill()
  const lost = await inFlight
  t.equal(lost.level, 'fallback', 'decided by the fallback')
  await sleep(50)
  t.equal(released.length, 1, 'its lease is released')
  t.match(released[0], /^lease:n:dave lost~/, 'under the key and the id the call was sent with')
  // Redis gone: ioredis refuses to send, so nothing was taken and nothing is released
  await sleep(200)
  released.length = 0
  const unsent = await decide('unsent')
  t.equal(unsent.level, 'fallback', 'decided by the fallback')
  await sleep(50)
  t.same(released, [], 'no release for a call never sent')
})

t.test('a call Redis refused BUSY (it ran nothing): no release', async t => {
  const { redis, client } = await connectedRedis(t)
  const { guard, released } = releasingGuard(t, client)
  const decide = leaseDecider(guard, 'b', 'fay')
  t.equal((await decide('warm')).level, 'redis', 'scripts loaded while Redis answers')
  const endBusy = await busyRedis(t, redis)
  const refused = await decide('busy')
  await endBusy()
  t.equal(refused.level, 'fallback', 'decided by the fallback')
  await sleep(50)
  t.same(released, [], 'no release for a call refused BUSY')
})

t.test('a Cluster call refused as the cluster is not ready (ioredis never sent it): no release', async t => {
  const dead = await startRedis(t)
  const deadPort = dead.port
  await dead.stop()
  const client = createRedisClient({ cluster: [`redis://127.0.0.1:${deadPort}`], connectTimeoutMs: 500, onError: () => {} })
  t.teardown(() => client.disconnect())
  const { guard, released } = releasingGuard(t, client)
  const refused = await leaseDecider(guard, 'c', 'erin')('notready')
  t.equal(refused.level, 'fallback', 'decided by the fallback')
  await sleep(50)
  t.same(released, [], 'no release for a call never sent')
})

t.test('under Cluster too, a call refused BUSY (it ran nothing, and ioredis sends no call again after its connection closed): no release', async t => {
  const cluster = await startRedisCluster(t)
  const client = createRedisClient({ cluster: cluster.urls }) as Cluster
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const { guard, released } = releasingGuard(t, client, clusterNodes(client).nodeOf)
  const decide = leaseDecider(guard, 'cb', 'gus')
  t.equal((await decide('warm')).level, 'redis', 'scripts loaded while the Cluster answers')
  // the key's master runs another client's endless script
  const ownerPort = Number(clusterNodes(client).nodeOf('lease:cb:gus').split(':')[1])
  t.ok(cluster.ports.includes(ownerPort), `the key's master (${ownerPort})`)
  const endBusy = await busyRedis(t, { client: () => nodeClient(t, ownerPort) })
  const refused = await decide('cbusy')
  await endBusy()
  t.equal(refused.level, 'fallback', 'decided by the fallback')
  await sleep(50)
  t.same(released, [], 'no release for a call refused BUSY')
})

t.test('under Cluster, a request refused by one master while its lease\'s master lost the answer: that lease is released', async t => {
  const cluster = await startRedisCluster(t, { args: ['--enable-debug-command', 'yes'] })
  const client = createRedisClient({ cluster: cluster.urls, onError: () => {} }) as Cluster
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const { nodeOf } = clusterNodes(client)
  const { guard, released } = releasingGuard(t, client, nodeOf)
  // a rate limit already spent on one master, and the user's lease on another
  const rate: LimitSpec = Object.freeze({ id: 'pf.user', algorithm: 'fixed-window', limit: 1, windowMs: 600_000, burst: 1, maxDelayMs: 0 })
  const lease: LimitSpec = Object.freeze({ id: 'pf.concurrency.user', algorithm: 'lease', limit: 1, windowMs: 10_000, burst: 1, maxDelayMs: 0 })
  const rateKey = 'rate:pf:hal'
  let leaseKey = ''
  for (let i = 0; leaseKey === '' || nodeOf(leaseKey) === nodeOf(rateKey); i++) leaseKey = `lease:pf:hal${i}`
  const LOCAL = [{ onError: 'local' as const }, { onError: 'local' as const }]
  t.equal((await guard.decide([{ key: rateKey, spec: rate, cost: 1 }], LOCAL, 'spend')).decision.allowed, true, 'the rate limit spent')
  const port = Number(nodeOf(leaseKey).split(':')[1])
  const [blocker, killer] = [nodeClient(t, port), nodeClient(t, port)]
  await Promise.all([blocker.ping(), killer.ping()])
  const list = await killer.call('CLIENT', 'LIST', 'TYPE', 'normal') as string
  const ids = [...list.matchAll(/^id=(\d+) .* name=edge-gateway /gm)].map((m) => m[1] as string)
  t.ok(ids.length > 0, 'the guard\'s client is connected to the lease\'s master')
  // The lease's master sleeps; the call arrives, then the kill of the client's connections: the
  // call may run before its connection closes, its answer never comes.
  const sleeping = blocker.call('DEBUG', 'SLEEP', '1')
  await sleep(50)
  const deciding = guard.decide([{ key: rateKey, spec: rate, cost: 1 }, { key: leaseKey, spec: lease, cost: 1 }], LOCAL, 'refused')
  await sleep(150)
  await Promise.all(ids.map(async (id) => await killer.call('CLIENT', 'KILL', 'ID', id).catch(() => 0)))
  await sleeping
  const refused = await deciding
  t.equal(refused.level, 'redis', 'decided by Redis')
  t.equal(refused.decision.allowed, false, 'refused by the spent rate limit')
  await sleep(50)
  t.equal(released.length, 1, 'the lease the lost call may have taken is released')
  t.match(released[0], new RegExp(`^${leaseKey} refused~`), 'under its key and the id of the call')
})
