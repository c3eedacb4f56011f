// The Redis store on a real 3-master Redis Cluster: checks whose keys live in different slots
// (on different masters) are decided per slot in parallel; limits still hold exactly, and when
// one slot rejects, what the other slots recorded is refunded.
import t, { type Test } from 'tap'
import { Redis, type Cluster } from 'ioredis'
import { startRedisCluster } from './helpers/redis.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { clusterNodes, createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { keySlot, limitKey } from '../src/limit/keys.js'
import type { AlgorithmName, LimitCheck, LimitSpec } from '../src/limit/types.js'
import { awayFromWindowEdge } from './helpers/window-edge.js'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'

const ALL: AlgorithmName[] = ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'sliding-window', 'fixed-window']
const BUCKETS = new Set<AlgorithmName>(['gcra', 'token-bucket', 'leaky-bucket'])

function spec (algorithm: AlgorithmName, limit: number, windowMs: number): LimitSpec {
  return Object.freeze({ id: `${algorithm}-${limit}-${windowMs}`, algorithm, limit, windowMs, burst: limit, maxDelayMs: 0 })
}

const servers = await startRedisCluster(t)
const errors: Error[] = []
const cluster = createRedisClient({ cluster: servers.urls, onError: (err) => errors.push(err) }) as Cluster
t.teardown(() => cluster.disconnect())
await whenReady(cluster, 15_000)
const store = createRedisStore({ client: cluster })

// slot -> port of the master serving it, from CLUSTER SLOTS.
const owners = new Map<number, number>()
for (const [start, end, master] of await cluster.cluster('SLOTS') as unknown as Array<[number, number, [string, number]]>) {
  for (let s = start; s <= end; s++) owners.set(s, master[1])
}
let n = 0
/** A fresh key served by the master on `port` (so checks of one request span several masters). */
function keyOn (port: number, label: string): string {
  for (;;) {
    const key = limitKey('gw', `cluster.${label}`, `client-${n++}`)
    if (owners.get(keySlot(key)) === port) return key
  }
}
const [p1, p2, p3] = servers.ports as [number, number, number]

const ONE = spec('fixed-window', 1, 3_600_000)

/** A check on p1 whose limit of 1 is spent: any request with it is refused by p1. */
async function fullOnP1 (t: Test, label: string): Promise<string> {
  await awayFromWindowEdge(3_600_000, 30_000)
  const full = keyOn(p1, `${label}-full`)
  t.equal((await store.decide([{ key: full, spec: ONE, cost: 1 }], 'fill')).allowed, true, 'the p1 check is full')
  return full
}

/** A guard over the cluster store (closed at teardown); `options` override the defaults. */
function clusterGuard (t: Test, options: Partial<ConstructorParameters<typeof RedisGuard>[0]> = {}): RedisGuard {
  const guard = new RedisGuard({ store, fallbackMaxKeys: 100, timeoutMs: 3000, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {}, ...options })
  t.teardown(() => guard.close())
  return guard
}

t.test('keySlot agrees with CLUSTER KEYSLOT', async (t) => {
  const keys = ['', 'a', 'gw:api.ip.x:10.0.0.1', 'user:{42}:profile', '{}x', '{a}{b}', 'x{}{y}', 'ünïcødé:ключ', '{', '}{', 'foo{bar',
    limitKey('gw', 'login.user.abc', '{tenant}:alice'), ...Array.from({ length: 200 }, (_, i) => `k${i}:${(i * 7919).toString(36)}`)]
  const mismatches = []
  for (const key of keys) {
    const expected = await cluster.cluster('KEYSLOT', key)
    if (keySlot(key) !== expected) mismatches.push(`${key}: ${keySlot(key)} != ${expected}`)
  }
  t.same(mismatches, [], `${keys.length} keys`)
  t.equal(keySlot(limitKey('gw', 'id', '{tenant}:a')), await cluster.cluster('KEYSLOT', 'gw:id:%7Btenant%7D:a'), 'an escaped value is hashed whole')
})

// The fixed-window counters below (1 h, aligned on the epoch) are read as such: each test that
// counts on one keeps clear of the top of the hour, where the count would start afresh.
t.test('checks on three masters: 200 concurrent requests, exactly the tightest limit admitted', async (t) => {
  for (const algorithm of ['gcra', 'token-bucket', 'sliding-window-log', 'fixed-window'] as const) {
    await awayFromWindowEdge(3_600_000, 30_000)
    const tight = keyOn(p1, 'tight')
    const roomy = keyOn(p2, 'roomy')
    const log = keyOn(p3, 'log')
    const checks: LimitCheck[] = [
      { key: roomy, spec: spec('fixed-window', 1000, 3_600_000), cost: 1 },
      { key: tight, spec: spec(algorithm, 50, 3_600_000), cost: 1 },
      { key: log, spec: spec('sliding-window-log', 1000, 3_600_000), cost: 1 }
    ]
    const decisions = await Promise.all(Array.from({ length: 200 }, (_, i) => store.decide(checks, `c${i}`)))
    const admitted = decisions.filter((d) => d.allowed).length
    t.equal(admitted, 50, `${algorithm}: 50 admitted`)
    t.ok(decisions.filter((d) => !d.allowed).every((d) => d.limitingIndex === 1), 'every rejection names the tight check')
    // The 150 rejected requests were refunded on the other two masters.
    t.equal(Number(await cluster.hget(roomy, 'c')), 50, 'fixed-window on another master counts only the admitted 50')
    t.equal(await cluster.zcard(log), 50, 'the log on the third master holds only the admitted 50')
  }
})

t.test('when one slot rejects, the other slots get their budget back', async (t) => {
  for (const algorithm of ALL) {
    await awayFromWindowEdge(3_600_000, 30_000)
    const generous = spec(algorithm, 100, 3_600_000)
    const a = keyOn(p1, `refund-${algorithm}`)
    const b = keyOn(p2, 'one')
    const checks: LimitCheck[] = [{ key: a, spec: generous, cost: 1 }, { key: b, spec: spec('fixed-window', 1, 3_600_000), cost: 1 }]
    t.equal((await store.decide(checks, 'first')).allowed, true)
    // The exactly comparable part of each state (bucket levels move with time, see below).
    const exact = async (): Promise<unknown> => {
      if (algorithm === 'gcra') return await cluster.get(a)
      if (algorithm === 'sliding-window-log') return await cluster.zrange(a, '0', '-1')
      if (algorithm === 'fixed-window' || algorithm === 'sliding-window') return await cluster.hget(a, 'c')
      return null
    }
    const after = await exact()
    t.ok(algorithm === 'token-bucket' || algorithm === 'leaky-bucket' || after !== null)
    for (let i = 0; i < 5; i++) {
      const d = await store.decide(checks, `rejected-${i}`)
      t.same([d.allowed, d.limitingIndex], [false, 1], `${algorithm}: rejected by the other slot`)
    }
    t.same(await exact(), after, `${algorithm}: state as after the first request (TAT, log members, count)`)
    // Whatever the representation: the budget left is what one admitted request leaves.
    const alone = await store.decide([{ key: a, spec: generous, cost: 1 }], 'alone')
    t.same([alone.allowed, alone.remaining], [true, 98], `${algorithm}: 100 - first - this one`)
    if (BUCKETS.has(algorithm)) t.ok(Number(await cluster.pttl(a)) > 0, 'still expires')
  }
})

t.test('a slot group that fails: the others are refunded; a known rejection still wins', async (t) => {
  const background: unknown[] = []
  const watched = createRedisStore({ client: cluster, onBackgroundError: (err) => background.push(err) })
  const fw = spec('fixed-window', 10, 3_600_000)
  await awayFromWindowEdge(3_600_000, 30_000)
  const ok = keyOn(p1, 'fails-ok')
  const broken = keyOn(p2, 'fails-broken')
  // The wrong type makes the script fail on that slot (WRONGTYPE), after the other admitted.
  await cluster.set(broken, 'not a hash')
  await t.rejects(watched.decide([{ key: ok, spec: fw, cost: 1 }, { key: broken, spec: fw, cost: 1 }], 'r1'), /WRONGTYPE/)
  t.equal(await cluster.hget(ok, 'c'), '0', 'the admitting slot was refunded')
  const full = keyOn(p3, 'fails-full')
  const one = spec('fixed-window', 1, 3_600_000)
  t.equal((await watched.decide([{ key: full, spec: one, cost: 1 }], 'r2')).allowed, true)
  const d = await watched.decide([{ key: ok, spec: fw, cost: 1 }, { key: broken, spec: fw, cost: 1 }, { key: full, spec: one, cost: 1 }], 'r3')
  t.same([d.allowed, d.limitingIndex], [false, 2], 'rejected by the full check rather than failing')
  t.match(String(background[0]), /WRONGTYPE/, 'the failure is reported aside')
  t.equal(await cluster.hget(ok, 'c'), '0', 'and the admitting slot refunded again')
})

t.test('a rejection is answered without waiting for the refunds: a master that stops taking writes after it admitted cannot turn it into a fallback admission', async (t) => {
  const full = await fullOnP1(t, 'late')
  const admitting = keyOn(p2, 'late-ok')
  const guard = clusterGuard(t)
  const s1 = new Redis(p1, '127.0.0.1')
  const s2 = new Redis(p2, '127.0.0.1')
  t.teardown(async () => {
    await s2.call('CLIENT', 'UNPAUSE')
    s1.disconnect()
    s2.disconnect()
  })
  await Promise.all([s1.ping(), s2.ping()])
  // p1 busy for 1 s (a script spinning on its own connection): its rejection comes after p2 admitted
  const busy = s1.eval("local t = redis.call('TIME'); local s = t[1] * 1e6 + t[2]; repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - s > 1000000; return 1", 0)
  const decided = guard.decide([{ key: full, spec: ONE, cost: 1 }, { key: admitting, spec: ONE, cost: 1 }], [{ onError: 'local' }, { onError: 'local' }], 'late')
  // once p2 has admitted, it stops taking writes for 8 s: the refund waits that long
  const deadline = Date.now() + 10_000
  while (await s2.hget(admitting, 'c') !== '1' && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 5))
  await s2.call('CLIENT', 'PAUSE', '8000', 'WRITE')
  await busy
  const g = await decided
  t.same([g.level, g.decision.allowed, g.decision.limitingIndex], ['redis', false, 0], 'refused by Redis (waiting for the refund: the 3 s timeout, and the fallback admitted it)')
  await s2.call('CLIENT', 'UNPAUSE')
  await new Promise((resolve) => setTimeout(resolve, 200))
  t.equal(await s2.hget(admitting, 'c'), '0', 'the refund landed once p2 took writes again')
})

t.test('a rejection beside a slot group that failed counts a failure on that master: a probe through it does not close its breaker', async (t) => {
  const full = await fullOnP1(t, 'probe')
  const broken = keyOn(p2, 'probe-broken')
  // the wrong type makes the script fail on p2's slot (WRONGTYPE)
  await cluster.set(broken, 'not a hash')
  const transitions: string[] = []
  const guard = clusterGuard(t, { failureThreshold: 1, openMs: 50, onStateChange: (state, reason) => transitions.push(`${state} ${reason}`), ...clusterNodes(cluster) })
  const node = `127.0.0.1:${p2}`
  const stateOf = (): string | undefined => guard.breakerStates().find((b) => b.node === node)?.state
  t.equal((await guard.decide([{ key: broken, spec: ONE, cost: 1 }], [{ onError: 'local' }], 'a')).level, 'fallback')
  t.equal(stateOf(), 'open', 'p2\'s breaker opened')
  await new Promise((resolve) => setTimeout(resolve, 150))
  // due for a probe: this request goes to Redis, where p1 refuses it and p2 fails again
  const g = await guard.decide([{ key: full, spec: ONE, cost: 1 }, { key: broken, spec: ONE, cost: 1 }], [{ onError: 'local' }, { onError: 'local' }], 'b')
  t.same([g.level, g.decision.allowed, g.decision.limitingIndex], ['redis', false, 0], 'the rejection is the answer')
  t.equal(stateOf(), 'open', 'p2\'s breaker is open again (taken as an answer, the probe closed it)')
  t.notOk(transitions.some((x) => x.startsWith('closed')), transitions.join('; '))
})

t.test('a decision failing in one slot group opens only that master\'s breaker: the masters that answered stay on Redis', async (t) => {
  const many = spec('fixed-window', 100, 3_600_000)
  await awayFromWindowEdge(3_600_000, 30_000)
  const healthy = keyOn(p1, 'partial-ok')
  const broken = keyOn(p2, 'partial-broken')
  await cluster.set(broken, 'not a hash')
  const guard = clusterGuard(t, { failureThreshold: 1, ...clusterNodes(cluster) })
  const g = await guard.decide([{ key: healthy, spec: many, cost: 1 }, { key: broken, spec: many, cost: 1 }], [{ onError: 'local' }, { onError: 'local' }], 'a')
  t.equal(g.level, 'fallback', 'the request is decided by the fallback whole')
  const states = Object.fromEntries(guard.breakerStates().map((b) => [b.node, b.state]))
  t.same([states[`127.0.0.1:${p1}`], states[`127.0.0.1:${p2}`]], ['closed', 'open'], 'p2 failed, p1 answered')
  t.equal((await guard.decide([{ key: healthy, spec: many, cost: 1 }], [{ onError: 'local' }], 'b')).level, 'redis', 'a request on p1 alone stays on Redis')
})

t.test('a request whose keys share a slot is one call, all or nothing', async (t) => {
  const a = keyOn(p3, 'same')
  // A deliberate hash tag (chosen by configuration, never by a client) keeps keys together.
  const tagged = (k: string): string => `{${a}}:${k}`
  const checks: LimitCheck[] = [
    { key: tagged('x'), spec: spec('gcra', 10, 3_600_000), cost: 1 },
    { key: tagged('y'), spec: spec('fixed-window', 1, 3_600_000), cost: 1 }
  ]
  t.equal(keySlot(tagged('x')), keySlot(tagged('y')))
  await awayFromWindowEdge(3_600_000, 30_000)
  t.equal((await store.decide(checks, 'a')).allowed, true)
  const tat = await cluster.get(tagged('x'))
  t.equal((await store.decide(checks, 'b')).allowed, false)
  t.equal(await cluster.get(tagged('x')), tat, 'nothing recorded, no refund needed')
  t.same(errors, [], 'no client errors along the way')
})
