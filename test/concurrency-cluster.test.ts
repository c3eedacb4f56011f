// Issue 10 under Redis Cluster: lease keys carry no hash tag, so a request's leases and rate-limit
// keys sit in different slots, decided per slot and refunded when another slot refuses. The caps
// still hold exactly, and a refusal by either kind still takes nothing from the other.
import t, { type Test } from 'tap'
import { Cluster, Redis } from 'ioredis'
import { startGateway } from './helpers/gateway.js'
import { startRedisCluster } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { eventually, send } from './helpers/ratelimit.js'
import { keySlot } from '../src/limit/keys.js'
import { compileLimitSpec } from '../src/limit/plan.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { LeaseKeeper, MAX_WAITING_SENDS, type HeldLease } from '../src/limit/concurrency.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'
import type { LimitSpec } from '../src/limit/types.js'

const cluster = await startRedisCluster(t)
const reader = new Cluster(cluster.ports.map(port => ({ host: '127.0.0.1', port })), { scaleReads: 'master' })
t.teardown(() => reader.disconnect())

const ALICE = { headers: { 'x-user-id': 'alice' } }

// A token bucket, not a fixed window: a fixed window is aligned on the epoch, and a run across the
// top of the hour would admit a seventh request (6 per hour: one token per 10 min comes back).
function config (upstream: string): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { cluster: [${cluster.urls.join(', ')}], timeout: 2s, onError: deny }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: cl
    pathPrefix: /
    upstream: backend
    limits:
      user: { algorithm: token-bucket, limit: 6, window: 1h }
    concurrency: { user: 2 }
`
}

t.test('two instances on a Cluster share `user: 2`; refusals by either kind take nothing from the other', async t => {
  const rateKey = `gw:${compileLimitSpec('cl', 'user', { algorithm: 'token-bucket', limit: 6, windowMs: 3_600_000, burst: 6, maxDelayMs: 0 }).id}:alice`
  const leaseKey = 'gw:lease:cl.user:alice'
  t.not(keySlot(rateKey), keySlot(leaseKey), 'the rate-limit key and the lease key are in different slots')
  const up = await startUpstream(t)
  const a = await startGateway(t, config(up.url))
  const b = await startGateway(t, config(up.url))
  const replies = await Promise.all(Array.from({ length: 20 }, (_, i) => send(`${(i % 2 === 0 ? a : b).url}/slow?ms=1500`, ALICE)))
  // Never more than the cap; under load a refusal may be the rate limit's while a concurrent
  // request's units are on their way back from the other slot (briefly under-admitting), so 1 or 2.
  const admitted = replies.filter(r => r.status === 200).length
  t.ok(admitted >= 1 && admitted <= 2, `at most 2 admitted across both instances (${admitted})`)
  t.equal(admitted + replies.filter(r => r.status === 429).length, 20, 'every other request refused with 429')
  // A refusal may also be the rate limit's: units a concurrent request is about to have refunded
  // from the other slot (README: never over-admit, at worst briefly under-admit).
  t.ok(replies.filter(r => r.status === 429).every(r => r.json?.error === 'GW_ERR_CONCURRENCY_LIMITED' || r.json?.error === 'rate_limited'), 'every refusal is the cap\'s or the rate limit\'s')
  t.ok(replies.some(r => r.json?.error === 'GW_ERR_CONCURRENCY_LIMITED'), 'the cap refused some')
  await eventually('leases back', async () => await reader.zcard(leaseKey) === 0, 3000)
  // the refusals were refunded in the rate limit's slot: 6 - admitted left, one at a time on each instance
  for (let i = 0; i < 6 - admitted; i++) t.equal((await send(`${(i % 2 === 0 ? a : b).url}/slow?ms=10`, ALICE)).status, 200, `request ${i + 1} of the ${6 - admitted} left`)
  const limited = await send(`${a.url}/x`, ALICE)
  t.equal(limited.json?.error, 'rate_limited', 'the seventh is refused by the rate limit')
  await eventually('the rate-limited request\'s lease was refunded', async () => await reader.zcard(leaseKey) === 0, 3000)
})

// Under Cluster releases do not ride with the limit call (one call per slot): the limiter sends
// them in a call of their own just before its call, to the same master (the lease key's slot), so
// Redis removes a finished request's lease before it decides the next one of the same client.
t.test('a cap of 1 under Cluster: 30 requests in a row from one user on one instance are all admitted', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
redis: { cluster: [${cluster.urls.join(', ')}], timeout: 2s, onError: deny }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: seq
    pathPrefix: /
    upstream: backend
    concurrency: { user: 1 }
`)
  const answers: string[] = []
  for (let i = 0; i < 30; i++) {
    // each awaited before the next: alice never has more than one request in flight
    const r = await send(`${gw.url}/x?i=${i}`, ALICE)
    answers.push(r.status === 200 ? '200' : `${r.status} ${String(r.json?.error)}`)
  }
  t.same(answers, Array.from({ length: 30 }, () => '200'), `every one admitted (${answers.filter(a => a !== '200').length} refused): none met the lease of the request before it (it waited up to 10 ms for a later call)`)
  t.equal(up.log.filter(u => u.startsWith('/x?')).length, 30, 'all 30 reached the upstream')
  await eventually('the last lease back', async () => await reader.zcard('gw:lease:seq.user:alice') === 0, 3000)
})

// One renewal round or one flush of releases is one call per hash slot under Cluster. The bound on
// calls waiting for a stalled Redis used to count calls, so every call past the 64th of one
// healthy round was dropped: leases in more than 64 slots expired while their requests ran.
async function leasesInSlots (t: Test, family: string, ttlMs: number): Promise<{ keeper: LeaseKeeper, keys: string[], leases: HeldLease[] }> {
  const client = createRedisClient({ cluster: cluster.urls })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const store = createRedisStore({ client })
  const spec: LimitSpec = Object.freeze({ id: `${family}.concurrency.user`, algorithm: 'lease', limit: 5, windowMs: ttlMs, burst: 5, maxDelayMs: 0 })
  const guard = new RedisGuard({ store, fallbackMaxKeys: 1000, timeoutMs: 2000, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {} })
  t.teardown(() => guard.close())
  const keeper = new LeaseKeeper({ redis: { client, guard, store }, ttlMs })
  const keys = Array.from({ length: 200 }, (_, i) => `gw:lease:${family}.user:u${i}`)
  t.ok(new Set(keys.map(keySlot)).size > 150, 'the lease keys spread over many slots')
  const leases: HeldLease[] = []
  for (const key of keys) {
    // taken through the store (lua/lease.lua), as the limiter does
    const d = await store.decideDetailed([{ key, spec, cost: 1 }], 'r')
    const lease: HeldLease = { keys: [key], member: d.callId, level: 'redis', units: 1, released: false, heldAt: -1 }
    keeper.hold(lease)
    leases.push(lease)
  }
  return { keeper, keys, leases }
}

async function countedLeases (keys: readonly string[]): Promise<number> {
  let n = 0
  for (const key of keys) n += await reader.zcard(key)
  return n
}

t.test('leases held in 200 slots of a healthy Cluster are all renewed', async t => {
  const ttlMs = 1500
  const { keeper, keys } = await leasesInSlots(t, 'renew200', ttlMs)
  t.teardown(() => keeper.close())
  await new Promise(resolve => setTimeout(resolve, 3 * ttlMs))
  t.equal(keeper.dropped, 0, 'no renewal dropped')
  t.equal(await countedLeases(keys), 200, 'after three TTLs every lease is still held in Redis')
})

t.test('200 leases in as many slots released in one turn are all given back', async t => {
  const { keeper, keys, leases } = await leasesInSlots(t, 'release200', 10_000)
  t.teardown(() => keeper.close())
  for (const lease of leases) keeper.release(lease)
  await eventually('the releases reach Redis', async () => await countedLeases(keys) === 0, 2000).catch(() => {})
  t.equal(await countedLeases(keys), 0, 'none still counted in Redis (they would be for the 10 s TTL)')
  t.equal(keeper.dropped, 0)
})

// The bound on sends waiting for a stalled Redis (MAX_WAITING_SENDS) counted sends, and under
// Cluster a send holds calls to every master its leases live on: with one master stalled
// (SIGSTOPped, paused) every flush touching it waited, and past 64 of them the releases and
// renewals of the healthy masters were dropped too, for as long as the stall lasted.
t.test('one master stalled: releases to the healthy masters still go out', async t => {
  const client = createRedisClient({ cluster: cluster.urls })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const store = createRedisStore({ client })
  const guard = new RedisGuard({ store, fallbackMaxKeys: 1000, timeoutMs: 2000, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {} })
  t.teardown(() => guard.close())
  const keeper = new LeaseKeeper({ redis: { client, guard, store }, ttlMs: 10_000 })
  t.teardown(() => keeper.close(100))
  const spec: LimitSpec = Object.freeze({ id: 'stall.concurrency.user', algorithm: 'lease', limit: 5, windowMs: 10_000, burst: 5, maxDelayMs: 0 })
  const stalled = `127.0.0.1:${cluster.ports[0] as number}`
  const keyOn = (onStalled: boolean, tag: string): string => {
    for (let i = 0; ; i++) {
      const key = `gw:lease:stall.user:${tag}${i}`
      if (((client as Cluster).slots[keySlot(key)]?.[0] === stalled) === onStalled) return key
    }
  }
  // alice's lease lives on a healthy master
  const aliceKey = keyOn(false, 'alice')
  const taken = await store.decideDetailed([{ key: aliceKey, spec, cost: 1 }], 'alice')
  const alice: HeldLease = { keys: [aliceKey], member: taken.callId, level: 'redis', units: 1, released: false, heldAt: -1 }
  keeper.hold(alice)
  t.equal(await reader.zcard(aliceKey), 1)
  const direct = new Redis({ host: '127.0.0.1', port: cluster.ports[0] as number })
  direct.on('error', () => {})
  t.teardown(() => direct.disconnect())
  const pause = direct.call('CLIENT', 'PAUSE', '5000', 'ALL')
  // releases of leases on the stalled master, each flushed in a send of its own (10 ms batching)
  for (let i = 0; i < MAX_WAITING_SENDS + 6; i++) {
    keeper.release({ keys: [keyOn(true, `s${i}-`)], member: `m${i}`, level: 'redis', units: 1, released: false, heldAt: -1 })
    await new Promise(resolve => setTimeout(resolve, 12))
  }
  t.ok(keeper.dropped > 0, `sends beyond the bound for the stalled master were dropped (${keeper.dropped})`)
  keeper.release(alice)
  await eventually('alice\'s release reaches her healthy master', async () => await reader.zcard(aliceKey) === 0, 1500).catch(() => {})
  t.equal(await reader.zcard(aliceKey), 0, 'alice\'s lease is given back while the other master is stalled (it stayed counted for leaseTtl, 10 s)')
  await pause
  await eventually('every send answered once the master resumes', async () => keeper.waiting === 0, 8000).catch(() => {})
  t.equal(keeper.waiting, 0)
})
