// Unit tests of the in-process algorithm twins that test/limit-algorithms.test.ts does not reach
// without a server: the calendar arithmetic of calendar-quota, the lease count, and the limits of
// what validateLimitSpec and assertDecidable accept (each boundary on both sides). Written from the
// mutation run's survivors (docs/mutation.md).
import t from 'tap'
import { ALGORITHMS, MAX_EXACT, assertDecidable, msUp, validateLimitSpec, type AlgorithmState } from '../src/limit/algorithms/index.js'
import { PERIOD_WINDOW_MS, calendarPeriod, civilFromDays, daysFromCivil, localPeriod, quotaOffsetSeconds, utcOffsetMinutes } from '../src/limit/algorithms/calendar-quota.js'
import type { AlgorithmName, LimitSpec } from '../src/limit/types.js'

const DAY_MS = 86_400_000
const spec = (algorithm: AlgorithmName, over: Partial<LimitSpec> = {}): LimitSpec =>
  ({ id: 'unit', algorithm, limit: 10, windowMs: 1000, burst: 10, maxDelayMs: 0, ...over })

t.test('daysFromCivil and civilFromDays agree with Date for every day from 1600 to 2400', async t => {
  let wrong = ''
  let days = 0
  for (let d = Date.UTC(1600, 0, 1) / DAY_MS; d <= Date.UTC(2400, 11, 31) / DAY_MS; d++) {
    const date = new Date(d * DAY_MS)
    const civil = civilFromDays(d)
    const back = daysFromCivil(date.getUTCFullYear(), date.getUTCMonth() + 1, date.getUTCDate())
    if (wrong === '' && (civil.year !== date.getUTCFullYear() || civil.month !== date.getUTCMonth() + 1 || back !== d)) {
      wrong = `day ${d} (${date.toISOString()}): civilFromDays ${JSON.stringify(civil)}, daysFromCivil ${back}`
    }
    days++
  }
  t.equal(wrong, '', `${days} days checked`)
})

t.test('localPeriod: the hour, day, ISO week (from Monday) and month holding a second, before and after 1970', async t => {
  let wrong = ''
  let seconds = 0
  for (let s = Date.UTC(1960, 0, 1) / 1000; s < Date.UTC(2040, 0, 1) / 1000; s += 100_003) {
    const at = new Date(s * 1000)
    const y = at.getUTCFullYear()
    const m = at.getUTCMonth()
    const dayStart = Date.UTC(y, m, at.getUTCDate()) / 1000
    const monday = dayStart - ((at.getUTCDay() + 6) % 7) * 86_400
    const expected = {
      hour: { start: Date.UTC(y, m, at.getUTCDate(), at.getUTCHours()) / 1000, end: Date.UTC(y, m, at.getUTCDate(), at.getUTCHours() + 1) / 1000 },
      day: { start: dayStart, end: dayStart + 86_400 },
      week: { start: monday, end: monday + 7 * 86_400 },
      month: { start: Date.UTC(y, m, 1) / 1000, end: Date.UTC(y, m + 1, 1) / 1000 }
    }
    for (const period of ['hour', 'day', 'week', 'month'] as const) {
      const got = localPeriod(PERIOD_WINDOW_MS[period], s)
      if (wrong === '' && (got.start !== expected[period].start || got.end !== expected[period].end)) {
        wrong = `${period} of ${at.toISOString()}: ${JSON.stringify(got)}, expected ${JSON.stringify(expected[period])}`
      }
    }
    seconds++
  }
  t.equal(wrong, '', `${seconds} instants checked`)
  t.same(PERIOD_WINDOW_MS, { hour: 3_600_000, day: 86_400_000, week: 604_800_000, month: 2_678_400_000 }, 'each period is passed as its longest length')
})

t.test('the UTC offset a quota is counted in', async t => {
  t.equal(quotaOffsetSeconds(0), 0, '0: UTC')
  t.equal(quotaOffsetSeconds(1440), 0, '1440: an explicit +00:00')
  t.equal(quotaOffsetSeconds(1500), 3600, '+01:00')
  t.equal(quotaOffsetSeconds(1110), -19_800, '-05:30')
  // 2024-03-10 20:00 UTC is 2024-03-11 01:30 in UTC+05:30: that local day, in Unix seconds
  const now = Date.UTC(2024, 2, 10, 20) * 1000
  t.same(calendarPeriod(PERIOD_WINDOW_MS.day, now, 19_800), { start: Date.UTC(2024, 2, 11) / 1000 - 19_800, end: Date.UTC(2024, 2, 12) / 1000 - 19_800 })
  t.same(calendarPeriod(PERIOD_WINDOW_MS.day, now), { start: Date.UTC(2024, 2, 10) / 1000, end: Date.UTC(2024, 2, 11) / 1000 }, 'UTC by default')
  t.same(calendarPeriod(PERIOD_WINDOW_MS.hour, now + 999_999, -3600), { start: Date.UTC(2024, 2, 10, 20) / 1000, end: Date.UTC(2024, 2, 10, 21) / 1000 }, 'µs are floored to the second')
})

t.test('utcOffsetMinutes: IANA zones, daylight saving, and an unknown zone', async t => {
  const winter = Date.UTC(2024, 0, 15, 12)
  const summer = Date.UTC(2024, 6, 15, 12)
  t.equal(utcOffsetMinutes('UTC', winter), 0)
  t.equal(utcOffsetMinutes('Asia/Kolkata', winter + 999), 330, 'half-hour zone, ms within the second ignored')
  t.equal(utcOffsetMinutes('Asia/Kathmandu', summer), 345)
  t.equal(utcOffsetMinutes('America/New_York', winter), -300)
  t.equal(utcOffsetMinutes('America/New_York', summer), -240, 'the same zone again (cached), now in DST')
  t.equal(utcOffsetMinutes('Pacific/Kiritimati', Date.UTC(2024, 11, 31, 23, 59, 59)), 840, 'across a year boundary')
  t.throws(() => utcOffsetMinutes('Mars/Olympus_Mons', winter), RangeError)
})

t.test('calendar-quota: a count per period, reset at the period end, kept when the clock steps back', async t => {
  const quota = ALGORITHMS['calendar-quota']
  const day = spec('calendar-quota', { limit: 3, windowMs: PERIOD_WINDOW_MS.day, burst: 3 })
  const now = Date.UTC(2024, 0, 15, 10) * 1000
  const toEnd = Date.UTC(2024, 0, 16) * 1000 - now
  const first = quota.check(undefined, day, 1, now)
  t.match(first, { ok: true, remaining: 2, retryUs: 0, resetUs: toEnd, delayUs: 0 })
  t.same(first.commit(), { kind: 'calendar-quota', period: Date.UTC(2024, 0, 15) / 1000, count: 1 })
  const two = { kind: 'calendar-quota', period: Date.UTC(2024, 0, 15) / 1000, count: 2 } as const
  const last = quota.check(two, day, 1, now)
  t.match(last, { ok: true, remaining: 0 })
  t.same(last.commit(), { ...two, count: 3 })
  t.match(quota.check({ ...two, count: 3 }, day, 1, now), { ok: false, remaining: 0, retryUs: toEnd, resetUs: toEnd, delayUs: 0 })
  t.match(quota.check(two, day, 2, now), { ok: false, remaining: 1, retryUs: toEnd, resetUs: toEnd }, 'a cost of 2 with 1 left')
  t.match(quota.check(undefined, day, 3, now), { ok: true, remaining: 0 }, 'a cost of the whole limit fits an empty period')
  t.match(quota.check(undefined, day, 4, now), { ok: false, remaining: 3, retryUs: -1, resetUs: 0 }, 'a cost above the limit never fits')
  t.match(quota.check({ ...two, count: 1 }, day, 3, now), { ok: false, remaining: 2, retryUs: toEnd }, 'a cost of the whole limit fits the next period')
  t.match(quota.check({ kind: 'lease', held: 5 }, day, 1, now), { ok: true, remaining: 2 }, 'another algorithm\'s state counts as none')
  const tomorrow = now + DAY_MS * 1000
  t.match(quota.check({ ...two, count: 3 }, day, 1, tomorrow), { ok: true, remaining: 2, resetUs: toEnd }, 'a new day, a new count')
  // the clock stepped back an hour across midnight: the stored (later) day keeps counting
  const later = { kind: 'calendar-quota', period: Date.UTC(2024, 0, 16) / 1000, count: 2 } as const
  const stepped = Date.UTC(2024, 0, 15, 23, 30) * 1000
  const back = quota.check(later, day, 1, stepped)
  t.match(back, { ok: true, remaining: 0, resetUs: Date.UTC(2024, 0, 17) * 1000 - stepped })
  t.same(back.commit(), { ...later, count: 3 })
})

t.test('calendar-quota on a local clock: the month of UTC+01:00', async t => {
  const quota = ALGORITHMS['calendar-quota']
  const month = spec('calendar-quota', { limit: 5, windowMs: PERIOD_WINDOW_MS.month, burst: 5, maxDelayMs: 1500 })
  // 2024-01-31 23:30 UTC is already February 00:30 in UTC+01:00
  const now = Date.UTC(2024, 0, 31, 23, 30) * 1000
  const r = quota.check(undefined, month, 1, now)
  t.match(r, { ok: true, remaining: 4, resetUs: (Date.UTC(2024, 2, 1) / 1000 - 3600) * 1_000_000 - now })
  t.same(r.commit(), { kind: 'calendar-quota', period: Date.UTC(2024, 1, 1) / 1000, count: 1 })
})

t.test('lease: a count of leases held, released elsewhere', async t => {
  const lease = ALGORITHMS.lease
  const two = spec('lease', { limit: 2, burst: 2 })
  const first = lease.check(undefined, two, 1, 0)
  t.match(first, { ok: true, remaining: 2 ** 50, retryUs: 0, resetUs: 0, delayUs: 0 })
  t.same(first.commit(), { kind: 'lease', held: 1 })
  t.same(lease.check({ kind: 'lease', held: 1 }, two, 1, 0).commit(), { kind: 'lease', held: 2 })
  t.match(lease.check({ kind: 'gcra', tat: 99 }, two, 2, 0), { ok: true }, 'another algorithm\'s state counts as none')
  const full = lease.check({ kind: 'lease', held: 2 }, two, 1, 0)
  t.match(full, { ok: false, remaining: 0, retryUs: 1_000_000, resetUs: 1_000_000, delayUs: 0 })
  t.throws(() => full.commit(), { message: 'commit() called on a rejected evaluation' })
  t.match(lease.check({ kind: 'lease', held: 1 }, two, 2, 0), { ok: false, remaining: 1 }, 'a cost of 2 with 1 free')
  t.match(lease.check({ kind: 'lease', held: 3 }, two, 1, 0), { ok: false, remaining: 0 }, 'over-held (limit lowered by a reload): none left, not negative')
})

t.test('msUp: µs to whole ms as lua/common.lua rounds them', async t => {
  t.equal(msUp(-1500), 0, 'a past instant waits 0 ms')
  t.equal(msUp(0), 0)
  t.equal(msUp(1), 1, '1 µs waits 1 ms, never 0')
  t.equal(msUp(1000), 1)
  t.equal(msUp(1001), 2)
})

t.test('validateLimitSpec: every bound, on both sides', async t => {
  const ok = (s: LimitSpec, why: string): void => { t.equal(validateLimitSpec(s), undefined, why) }
  const bad = (s: LimitSpec, message: string | RegExp, why: string): void => { t.match(validateLimitSpec(s), message, why) }
  // windowMs * 1000 must stay <= 2^50
  ok(spec('fixed-window', { limit: 1, windowMs: Math.floor(MAX_EXACT / 1000) }), 'the longest window')
  bad(spec('fixed-window', { limit: 1, windowMs: Math.floor(MAX_EXACT / 1000) + 1 }), 'windowMs is too large', 'one ms longer')
  // gcra: at most one request per µs, and burst * ceil(windowUs / limit) <= 2^50 (1024 ms / 125 = 8192 = 2^13 µs)
  ok(spec('gcra', { limit: 1000, windowMs: 1 }), 'one per µs')
  bad(spec('gcra', { limit: 1001, windowMs: 1 }), /at most one request per µs/, 'more than one per µs')
  ok(spec('gcra', { limit: 125, windowMs: 1024, burst: 2 ** 37 }), 'burst * emission interval = 2^50')
  bad(spec('gcra', { limit: 125, windowMs: 1024, burst: 2 ** 37 + 1 }), 'burst * windowMs / limit is too large', 'one more')
  // buckets: burst * perToken <= 2^50 (perToken = 1024000 / gcd(1024000, 125) = 2^13)
  for (const algorithm of ['token-bucket', 'leaky-bucket'] as const) {
    ok(spec(algorithm, { limit: 125, windowMs: 1024, burst: 2 ** 37 }), `${algorithm}: burst * perToken = 2^50`)
    bad(spec(algorithm, { limit: 125, windowMs: 1024, burst: 2 ** 37 + 1 }), /^burst is too large for this rate/, `${algorithm}: one more`)
  }
  // maxDelayMs * 1000 * perUs <= 2^50; 2000 per ms: perUs = 2000 / gcd(1000, 2000) = 2
  ok(spec('leaky-bucket', { limit: 2000, windowMs: 1, burst: 1, maxDelayMs: 5e11 }), 'maxDelay 5e11 ms at 2 units/µs: 1e15 <= 2^50')
  bad(spec('leaky-bucket', { limit: 2000, windowMs: 1, burst: 1, maxDelayMs: 6e11 }), 'maxDelayMs is too large for this rate', '1.2e15 > 2^50')
  ok(spec('leaky-bucket', { limit: 10, windowMs: 1, burst: 1, maxDelayMs: 1e11 }), 'perUs is limit / gcd: 10 / 10 = 1, so 1e14 fits')
  // sliding-window: limit * windowMs <= 2^50
  ok(spec('sliding-window', { limit: 2 ** 25, windowMs: 2 ** 25, burst: 2 ** 25 }), 'limit * windowMs = 2^50')
  bad(spec('sliding-window', { limit: 2 ** 25 + 1, windowMs: 2 ** 25, burst: 2 ** 25 + 1 }), 'limit * windowMs is too large (> 2^50)', 'one more')
  ok(spec('sliding-window-log', { limit: 10_000, burst: 10_000 }), 'the largest log')
  bad(spec('sliding-window-log', { limit: 10_001, burst: 10_001 }), /limit must be <= 10000/, 'one more entry')
  for (const algorithm of ['fixed-window', 'lease', 'calendar-quota'] as const) {
    const windowMs = algorithm === 'calendar-quota' ? PERIOD_WINDOW_MS.day : 1000
    ok(spec(algorithm, { limit: MAX_EXACT, windowMs, burst: MAX_EXACT }), `${algorithm}: limit 2^50`)
    bad(spec(algorithm, { limit: MAX_EXACT + 1, windowMs, burst: MAX_EXACT + 1 }), 'limit is too large', `${algorithm}: 2^50 + 1`)
  }
  for (const period of Object.values(PERIOD_WINDOW_MS)) ok(spec('calendar-quota', { windowMs: period }), `calendar-quota of ${period} ms`)
  bad(spec('calendar-quota', { windowMs: PERIOD_WINDOW_MS.day + 1 }), /windowMs names its period/, 'not a period')
  ok(spec('calendar-quota', { windowMs: PERIOD_WINDOW_MS.day, maxDelayMs: 2880 }), 'UTC+24:00, the largest offset')
  bad(spec('calendar-quota', { windowMs: PERIOD_WINDOW_MS.day, maxDelayMs: 2881 }), /carries its UTC offset/, 'beyond it')
  ok(spec('calendar-quota', { windowMs: PERIOD_WINDOW_MS.day, maxDelayMs: 2880 + 4096 * 2880 }), 'two offsets: now and at the period\'s end')
  bad(spec('calendar-quota', { windowMs: PERIOD_WINDOW_MS.day, maxDelayMs: 1500 + 4096 * 2881 }), /carries its UTC offset/, 'the end\'s beyond it')
})

t.test('assertDecidable: a located RangeError for each check no store can decide', async t => {
  const good = spec('fixed-window')
  t.doesNotThrow(() => assertDecidable([{ key: 'a', spec: good, cost: MAX_EXACT }]), 'a cost of 2^50')
  t.throws(() => assertDecidable([{ key: 'a', spec: good, cost: MAX_EXACT + 1 }]), new RangeError(`limit unit: cost must be an integer >= 1, got ${MAX_EXACT + 1}`))
  t.throws(() => assertDecidable([{ key: 'a', spec: good, cost: 0 }]), new RangeError('limit unit: cost must be an integer >= 1, got 0'))
  t.throws(() => assertDecidable([{ key: 'a', spec: good, cost: 1.5 }]), new RangeError('limit unit: cost must be an integer >= 1, got 1.5'))
  t.throws(() => assertDecidable([{ key: 'a', spec: spec('fixed-window', { limit: 0 }), cost: 1 }]), new RangeError('limit unit: limit must be an integer >= 1'))
  t.throws(() => assertDecidable([{ key: 'a', spec: good, cost: 1 }, { key: 'b', spec: good, cost: 1 }, { key: 'a', spec: good, cost: 1 }]),
    new RangeError('duplicate limit key in one request: a'))
})

t.test('each twin is registered under its own name', async t => {
  for (const [name, twin] of Object.entries(ALGORITHMS)) t.equal(twin.name, name)
})

t.test('another algorithm\'s state counts as none (a route switched algorithm on reload)', async t => {
  const now = 5_250_000
  const foreign = { kind: 'lease', held: 7 } as const
  for (const name of ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window', 'sliding-window-log', 'fixed-window'] as const) {
    const s = spec(name, { limit: 10, windowMs: 1000, burst: 5 })
    const fresh = ALGORITHMS[name].check(undefined, s, 2, now)
    const other = ALGORITHMS[name].check(foreign, s, 2, now)
    t.same({ ...other, commit: null, state: other.commit() }, { ...fresh, commit: null, state: fresh.commit() }, name)
  }
})

// 3000 per second: one token is 1000 units and 3 units flow per µs, so every wait is rounded up
// from a third of a µs (a rate of 10 per second, 1 unit per µs, cannot tell * from /).
const THREE_PER_US = { limit: 3000, windowMs: 1000, burst: 5 }

t.test('token-bucket: exact refill, waits and stored tokens at 3 units per µs', async t => {
  const bucket = ALGORITHMS['token-bucket']
  const s = spec('token-bucket', THREE_PER_US)
  const now = 10_000_000
  const fresh = bucket.check(undefined, s, 1, now)
  t.match(fresh, { ok: true, remaining: 4, resetUs: 334 }, '1000 units back in ceil(1000 / 3) µs')
  t.same(fresh.commit(), { kind: 'token-bucket', tokens: 4000, ts: now })
  // exactly the refill time: full again, not one unit more
  t.same(bucket.check({ kind: 'token-bucket', tokens: 4000, ts: now - 334 }, s, 1, now).commit(), { kind: 'token-bucket', tokens: 4000, ts: now })
  t.same(bucket.check({ kind: 'token-bucket', tokens: 4000, ts: now - 500 }, s, 1, now).commit(), { kind: 'token-bucket', tokens: 4000, ts: now }, 'a refill never passes the capacity')
  // 100 µs refill 300 units: 4300, 700 short of full
  t.match(bucket.check({ kind: 'token-bucket', tokens: 4000, ts: now - 100 }, s, 5, now), { ok: false, remaining: 4, retryUs: 234, resetUs: 234 })
  // the clock stepped back 3 ms: no refill, and every wait starts where the stored clock is
  const back = bucket.check({ kind: 'token-bucket', tokens: 2000, ts: now + 3000 }, s, 1, now)
  t.match(back, { ok: true, remaining: 1, resetUs: 3000 + 1334 })
  t.same(back.commit(), { kind: 'token-bucket', tokens: 1000, ts: now + 3000 })
})

t.test('leaky-bucket: exact drain, waits, delays and stored water at 3 units per µs', async t => {
  const bucket = ALGORITHMS['leaky-bucket']
  const meter = spec('leaky-bucket', THREE_PER_US)
  const now = 10_000_000
  // 1000 units drain in exactly ceil(1000 / 3) = 334 µs: empty, not 2 units below empty
  t.same(bucket.check({ kind: 'leaky-bucket', water: 1000, ts: now - 334 }, meter, 1, now).commit(), { kind: 'leaky-bucket', water: 1000, ts: now })
  // 2000 - 300 = 1700 left after 100 µs
  const admitted = bucket.check({ kind: 'leaky-bucket', water: 2000, ts: now - 100 }, meter, 1, now)
  t.match(admitted, { ok: true, remaining: 2, resetUs: 900, delayUs: 0 })
  t.same(admitted.commit(), { kind: 'leaky-bucket', water: 2700, ts: now })
  t.match(bucket.check({ kind: 'leaky-bucket', water: 2000, ts: now - 100 }, meter, 4, now), { ok: false, remaining: 3, retryUs: 234, resetUs: 567 })
  // shaper: held ceil(2000 / 3) µs for its slot, within maxDelay 1 ms (3000 units)
  const shaper = spec('leaky-bucket', { ...THREE_PER_US, maxDelayMs: 1 })
  t.match(bucket.check({ kind: 'leaky-bucket', water: 2000, ts: now }, shaper, 1, now), { ok: true, delayUs: 667, resetUs: 1000, remaining: 2 })
  t.match(bucket.check({ kind: 'leaky-bucket', water: 3001, ts: now }, shaper, 1, now), { ok: false }, 'one unit past maxDelay')
  // the clock stepped back: no drain, and the stored clock's lead counts in every wait
  const meter10 = spec('leaky-bucket', { limit: 10, windowMs: 1000, burst: 5 })
  const back = bucket.check({ kind: 'leaky-bucket', water: 200_000, ts: now + 3000 }, meter10, 1, now)
  t.match(back, { ok: true, remaining: 2, resetUs: 303_000 })
  t.same(back.commit(), { kind: 'leaky-bucket', water: 300_000, ts: now + 3000 })
  const shaper10 = spec('leaky-bucket', { limit: 10, windowMs: 1000, burst: 5, maxDelayMs: 1 })
  t.match(bucket.check({ kind: 'leaky-bucket', water: 0, ts: now + 2000 }, shaper10, 1, now), { ok: false, remaining: 5, retryUs: 2000, resetUs: 2000 },
    'an empty bucket whose clock is 2 ms ahead would hold the request 2 ms, beyond maxDelay 1 ms')
})

t.test('gcra: what a cost above the burst leaves, and how long the state matters', async t => {
  const s = spec('gcra', { limit: 10, windowMs: 1000, burst: 5 })
  const now = 7_000_000
  t.match(ALGORITHMS.gcra.check(undefined, s, 6, now), { ok: false, remaining: 5, retryUs: -1, resetUs: 0 })
  t.same(ALGORITHMS.gcra.check(undefined, s, 1, now).commit(), { kind: 'gcra', tat: now + 100_000 })
})

t.test('fixed-window: a cost of the whole limit waits for the next window', async t => {
  const s = spec('fixed-window', { limit: 3, windowMs: 1000, burst: 3 })
  t.match(ALGORITHMS['fixed-window'].check({ kind: 'fixed-window', window: 5, count: 1 }, s, 3, 5_250_000), { ok: false, remaining: 2, retryUs: 750_000, resetUs: 750_000 })
  // a sliding-window state has a `window` too: it must still count as none
  t.match(ALGORITHMS['fixed-window'].check({ kind: 'sliding-window', window: 5, current: 3, previous: 0 }, s, 1, 5_250_000), { ok: true, remaining: 2 })
})

t.test('sliding-window: remaining, waits and resets on each path', async t => {
  const sw = ALGORITHMS['sliding-window']
  const s = spec('sliding-window', { limit: 10, windowMs: 1000, burst: 10 })
  const now = 5_200_000 // 200 ms into window 5
  t.match(sw.check(undefined, s, 3, now), { ok: true, remaining: 7 }, 'a cost of 3 leaves 7')
  t.match(sw.check(undefined, s, 11, now), { ok: false, remaining: 10, retryUs: -1, resetUs: 0 }, 'above the limit: never, and nothing to reset')
  // window 4 admitted 10: weighted by 800/1000 it leaves 2
  const previous = { kind: 'sliding-window', window: 4, current: 10, previous: 0 } as const
  t.match(sw.check(previous, s, 3, now), { ok: false, remaining: 2, retryUs: 100_000, resetUs: 800_000 }, 'fits once the previous weight is down to 7: at 300 ms')
  t.match(sw.check(previous, s, 10, now), { ok: false, remaining: 2, retryUs: 800_000 }, 'the whole limit: once the previous window has no weight left')
  // the clock stepped back into window 5 while the stored window is 6: window 6 keeps counting
  const ahead = { kind: 'sliding-window', window: 6, current: 4, previous: 3 } as const
  const back = sw.check(ahead, s, 1, now)
  t.match(back, { ok: true, remaining: 2, resetUs: 2_800_000 })
  t.same(back.commit(), { kind: 'sliding-window', window: 6, current: 5, previous: 3 })
})

t.test('sliding-window-log: entries stay sorted when the clock steps back; waits on each path', async t => {
  const log = ALGORITHMS['sliding-window-log']
  const s = spec('sliding-window-log', { limit: 5, windowMs: 1000, burst: 5 })
  const now = 9_000_000
  const back = log.check({ kind: 'sliding-window-log', entries: [now - 1000, now + 5000] }, s, 1, now)
  t.same(back.commit(), { kind: 'sliding-window-log', entries: [now - 1000, now, now + 5000] })
  t.match(log.check(undefined, s, 6, now), { ok: false, remaining: 5, retryUs: -1, resetUs: 0 }, 'above the limit, empty log')
  const four: AlgorithmState = { kind: 'sliding-window-log', entries: [now - 4000, now - 3000, now - 2000, now - 1000] }
  t.match(log.check(four, s, 2, now), { ok: false, remaining: 1, retryUs: 996_000, resetUs: 999_000 }, 'fits once the oldest entry leaves')
  t.match(log.check({ kind: 'sliding-window-log', entries: [now - 1000] }, s, 5, now), { ok: false, remaining: 4, retryUs: 999_000, resetUs: 999_000 }, 'the whole limit waits for the one entry to leave')
})
