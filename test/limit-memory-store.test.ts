// The in-process store: synchronous, all-or-nothing, bounded, and strict about what it accepts.
import t from 'tap'
import { createMemoryStore } from '../src/limit/memory-store.js'
import { validateLimitSpec } from '../src/limit/algorithms/index.js'
import { limitKey } from '../src/limit/redis-store.js'
import type { AlgorithmName, LimitCheck, LimitSpec } from '../src/limit/types.js'

function spec (algorithm: AlgorithmName, limit: number, windowMs: number, burst = limit, maxDelayMs = 0): LimitSpec {
  return Object.freeze({ id: `${algorithm}-${limit}-${windowMs}-${burst}-${maxDelayMs}`, algorithm, limit, windowMs, burst, maxDelayMs })
}

t.test('decide is synchronous: a decision, never a Promise', async (t) => {
  const store = createMemoryStore({ maxKeys: 10 })
  const d = store.decide([{ key: 'a', spec: spec('gcra', 2, 1000), cost: 1 }], 'r1')
  t.notOk(d instanceof Promise)
  t.equal(typeof (d as unknown as { then?: unknown }).then, 'undefined')
  t.equal(d.allowed, true)
  t.equal(store.kind, 'memory')
})

t.test('all or nothing: a rejecting check leaves the others untouched', async (t) => {
  let now = 1_700_000_000_000_000
  const store = createMemoryStore({ maxKeys: 100, now: () => now })
  const global = spec('token-bucket', 100, 60_000)
  const user = spec('fixed-window', 1, 60_000)
  const request = (u: string): LimitCheck[] => [{ key: 'global', spec: global, cost: 1 }, { key: `user:${u}`, spec: user, cost: 1 }]
  t.equal(store.decide(request('alice'), 'r').remaining, 0, 'alice: admitted, her window is now full')
  for (let i = 0; i < 20; i++) {
    const d = store.decide(request('alice'), 'r')
    t.equal(d.limitingIndex, 1, 'rejected by the user dimension')
    now += 1
  }
  // The global bucket only paid for alice's one admitted request.
  const bob = store.decide(request('bob'), 'r')
  t.same([bob.allowed, bob.limitingIndex, bob.remaining], [true, 1, 0])
  const g = store.decide([{ key: 'global', spec: global, cost: 1 }], 'r')
  t.equal(g.remaining, 97, 'global: 100 - alice - bob - this one')
})

t.test('bounded: at most maxKeys keys, least recently used evicted', async (t) => {
  const store = createMemoryStore({ maxKeys: 10 })
  const s = spec('fixed-window', 1, 3_600_000)
  for (let i = 0; i < 50; i++) store.decide([{ key: `k${i}`, spec: s, cost: 1 }], 'r')
  t.equal(store.size, 10)
  t.equal(store.decide([{ key: 'k49', spec: s, cost: 1 }], 'r').allowed, false, 'a recent key keeps its state')
  t.equal(store.decide([{ key: 'k0', spec: s, cost: 1 }], 'r').allowed, true, 'an evicted key starts over (why maxKeys must be sized)')
  await store.close()
  t.equal(store.size, 0, 'close() drops everything')
})

t.test('a key evicted and decided again keeps the state of its new entry, not of the one it had before', async (t) => {
  const store = createMemoryStore({ maxKeys: 2 })
  const s = spec('fixed-window', 2, 3_600_000)
  const a = (): boolean => store.decide([{ key: 'a', spec: s, cost: 1 }], 'r').allowed
  t.same([a(), a()], [true, true], 'a spends its budget, the second time through the entry read')
  store.decide([{ key: 'b', spec: s, cost: 1 }], 'r')
  store.decide([{ key: 'c', spec: s, cost: 1 }], 'r')
  // evicted: a starts over, and what it spends now must be kept in its new entry
  t.same([a(), a(), a()], [true, true, false], 'two admitted after the eviction, the third refused')
  t.equal(store.size, 2)
})

t.test('an entry past its time decides like a fresh key: nothing expires, nothing is cleared', async (t) => {
  let now = 1_700_000_000_000_000
  const store = createMemoryStore({ maxKeys: 10, now: () => now })
  const s = spec('gcra', 10, 1000, 1)
  store.decide([{ key: 'k', spec: s, cost: 1 }], 'r')
  t.equal(store.decide([{ key: 'k', spec: s, cost: 1 }], 'r').allowed, false)
  now += 100_000
  t.equal(store.decide([{ key: 'k', spec: s, cost: 1 }], 'r').allowed, true, 'admitted once the TAT has passed')
  now += 10_000_000
  t.equal(store.decide([{ key: 'other', spec: s, cost: 1 }], 'r').allowed, true)
  t.equal(store.size, 2, 'the stale entry is still counted until touched')
  t.equal(store.decide([{ key: 'k', spec: s, cost: 1 }], 'r').remaining, 0, 'and decides like a fresh key')
  // Read while lapsed, a key is kept: with a TTL, lru-cache deletes it, and deleting the last key
  // held clears all its maxKeys-long arrays on that request (createMemoryStore's comment).
  const lone = createMemoryStore({ maxKeys: 10, now: () => now })
  lone.decide([{ key: 'k', spec: s, cost: 1 }], 'r')
  now += 10_000_000
  t.same(lone.peek([{ key: 'k', spec: s, cost: 1 }]), [{ remaining: 1, resetMs: 0, retryAfterMs: 0 }], 'a whole budget again')
  t.equal(lone.size, 1, 'and the key is still held')
})

t.test('a lease released to zero is deleted; lease counts are not evicted by budgets, nor forgotten by a reset', async (t) => {
  const store = createMemoryStore({ maxKeys: 4 })
  const lease = spec('lease', 1, 1000)
  t.equal(store.decide([{ key: 'l', spec: lease, cost: 1 }], 'r').allowed, true)
  t.equal(store.decide([{ key: 'l', spec: lease, cost: 1 }], 'r').allowed, false, 'the one lease is held')
  store.release('l', 1)
  t.equal(store.size, 0, 'released to zero: nothing kept')
  t.equal(store.decide([{ key: 'l', spec: lease, cost: 1 }], 'r').allowed, true, 'and the lease can be taken again')
  // more budget keys than maxKeys: an LRU holding the count would evict it and admit a second holder
  const budget = spec('fixed-window', 10, 1000)
  for (let i = 0; i < 10; i++) store.decide([{ key: `b${i}`, spec: budget, cost: 1 }], 'r')
  t.equal(store.decide([{ key: 'l', spec: lease, cost: 1 }], 'r').allowed, false, 'still held after the budgets filled maxKeys (admitted before: evicted)')
  store.forget('l')
  t.equal(store.decide([{ key: 'l', spec: lease, cost: 1 }], 'r').allowed, false, 'an admin reset forgives budgets, not requests in flight')
  store.clearBudgets()
  t.equal(store.decide([{ key: 'l', spec: lease, cost: 1 }], 'r').allowed, false, 'nor does the end of a Redis outage')
  store.release('l', 1)
  t.equal(store.decide([{ key: 'l', spec: lease, cost: 1 }], 'r').allowed, true, 'given back by its request, it can be taken again')
})

t.test('the default clock is real and monotonic', async (t) => {
  const store = createMemoryStore({ maxKeys: 10 })
  const s = spec('gcra', 2, 400)
  const check = [{ key: 'k', spec: s, cost: 1 }]
  t.same([store.decide(check, 'a').allowed, store.decide(check, 'b').allowed, store.decide(check, 'c').allowed], [true, true, false])
  const retry = store.decide(check, 'd').retryAfterMs
  t.ok(retry > 0 && retry <= 200, `retry ${retry} ms`)
  // The wall clock steps an hour ahead (an NTP correction, an operator's `date -s`): a store on
  // Date.now() would see a whole budget again at once; the monotonic clock does not move.
  const wallClock = Date.now
  Date.now = () => wallClock() + 3_600_000
  try {
    t.equal(store.decide(check, 'stepped').allowed, false, 'still limited after the wall clock stepped ahead')
  } finally {
    Date.now = wallClock
  }
  await new Promise((resolve) => setTimeout(resolve, retry + 50))
  t.equal(store.decide(check, 'e').allowed, true, 'admitted after the advertised wait')
})

t.test('refuses what it cannot decide exactly (a config error, not a silent deny)', async (t) => {
  const store = createMemoryStore({ maxKeys: 10 })
  const good = spec('gcra', 10, 1000)
  t.throws(() => store.decide([{ key: 'k', spec: spec('gcra', 0, 1000), cost: 1 }], 'r'), RangeError, 'limit 0')
  t.throws(() => store.decide([{ key: 'k', spec: good, cost: 0 }], 'r'), RangeError, 'cost 0')
  t.throws(() => store.decide([{ key: 'k', spec: good, cost: 1.5 }], 'r'), RangeError, 'fractional cost')
  t.throws(() => store.decide([{ key: 'k', spec: good, cost: 1 }, { key: 'k', spec: good, cost: 1 }], 'r'), RangeError, 'same key twice')
  t.throws(() => createMemoryStore({ maxKeys: 0 }), RangeError)
  t.equal(store.decide([{ key: 'k', spec: good, cost: 1 }], 'r').allowed, true, 'nothing was recorded by the refused calls')
  t.equal(store.decide([{ key: 'k', spec: good, cost: 1 }], 'r').remaining, 8)
})

t.test('validateLimitSpec: one message per problem', async (t) => {
  const cases: Array<[LimitSpec, RegExp | undefined]> = [
    [spec('gcra', 100, 1000), undefined],
    [spec('token-bucket', 1_000_000, 86_400_000), undefined],
    [spec('sliding-window', 10_000_000, 86_400_000), undefined],
    [spec('sliding-window', 100_000_000, 86_400_000), /limit \* windowMs is too large/],
    [spec('gcra', 0, 1000), /limit must be an integer >= 1/],
    [spec('gcra', 10, 0), /windowMs must be an integer >= 1/],
    [spec('token-bucket', 10, 1000, 0), /burst must be an integer >= 1/],
    [spec('leaky-bucket', 10, 1000, 10, -1), /maxDelayMs must be an integer >= 0/],
    [spec('gcra', 2_000_000, 1000), /at most one request per µs/],
    [spec('token-bucket', 999_983, 86_400_000, 999_983), /burst is too large/],
    [spec('sliding-window-log', 2_000_000, 1000), /use sliding-window/],
    [{ ...spec('gcra', 1, 1), algorithm: 'nope' as AlgorithmName }, /unknown algorithm/]
  ]
  for (const [s, expected] of cases) {
    const problem = validateLimitSpec(s)
    if (expected === undefined) t.equal(problem, undefined, `${s.id} is valid`)
    else t.match(problem, expected, `${s.id}: ${problem}`)
  }
})

t.test('limitKey percent-encodes braces so a value cannot be a hash tag', async (t) => {
  t.equal(limitKey('gw', 'api.ip.abc', '10.0.0.1'), 'gw:api.ip.abc:10.0.0.1')
  t.equal(limitKey('gw', 'api.user.x', '{tenant}'), 'gw:api.user.x:%7Btenant%7D')
  t.equal(limitKey('gw', 'id', '%7B'), 'gw:id:%257B', '"%" is encoded too: "{" and "%7B" stay different keys')
  t.notOk(limitKey('gw', 'id', 'a{b}c').includes('{'))
  // each of the three alone in a value, after other characters
  t.equal(limitKey('gw', 'id', 'a}'), 'gw:id:a%7D', 'a closing brace alone')
  t.equal(limitKey('gw', 'id', 'x{'), 'gw:id:x%7B', 'an opening brace last')
  t.equal(limitKey('gw', 'id', 'ab%'), 'gw:id:ab%25', 'a percent sign last')
})
