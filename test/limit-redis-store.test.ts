// The Redis store against a real redis-server: exact under concurrency (several "gateway
// instances" with their own connections), windows that pass, a function library that survives
// FUNCTION FLUSH and a server crash, and failing fast while Redis is down.
import t from 'tap'
import type { Redis } from 'ioredis'
import { fcallStats, functionLibraries, startRedis } from './helpers/redis.js'
import { eventually } from './helpers/ratelimit.js'
import { FUNCTION_LIBRARY_NAME } from '../src/limit/scripts.js'
import { createRedisStore, type RedisStore } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import type { AlgorithmName, LimitCheck, LimitDecision, LimitSpec } from '../src/limit/types.js'
import { awayFromWindowEdge } from './helpers/window-edge.js'

const BUCKETS = new Set<AlgorithmName>(['gcra', 'token-bucket', 'leaky-bucket'])
const EXACT: AlgorithmName[] = ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'fixed-window']

function spec (algorithm: AlgorithmName, limit: number, windowMs: number, burst = limit, maxDelayMs = 0): LimitSpec {
  return Object.freeze({ id: `${algorithm}-${limit}-${windowMs}`, algorithm, limit, windowMs, burst: BUCKETS.has(algorithm) ? burst : limit, maxDelayMs })
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** Waits until just after a boundary of `windowMs` (epoch-aligned, like the window algorithms). */
async function windowStart (windowMs: number): Promise<void> {
  await sleep(windowMs - (Date.now() % windowMs) + 5)
}

const redis = await startRedis(t)

// Four gateway instances, each with its own production-configured connection.
const instances: RedisStore[] = []
for (let i = 0; i < 4; i++) {
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  instances.push(createRedisStore({ client }))
}
const plain: Redis = redis.client()
let run = 0
const freshKey = (): string => `t${process.pid}:${run++}`

/** `n` concurrent decisions spread over the instances; resolves to how many were admitted. */
async function burst (n: number, checks: readonly LimitCheck[]): Promise<number> {
  const decisions = await Promise.all(Array.from({ length: n }, (_, i) => (instances[i % instances.length] as RedisStore).decide(checks, `req-${i}`)))
  return decisions.filter((d) => d.allowed).length
}

t.test('200 concurrent requests against limit 50 (1 h window): exactly 50 admitted', async (t) => {
  for (const algorithm of [...EXACT, 'sliding-window'] as const) {
    // fixed and sliding windows are aligned on the epoch: neither burst across the top of the hour
    await awayFromWindowEdge(3_600_000, 30_000)
    const checks = [{ key: freshKey(), spec: spec(algorithm, 50, 3_600_000), cost: 1 }]
    t.equal(await burst(200, checks), 50, algorithm)
    t.equal(await burst(20, checks), 0, `${algorithm}: and nothing more`)
  }
})

t.test('short window (1 s): the limit holds, then requests pass again', async (t) => {
  await windowStart(1000)
  const keys = new Map<AlgorithmName, string>()
  const started = Date.now()
  const first = new Map<AlgorithmName, number>()
  await Promise.all(EXACT.map(async (algorithm) => {
    const key = freshKey()
    keys.set(algorithm, key)
    first.set(algorithm, await burst(200, [{ key, spec: spec(algorithm, 50, 1000), cost: 1 }]))
  }))
  const tookMs = Date.now() - started
  t.ok(tookMs < 900, `bursts took ${tookMs} ms, inside one window`)
  t.equal(first.get('sliding-window-log'), 50, 'sliding-window-log: exactly 50')
  t.equal(first.get('fixed-window'), 50, 'fixed-window: exactly 50')
  // Buckets refill one token per 20 ms while the burst runs: at most that many more.
  const refilled = Math.ceil(tookMs / 20) + 1
  for (const algorithm of ['gcra', 'token-bucket', 'leaky-bucket'] as const) {
    const n = first.get(algorithm) as number
    t.ok(n >= 50 && n <= 50 + refilled, `${algorithm}: ${n} admitted (50 + at most ${refilled} refilled)`)
  }
  // A whole window after the last admission, then a fresh aligned window: every log entry has
  // left and every bucket is full again (capped at its burst of 50).
  await sleep(1000)
  await windowStart(1000)
  for (const algorithm of EXACT) {
    const againStarted = Date.now()
    const again = await burst(200, [{ key: keys.get(algorithm) as string, spec: spec(algorithm, 50, 1000), cost: 1 }])
    if (BUCKETS.has(algorithm)) {
      const refilledAgain = Math.ceil((Date.now() - againStarted) / 20) + 1
      t.ok(again >= 50 && again <= 50 + refilledAgain, `${algorithm}: a window later, ${again} admitted again (50 + at most ${refilledAgain} refilled)`)
    } else {
      t.equal(again, 50, `${algorithm}: a window later, exactly 50 admitted again`)
    }
  }
})

t.test('sliding-window: what it admits follows its estimate, within the documented error', async (t) => {
  const s = spec('sliding-window', 50, 1000)
  const key = freshKey()
  await windowStart(1000)
  t.equal(await burst(200, [{ key, spec: s, cost: 1 }]), 50, 'a fresh key: exactly the limit in its first window')
  // Half-way through the next window the previous 50 weigh about 25.
  await windowStart(1000)
  await sleep(495)
  const fromMs = Date.now() % 1000
  const second = await burst(200, [{ key, spec: s, cost: 1 }])
  const toMs = Date.now() % 1000
  t.ok(toMs > fromMs, 'the second burst stayed inside one window')
  // Admitted while 50 * (1000 - elapsed) / 1000 + admitted <= 50, elapsed in [fromMs, toMs].
  const low = Math.floor((50 * (fromMs - 1)) / 1000)
  const high = Math.floor((50 * (toMs + 1)) / 1000)
  t.ok(second >= low && second <= high, `${second} admitted at ${fromMs}..${toMs} ms into the window (estimate allows ${low}..${high})`)
  t.ok(50 + second < 2 * 50, `${50 + second} over two windows, below 2 * limit`)
})

t.test('a lost function library (FUNCTION FLUSH): recovers by itself, counts continue', async (t) => {
  const store = instances[0] as RedisStore
  // a token bucket (one token per 6 min), not a fixed window: an epoch-aligned window would start
  // afresh if the run crossed the top of the hour, and the counts below would jump back to 9
  const checks = [{ key: freshKey(), spec: spec('token-bucket', 10, 3_600_000), cost: 1 }]
  const remaining = async (): Promise<number> => (await store.decide(checks, 'r')).remaining
  t.same([await remaining(), await remaining(), await remaining()], [9, 8, 7])
  const before = await fcallStats(plain)
  t.ok(before.calls >= 3, 'the store calls the function library (FCALL)')
  t.equal(await plain.call('FUNCTION', 'FLUSH'), 'OK')
  t.equal(await remaining(), 6, 'decided correctly after the flush')
  t.equal((await fcallStats(plain)).failed, before.failed + 1, 'the FCALL found no function once (that call went by EVALSHA)')
  await eventually('the library loaded again', async () => (await functionLibraries(plain)).includes(FUNCTION_LIBRARY_NAME))
  t.same(await functionLibraries(plain), [FUNCTION_LIBRARY_NAME], 'the library is loaded again')
  const again = await fcallStats(plain)
  t.same([await remaining(), await remaining()], [5, 4])
  t.same(await fcallStats(plain), { calls: again.calls + 2, failed: again.failed }, 'and FCALL works again afterwards')
})

t.test('Redis down: calls fail fast with the ioredis error; back up: decides again', async (t) => {
  const client = createRedisClient({ url: redis.url, onError: () => {} })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const store = createRedisStore({ client })
  const checks = [{ key: freshKey(), spec: spec('gcra', 5, 60_000), cost: 1 }]
  t.equal((await store.decide(checks, 'r')).allowed, true)
  await redis.kill()
  const started = Date.now()
  const failed = await store.decide(checks, 'r').then(() => null, (err: unknown) => err)
  t.ok(failed instanceof Error, `rejected: ${(failed as Error | null)?.message}`)
  t.ok(Date.now() - started < 1000, `in ${Date.now() - started} ms, not after a reconnect`)
  await redis.restart()
  await whenReady(client, 10_000)
  const d: LimitDecision = await store.decide(checks, 'r')
  // The new server has neither the script (NOSCRIPT path again) nor the state (no persistence).
  t.same([d.allowed, d.remaining], [true, 4])
})

t.test('a debt is capped at one extra budget: charging 100 budgets locks a client out for at most two windows', async t => {
  // README: "What the fallback admitted is written back to Redis ... (a debt, at most one extra
  // budget per key)". Without the cap, 1000 units on a limit of 10 per second would refuse the
  // client for about 100 s on the bucket algorithms.
  const store = instances[0] as RedisStore
  for (const algorithm of ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'sliding-window', 'fixed-window'] as const) {
    const s = spec(algorithm, 10, 1000)
    const key = freshKey()
    // at the start of a window: the window algorithms must not see the charge and the decision
    // fall on both sides of a boundary
    await windowStart(1000)
    await store.charge([{ key, spec: s, cost: 1000 }])
    const d = await store.decide([{ key, spec: s, cost: 1 }], `after-debt-${algorithm}`)
    t.equal(d.allowed, false, `${algorithm}: the debt is counted`)
    t.ok(d.retryAfterMs > 0 && d.retryAfterMs <= 2 * 1000 + 50, `${algorithm}: refused for ${d.retryAfterMs} ms, at most two windows (2 s), not a hundred`)
  }
})

t.test('a refused request reports every check\'s budget as it was before it, never below 0, one call or batched', async t => {
  // The guard learns these remainings as the fallback's starting budgets (src/limit/redis-guard.ts):
  // a refusal must not make the other checks look spent by the request that was refused.
  const store = instances[0] as RedisStore
  const roomy = spec('fixed-window', 10, 3_600_000)
  const tight = spec('fixed-window', 1, 3_600_000)
  const indebted = spec('token-bucket', 10, 3_600_000)
  const roomyKey = freshKey()
  const tightKey = freshKey()
  const indebtedKey = freshKey()
  await awayFromWindowEdge(3_600_000, 5_000)
  for (let i = 0; i < 3; i++) await store.decide([{ key: roomyKey, spec: roomy, cost: 1 }], `fill-${i}`)
  await store.decide([{ key: tightKey, spec: tight, cost: 1 }], 'fill-tight')
  // a fallback's debt takes the bucket below empty (charge.lua: at most one budget more)
  await store.charge([{ key: indebtedKey, spec: indebted, cost: 15 }])
  const request: LimitCheck[] = [{ key: roomyKey, spec: roomy, cost: 2 }, { key: tightKey, spec: tight, cost: 1 }, { key: indebtedKey, spec: indebted, cost: 1 }]
  // alone in its turn: limit.lua; two in one turn: limit-batch.lua
  const alone = await store.decideDetailed(request, 'alone')
  const batched = await Promise.all([store.decideDetailed(request, 'batched-1'), store.decideDetailed(request, 'batched-2')])
  for (const [name, d] of [['one call', alone], ['batched', batched[0]], ['batched, second', batched[1]]] as const) {
    t.equal(d?.decision.allowed, false, `${name}: refused`)
    t.same(d?.remainings, [7, 0, 0], `${name}: 7 left of the roomy window (not 5), the full window 0, the indebted bucket 0 (not below)`)
  }
})
