// Zoned calendar quotas around DST changes and on :30 / :45 offsets, Redis and in process, on the
// stores' test clocks: an hour is a real hour (the repeated local 02:00 of an autumn change is a
// period of its own), a day on a DST day ends at the real next local midnight, and Retry-After
// runs to those instants.
import t, { type Test } from 'tap'
import { startRedis } from './helpers/redis.js'
import { parseConfigText } from '../src/config/load.js'
import { keyFor, type PlannedLimit } from '../src/limit/plan.js'
import { routeLimitPlan } from '../src/runtime.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { createMemoryStore } from '../src/limit/memory-store.js'
import { PERIOD_WINDOW_MS, zonedQuotaDelay, type QuotaPeriod } from '../src/limit/algorithms/calendar-quota.js'
import type { LimitCheck, LimitStore } from '../src/limit/types.js'

const redis = await startRedis(t)

/**
 * Both stores on one test clock; `quota(...)(iso)` sets the clock to `iso` and returns the check
 * as the gateway builds it then (the spec carries the zone's offsets in force at that instant).
 */
async function stores (t: Test, period: QuotaPeriod, zone: string): Promise<Array<{ name: string, store: LimitStore, at: (who: string) => (iso: string) => LimitCheck }>> {
  const redisClient = createRedisClient({ url: redis.url })
  t.teardown(() => redisClient.disconnect())
  await whenReady(redisClient, 5000)
  await redisClient.flushall()
  const loaded = parseConfigText(`identity: { header: x-user }
quotaTimezone: ${zone}
plans:
  p: { limits: { quota: { limit: 1, period: ${period} } } }
defaultPlan: p
upstreams:
  b: { targets: ["http://127.0.0.1:1"] }
routes:
  - { name: r, pathPrefix: /, upstream: b }
`, 'gateway.yaml')
  const planned = routeLimitPlan(loaded.config, loaded.config.routes[0] as never, 'p').all.find(l => l.dimension === 'quota') as PlannedLimit
  let now = 0
  const at = (who: string) => (iso: string): LimitCheck => {
    now = Date.parse(iso) * 1000
    const spec = { ...planned.spec, maxDelayMs: zonedQuotaDelay(zone, PERIOD_WINDOW_MS[period], Date.parse(iso)) }
    return { key: keyFor(planned.keyBase, who), spec, cost: planned.cost }
  }
  return [
    { name: 'redis', store: createRedisStore({ client: redisClient, nowUs: () => now }), at },
    { name: 'memory', store: createMemoryStore({ maxKeys: 100, now: () => now }), at }
  ]
}

/** One request at each instant, with the decision expected: admitted, or refused until `until`. */
async function walk (t: Test, period: QuotaPeriod, zone: string, steps: ReadonlyArray<readonly [string, string, string | true]>): Promise<void> {
  for (const { name, store, at } of await stores(t, period, zone)) {
    const check = at(`${name}-client`)
    for (const [iso, what, until] of steps) {
      const d = await store.decide([check(iso)], iso)
      if (until === true) {
        t.ok(d.allowed, `${name}: ${iso} (${what}) is admitted`)
      } else {
        t.notOk(d.allowed, `${name}: ${iso} (${what}) is refused`)
        t.equal(d.retryAfterMs, Date.parse(until) - Date.parse(iso), `${name}: Retry-After at ${iso} runs to ${until}`)
      }
    }
  }
}

t.test('Berlin autumn change: the repeated local 02:00 hour has a budget of its own, and each pass ends after 60 minutes', async t => {
  // 2026-10-25: 03:00 CEST (00:59:59 UTC) falls back to 02:00 CET (01:00 UTC)
  await walk(t, 'hour', 'Europe/Berlin', [
    ['2026-10-25T00:10:00Z', '02:10 CEST', true],
    ['2026-10-25T00:45:00Z', '02:45 CEST, the first pass', '2026-10-25T01:00:00Z'],
    ['2026-10-25T01:10:00Z', '02:10 CET, the second pass', true],
    ['2026-10-25T01:50:00Z', '02:50 CET', '2026-10-25T02:00:00Z'],
    ['2026-10-25T02:00:00Z', '03:00 CET', true]
  ])
})

t.test('Berlin spring change: the hour before the skipped one ends at 03:00 CEST, the next hour starts there', async t => {
  // 2026-03-29: 02:00 CET (01:00 UTC) jumps to 03:00 CEST
  await walk(t, 'hour', 'Europe/Berlin', [
    ['2026-03-29T00:10:00Z', '01:10 CET', true],
    ['2026-03-29T00:50:00Z', '01:50 CET', '2026-03-29T01:00:00Z'],
    ['2026-03-29T01:00:00Z', '03:00 CEST', true],
    ['2026-03-29T01:59:00Z', '03:59 CEST', '2026-03-29T02:00:00Z']
  ])
})

t.test('Berlin DST days: a 25 h and a 23 h day end at the real next local midnight', async t => {
  await walk(t, 'day', 'Europe/Berlin', [
    ['2026-10-24T22:30:00Z', 'October 25th, 00:30 CEST', true],
    ['2026-10-25T12:00:00Z', 'October 25th, 13:00 CET', '2026-10-25T23:00:00Z'],
    ['2026-10-25T22:59:59Z', 'October 25th, 23:59:59 CET', '2026-10-25T23:00:00Z'],
    ['2026-10-25T23:00:00Z', 'October 26th, 00:00 CET', true]
  ])
  await walk(t, 'day', 'Europe/Berlin', [
    ['2026-03-28T23:30:00Z', 'March 29th, 00:30 CET', true],
    ['2026-03-29T12:00:00Z', 'March 29th, 14:00 CEST', '2026-03-29T22:00:00Z'],
    ['2026-03-29T22:00:00Z', 'March 30th, 00:00 CEST', true]
  ])
})

t.test('Kolkata (+05:30) and Kathmandu (+05:45): hours run from local :00, 30 and 15 minutes past the UTC hour', async t => {
  await walk(t, 'hour', 'Asia/Kolkata', [
    ['2026-07-01T04:40:00Z', '10:10 IST', true],
    ['2026-07-01T05:29:00Z', '10:59 IST', '2026-07-01T05:30:00Z'],
    ['2026-07-01T05:30:00Z', '11:00 IST', true]
  ])
  await walk(t, 'hour', 'Asia/Kathmandu', [
    ['2026-07-01T04:20:00Z', '10:05 NPT', true],
    ['2026-07-01T05:14:00Z', '10:59 NPT', '2026-07-01T05:15:00Z'],
    ['2026-07-01T05:15:00Z', '11:00 NPT', true]
  ])
})

t.test('a zoned hour stored the old way (its local start) does not hold a client east of UTC for hours', async t => {
  // Before 2026-11-27 a zoned hour's key held the hour's local start. Tokyo is 9 h ahead of UTC,
  // so read as a Unix start it lies 9 h ahead: the store took that for a clock stepped back and
  // kept the client to that hour, refused until 10 h later, after the upgrade.
  const [redisStore] = await stores(t, 'hour', 'Asia/Tokyo')
  const { store, at } = redisStore as { store: LimitStore, at: (who: string) => (iso: string) => LimitCheck }
  const check = at('upgraded-client')
  const first = check('2026-07-01T03:10:00Z')
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client, 5000)
  // 12:00 JST, as the old script stored it: the local start in seconds, the hour's one unit spent
  const oldLocalStart = Date.parse('2026-07-01T03:00:00Z') / 1000 + 9 * 3600
  await client.hset(first.key, 'w', String(oldLocalStart), 'c', '1')
  await client.pexpire(first.key, 3_600_000)
  const d = await store.decide([first], 'upgrade')
  t.ok(d.allowed, 'the hour is counted again from its start in Unix seconds: admitted')
  const next = await store.decide([check('2026-07-01T03:20:00Z')], 'after')
  t.notOk(next.allowed, 'the new count holds: the second request of the hour is refused')
  t.equal(next.retryAfterMs, Date.parse('2026-07-01T04:00:00Z') - Date.parse('2026-07-01T03:20:00Z'), 'until 13:00 JST, not 10 h later')
})
