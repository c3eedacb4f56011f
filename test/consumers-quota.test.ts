// Quotas (issue 9): exact under concurrency across two gateway instances sharing Redis and in
// process; calendar periods in UTC, rolled over at the boundary (the stores' test-only clock
// override drives the time); the Lua script and its TypeScript twin agree.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { burst, send, statusCounts } from './helpers/ratelimit.js'
import { parseConfigText } from '../src/config/load.js'
import { keyFor, type PlannedLimit } from '../src/limit/plan.js'
import { routeLimitPlan } from '../src/runtime.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { createMemoryStore } from '../src/limit/memory-store.js'
import { calendarPeriod, PERIOD_WINDOW_MS, quotaEndOffsetSeconds, quotaOffsetSeconds, utcOffsetMinutes, zonedQuotaDelay, type QuotaPeriod } from '../src/limit/algorithms/calendar-quota.js'
import type { LimitCheck, LimitStore } from '../src/limit/types.js'
import type { Teardown } from './helpers/teardown.js'
import { prng } from './helpers/prng.js'
import { awayFromQuotaEdge } from './helpers/window-edge.js'

const redis = await startRedis(t)
const client = redis.client()

function config (upstream: string, store: string): string {
  return `listen: "127.0.0.1:0"
admin: 127.0.0.1:0
${store}
identity:
  apiKeys: { header: x-api-key, keys: { k-1: acme } }
consumers:
  acme: { plan: metered }
plans:
  metered:
    limits:
      user: { algorithm: token-bucket, limit: 100000, window: 1s }
      quota: { limit: 50, period: day }
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
}

t.test('quota exactness: 200 concurrent requests across 2 instances admit exactly the quota', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const yaml = config(up.url, `redis: { url: ${redis.url}, timeout: 5s, onError: deny }`)
  const a = await startGateway(t, yaml)
  const b = await startGateway(t, yaml)
  // the daily quota is a calendar day in UTC: a burst across midnight would count in two days
  await awayFromQuotaEdge('day', 30_000)
  // one fresh connection per request, all at once, alternating between the two instances
  const all = await Promise.all(Array.from({ length: 200 }, (_, i) => send(`${(i % 2 === 0 ? a : b).url}/x`, { headers: { 'x-api-key': 'k-1' } })))
  t.same(statusCounts(all), { 200: 50, 429: 150 }, 'exactly 50 admitted')
  t.equal(up.requests, 50, 'the upstream saw exactly the quota')
  t.equal(await client.hget('gw:quota.day:acme', 'c'), '50', 'Redis counted exactly the admitted ones')
  const fromA = all.filter((r, i) => i % 2 === 0 && r.status === 200).length
  t.ok(fromA > 0 && fromA < 50, `both instances admitted some (${fromA} / ${50 - fromA})`)
  t.ok(all.filter(r => r.status === 429).every(r => r.json?.limit === 'metered:quota'), 'every rejection names the quota')
})

t.test('quota exactness in process (no Redis): 200 concurrent requests, exactly the quota', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, ''))
  await awayFromQuotaEdge('day', 30_000) // not across midnight UTC, as above
  const all = await burst(200, `${gw.url}/x`, { headers: { 'x-api-key': 'k-1' } })
  t.same(statusCounts(all), { 200: 50, 429: 150 })
  t.equal(up.requests, 50)
})

/** The quota check of consumer `who` compiled from a real config, for `period`. */
function quotaCheck (period: QuotaPeriod, limit: number, who: string, zone?: string): { check: LimitCheck, planned: PlannedLimit } {
  const loaded = parseConfigText(`identity: { header: x-user }${zone === undefined ? '' : `\nquotaTimezone: ${zone}`}
plans:
  p: { limits: { quota: { limit: ${limit}, period: ${period} } } }
defaultPlan: p
upstreams:
  b: { targets: ["http://127.0.0.1:1"] }
routes:
  - { name: r, pathPrefix: /, upstream: b }
`, 'gateway.yaml')
  const plan = routeLimitPlan(loaded.config, loaded.config.routes[0] as never, 'p')
  const planned = plan.all.find(l => l.dimension === 'quota') as PlannedLimit
  return { check: { key: keyFor(planned.keyBase, who), spec: planned.spec, cost: planned.cost }, planned }
}

const us = (iso: string): number => Date.parse(iso) * 1000

t.test('quota rollover at calendar boundaries in UTC, Redis and in process, on the test clock', async t => {
  await client.flushall()
  const redisClient = createRedisClient({ url: redis.url })
  t.teardown(() => redisClient.disconnect())
  await whenReady(redisClient, 5000)
  let now = 0
  const stores: Array<[string, LimitStore]> = [
    ['redis', createRedisStore({ client: redisClient, nowUs: () => now })],
    ['memory', createMemoryStore({ maxKeys: 100, now: () => now })]
  ]
  const cases: Array<[QuotaPeriod, string, string]> = [
    ['hour', '2026-03-29T00:59:59.500Z', '2026-03-29T01:00:00.000Z'],
    ['day', '2026-02-28T23:59:59.999Z', '2026-03-01T00:00:00.000Z'],
    ['week', '2026-11-29T23:59:59.000Z', '2026-11-30T00:00:00.000Z'], // Sunday -> Monday
    ['month', '2024-02-29T23:59:59.000Z', '2024-03-01T00:00:00.000Z'], // leap year
    ['month', '2026-12-31T23:59:59.000Z', '2027-01-01T00:00:00.000Z']
  ]
  for (const [name, store] of stores) {
    for (const [period, before, after] of cases) {
      const { check } = quotaCheck(period, 2, `${name}-${period}-${before}`)
      now = us(before)
      const d1 = await store.decide([check], 'r1')
      const d2 = await store.decide([check], 'r2')
      const d3 = await store.decide([check], 'r3')
      t.same([d1.allowed, d2.allowed, d3.allowed], [true, true, false], `${name} ${period}: 2 then rejected at ${before}`)
      t.equal(d3.retryAfterMs, Math.max(1, Math.ceil((us(after) - now) / 1000)), `${name} ${period}: Retry-After runs to ${after}`)
      now = us(after) - 1
      t.notOk((await store.decide([check], 'r4')).allowed, `${name} ${period}: still rejected 1 µs before the boundary`)
      now = us(after)
      const fresh = await store.decide([check], 'r5')
      t.ok(fresh.allowed, `${name} ${period}: a new quota at ${after}`)
      t.equal(fresh.remaining, 1, `${name} ${period}: the new period counts from 0`)
    }
  }
})

t.test('calendarPeriod agrees with Date for random instants (hour, day, ISO week, month)', async t => {
  const rand = prng(9)
  let checked = 0
  for (let i = 0; i < 2000; i++) {
    const ms = Math.floor(rand() * Date.UTC(2200, 0, 1))
    const d = new Date(ms)
    const y = d.getUTCFullYear()
    const m = d.getUTCMonth()
    const day = d.getUTCDate()
    const expected: Record<QuotaPeriod, [number, number]> = {
      hour: [Date.UTC(y, m, day, d.getUTCHours()), Date.UTC(y, m, day, d.getUTCHours() + 1)],
      day: [Date.UTC(y, m, day), Date.UTC(y, m, day + 1)],
      week: [Date.UTC(y, m, day - (d.getUTCDay() + 6) % 7), Date.UTC(y, m, day - (d.getUTCDay() + 6) % 7 + 7)],
      month: [Date.UTC(y, m, 1), Date.UTC(y, m + 1, 1)]
    }
    for (const period of Object.keys(PERIOD_WINDOW_MS) as QuotaPeriod[]) {
      const got = calendarPeriod(PERIOD_WINDOW_MS[period], ms * 1000 + 123)
      if (got.start * 1000 !== expected[period][0] || got.end * 1000 !== expected[period][1]) {
        t.fail(`${period} of ${d.toISOString()}: got ${new Date(got.start * 1000).toISOString()}..${new Date(got.end * 1000).toISOString()}`)
      }
      checked++
    }
  }
  t.equal(checked, 8000, 'every instant and period matched Date')
})

t.test('lua/calendar-quota.lua and its TypeScript twin decide identically on random instants', async t => {
  await client.flushall()
  const redisClient = createRedisClient({ url: redis.url })
  t.teardown(() => redisClient.disconnect())
  await whenReady(redisClient, 5000)
  let now = 0
  const lua = createRedisStore({ client: redisClient, nowUs: () => now })
  const twin = createMemoryStore({ maxKeys: 1000, now: () => now })
  const rand = prng(21)
  let compared = 0
  for (const period of Object.keys(PERIOD_WINDOW_MS) as QuotaPeriod[]) {
    const { check } = quotaCheck(period, 3, `parity-${period}`)
    now = Math.floor(rand() * Date.UTC(2100, 0, 1)) * 1000
    for (let i = 0; i < 60; i++) {
      // steps of up to a fifth of the period: every decision kind, and rollovers, come up
      now += Math.floor(rand() * PERIOD_WINDOW_MS[period] * 200)
      const a = await lua.decide([check], `p${i}`)
      const b = twin.decide([check], `p${i}`)
      t.same(a, b, `${period} step ${i}`, { diagnostic: false })
      compared++
    }
  }
  t.equal(compared, 240)
})

t.test('quotaTimezone: offsets follow the zone, including DST', async t => {
  t.equal(utcOffsetMinutes('Europe/Berlin', Date.parse('2026-01-15T12:00:00Z')), 60)
  t.equal(utcOffsetMinutes('Europe/Berlin', Date.parse('2026-03-29T00:59:59.999Z')), 60, 'just before the switch to summer time')
  t.equal(utcOffsetMinutes('Europe/Berlin', Date.parse('2026-03-29T01:00:00Z')), 120, 'at the switch')
  t.equal(utcOffsetMinutes('America/New_York', Date.parse('2026-07-01T00:00:00Z')), -240)
  t.equal(utcOffsetMinutes('Pacific/Kiritimati', Date.parse('2026-07-01T00:00:00Z')), 840)
  const { planned } = quotaCheck('day', 2, 'x', 'Europe/Berlin')
  t.equal(quotaOffsetSeconds(planned.spec.maxDelayMs), utcOffsetMinutes('Europe/Berlin', Date.now()) * 60, 'a compiled quota carries the zone\'s current offset')
  // and the offset at its period's end: a March seen on CET ends on CEST
  const march = zonedQuotaDelay('Europe/Berlin', PERIOD_WINDOW_MS.month, Date.parse('2026-03-15T12:00:00Z'))
  t.same([quotaOffsetSeconds(march), quotaEndOffsetSeconds(march)], [3600, 7200], 'mid-March in Berlin: +1 h now, +2 h when the month ends')
  const october = zonedQuotaDelay('Europe/Berlin', PERIOD_WINDOW_MS.month, Date.parse('2026-10-10T12:00:00Z'))
  t.same([quotaOffsetSeconds(october), quotaEndOffsetSeconds(october)], [7200, 3600], 'October: +2 h now, +1 h when it ends')
  t.equal(planned.spec.id, 'quota.day.Europe/Berlin', 'zoned periods have keys of their own')
})

/**
 * Both stores on a test clock, and a Berlin month quota's check as the gateway builds it at each
 * instant (`at` sets the clock and the spec carries the offsets in force then).
 */
async function berlinMonthStores (t: Teardown): Promise<Array<{ name: string, store: LimitStore, quota: (limit: number, who: string) => (iso: string) => LimitCheck }>> {
  await client.flushall()
  const redisClient = createRedisClient({ url: redis.url })
  t.teardown(() => redisClient.disconnect())
  await whenReady(redisClient, 5000)
  let now = 0
  const quota = (limit: number, who: string) => {
    const { check, planned } = quotaCheck('month', limit, who, 'Europe/Berlin')
    return (iso: string): LimitCheck => {
      now = us(iso)
      return { ...check, spec: { ...planned.spec, maxDelayMs: zonedQuotaDelay('Europe/Berlin', PERIOD_WINDOW_MS.month, Date.parse(iso)) } }
    }
  }
  return [
    { name: 'redis', store: createRedisStore({ client: redisClient, nowUs: () => now }), quota },
    { name: 'memory', store: createMemoryStore({ maxKeys: 100, now: () => now }), quota }
  ]
}

t.test('quotaTimezone: a Berlin month keeps its count across the DST change and rolls over at local midnight, Redis and in process', async t => {
  for (const { name, store, quota } of await berlinMonthStores(t)) {
    const at = quota(2, `berlin-${name}`)
    t.ok((await store.decide([at('2026-02-28T23:30:00Z')], 'a')).allowed, `${name}: 00:30 on March 1st in Berlin is March`)
    const second = await store.decide([at('2026-03-30T12:00:00Z')], 'b')
    t.same([second.allowed, second.remaining], [true, 0], `${name}: after the switch to summer time, the same month: the count carries on`)
    const third = await store.decide([at('2026-03-31T21:59:59Z')], 'c')
    t.notOk(third.allowed, `${name}: still March in Berlin`)
    t.equal(third.retryAfterMs, 1000, `${name}: Retry-After runs to April 1st, 00:00 in Berlin (22:00 UTC)`)
    t.ok((await store.decide([at('2026-03-31T22:00:00Z')], 'd')).allowed, `${name}: April in Berlin: a new quota`)
  }
})

t.test('quotaTimezone: a month refused before a DST change waits until the local midnight after it, Redis and in process', async t => {
  for (const { name, store, quota } of await berlinMonthStores(t)) {
    for (const [month, used, refused, localMidnightUtc] of [
      ['March', '2026-03-02T12:00:00Z', '2026-03-15T12:00:00Z', '2026-03-31T22:00:00Z'],
      ['October', '2026-10-02T12:00:00Z', '2026-10-10T12:00:00Z', '2026-10-31T23:00:00Z']
    ] as const) {
      const at = quota(1, `dst-${name}-${month}`)
      t.ok((await store.decide([at(used)], 'a')).allowed, `${name}: ${month}'s one request`)
      const over = await store.decide([at(refused)], 'b')
      t.notOk(over.allowed)
      // an hour off before: the end was taken at the offset in force when the request came
      t.equal(over.retryAfterMs, Date.parse(localMidnightUtc) - Date.parse(refused), `${name}: ${month} ends at local midnight, ${localMidnightUtc}`)
    }
  }
})

t.test('quotaTimezone through HTTP: Retry-After runs to the zone\'s midnight; an unknown zone is a located error', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const yaml = config(up.url, `redis: { url: ${redis.url}, timeout: 5s, onError: deny }\nquotaTimezone: Pacific/Kiritimati`).replace('limit: 50, period: day', 'limit: 1, period: day')
  const gw = await startGateway(t, yaml)
  // the day at UTC+14 ends at 10:00 UTC: both requests and the expected wait in one local day
  await awayFromQuotaEdge('day', 30_000, 'Pacific/Kiritimati')
  t.equal((await send(`${gw.url}/x`, { headers: { 'x-api-key': 'k-1' } })).status, 200)
  const over = await send(`${gw.url}/x`, { headers: { 'x-api-key': 'k-1' } })
  t.equal(over.status, 429)
  const offset = 14 * 3600
  const nowS = Math.floor(Date.now() / 1000)
  const toLocalMidnight = 86400 - (nowS + offset) % 86400
  t.ok(Math.abs(Number(over.headers['retry-after']) - toLocalMidnight) <= 2, `Retry-After ${String(over.headers['retry-after'])} ~ ${toLocalMidnight} s to midnight at UTC+14`)
  t.throws(() => parseConfigText(yaml.replace('Pacific/Kiritimati', 'Mars/Olympus'), 'gateway.yaml'), { message: /^gateway\.yaml:\d+:16 quotaTimezone: unknown time zone "Mars\/Olympus"/ })
})
