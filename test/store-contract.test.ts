// One contract for every implementation of the shared level (SharedLevel, src/limit/types.ts):
// the in-process store, Redis standalone and a real 3-master Redis Cluster run the same suite, as
// hono runs one router suite against every router. What a client relies on is asserted: exactly
// `limit` admissions under concurrency for every algorithm, all-or-nothing across checks (on
// Cluster the checks land on different masters), honest retry-after, and the RateLimit headers
// and 429 body the limiter builds from each store's decisions.
import t, { type Test } from 'tap'
import { randomUUID } from 'node:crypto'
import type { Cluster } from 'ioredis'
import { startRedis, startRedisCluster } from './helpers/redis.js'
import { createInProcessLevel, createMemoryStore } from '../src/limit/memory-store.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { clusterNodes, createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { Limiter, type LimitVerdict } from '../src/limit/limiter.js'
import { DenyCache } from '../src/limit/local-level.js'
import type { PlannedLimit, RouteLimitPlan } from '../src/limit/plan.js'
import type { AlgorithmName, LimitCheck, LimitSpec, SharedDecision, SharedLevel } from '../src/limit/types.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'
import { awayFromQuotaEdge, awayFromWindowEdge } from './helpers/window-edge.js'

interface Subject {
  readonly level: SharedLevel
  /** The in-process level answers without a Promise: the hot path allocates none. */
  readonly synchronous: boolean
}

const BUCKETS = new Set<AlgorithmName>(['gcra', 'token-bucket', 'leaky-bucket'])
const EVERY_ALGORITHM: readonly AlgorithmName[] = ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'sliding-window', 'fixed-window', 'calendar-quota', 'lease']
// Windows aligned on the epoch (a minute, 10 s) or the calendar (a day) start afresh at their
// boundary: each part that counts on one waits out the last seconds of a window instead.
const EPOCH_ALIGNED = new Set<AlgorithmName>(['fixed-window', 'sliding-window'])
const ON_ERROR = [{ onError: 'local' as const }, { onError: 'local' as const }, { onError: 'local' as const }]

function spec (algorithm: AlgorithmName, limit: number, windowMs: number, burst = limit): LimitSpec {
  return Object.freeze({ id: `contract.${algorithm}.${limit}.${windowMs}.${burst}`, algorithm, limit, windowMs, burst: BUCKETS.has(algorithm) ? burst : limit, maxDelayMs: 0 })
}

/** A fresh key per call: every subject and every test starts from whole budgets. */
const fresh = (label: string): string => `contract:${label}:${randomUUID()}`

async function decide (level: SharedLevel, checks: readonly LimitCheck[], id = randomUUID()): Promise<SharedDecision> {
  return await level.decide(checks, ON_ERROR.slice(0, checks.length), id)
}

function planned (name: string, s: LimitSpec, keyBase: string): PlannedLimit {
  return {
    name,
    dimension: 'ip',
    spec: s,
    cost: 1,
    shadow: false,
    status: 429,
    onError: 'local',
    keyBase,
    policy: `"${name}";q=${s.limit};w=${Math.ceil(s.windowMs / 1000)}`,
    fixedCheck: null,
    concurrency: false
  }
}

function header (v: LimitVerdict, name: string): string | undefined {
  if (v.kind === 'unavailable') return undefined
  return v.headers?.find(([n]) => n === name)?.[1]
}

async function storeContract (t: Test, subject: Subject): Promise<void> {
  const { level } = subject

  await t.test('exactly `limit` admissions under concurrency, for every algorithm', async (t) => {
    for (const algorithm of EVERY_ALGORITHM) {
      const windowMs = algorithm === 'calendar-quota' ? 86_400_000 : 60_000
      const check: LimitCheck = { key: fresh(algorithm), spec: spec(algorithm, 5, windowMs), cost: 1 }
      if (algorithm === 'calendar-quota') await awayFromQuotaEdge('day', 5000)
      if (EPOCH_ALIGNED.has(algorithm)) await awayFromWindowEdge(windowMs, 5000)
      const decisions = await Promise.all(Array.from({ length: 12 }, async () => await decide(level, [check])))
      t.equal(decisions.filter(d => d.decision.allowed).length, 5, `${algorithm}: 5 of 12 admitted`)
      const refused = decisions.filter(d => !d.decision.allowed)
      // A sliding window counts the previous window weighted by its overlap: units spent late in
      // one window still weigh in the next, so its wait reaches into it (at most one more window).
      const longest = algorithm === 'sliding-window' ? 2 * windowMs : windowMs
      t.ok(refused.every(d => d.decision.retryAfterMs > 0 && d.decision.retryAfterMs <= longest), `${algorithm}: every refusal says when to retry, within ${longest} ms`)
      t.ok(decisions.every(d => !d.unavailable), `${algorithm}: decided, not unavailable`)
    }
  })

  await t.test('all or nothing: a request one check rejects consumes nothing in the others', async (t) => {
    for (const rejectingFirst of [true, false]) {
      const tight: LimitCheck = { key: fresh('tight'), spec: spec('fixed-window', 1, 60_000), cost: 1 }
      const roomy: LimitCheck = { key: fresh('roomy'), spec: spec('gcra', 10, 60_000), cost: 1 }
      const other: LimitCheck = { key: fresh('other'), spec: spec('sliding-window-log', 10, 60_000), cost: 1 }
      const checks = rejectingFirst ? [tight, roomy, other] : [roomy, other, tight]
      await awayFromWindowEdge(60_000, 5000) // the tight fixed window must still be spent for the five
      const first = await decide(level, checks)
      t.ok(first.decision.allowed, 'the first request passes every check')
      const refusals = await Promise.all(Array.from({ length: 5 }, async () => await decide(level, checks)))
      t.ok(refusals.every(d => !d.decision.allowed && d.decision.limitingIndex === checks.indexOf(tight)), 'the next five are refused by the tight check')
      const after = await decide(level, [roomy, other])
      t.ok(after.decision.allowed, 'the roomy checks still admit')
      t.same(after.decision.remainings, [8, 8], 'and only the admitted request was counted in them (10 - 1 - this one)')
    }
  })

  await t.test('retry-after: the wait until the budget admits again, -1 when it never can', async (t) => {
    const window: LimitCheck = { key: fresh('window'), spec: spec('fixed-window', 2, 10_000), cost: 1 }
    await awayFromWindowEdge(10_000, 2000) // the third in the window of the first two
    await decide(level, [window])
    await decide(level, [window])
    const w = await decide(level, [window])
    t.equal(w.decision.allowed, false)
    t.ok(w.decision.retryAfterMs > 0 && w.decision.retryAfterMs <= 10_000, `fixed window: until the window ends (${w.decision.retryAfterMs} ms)`)
    // gcra, 2 per 10 s, burst 2: once the burst is spent, the next unit is one emission (5 s) away
    const rate: LimitCheck = { key: fresh('rate'), spec: spec('gcra', 2, 10_000), cost: 1 }
    await decide(level, [rate])
    await decide(level, [rate])
    const r = await decide(level, [rate])
    t.equal(r.decision.allowed, false)
    t.ok(r.decision.retryAfterMs > 3000 && r.decision.retryAfterMs <= 5000, `gcra: one emission interval (${r.decision.retryAfterMs} ms)`)
    const huge = await decide(level, [{ key: fresh('huge'), spec: spec('token-bucket', 2, 10_000), cost: 3 }])
    t.equal(huge.decision.allowed, false, 'a cost above the burst is refused')
    t.equal(huge.decision.retryAfterMs, -1, 'and can never pass')
  })

  await t.test('headers and 429 body, through the limiter', async (t) => {
    const limiter = new Limiter({ local: null, deny: new DenyCache(1000), shared: level, legacyHeaders: true, telemetry: NOOP_TELEMETRY })
    const limit = planned('ip', spec('fixed-window', 3, 60_000), `${fresh('headers')}:`)
    const plan: RouteLimitPlan = { enforced: [limit], shadow: [], all: [limit] }
    const request = { route: 'contract', plan, ipKey: '192.0.2.7', user: null, requestId: 'contract' }
    const verdicts: LimitVerdict[] = []
    await awayFromWindowEdge(60_000, 5000) // the four in one fixed window
    for (let i = 0; i < 4; i++) {
      const v = limiter.check(request)
      if (subject.synchronous) t.notOk(v instanceof Promise, 'decided without a Promise')
      verdicts.push(await v)
    }
    t.same(verdicts.map(v => v.kind), ['allow', 'allow', 'allow', 'reject'])
    t.same(verdicts.map(v => header(v, 'ratelimit-policy')), ['"ip";q=3;w=60', '"ip";q=3;w=60', '"ip";q=3;w=60', '"ip";q=3;w=60'], 'RateLimit-Policy names the limit')
    t.same(verdicts.map(v => header(v, 'ratelimit')?.replace(/;t=\d+$/, '')), ['"ip";r=2', '"ip";r=1', '"ip";r=0', '"ip";r=0'], 'RateLimit counts down')
    t.same(verdicts.map(v => header(v, 'x-ratelimit-remaining')), ['2', '1', '0', '0'], 'legacy X-RateLimit-Remaining too')
    const t0 = Number(/;t=(\d+)$/.exec(header(verdicts[0] as LimitVerdict, 'ratelimit') ?? '')?.[1])
    t.ok(t0 > 0 && t0 <= 60, `t = seconds until the window resets (${t0})`)
    const rejected = verdicts[3] as LimitVerdict
    if (rejected.kind !== 'reject') return t.fail('the fourth is refused')
    t.equal(rejected.status, 429)
    t.match(rejected.body, { error: 'rate_limited', dimension: 'ip', limit: 'ip', message: 'rate limit exceeded' }, 'the 429 body clients know')
    t.ok(rejected.body.retryAfterMs > 0 && rejected.body.retryAfterMs <= 60_000, 'retryAfterMs within the window')
    t.equal(header(rejected, 'retry-after'), String(Math.ceil(rejected.body.retryAfterMs / 1000)), 'Retry-After in whole seconds, rounded up')
  })
}

t.test('in process', async (t) => {
  await storeContract(t, { level: createInProcessLevel(createMemoryStore({ maxKeys: 10_000 })), synchronous: true })
})

t.test('Redis standalone', async (t) => {
  const redis = await startRedis(t)
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const guard = new RedisGuard({ store: createRedisStore({ client }), fallbackMaxKeys: 1000, timeoutMs: 5000, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {} })
  t.teardown(() => guard.close())
  await storeContract(t, { level: guard, synchronous: false })
  t.equal(guard.breaker, 'closed', 'every answer came from Redis, none from the fallback')
})

t.test('Redis Cluster, 3 masters', async (t) => {
  const servers = await startRedisCluster(t)
  const cluster = createRedisClient({ cluster: servers.urls }) as Cluster
  t.teardown(() => cluster.disconnect())
  await whenReady(cluster, 15_000)
  const guard = new RedisGuard({ store: createRedisStore({ client: cluster }), fallbackMaxKeys: 1000, timeoutMs: 5000, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {}, denyCacheMaxMs: 250, ...clusterNodes(cluster) })
  t.teardown(() => guard.close())
  await storeContract(t, { level: guard, synchronous: false })
  t.equal(guard.breaker, 'closed', 'every answer came from Redis, none from the fallback')
})
