// What remaining / retryAfterMs / resetMs / delayMs mean for each algorithm, on hand-computed
// cases, plus two properties over random sequences: a rejected request retried exactly
// retryAfterMs later passes (and 1 ms earlier does not), and resetMs later the budget is whole.
// Run on the memory twins with a virtual clock; the parity test holds the Lua side to the same.
import t from 'tap'
import { decideAt, type LimitStateMap } from '../src/limit/memory-store.js'
import type { AlgorithmState } from '../src/limit/algorithms/index.js'
import type { AlgorithmName, LimitCheck, LimitDecision, LimitSpec } from '../src/limit/types.js'
import { prng } from './helpers/prng.js'

const BUCKETS = new Set<AlgorithmName>(['gcra', 'token-bucket', 'leaky-bucket'])
const ALL: AlgorithmName[] = ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'sliding-window', 'fixed-window']

function spec (algorithm: AlgorithmName, limit: number, windowMs: number, burst = limit, maxDelayMs = 0): LimitSpec {
  return Object.freeze({ id: `${algorithm}:${limit}/${windowMs}:${burst}:${maxDelayMs}`, algorithm, limit, windowMs, burst: BUCKETS.has(algorithm) ? burst : limit, maxDelayMs })
}

class Clocked {
  readonly states = new Map<string, AlgorithmState>()
  private readonly map: LimitStateMap = { get: (k) => this.states.get(k), set: (k, v) => { this.states.set(k, v) } }
  constructor (public nowUs: number) {}
  decide (checks: readonly LimitCheck[]): LimitDecision {
    return decideAt(this.map, checks, 'r', this.nowUs)
  }

  one (s: LimitSpec, cost = 1, key = 'k'): LimitDecision {
    return this.decide([{ key, spec: s, cost }])
  }

  /** Runs `checks` on a copy of the state at a later time, leaving this one unchanged. */
  probe (checks: readonly LimitCheck[], atUs: number): LimitDecision {
    const copy = new Clocked(atUs)
    for (const [k, v] of this.states) copy.states.set(k, structuredClone(v))
    return copy.decide(checks)
  }

  advanceMs (ms: number): void { this.nowUs += ms * 1000 }
}

const pick = (d: LimitDecision): number[] => [d.allowed ? 1 : 0, d.remaining, d.retryAfterMs, d.resetMs, d.delayMs]

// A window start (aligned to the epoch like the window algorithms) far from time zero.
const T0 = 1_700_000_000_000_000

t.test('bucket algorithms: burst 5, 10 per second (one token per 100 ms)', async (t) => {
  for (const algorithm of ['gcra', 'token-bucket', 'leaky-bucket'] as const) {
    const s = spec(algorithm, 10, 1000, 5)
    const c = new Clocked(T0 + 37)
    // [allowed, remaining, retryAfterMs, resetMs, delayMs]
    t.same([1, 2, 3, 4, 5].map(() => pick(c.one(s))), [
      [1, 4, 0, 100, 0], [1, 3, 0, 200, 0], [1, 2, 0, 300, 0], [1, 1, 0, 400, 0], [1, 0, 0, 500, 0]
    ], `${algorithm}: remaining counts down, resetMs = time to refill/drain completely`)
    t.same(pick(c.one(s)), [0, 0, 100, 500, 0], `${algorithm}: empty: retry when one token is back`)
    c.advanceMs(99)
    t.same(pick(c.one(s)), [0, 0, 1, 401, 0], `${algorithm}: 1 ms early: still rejected, 1 ms to go`)
    c.advanceMs(1)
    t.same(pick(c.one(s)), [1, 0, 0, 500, 0], `${algorithm}: exactly on time: admitted`)
    t.same(pick(c.one(s, 3)), [0, 0, 300, 500, 0], `${algorithm}: cost 3 waits for 3 tokens`)
    t.same(pick(c.one(s, 6)), [0, 0, -1, 500, 0], `${algorithm}: cost above burst: never`)
    c.advanceMs(10_000)
    t.same(pick(c.one(s, 5)), [1, 0, 0, 500, 0], `${algorithm}: idle: the whole burst, not more`)
  }
})

t.test('leaky-bucket delay mode: virtual scheduling with a 250 ms cap', async (t) => {
  const s = spec('leaky-bucket', 10, 1000, 5, 250)
  const c = new Clocked(T0)
  t.same([1, 2, 3].map(() => pick(c.one(s))), [
    [1, 4, 0, 100, 0], [1, 3, 0, 200, 100], [1, 2, 0, 300, 200]
  ], 'each request is held until the ones before it have drained')
  // The 4th would wait 300 ms > 250: rejected until the water is down to 2.5 requests (50 ms).
  t.same(pick(c.one(s)), [0, 2, 50, 300, 0], 'delay above maxDelayMs: rejected with the wait until it fits')
  c.advanceMs(50)
  t.same(pick(c.one(s)), [1, 1, 0, 350, 250], 'then admitted with the longest allowed delay')
  const tight = spec('leaky-bucket', 10, 1000, 2, 10_000)
  const d = new Clocked(T0)
  t.same([pick(d.one(tight)), pick(d.one(tight)), pick(d.one(tight))], [
    [1, 1, 0, 100, 0], [1, 0, 0, 200, 100], [0, 0, 100, 200, 0]
  ], 'a full bucket rejects even when the delay would be allowed')
  const shaped = new Clocked(T0)
  const fine = spec('leaky-bucket', 1000, 1000, 10, 5)
  shaped.one(fine)
  shaped.nowUs += 500
  t.equal(shaped.one(fine).delayMs, 1, 'a 0.5 ms delay is 1 ms, not 0')
})

t.test('sliding-window-log: exact window (now - W, now]', async (t) => {
  const s = spec('sliding-window-log', 3, 1000)
  const c = new Clocked(T0 + 5)
  t.same(pick(c.one(s)), [1, 2, 0, 1000, 0])
  c.advanceMs(100)
  t.same(pick(c.one(s)), [1, 1, 0, 1000, 0])
  c.advanceMs(100)
  t.same(pick(c.one(s)), [1, 0, 0, 1000, 0])
  c.advanceMs(100)
  t.same(pick(c.one(s)), [0, 0, 700, 900, 0], 'retry when the oldest entry leaves; reset when the newest does')
  t.same(pick(c.one(s, 2)), [0, 0, 800, 900, 0], 'cost 2 waits for the two oldest')
  t.same(pick(c.one(s, 4)), [0, 0, -1, 900, 0], 'cost above the limit: never')
  c.nowUs = T0 + 5 + 999_999
  t.equal(c.one(s).allowed, false, '1 µs before the oldest entry leaves')
  c.nowUs = T0 + 5 + 1_000_000
  t.same(pick(c.one(s)), [1, 0, 0, 1000, 0], 'admitted the µs it leaves')
})

t.test('fixed-window: epoch-aligned windows', async (t) => {
  const s = spec('fixed-window', 3, 1000)
  const c = new Clocked(T0 + 200_000)
  t.same([1, 2, 3, 4].map(() => pick(c.one(s))), [
    [1, 2, 0, 800, 0], [1, 1, 0, 800, 0], [1, 0, 0, 800, 0], [0, 0, 800, 800, 0]
  ], 'retry and reset at the end of the window')
  c.nowUs = T0 + 1_000_000
  t.same(pick(c.one(s, 3)), [1, 0, 0, 1000, 0], 'the next window starts whole')
  t.same(pick(new Clocked(T0).one(s, 4)), [0, 3, -1, 0, 0], 'cost above the limit: never, nothing consumed')
})

t.test('sliding-window: the two-window estimate and its documented error bound', async (t) => {
  const s = spec('sliding-window', 10, 1000)
  const c = new Clocked(T0 + 900_000)
  const first = Array.from({ length: 11 }, () => c.one(s))
  t.equal(first.filter((d) => d.allowed).length, 10, 'a fresh key: exactly the limit in its window')
  t.same(pick(first[10] as LimitDecision), [0, 0, 200, 1100, 0],
    'full: retry in the next window once the previous 10 weigh <= 9, i.e. at its offset 100 ms (100 + 100 ms)')
  // Half-way through the next window the previous 10 weigh 10 * 0.5 = 5.
  c.nowUs = T0 + 1_500_000
  const second = Array.from({ length: 6 }, () => c.one(s))
  t.equal(second.filter((d) => d.allowed).length, 5, 'admits limit - previous * (1 - elapsed/W)')
  t.same(pick(second[5] as LimitDecision), [0, 0, 100, 1500, 0], 'retry once the previous window weighs 4 (at 600 ms)')
  // The bound is tight: the 10 of the previous window came at its very end (offset 900 ms), so
  // all of them are inside (now - W, now]: 15 = limit + previous * elapsed / W admitted in one window.
  const admittedAt = [
    ...first.filter((d) => d.allowed).map(() => T0 + 900_000),
    ...second.filter((d) => d.allowed).map(() => T0 + 1_500_000)
  ]
  const inWindow = admittedAt.filter((at) => at > c.nowUs - 1_000_000 && at <= c.nowUs).length
  t.equal(inWindow, 10 + 10 * 0.5, 'worst case reached: limit + p * e / W admissions in the window ending now (< 2 * limit)')
  c.nowUs = T0 + 3_000_000
  t.same(pick(c.one(s)), [1, 9, 0, 2000, 0], 'two windows later the budget is whole again')
})

t.test('properties: retryAfterMs is exact (to the ms) and resetMs restores the whole budget', async (t) => {
  const specs = ALL.flatMap((a) => [spec(a, 5, 1000), spec(a, 3, 1000, 7), spec(a, 7, 60_000, 3),
    ...(a === 'leaky-bucket' ? [spec(a, 10, 1000, 6, 250)] : [])])
  const random = prng(99)
  let retries = 0
  let resets = 0
  const failures: string[] = []
  for (let run = 0; run < 60; run++) {
    // One to three checks per request, on different keys.
    const chosen = Array.from({ length: 1 + Math.floor(random() * 3) }, () => specs[Math.floor(random() * specs.length)] as LimitSpec)
    const c = new Clocked(T0 + Math.floor(random() * 1e9))
    for (let step = 0; step < 120; step++) {
      c.nowUs += random() < 0.3 ? 0 : Math.floor(random() * 400_000)
      const checks = chosen.map((s, i) => ({ key: `k${i}`, spec: s, cost: 1 + Math.floor(random() * 3) }))
      const before = c.probe(checks, c.nowUs)
      const d = c.decide(checks)
      if (JSON.stringify(d) !== JSON.stringify(before)) failures.push('probe() changed the state')
      if (!d.allowed && d.retryAfterMs > 0) {
        retries++
        const later = c.probe(checks, c.nowUs + d.retryAfterMs * 1000)
        const earlier = c.probe(checks, c.nowUs + (d.retryAfterMs - 1) * 1000)
        if (!later.allowed || earlier.allowed) {
          failures.push(`${JSON.stringify(checks.map((x) => [x.spec.id, x.cost]))} retry ${d.retryAfterMs}: at retry ${later.allowed}, 1 ms before ${earlier.allowed}`)
        }
      }
      if (d.limitingIndex >= 0) {
        resets++
        const deciding = checks[d.limitingIndex] as LimitCheck
        const whole = c.probe([{ ...deciding, cost: 1 }], c.nowUs + d.resetMs * 1000)
        const capacity = BUCKETS.has(deciding.spec.algorithm) ? deciding.spec.burst : deciding.spec.limit
        if (whole.remaining !== capacity - 1) failures.push(`${deciding.spec.id}: resetMs ${d.resetMs} later remaining ${whole.remaining}, expected ${capacity - 1}`)
      }
    }
  }
  t.same(failures.slice(0, 5), [], `${retries} retries and ${resets} resets checked`)
  t.ok(retries > 500 && resets > 2000, 'enough cases exercised')
})
