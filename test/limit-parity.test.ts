// The memory twins (src/limit/algorithms) and the Lua scripts (lua/) must reach identical
// decisions: both stores are fed the same (time step, cost) sequences on one virtual clock
// (the Lua side through its now override) and every decision tuple is compared.
import t, { type Test as Tap } from 'tap'
import { startRedis } from './helpers/redis.js'
import type { Redis } from 'ioredis'
import { createMemoryStore, decideAt, type LimitStateMap } from '../src/limit/memory-store.js'
import type { AlgorithmState } from '../src/limit/algorithms/index.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { LIMIT_SCRIPT, parseLimitReply } from '../src/limit/scripts.js'
import type { AlgorithmName, LimitCheck, LimitSpec } from '../src/limit/types.js'
import { prng } from './helpers/prng.js'

const ALL: AlgorithmName[] = ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'sliding-window', 'fixed-window']
const BUCKETS = new Set<AlgorithmName>(['gcra', 'token-bucket', 'leaky-bucket'])

function spec (algorithm: AlgorithmName, limit: number, windowMs: number, burst = limit, maxDelayMs = 0): LimitSpec {
  return Object.freeze({
    id: `${algorithm}-${limit}-${windowMs}-${burst}-${maxDelayMs}`,
    algorithm,
    limit,
    windowMs,
    burst: BUCKETS.has(algorithm) ? burst : limit,
    maxDelayMs
  })
}

// Rates that divide evenly and rates that do not (fractional tokens per µs), small and large windows.
function specsFor (algorithm: AlgorithmName): LimitSpec[] {
  const specs = [
    spec(algorithm, 5, 1000),
    spec(algorithm, 3, 1000, 7),
    spec(algorithm, 7, 60_000, 3),
    spec(algorithm, 1000, 1000, 20),
    spec(algorithm, 2, 86_400_000, 2)
  ]
  if (algorithm === 'leaky-bucket') specs.push(spec(algorithm, 10, 1000, 6, 250), spec(algorithm, 3, 1000, 4, 1))
  return specs
}

interface Step { readonly dtUs: number, readonly costs: readonly number[] }

/** Steps on the scale of the specs: same instant, sub-ms, around one emission, around a window, long idle. */
function randomSteps (random: () => number, specs: readonly LimitSpec[], count: number): Step[] {
  const windowUs = Math.min(...specs.map((s) => s.windowMs)) * 1000
  const tokenUs = Math.min(...specs.map((s) => Math.ceil((s.windowMs * 1000) / s.limit)))
  const steps: Step[] = []
  for (let i = 0; i < count; i++) {
    const r = random()
    const dtUs = r < 0.25
      ? 0
      : r < 0.45
        ? Math.floor(random() * 1500)
        : r < 0.85
          ? Math.floor(random() * 2.5 * tokenUs)
          : r < 0.98 ? Math.floor(random() * 1.5 * windowUs) : Math.floor(random() * 3 * windowUs)
    const costs = specs.map((s) => {
      const top = Math.max(s.burst, s.limit)
      const c = random()
      // Mostly 1, sometimes several, rarely more than the burst ("never").
      return c < 0.6 ? 1 : c < 0.95 ? 1 + Math.floor(random() * Math.min(top, 5)) : top + 1
    })
    steps.push({ dtUs, costs })
  }
  return steps
}

/** The state lua/ keeps for `key`, in the twins' shape (undefined when the key is absent). */
async function redisState (client: Redis, key: string, algorithm: AlgorithmName): Promise<AlgorithmState | undefined> {
  const num = (v: string | null | undefined): number => Number(v)
  switch (algorithm) {
    case 'gcra': {
      const v = await client.get(key)
      return v === null ? undefined : { kind: 'gcra', tat: num(v) }
    }
    case 'token-bucket': {
      const [tk, ts] = await client.hmget(key, 'tk', 'ts')
      return tk === null ? undefined : { kind: 'token-bucket', tokens: num(tk), ts: num(ts) }
    }
    case 'leaky-bucket': {
      const [wt, ts] = await client.hmget(key, 'wt', 'ts')
      return wt === null ? undefined : { kind: 'leaky-bucket', water: num(wt), ts: num(ts) }
    }
    case 'sliding-window-log': {
      const flat = await client.zrange(key, '0', '-1', 'WITHSCORES')
      if (flat.length === 0) return undefined
      return { kind: 'sliding-window-log', entries: flat.filter((_, i) => i % 2 === 1).map(num) }
    }
    case 'sliding-window': {
      const [w, c, p] = await client.hmget(key, 'w', 'c', 'p')
      return w === null ? undefined : { kind: 'sliding-window', window: num(w), current: num(c), previous: num(p) }
    }
    case 'fixed-window': {
      const [w, c] = await client.hmget(key, 'w', 'c')
      return w === null ? undefined : { kind: 'fixed-window', window: num(w), count: num(c) }
    }
  }
}

t.test('memory twins and Lua decide identically', async (t) => {
  const redis = await startRedis(t)
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)

  // One virtual clock for both stores, starting at a real, non-aligned instant.
  let now = Date.now() * 1000 + 123_457
  const clock = (): number => now
  const redisStore = createRedisStore({ client, nowUs: clock })
  const run = 'p' + Math.floor(Math.random() * 1e9).toString(36)
  let sequence = 0

  async function replay (t: Tap, name: string, specs: readonly LimitSpec[], steps: readonly Step[]): Promise<void> {
    // The pure form over a plain Map, so the twin's state can be compared with Redis's.
    const states = new Map<string, AlgorithmState>()
    const memory: LimitStateMap = { get: (k) => states.get(k), set: (k, v) => { states.set(k, v) } }
    const reader = redis.client()
    const prefix = `${run}:${sequence++}`
    const mismatches: string[] = []
    let admitted = 0
    for (let i = 0; i < steps.length; i++) {
      const step = steps[i] as Step
      now += step.dtUs
      const checks: LimitCheck[] = specs.map((s, k) => ({ key: `${prefix}:${k}:${s.id}`, spec: s, cost: step.costs[k] as number }))
      const fromMemory = decideAt(memory, checks, `r${i}`, now)
      const fromRedis = await redisStore.decide(checks, `r${i}`)
      if (fromMemory.allowed) admitted++
      if (JSON.stringify(fromMemory) !== JSON.stringify(fromRedis)) {
        mismatches.push(`step ${i} (+${step.dtUs} µs, costs ${step.costs.join(',')}): memory ${JSON.stringify(fromMemory)} redis ${JSON.stringify(fromRedis)}`)
      }
      for (const check of checks) {
        const inRedis = JSON.stringify(await redisState(reader, check.key, check.spec.algorithm))
        const inMemory = JSON.stringify(states.get(check.key))
        if (inRedis !== inMemory) mismatches.push(`step ${i} state of ${check.key}: memory ${inMemory} redis ${inRedis}`)
      }
    }
    t.same(mismatches.slice(0, 3), [], `${name}: ${steps.length} steps, ${admitted} admitted, identical decisions`)
    // A sequence that never admits or never rejects would prove little.
    t.ok(admitted > 0 && admitted < steps.length, `${name}: both outcomes exercised (${admitted}/${steps.length})`)
  }

  for (const algorithm of ALL) {
    for (const [n, s] of specsFor(algorithm).entries()) {
      await replay(t, `${algorithm} #${n} random`, [s], randomSteps(prng(1000 + n), [s], 400))
    }
  }

  await t.test('hand-written sequences', async (t) => {
    for (const algorithm of ALL) {
      const s = spec(algorithm, 4, 1000, 4, algorithm === 'leaky-bucket' ? 600 : 0)
      const same = (n: number, cost = 1): Step[] => Array.from({ length: n }, () => ({ dtUs: 0, costs: [cost] }))
      await replay(t, `${algorithm} same instant, then cost above burst`, [s], [...same(6), { dtUs: 1, costs: [5] }, { dtUs: 1, costs: [1] }])
      // Exactly on and one µs around window and emission boundaries.
      const windowUs = 1_000_000
      now = Math.ceil(now / windowUs) * windowUs - 1
      await replay(t, `${algorithm} around boundaries`, [s], [
        ...same(3), { dtUs: 1, costs: [1] }, { dtUs: 0, costs: [2] }, { dtUs: 249_999, costs: [1] }, { dtUs: 1, costs: [1] },
        { dtUs: 499_999, costs: [1] }, { dtUs: 1, costs: [3] }, { dtUs: windowUs - 1, costs: [1] }, { dtUs: 1, costs: [4] },
        { dtUs: 0, costs: [1] }, { dtUs: 2 * windowUs, costs: [4] }, { dtUs: 0, costs: [1] }
      ])
      // Exactly when the first admissions stop counting (entry + window, TAT, full refill).
      await replay(t, `${algorithm} exact expiry`, [s], [
        ...same(4), { dtUs: windowUs - 1, costs: [1] }, { dtUs: 1, costs: [4] }, { dtUs: 0, costs: [1] },
        { dtUs: 249_999, costs: [1] }, { dtUs: 1, costs: [1] }, { dtUs: 250_000, costs: [2] }
      ])
      // A long idle time (a week) must neither overflow nor lose state semantics.
      await replay(t, `${algorithm} long idle`, [s], [...same(5), { dtUs: 7 * 86_400_000_000, costs: [4] }, ...same(2)])
      // Many tiny steps: fractions of tokens must add up the same on both sides.
      await replay(t, `${algorithm} tiny steps`, [spec(algorithm, 3, 1000, 2, algorithm === 'leaky-bucket' ? 500 : 0)],
        Array.from({ length: 300 }, (_, i) => ({ dtUs: 7_919 + (i % 3), costs: [1] })))
    }
  })

  await t.test('multi-check requests (all-or-nothing parity)', async (t) => {
    const random = prng(42)
    for (let n = 0; n < 12; n++) {
      const count = 2 + Math.floor(random() * 3)
      const specs = Array.from({ length: count }, () => {
        const algorithm = ALL[Math.floor(random() * ALL.length)] as AlgorithmName
        const all = specsFor(algorithm)
        return all[Math.floor(random() * all.length)] as LimitSpec
      })
      await replay(t, `multi ${specs.map((s) => s.id).join(' + ')}`, specs, randomSteps(prng(7 + n), specs, 250))
    }
  })

  await t.test('no checks: allowed, limitingIndex -1, on both sides', async (t) => {
    const empty = { allowed: true, remaining: 0, retryAfterMs: 0, resetMs: 0, limitingIndex: -1, delayMs: 0 }
    t.same(createMemoryStore({ maxKeys: 1 }).decide([], 'r'), empty)
    t.same(await redisStore.decide([], 'r'), empty)
    // The store short-cuts an empty request; the script itself answers the same.
    const raw = await client.eval(LIMIT_SCRIPT, 0, '0', 'r')
    t.same(parseLimitReply(raw, 0).decision, empty)
  })
})
