// Issue 8 against a real redis-server: the fallback starts from what Redis last said was left
// and writes what it admitted back (a debt); a clock stepping back keeps the later window; a
// refund re-sent by ioredis Cluster is applied once; the heartbeat's count and
// redis.expectedInstances floor the divisor; a write-back that fails is retried, unless its window passed.
import t, { type Test } from 'tap'
import { startRedis } from './helpers/redis.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { createMemoryStore } from '../src/limit/memory-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { InstanceHeartbeat } from '../src/limit/heartbeat.js'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { LIMIT_SCRIPT, REFUND_SCRIPT, parseLimitReply } from '../src/limit/scripts.js'
import { compileLimitSpec } from '../src/limit/plan.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'
import type { AlgorithmName, LimitCheck, LimitSpec } from '../src/limit/types.js'
import { awayFromWindowEdge } from './helpers/window-edge.js'

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))
const LOCAL = [{ onError: 'local' as const }]

function spec (algorithm: AlgorithmName, limit: number, windowMs: number, burst = limit): LimitSpec {
  return Object.freeze({ id: `${algorithm}-${limit}-${windowMs}-${burst}`, algorithm, limit, windowMs, burst, maxDelayMs: 0 })
}

const redis = await startRedis(t)
const plain = redis.client()

/** Polls `ok` every 20 ms; fails the test after `ms`. */
async function eventually (t: Test, ok: () => boolean, what: string, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms
  while (!ok()) {
    if (Date.now() > deadline) {
      t.fail(`timed out waiting for ${what}`)
      return
    }
    await sleep(20)
  }
}

/**
 * A guard as src/runtime-resources.ts wires it (a PING probe on a timer, a probe at once when the
 * client is ready), on a client of its own, with what it reports of its debts.
 */
async function guardedClient (t: Test, instances: number, fallbackMaxKeys = 100): Promise<{ client: ReturnType<typeof createRedisClient>, guard: RedisGuard, debtErrors: string[], dropped: number[], overflow: number[], closed: () => number }> {
  const client = createRedisClient({ url: redis.url })
  await whenReady(client)
  const debtErrors: string[] = []
  const dropped: number[] = []
  const overflow: number[] = []
  let closings = 0
  const guard = new RedisGuard({
    store: createRedisStore({ client }),
    fallbackMaxKeys,
    // the partition is a disconnect, not a slow call: a timeout on a loaded CI machine would add
    // fallback decisions of its own to the sequences these tests count
    timeoutMs: 2000,
    instances: () => instances,
    telemetry: NOOP_TELEMETRY,
    onStateChange: (state) => { if (state === 'closed') closings++ },
    ping: async () => await client.ping(),
    onDebtError: (err) => { debtErrors.push((err as Error).message) },
    onDebtDropped: (keys) => { dropped.push(keys) },
    onDebtOverflow: (admissions) => { overflow.push(admissions) }
  })
  // reconnected -> probe at once
  client.on('ready', () => guard.probeNow())
  t.teardown(() => {
    guard.close()
    client.disconnect()
  })
  return { client, guard, debtErrors, dropped, overflow, closed: () => closings }
}

/** Cuts this client off (nothing it sends reaches Redis); Redis keeps its data. */
async function partition (client: ReturnType<typeof createRedisClient>): Promise<void> {
  const ended = new Promise((resolve) => client.once('end', resolve))
  client.disconnect(false)
  await ended
}

// Redis refuses every write (maxmemory 1, noeviction) but answers PING: the breaker closes on the
// probe, the outage ends, and its write-back fails.
async function refuseWrites (t: Test): Promise<void> {
  await plain.config('SET', 'maxmemory', '1')
  t.teardown(async () => { await plain.config('SET', 'maxmemory', '0') })
}

/** Decides `check` one request at a time; `levels` holds where each admission was decided. */
function admissions (guard: RedisGuard, check: LimitCheck): { one: () => Promise<void>, levels: Array<'redis' | 'fallback'> } {
  const levels: Array<'redis' | 'fallback'> = []
  const one = async (): Promise<void> => {
    const g = await guard.decide([check], LOCAL, 'r')
    if (g.decision.allowed) levels.push(g.level)
  }
  return { one, levels }
}

t.test('a partition: the fallback starts from Redis\'s remaining and its admissions are charged back, so the window admits exactly the limit', async t => {
  for (const algorithm of ['sliding-window-log', 'fixed-window', 'sliding-window', 'token-bucket', 'gcra', 'leaky-bucket'] as const) {
    // Two instances share the budget; only this one is running, the other is counted.
    const { client, guard, debtErrors } = await guardedClient(t, 2)
    const check = { key: `debt-${algorithm}`, spec: spec(algorithm, 20, 600_000), cost: 1 }
    // fixed and sliding windows of 10 min are aligned on the epoch: the whole partition and
    // recovery in one window, or the budget would start afresh mid-count
    await awayFromWindowEdge(600_000, 30_000)
    const { one, levels } = admissions(guard, check)
    for (let i = 0; i < 15; i++) await one()
    t.equal(levels.length, 15, `${algorithm}: 15 admitted by Redis`)
    await partition(client)
    for (let i = 0; i < 10; i++) await one()
    // 5 left, shared by 2 instances: this one's share is 2.5, i.e. 2 whole requests.
    t.equal(levels.filter((l) => l === 'fallback').length, 2, `${algorithm}: the fallback admitted this instance's share of the 5 Redis had left (not a new budget of 10)`)
    await client.connect()
    await whenReady(client)
    // Redis back: the first answer (a request's, or the probe's PING) ends the outage and writes the debt of 2.
    for (let i = 0; i < 10; i++) {
      await one()
      await sleep(20)
    }
    t.same(debtErrors, [])
    t.equal(levels.length, 20, `${algorithm} (${levels.join(',')}): 15 + 2 (fallback) + 3 after recovery = the limit exactly (without the debt: 22)`)
  }
})

t.test('a write-back that fails (Redis refuses writes right after it answers again) is kept and written with a later answer: the window admits exactly the limit', async t => {
  // Not sliding-window-log: its charge trims the log first, and Redis lets a script that has
  // written once (a trim frees memory, so maxmemory allows it) write on past maxmemory.
  for (const algorithm of ['fixed-window', 'token-bucket', 'gcra'] as const) {
    const { client, guard, debtErrors, dropped } = await guardedClient(t, 2)
    const check = { key: `debt-retry-${algorithm}`, spec: spec(algorithm, 20, 600_000), cost: 1 }
    await awayFromWindowEdge(600_000, 30_000)
    const { one, levels } = admissions(guard, check)
    for (let i = 0; i < 15; i++) await one()
    await partition(client)
    for (let i = 0; i < 10; i++) await one()
    t.equal(levels.filter((l) => l === 'fallback').length, 2, `${algorithm}: the fallback admitted this instance's share of the 5 left`)
    await refuseWrites(t)
    await client.connect()
    await eventually(t, () => debtErrors.length > 0, 'the failed write-back')
    t.match(debtErrors[0], /OOM/, `${algorithm}: the write-back was refused`)
    t.equal(guard.breaker, 'closed', `${algorithm}: back on Redis (the PING answered)`)
    await plain.config('SET', 'maxmemory', '0')
    // past the retry's back-off (250 ms after the failure), so the first answer retries it
    await sleep(400)
    for (let i = 0; i < 10; i++) {
      await one()
      await sleep(20)
    }
    t.equal(debtErrors.length, 1, `${algorithm}: one failed write-back, and its retry did not fail`)
    t.same(dropped, [], `${algorithm}: nothing dropped`)
    t.equal(levels.length, 20, `${algorithm} (${levels.join(',')}): 15 + 2 (fallback) + 3 = the limit exactly (with the debt lost: 22)`)
  }
})

t.test('a write-back is written in pieces, and only a piece that failed is retried: the pieces Redis took are not charged twice', async t => {
  const { client, guard, debtErrors } = await guardedClient(t, 1, 1000)
  const s = spec('fixed-window', 20, 600_000)
  await awayFromWindowEdge(600_000, 60_000)
  const keys = Array.from({ length: 300 }, (_, i) => `piece-${i}`)
  await partition(client)
  for (const key of keys) await guard.decide([{ key, spec: s, cost: 1 }], LOCAL, 'f')
  // The second piece's first key holds a list: that piece (pieces hold 256 keys) fails with
  // WRONGTYPE before it writes anything, the first piece lands.
  await plain.rpush('piece-256', 'x')
  await client.connect()
  await eventually(t, () => debtErrors.length > 0, 'the failed piece')
  t.match(debtErrors[0], /WRONGTYPE/, 'the second piece failed')
  await plain.del('piece-256')
  await sleep(400)
  // any answer from Redis retries what is owed
  await guard.decide([{ key: 'piece-trigger', spec: s, cost: 1 }], LOCAL, 'r')
  const deadline = Date.now() + 10_000
  while (await plain.hget('piece-299', 'c') === null && Date.now() < deadline) await sleep(20)
  const counts = await Promise.all(keys.map(async (key) => await plain.hget(key, 'c')))
  t.same(counts, keys.map(() => '1'), 'each of the 300 keys charged its debt of 1 once (retrying both pieces charged the first 256 twice)')
  t.equal(debtErrors.length, 1, 'one failed write-back, and its retry did not fail')
})

t.test('an admin reset drops a debt waiting for its retry: the fresh budget is not spent again once Redis takes writes', async t => {
  const { client, guard, debtErrors } = await guardedClient(t, 1)
  const check = { key: 'debt-reset', spec: spec('fixed-window', 20, 600_000), cost: 1 }
  await awayFromWindowEdge(600_000, 30_000)
  await partition(client)
  for (let i = 0; i < 5; i++) await guard.decide([check], LOCAL, 'f')
  await refuseWrites(t)
  await client.connect()
  await eventually(t, () => debtErrors.length > 0, 'the failed write-back')
  await plain.config('SET', 'maxmemory', '0')
  // DELETE /limits: Redis's key and everything the guard holds for it
  await plain.del(check.key)
  guard.forgetFallback([check.key])
  await sleep(400)
  let admitted = 0
  for (let i = 0; i < 25; i++) if ((await guard.decide([check], LOCAL, 'r')).decision.allowed) admitted++
  t.equal(admitted, 20, 'the reset key admits its whole limit (with the debt of 5 retried: 15)')
})

t.test('a reload during a partition (the same limits compiled again) keeps the outage\'s debt and what Redis last said was left: the window admits exactly the limit', async t => {
  const { client, guard, debtErrors } = await guardedClient(t, 2)
  const rule = { algorithm: 'fixed-window' as const, limit: 20, windowMs: 600_000, burst: 20, maxDelayMs: 0 }
  // what a reload does: the unchanged limit compiled again, a new object with the same id
  const before = compileLimitSpec('reload', 'user', rule)
  const after = compileLimitSpec('reload', 'user', rule)
  t.not(before, after)
  await awayFromWindowEdge(600_000, 30_000)
  // owed: admitted by the fallback both before and after the reload
  const owed = admissions(guard, { key: 'reload-owed', spec: before, cost: 1 })
  const owedAfter = admissions(guard, { key: 'reload-owed', spec: after, cost: 1 })
  // seeded: first met by the fallback after the reload
  const seeded = admissions(guard, { key: 'reload-seeded', spec: before, cost: 1 })
  const seededAfter = admissions(guard, { key: 'reload-seeded', spec: after, cost: 1 })
  for (let i = 0; i < 10; i++) {
    await owed.one()
    await seeded.one()
  }
  await partition(client)
  // 10 left, shared by 2 instances: this one's share is 5 of each key
  for (let i = 0; i < 2; i++) await owed.one()
  for (let i = 0; i < 10; i++) {
    await owedAfter.one()
    await seededAfter.one()
  }
  t.equal(owed.levels.length - 10 + owedAfter.levels.length, 5, 'reload-owed: the fallback admitted this instance\'s share of the 10 left, across the reload')
  t.equal(seededAfter.levels.length, 5, 'reload-seeded: the fallback started from what Redis said was left (a new budget: 10)')
  await client.connect()
  await whenReady(client)
  for (let i = 0; i < 10; i++) {
    await owedAfter.one()
    await seededAfter.one()
    await sleep(20)
  }
  t.same(debtErrors, [])
  t.equal(owed.levels.length + owedAfter.levels.length, 20, 'reload-owed: 10 + 5 (fallback, 2 of them before the reload) + 5 after recovery = the limit (the debt before the reload lost: 22)')
  t.equal(seeded.levels.length + seededAfter.levels.length, 20, 'reload-seeded: 10 + 5 + 5 = the limit')
})

t.test('debts waiting for a retry are held for at most fallbackMaxKeys keys: a failed write-back beyond that is dropped and reported', async t => {
  const { client, guard, debtErrors, dropped } = await guardedClient(t, 1, 2)
  const s = spec('fixed-window', 20, 600_000)
  await refuseWrites(t)
  // Cut off, decided by the fallback (three failures open the breaker, whose PING probe then
  // ends the outage once reconnected), and written back in vain: Redis still refuses writes.
  const outage = async (keys: string[]): Promise<void> => {
    const failures = debtErrors.length
    await partition(client)
    for (const key of keys) await guard.decide([{ key, spec: s, cost: 1 }], LOCAL, 'f')
    await client.connect()
    await eventually(t, () => debtErrors.length > failures, 'the failed write-back')
  }
  await outage(['bound-a', 'bound-b', 'bound-a'])
  t.same(dropped, [], 'two keys owed: both kept')
  await outage(['bound-c', 'bound-c', 'bound-c'])
  t.same(dropped, [1], 'a third key owed: dropped and reported')
})

t.test('an outage owing more keys than fallbackMaxKeys reports the admissions it could not record, once, when it ends', async t => {
  const { client, guard, debtErrors, overflow } = await guardedClient(t, 1, 2)
  const s = spec('fixed-window', 20, 600_000)
  await awayFromWindowEdge(600_000, 30_000)
  await partition(client)
  for (const key of ['over-a', 'over-b', 'over-c', 'over-a', 'over-c', 'over-d']) {
    t.ok((await guard.decide([{ key, spec: s, cost: 1 }], LOCAL, 'f')).decision.allowed, `${key} admitted by the fallback`)
  }
  t.same(overflow, [], 'nothing reported while the outage lasts')
  await client.connect()
  await eventually(t, () => overflow.length > 0, 'the overflow report')
  t.same(overflow, [3], 'over-c twice and over-d: 3 admissions beyond the 2 keys held')
  // the write-back goes on the guard's connection: wait for it to land
  const deadline = Date.now() + 10_000
  while (await plain.hget('over-b', 'c') === null && Date.now() < deadline) await sleep(20)
  t.same(await Promise.all(['over-a', 'over-b', 'over-c'].map(async (k) => await plain.hget(k, 'c'))), ['2', '1', null], 'the 2 keys held were written back, the others not')
  t.same(debtErrors, [])
})

t.test('Redis refusing the scripts while PING answers (outages that end and start again): a key Redis never answered for gets one share in all, not one per outage', async t => {
  const { guard, closed } = await guardedClient(t, 2)
  const check = { key: 'flap-new', spec: spec('fixed-window', 20, 600_000), cost: 1 }
  await awayFromWindowEdge(600_000, 30_000)
  await refuseWrites(t)
  const { one, levels } = admissions(guard, check)
  // each script call fails (OOM) and is decided by the fallback; the probe's PING closes the
  // breaker every 250 ms or so, ending the outage, and the next call starts another
  const until = Date.now() + 2000
  while (Date.now() < until) {
    await one()
    await sleep(10)
  }
  t.ok(closed() >= 3, `several outages ended (${closed()})`)
  t.equal(levels.length, 10, `this instance's share of 20 between 2 instances, across ${closed()} outages (a whole share per outage before)`)
})

t.test('the fallback reports each check\'s remaining at its index and in units of the whole limit: a quota\'s header beside a limit that fails open', async t => {
  const { client, guard } = await guardedClient(t, 2)
  const open = { key: 'rem-open', spec: spec('fixed-window', 50, 600_000), cost: 1 }
  const quota = { key: 'rem-quota', spec: spec('fixed-window', 100, 600_000), cost: 1 }
  await awayFromWindowEdge(600_000, 30_000)
  await partition(client)
  const g = await guard.decide([open, quota], [{ onError: 'allow' }, { onError: 'local' }], 'f')
  t.equal(g.level, 'fallback')
  t.ok(g.decision.allowed)
  // 2 instances: the fallback charged 2 of the quota's 100 (this instance's share is 50)
  t.same(g.decision.remainings, [-1, 49], 'the skipped limit has none, the quota 98 / 2')
})

t.test('a lease the fallback granted counts there until it is given back, across outages: one finishing in a later outage does not free a lease granted there', async t => {
  const { client, guard } = await guardedClient(t, 1)
  const lease = { key: 'lease-across', spec: spec('lease', 1, 10_000), cost: 1 }
  const take = async (): Promise<string> => {
    const g = await guard.decide([lease], LOCAL, 'l')
    return `${g.level} ${g.decision.allowed ? 'granted' : 'refused'}`
  }
  await partition(client)
  t.equal(await take(), 'fallback granted', 'outage 1: a lease of the cap of 1 (its request goes on)')
  await client.connect()
  await whenReady(client)
  // an answer from Redis ends the outage
  t.equal((await guard.decide([{ key: 'lease-other', spec: spec('fixed-window', 5, 600_000), cost: 1 }], LOCAL, 'r')).level, 'redis')
  await partition(client)
  t.equal(await take(), 'fallback refused', 'outage 2: the lease of outage 1 is still held (forgotten: granted, 2 held)')
  guard.releaseFallback(lease.key, 1)
  t.equal(await take(), 'fallback granted', 'outage 1\'s request finished: its lease is free again')
  t.equal(await take(), 'fallback refused', 'and that lease is held')
})

t.test('a debt whose window passed before Redis took it is dropped, not charged to a later window', async t => {
  const { client, guard, debtErrors, dropped } = await guardedClient(t, 1)
  const windowMs = 2000
  const check = { key: 'debt-expired', spec: spec('fixed-window', 20, windowMs), cost: 1 }
  await partition(client)
  let fallback = 0
  for (let i = 0; i < 5; i++) if ((await guard.decide([check], LOCAL, 'f')).decision.allowed) fallback++
  const lastFallback = Date.now()
  t.equal(fallback, 5, 'the fallback admitted 5 (a debt of 5)')
  await refuseWrites(t)
  await client.connect()
  await eventually(t, () => debtErrors.length > 0, 'the failed write-back')
  await plain.config('SET', 'maxmemory', '0')
  // a whole window after the debt's last unit, then a fresh window with room for 20 decisions
  await sleep(Math.max(0, lastFallback + windowMs + 100 - Date.now()))
  await awayFromWindowEdge(windowMs, 1500)
  let admitted = 0
  for (let i = 0; i < 25; i++) if ((await guard.decide([check], LOCAL, 'r')).decision.allowed) admitted++
  t.same(dropped, [1], 'the expired debt was reported dropped')
  t.equal(admitted, 20, 'a later window admits its whole limit (charged the stale debt: 15)')
})

t.test('regression item 5: the clock stepping back across a window boundary keeps the later window (fixed-window 5/s admitted 15)', async t => {
  const base = Math.floor(Date.now() / 1000) * 1_000_000 + 10 * 1_000_000
  for (const algorithm of ['fixed-window', 'sliding-window'] as const) {
    const s = spec(algorithm, 5, 1000)
    let now = base + 1000 // 1 ms into window k+1
    const client = createRedisClient({ url: redis.url })
    t.teardown(() => client.disconnect())
    await whenReady(client)
    const store = createRedisStore({ client, nowUs: () => now })
    const memory = createMemoryStore({ maxKeys: 10, now: () => now })
    for (const [name, decide] of [['redis', (id: string) => store.decide([{ key: `step-${algorithm}`, spec: s, cost: 1 }], id)], ['memory', async (id: string) => memory.decide([{ key: 'k', spec: s, cost: 1 }], id)]] as const) {
      now = base + 1000
      let admitted = 0
      for (let i = 0; i < 5; i++) if ((await decide(`a${i}`)).allowed) admitted++
      now = base - 2000 // the clock steps back 3 ms, into window k
      for (let i = 0; i < 5; i++) if ((await decide(`b${i}`)).allowed) admitted++
      now = base + 2000 // and forward again
      for (let i = 0; i < 5; i++) if ((await decide(`c${i}`)).allowed) admitted++
      t.equal(admitted, 5, `${algorithm} (${name}): 5 admitted over the step, not 15`)
    }
  }
})

t.test('regression item 6: a refund delivered twice (ioredis Cluster re-send) gives the budget back once', async t => {
  const s = '6,3,600000,3,1,0'
  const key = 'refund-twice'
  // a fixed window of 10 min, aligned on the epoch (its count is read below): not across a boundary
  await awayFromWindowEdge(600_000, 5000)
  const take = async (id: string): Promise<{ allowed: boolean, receipts: readonly number[] }> => {
    const r = parseLimitReply(await plain.eval(LIMIT_SCRIPT, 1, key, '0', id, s), 1)
    return { allowed: r.decision.allowed, receipts: r.receipts }
  }
  await take('a')
  await take('b')
  const c = await take('c')
  t.equal((await take('d')).allowed, false, 'the 3 units are spent')
  const marker = `gw:refund:{x}:c`
  const refund = (): Promise<unknown> => plain.eval(REFUND_SCRIPT, 2, key, marker, '0', 'c', s, String(c.receipts[0]))
  t.equal(await refund(), 1, 'first refund applied')
  t.equal(await refund(), 0, 'the same refund again is a no-op')
  t.equal(await plain.hget(key, 'c'), '2', 'one unit back, not two')
})

t.test('regression item 9: sliding-window-log limits above 10^4 are refused with the reason', async t => {
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  const store = createRedisStore({ client })
  await t.rejects(store.decide([{ key: 'big', spec: spec('sliding-window-log', 10_001, 1000), cost: 1 }], 'r'), /limit must be <= 10000 \(use sliding-window/)
})

t.test('heartbeat: a lower live count is believed only after it held one interval (a Redis restarted empty shows 1 at first)', async t => {
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  const hb = new InstanceHeartbeat(client, 'hb-test', 1000)
  hb.observe(3, 0)
  t.equal(hb.instances, 3)
  hb.observe(1, 100)
  t.equal(hb.instances, 3, 'a drop is not believed at once')
  hb.observe(1, 900)
  t.equal(hb.instances, 3, 'still within one interval')
  hb.observe(3, 1000)
  t.equal(hb.instances, 3, 'the others beat again: never dropped')
  hb.observe(2, 2000)
  hb.observe(2, 3000)
  t.equal(hb.instances, 2, 'an instance really gone: believed after one interval')
})

t.test('redis.expectedInstances floors the divisor of an instance that never saw the others', async t => {
  const dead = { kind: 'redis' as const, decide: async () => { throw new Error('Connection is closed.') }, close: async () => {} }
  const guard = new RedisGuard({ store: dead, fallbackMaxKeys: 10, timeoutMs: 100, instances: () => 1, expectedInstances: 4, telemetry: NOOP_TELEMETRY, onStateChange: () => {} })
  t.equal(guard.instances, 4)
  let admitted = 0
  // a token bucket (one token per 2 min of this quarter share), not a fixed window: a window aligned
  // on the epoch would start afresh if the clock crossed hh:m0:00 during the twenty
  for (let i = 0; i < 20; i++) if ((await guard.decide([{ key: 'k', spec: spec('token-bucket', 20, 600_000), cost: 1 }], LOCAL, 'r')).decision.allowed) admitted++
  t.equal(admitted, 5, 'a quarter of 20')
})

t.test('a store failing with something other than an Error is still a failure the fallback answers, and opens the breaker', async t => {
  const odd = { kind: 'redis' as const, decide: async () => await Promise.reject(undefined), close: async () => {} }
  const reasons: string[] = []
  const guard = new RedisGuard({ store: odd, fallbackMaxKeys: 10, timeoutMs: 100, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: (_state, reason) => { reasons.push(reason) } })
  t.teardown(() => guard.close())
  const levels: string[] = []
  for (let i = 0; i < 4; i++) levels.push((await guard.decide([{ key: 'odd', spec: spec('fixed-window', 20, 600_000), cost: 1 }], LOCAL, 'r')).level)
  t.same(levels, ['fallback', 'fallback', 'fallback', 'fallback'])
  t.equal(guard.breaker, 'open')
  t.same(reasons, ['Redis other: undefined'])
})
