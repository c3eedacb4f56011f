// The `onError: local` fallback's arithmetic (issue 8, items 1-4): n gateway instances, each with
// Redis unreachable, must together admit no more than one budget, for every algorithm and
// n = 1..9, and a share must never make a valid limit invalid, refuse forever, or change scale
// when the live count changes. Driven through RedisGuard itself (the code the gateway runs) with a
// Redis store that always fails and a simulated clock.
import t from 'tap'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { validateLimitSpec } from '../src/limit/algorithms/index.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'
import type { AlgorithmName, LimitCheck, LimitSpec, LimitStore } from '../src/limit/types.js'
import { prng } from './helpers/prng.js'

const DEAD: LimitStore = {
  kind: 'redis',
  decide: async () => { throw new Error('Connection is closed.') },
  close: async () => {}
}

const LOCAL = [{ onError: 'local' as const }]

interface Fleet {
  clock: { us: number }
  instances: { n: number }
  guards: RedisGuard[]
}

function fleet (n: number, startUs = 1_700_000_000_000_000): Fleet {
  const clock = { us: startUs }
  const instances = { n }
  const guards = Array.from({ length: n }, () => new RedisGuard({
    store: DEAD,
    fallbackMaxKeys: 1000,
    timeoutMs: 1000,
    instances: () => instances.n,
    telemetry: NOOP_TELEMETRY,
    onStateChange: () => {},
    fallbackNowUs: () => clock.us
  }))
  return { clock, instances, guards }
}

function spec (algorithm: AlgorithmName, limit: number, windowMs: number, burst = limit): LimitSpec {
  const s: LimitSpec = Object.freeze({ id: `${algorithm}.${limit}.${windowMs}.${burst}`, algorithm, limit, windowMs, burst, maxDelayMs: 0 })
  if (validateLimitSpec(s) !== undefined) throw new Error(`bad test spec ${s.id}: ${validateLimitSpec(s)}`)
  return s
}

const ALL: AlgorithmName[] = ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'sliding-window', 'fixed-window']

/** Largest fleet-wide admission (in cost units) the algorithm allows over [a, b] (µs). */
function violations (s: LimitSpec, admissions: ReadonlyArray<{ at: number, cost: number }>): string[] {
  const W = s.windowMs * 1000
  const bad: string[] = []
  const sorted = [...admissions].sort((x, y) => x.at - y.at)
  if (s.algorithm === 'fixed-window' || s.algorithm === 'sliding-window') {
    // Both never let a fixed window's own count pass the limit.
    const per = new Map<number, number>()
    for (const a of sorted) per.set(Math.floor(a.at / W), (per.get(Math.floor(a.at / W)) ?? 0) + a.cost)
    for (const [k, c] of per) if (c > s.limit) bad.push(`window ${k}: ${c} > ${s.limit}`)
  } else if (s.algorithm === 'sliding-window-log') {
    for (let j = 0; j < sorted.length; j++) {
      let sum = 0
      const end = (sorted[j] as { at: number }).at
      for (let i = j; i >= 0 && (sorted[i] as { at: number }).at > end - W; i--) sum += (sorted[i] as { cost: number }).cost
      if (sum > s.limit) bad.push(`(${end - W}, ${end}]: ${sum} > ${s.limit}`)
    }
  } else {
    // Buckets: at most a full bucket plus what the rate refills over the interval.
    for (let i = 0; i < sorted.length; i++) {
      let sum = 0
      for (let j = i; j < sorted.length; j++) {
        sum += (sorted[j] as { cost: number }).cost
        const span = (sorted[j] as { at: number }).at - (sorted[i] as { at: number }).at
        if (sum * W > s.burst * W + s.limit * span) bad.push(`[${i}, ${j}] over ${span} µs: ${sum} > ${s.burst} + ${s.limit} * ${span} / ${W}`)
      }
    }
  }
  return bad
}

t.test('n instances on the fallback admit at most one budget together: every algorithm, n = 1..9', async t => {
  const random = prng(8)
  for (const algorithm of ALL) {
    for (let n = 1; n <= 9; n++) {
      const windowMs = 1000
      const limit = 1 + Math.floor(random() * 40)
      const burst = algorithm === 'token-bucket' || algorithm === 'leaky-bucket' || algorithm === 'gcra' ? 1 + Math.floor(random() * 40) : limit
      const s = spec(algorithm, limit, windowMs, burst)
      const cost = random() < 0.3 ? 1 + Math.floor(random() * 3) : 1
      const f = fleet(n)
      const admissions: Array<{ at: number, cost: number }> = []
      const check: LimitCheck = { key: 'k', spec: s, cost }
      // 2.5 windows of traffic, each request from a random instance, up to 10 ms apart.
      const end = f.clock.us + 2.5 * windowMs * 1000
      let sent = 0
      let neverOrNone = 0
      while (f.clock.us < end) {
        f.clock.us += Math.floor(random() * 10_000)
        const guard = f.guards[Math.floor(random() * n)] as RedisGuard
        const g = await guard.decide([check], LOCAL, `r${sent++}`)
        if (g.unavailable) neverOrNone++
        if (g.decision.allowed) admissions.push({ at: f.clock.us, cost })
        else if (!(g.decision.retryAfterMs > 0)) neverOrNone++
      }
      t.equal(neverOrNone, 0, 'every refusal carries a positive wait (never "never"), none is a 503')
      const bad = violations(s, admissions)
      t.same(bad.slice(0, 3), [], `${algorithm} ${limit}/${windowMs}ms burst ${burst} cost ${cost}, n=${n}: ${admissions.length} of ${sent} admitted, within the budget`)
    }
  }
})

t.test('regression item 1: token-bucket 1,000,000/day over 3 instances still decides (no 503, no throw)', async t => {
  const f = fleet(3)
  const s = spec('token-bucket', 1_000_000, 86_400_000)
  const g = await (f.guards[0] as RedisGuard).decide([{ key: 'k', spec: s, cost: 1 }], LOCAL, 'r')
  t.equal(g.unavailable, false)
  t.equal(g.decision.allowed, true)
  t.equal(g.decision.remaining, Math.floor((1_000_000 - 3) / 3), 'remaining in whole-budget units: this instance\'s share')
})

t.test('regression item 2: cost 5 against burst 10 over 3 instances: refused with a short Retry-After, not a day', async t => {
  const f = fleet(3)
  const s = spec('token-bucket', 10, 86_400_000, 10)
  const g = await (f.guards[0] as RedisGuard).decide([{ key: 'k', spec: s, cost: 5 }], LOCAL, 'r')
  t.equal(g.decision.allowed, false, 'three instances each admitting 5 would pass 10: refused while Redis is away')
  t.ok(g.decision.retryAfterMs > 0 && g.decision.retryAfterMs <= 1000, `retry after ${g.decision.retryAfterMs} ms (until Redis is probed again)`)
  // and with 2 instances the share (5) holds it exactly once per instance
  f.instances.n = 2
  const a = await (f.guards[0] as RedisGuard).decide([{ key: 'k2', spec: s, cost: 5 }], LOCAL, 'r')
  const b = await (f.guards[1] as RedisGuard).decide([{ key: 'k2', spec: s, cost: 5 }], LOCAL, 'r')
  const c = await (f.guards[1] as RedisGuard).decide([{ key: 'k2', spec: s, cost: 5 }], LOCAL, 'r')
  t.same([a.decision.allowed, b.decision.allowed, c.decision.allowed], [true, true, false])
})

t.test('regression item 3: 1/min across 5 instances admits at most 1 fleet-wide (not 5)', async t => {
  for (const algorithm of ALL) {
    const f = fleet(5)
    const s = spec(algorithm, 1, 60_000, 1)
    let admitted = 0
    for (const guard of f.guards) if ((await guard.decide([{ key: 'k', spec: s, cost: 1 }], LOCAL, 'r')).decision.allowed) admitted++
    t.ok(admitted <= 1, `${algorithm}: ${admitted} admitted fleet-wide`)
  }
})

t.test('regression item 4: the live count changing 3 -> 2 does not rescale stored state (no burst of extra admissions)', async t => {
  for (const algorithm of ['token-bucket', 'leaky-bucket', 'gcra'] as const) {
    const f = fleet(3)
    const s = spec(algorithm, 100, 1000, 100)
    const guard = f.guards[0] as RedisGuard
    let before = 0
    while ((await guard.decide([{ key: 'k', spec: s, cost: 1 }], LOCAL, 'r')).decision.allowed) before++
    t.equal(before, 33, `${algorithm}: a third of the bucket at n=3`)
    f.instances.n = 2
    let after = 0
    while (after < 100 && (await guard.decide([{ key: 'k', spec: s, cost: 1 }], LOCAL, 'r')).decision.allowed) after++
    t.equal(after, 0, `${algorithm}: 33 x 3 = 99 of 100 units taken, so the n=2 cost (2) does not fit at the same instant (the old code gave 24 more)`)
  }
})
