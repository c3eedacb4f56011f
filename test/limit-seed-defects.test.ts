// Each defect of the seed documents' Lua (see /work/shared/seeds/README.md), pinned by a test
// named after it, against a real redis-server.
import t from 'tap'
import type { Redis } from 'ioredis'
import { startRedis } from './helpers/redis.js'
import { createRedisStore, limitKey } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { keySlot } from '../src/limit/keys.js'
import { LIMIT_SCRIPT, parseLimitReply } from '../src/limit/scripts.js'
import type { AlgorithmName, LimitCheck, LimitSpec } from '../src/limit/types.js'
import { awayFromWindowEdge } from './helpers/window-edge.js'

const ALL: AlgorithmName[] = ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'sliding-window', 'fixed-window']
const BUCKETS = new Set<AlgorithmName>(['gcra', 'token-bucket', 'leaky-bucket'])

function spec (algorithm: AlgorithmName, limit: number, windowMs: number, burst = limit, maxDelayMs = 0): LimitSpec {
  return Object.freeze({ id: `${algorithm}-${limit}-${windowMs}-${burst}`, algorithm, limit, windowMs, burst: BUCKETS.has(algorithm) ? burst : limit, maxDelayMs })
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

const redis = await startRedis(t)
const client = createRedisClient({ url: redis.url })
t.teardown(() => client.disconnect())
await whenReady(client)
const plain: Redis = redis.client()
/** The production store: Redis TIME. */
const store = createRedisStore({ client })
/** A store on a virtual clock (the scripts' now override) for exact timings. */
let virtualUs = Math.floor(Date.now() / 1000) * 1_000_000
const virtual = createRedisStore({ client, nowUs: () => virtualUs })
let n = 0
const fresh = (label: string): string => `seed:${label}:${n++}`
const one = (s: LimitSpec, key: string, cost = 1): LimitCheck[] => [{ key, spec: s, cost }]

t.test('defect: time from the client clock (instances disagree) -> the script reads Redis TIME', async (t) => {
  const before = await plain.time()
  const reply = parseLimitReply(await plain.eval(LIMIT_SCRIPT, 1, fresh('time'), '0', 'r', '1,10,1000,10,1,0'), 1)
  const after = await plain.time()
  const ms = (time: ReadonlyArray<number | string>): number => Number(time[0]) * 1000 + Math.floor(Number(time[1]) / 1000)
  t.ok(reply.nowMs >= ms(before) && reply.nowMs <= ms(after), `decided at Redis time ${reply.nowMs}`)
})

t.test('defect: timestamps as ZSET members (same-millisecond requests collapse) -> all counted', async (t) => {
  const s = spec('sliding-window-log', 5, 1000)
  const key = fresh('same-us')
  const decisions = []
  // Ten requests in the very same µs.
  for (let i = 0; i < 10; i++) decisions.push(await virtual.decide(one(s, key), `req-${i}`))
  t.equal(decisions.filter((d) => d.allowed).length, 5, 'the limit trips')
  t.equal(await plain.zcard(key), 5, 'one entry per admitted request')
  const members = await plain.zrange(key, '0', '-1', 'WITHSCORES')
  t.equal(new Set(members.filter((_, i) => i % 2 === 1)).size, 1, 'all with the same score')
  t.ok(members.filter((_, i) => i % 2 === 0).every((m) => /^req-\d~/.test(m)), 'members are request ids, not timestamps')

  const dup = fresh('dup-id')
  // A client sending the same X-Request-Id every time must not collapse its entries either.
  for (let i = 0; i < 8; i++) await virtual.decide(one(s, dup), 'same-id')
  t.equal(await plain.zcard(dup), 5, 'a repeated request id is still counted per request')

  const real = fresh('same-ms')
  const admitted = (await Promise.all(Array.from({ length: 30 }, (_, i) => store.decide(one(spec('sliding-window-log', 100, 60_000), real), `c${i}`)))).filter((d) => d.allowed).length
  t.equal(admitted, 30)
  t.equal(await plain.zcard(real), 30, '30 concurrent requests (most in the same ms): 30 entries')
})

t.test('defect: sliding log counts rejected requests (a retrying client is locked out forever) -> only admissions recorded', async (t) => {
  const s = spec('sliding-window-log', 3, 600)
  const key = fresh('retrying')
  for (let i = 0; i < 3; i++) t.equal((await store.decide(one(s, key), `a${i}`)).allowed, true)
  const start = Date.now()
  let rejected = 0
  let largestLog = 0
  let admittedAfter = -1
  while (Date.now() - start < 2000) {
    const d = await store.decide(one(s, key), 'retry')
    if (d.allowed) {
      admittedAfter = Date.now() - start
      break
    }
    rejected++
    largestLog = Math.max(largestLog, await plain.zcard(key))
    await sleep(10)
  }
  t.ok(rejected > 20, `${rejected} rejected retries`)
  t.equal(largestLog, 3, 'rejections added nothing to the log')
  t.ok(admittedAfter >= 450 && admittedAfter <= 1000, `admitted again ${admittedAfter} ms later, once the window allowed`)
})

t.test('defect: not atomic (separate commands over-admit) -> one script call decides and writes', async (t) => {
  const s = spec('sliding-window-log', 10, 60_000)
  const key = fresh('atomic')
  const decisions = await Promise.all(Array.from({ length: 100 }, (_, i) => store.decide(one(s, key), `c${i}`)))
  t.equal(decisions.filter((d) => d.allowed).length, 10)
  t.equal(await plain.zcard(key), 10)
})

t.test('defect: non-integer EXPIRE (key left without TTL) -> every key has an integer TTL, just long enough', async (t) => {
  // Rates with fractions everywhere: 3 per second (333.33 ms per token) and 7 per minute.
  for (const s of ALL.flatMap((a) => [spec(a, 3, 1000, 7), spec(a, 7, 60_000, 3)])) {
    const key = fresh(`ttl-${s.id}`)
    let last
    for (let i = 0; i < 3; i++) last = await store.decide(one(s, key), `r${i}`)
    const pttl = await plain.pttl(key)
    t.ok(Number.isInteger(pttl) && pttl > 0, `${s.id}: TTL ${pttl} ms`)
    // The state matters exactly until the budget is whole again: the TTL is that long, no longer.
    const resetMs = last?.resetMs ?? 0
    t.ok(Math.abs(pttl - resetMs) <= 50, `${s.id}: TTL ${pttl} ms ~ resetMs ${resetMs}`)
  }
  const keys = await plain.keys('seed:ttl-*')
  const ttls = await Promise.all(keys.map((k) => plain.pttl(k)))
  t.ok(keys.length >= 12 && ttls.every((ms) => ms > 0), `all ${keys.length} keys expire`)
})

t.test('defect: permits documented but ignored -> cost is honoured by every algorithm', async (t) => {
  for (const algorithm of ALL) {
    const s = spec(algorithm, 10, 3_600_000)
    const key = fresh(`cost-${algorithm}`)
    const remaining = []
    for (let i = 0; i < 4; i++) remaining.push((await virtual.decide(one(s, key, 3), 'r')).remaining)
    t.same(remaining, [7, 4, 1, 1], `${algorithm}: cost 3 takes 3; the 4th does not fit`)
    t.same([(await virtual.decide(one(s, key, 1), 'r')).remaining], [0], `${algorithm}: 1 left, taken`)
    if (algorithm === 'sliding-window-log') t.equal(await plain.zcard(key), 10, 'one log entry per cost unit')
  }
})

t.test('defect: cost above the burst waits forever -> retryAfterMs = -1 ("never"), nothing recorded', async (t) => {
  for (const algorithm of ALL) {
    const s = spec(algorithm, 10, 1000)
    const key = fresh(`never-${algorithm}`)
    const d = await virtual.decide(one(s, key, 11), 'r')
    t.same([d.allowed, d.retryAfterMs, d.remaining], [false, -1, 10], algorithm)
    t.equal(await plain.exists(key), 0, `${algorithm}: no state written`)
  }
})

t.test('defect: refill that floors fractions (under-refills) -> 3 per second is exactly 3 per second', async (t) => {
  // Requests every 1 ms for 5 s against 3 per second with a burst of 2: each admission happens a
  // fraction of a ms after its token appears; flooring those fractions would lose tokens.
  for (const algorithm of ['token-bucket', 'leaky-bucket', 'gcra'] as const) {
    const s = spec(algorithm, 3, 1000, 2)
    const key = fresh(`fraction-${algorithm}`)
    virtualUs += 10_000_000
    let admitted = 0
    for (let ms = 0; ms <= 5000; ms++) {
      if ((await virtual.decide(one(s, key), 'r')).allowed) admitted++
      virtualUs += 1000
    }
    // token/leaky: exact. gcra: its emission interval is rounded up to whole µs (333 334 µs), as documented.
    const expected = algorithm === 'gcra' ? 2 + Math.floor(5_000_000 / 333_334) : 2 + 15
    t.equal(admitted, expected, `${algorithm}: ${admitted} admitted in 5 s`)
  }
})

t.test('defect: Lua truncates fractional numbers (a 0.5 ms wait returns 0) -> waits round up to whole ms', async (t) => {
  for (const algorithm of ALL) {
    // One per ms: the next slot is 0.5 ms away.
    const s = spec(algorithm, BUCKETS.has(algorithm) ? 1000 : 1, BUCKETS.has(algorithm) ? 1000 : 1, 1)
    const key = fresh(`half-${algorithm}`)
    virtualUs = Math.ceil(virtualUs / 1000) * 1000 + 1000
    t.equal((await virtual.decide(one(s, key), 'r')).allowed, true)
    virtualUs += 500
    const d = await virtual.decide(one(s, key), 'r')
    // sliding-window weighs the previous window per whole ms, so its slot is 1.5 ms away: 2.
    const expected = algorithm === 'sliding-window' ? 2 : 1
    t.same([d.allowed, d.retryAfterMs], [false, expected], `${algorithm}: retryAfterMs ${expected}, not 0`)
    t.ok(d.resetMs >= 1, `${algorithm}: resetMs ${d.resetMs}`)
  }
})

t.test('defect: multi-dimension limits consume the global budget before user/IP reject (and take 4 round trips) -> all or nothing, one call', async (t) => {
  const keys = { global: fresh('global'), user: fresh('user'), ip: fresh('ip'), api: fresh('api') }
  const checks: LimitCheck[] = [
    // Rates per hour, so the state written by the first request outlives the test.
    { key: keys.global, spec: spec('token-bucket', 1000, 3_600_000), cost: 1 },
    { key: keys.user, spec: spec('fixed-window', 1, 3_600_000), cost: 1 },
    { key: keys.ip, spec: spec('sliding-window-log', 10, 60_000), cost: 1 },
    { key: keys.api, spec: spec('gcra', 100, 3_600_000), cost: 1 }
  ]
  // the user check is a fixed window aligned on the epoch: all eleven requests in one hour
  await awayFromWindowEdge(3_600_000, 30_000)
  t.equal((await store.decide(checks, 'first')).allowed, true)
  const dump = async (): Promise<Array<string | null>> =>
    await Promise.all([keys.global, keys.ip, keys.api].map(async (k) => (await plain.dumpBuffer(k))?.toString('hex') ?? null))
  const before = await dump()
  // MONITOR shows every command a client sends; the commands a script runs come from "lua".
  const monitor = await redis.client().monitor()
  const sent: string[] = []
  monitor.on('monitor', (_time: string, args: string[], source: string) => { if (source !== 'lua') sent.push(String(args[0]).toLowerCase()) })
  await sleep(50)
  for (let i = 0; i < 10; i++) {
    const d = await store.decide(checks, `again-${i}`)
    t.same([d.allowed, d.limitingIndex], [false, 1], 'rejected by the user dimension')
  }
  await sleep(50)
  monitor.disconnect()
  t.same(sent, Array(10).fill('fcall'), 'one FCALL per decision (the function library, loaded by the earlier calls), nothing else')
  t.same(await dump(), before, 'global, ip and api keys are byte for byte unchanged')
  t.equal(await plain.zcard(keys.ip), 1, 'the ip log holds only the admitted request')
})

t.test('defect: bad config silently rejects everything ("deny, wait 1000 ms") -> refused loudly, Redis untouched', async (t) => {
  const key = fresh('bad')
  const bad = { ...spec('token-bucket', 10, 1000), burst: 0 }
  await t.rejects(store.decide(one(bad, key), 'r'), RangeError)
  t.equal(await plain.exists(key), 0)
})

t.test('defect: a literal {biz} placeholder is a hash tag (one slot for everyone) -> values cannot pick a slot', async (t) => {
  const a = limitKey('gw', 'login.user.x1', '{biz}:user-1')
  const b = limitKey('gw', 'login.user.x1', '{biz}:user-2')
  t.notOk(a.includes('{') || b.includes('{'), a)
  t.not(keySlot(a), keySlot(b), 'two users of one "business" land on different slots')
  t.not(keySlot(a), keySlot('biz'), 'the client-sent tag is not honoured')
})
