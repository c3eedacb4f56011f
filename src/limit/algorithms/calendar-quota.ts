import { admitted, rejected, type AlgorithmTwin } from './algorithm.js'

// Twin of lua/calendar-quota.lua: a counter per calendar period (hour, day, ISO week from Monday,
// month) in UTC or a quotaTimezone. The period is named by the spec's windowMs (PERIOD_WINDOW_MS), so a quota travels
// to Redis as an ordinary check. Dates are computed with integer arithmetic only (Howard
// Hinnant's days_from_civil / civil_from_days), the same operations as the Lua side.

export type QuotaPeriod = 'hour' | 'day' | 'week' | 'month'

/** The windowMs each period is passed as: its longest length (a month is at most 31 days). */
export const PERIOD_WINDOW_MS: Readonly<Record<QuotaPeriod, number>> = Object.freeze({
  hour: 3_600_000,
  day: 86_400_000,
  week: 604_800_000,
  month: 2_678_400_000
})

const DAY_S = 86_400

export function daysFromCivil (year: number, month: number, day: number): number {
  const y = month <= 2 ? year - 1 : year
  const era = Math.floor(y / 400)
  const yoe = y - era * 400
  const doy = Math.floor((153 * (month > 2 ? month - 3 : month + 9) + 2) / 5) + day - 1
  const doe = yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
}

export function civilFromDays (days: number): { year: number, month: number } {
  const z = days + 719468
  const era = Math.floor(z / 146097)
  const doe = z - era * 146097
  const yoe = Math.floor((doe - Math.floor(doe / 1460) + Math.floor(doe / 36524) - Math.floor(doe / 146096)) / 365)
  const doy = doe - (365 * yoe + Math.floor(yoe / 4) - Math.floor(yoe / 100))
  const mp = Math.floor((5 * doy + 2) / 153)
  const month = mp < 10 ? mp + 3 : mp - 9
  return { year: yoe + era * 400 + (month <= 2 ? 1 : 0), month }
}

/**
 * A zoned quota's `maxDelayMs` (which has no other use for a quota) carries two UTC offsets, each
 * in minutes east of UTC + 1440: the zone's offset now (which period it is) plus OFFSET_BASE times
 * its offset at that period's end (when the period ends). A DST change inside the period moves
 * the end by an hour: a March in Berlin starts on CET and ends on CEST. 0 = UTC. A value below
 * OFFSET_BASE carries one offset for both (lua/calendar-quota.lua reads it the same way).
 */
export const OFFSET_BASE = 4096

/** Seconds east of UTC of the clock that names the current period. */
export function quotaOffsetSeconds (maxDelayMs: number): number {
  return maxDelayMs === 0 ? 0 : (maxDelayMs % OFFSET_BASE - 1440) * 60
}

/** Seconds east of UTC at the end of the current period. */
export function quotaEndOffsetSeconds (maxDelayMs: number): number {
  return maxDelayMs < OFFSET_BASE ? quotaOffsetSeconds(maxDelayMs) : (Math.floor(maxDelayMs / OFFSET_BASE) - 1440) * 60
}

/**
 * The `maxDelayMs` of a quota counted in `timeZone` at `nowMs`: the zone's offset now and at the
 * end of the period holding `nowMs` (local midnight, computed twice: the first guess used the
 * offset of now, which a DST change in between makes an hour wrong).
 */
export function zonedQuotaDelay (timeZone: string, windowMs: number, nowMs: number): number {
  const now = utcOffsetMinutes(timeZone, nowMs)
  // an hour ends on the clock it started on: the repeated 02:00 of an autumn change ends at the
  // change (the local 03:00 after it is an hour later), and so does the hour a spring change skips into
  if (windowMs === PERIOD_WINDOW_MS.hour) return now + 1440
  const localEnd = localPeriod(windowMs, Math.floor(nowMs / 1000) + now * 60).end
  let atEnd = utcOffsetMinutes(timeZone, (localEnd - now * 60) * 1000)
  atEnd = utcOffsetMinutes(timeZone, (localEnd - atEnd * 60) * 1000)
  return now + 1440 + OFFSET_BASE * (atEnd + 1440)
}

/** Start and end (exclusive) of the period holding `s`, all in seconds of the same (local) clock. */
export function localPeriod (windowMs: number, s: number): { start: number, end: number } {
  const d = Math.floor(s / DAY_S)
  switch (windowMs) {
    case PERIOD_WINDOW_MS.hour: {
      const start = Math.floor(s / 3600) * 3600
      return { start, end: start + 3600 }
    }
    case PERIOD_WINDOW_MS.day:
      return { start: d * DAY_S, end: (d + 1) * DAY_S }
    case PERIOD_WINDOW_MS.week: {
      // 1970-01-01 was a Thursday: (d + 3) mod 7 counts days since Monday (ISO 8601 weeks)
      const monday = d - ((d + 3) % 7 + 7) % 7
      return { start: monday * DAY_S, end: (monday + 7) * DAY_S }
    }
    default: {
      const { year, month } = civilFromDays(d)
      const next = month === 12 ? daysFromCivil(year + 1, 1, 1) : daysFromCivil(year, month + 1, 1)
      return { start: daysFromCivil(year, month, 1) * DAY_S, end: next * DAY_S }
    }
  }
}

/**
 * Start and end (exclusive), in Unix seconds, of the period holding `nowUs`, on a clock `offsetS`
 * east of UTC now and `endOffsetS` at the period's end.
 */
export function calendarPeriod (windowMs: number, nowUs: number, offsetS = 0, endOffsetS = offsetS): { start: number, end: number } {
  const { start, end } = localPeriod(windowMs, Math.floor(nowUs / 1_000_000) + offsetS)
  return { start: start - offsetS, end: end - (windowMs === PERIOD_WINDOW_MS.hour ? offsetS : endOffsetS) }
}

/** When the period of the quota `spec` holding `nowUs` ends, in Unix seconds (its zone's offsets included). */
export function quotaPeriodEnd (spec: { readonly windowMs: number, readonly maxDelayMs: number }, nowUs: number): number {
  return calendarPeriod(spec.windowMs, nowUs, quotaOffsetSeconds(spec.maxDelayMs), quotaEndOffsetSeconds(spec.maxDelayMs)).end
}

const zoneFormats = new Map<string, Intl.DateTimeFormat>()

/** Minutes east of UTC in `timeZone` (IANA name) at `atMs`; throws RangeError for an unknown zone. */
export function utcOffsetMinutes (timeZone: string, atMs: number): number {
  let f = zoneFormats.get(timeZone)
  if (f === undefined) {
    f = new Intl.DateTimeFormat('en-US', { timeZone, hourCycle: 'h23', year: 'numeric', month: 'numeric', day: 'numeric', hour: 'numeric', minute: 'numeric', second: 'numeric' })
    zoneFormats.set(timeZone, f)
  }
  const parts: Record<string, number> = {}
  for (const p of f.formatToParts(atMs)) if (p.type !== 'literal') parts[p.type] = Number(p.value)
  const local = Date.UTC(parts.year as number, (parts.month as number) - 1, parts.day, parts.hour, parts.minute, parts.second)
  return Math.round((local - Math.floor(atMs / 1000) * 1000) / 60_000)
}

export const calendarQuota: AlgorithmTwin = {
  name: 'calendar-quota',
  check (state, spec, cost, now) {
    // A day, week or month is identified by its start on the local clock: a DST change within a
    // month does not move the month's identity, so its count carries on. An hour is identified by
    // its start in Unix seconds and lasts 3600 s: an autumn change repeats a local hour (02:00 to
    // 03:00 in Berlin), and the second pass is an hour of its own with a budget of its own.
    const offsetS = quotaOffsetSeconds(spec.maxDelayMs)
    const hour = spec.windowMs === PERIOD_WINDOW_MS.hour
    const endOffsetS = hour ? offsetS : quotaEndOffsetSeconds(spec.maxDelayMs)
    const local = localPeriod(spec.windowMs, Math.floor(now / 1_000_000) + offsetS)
    const start = hour ? local.start - offsetS : local.start
    const stored = state?.kind === 'calendar-quota' ? state : undefined
    // A stored period ahead of now: the clock stepped back; keep counting in the later period.
    const period = Math.max(start, stored?.period ?? -Infinity)
    const count = stored !== undefined && stored.period === period ? stored.count : 0
    const end = hour ? period + 3600 : (period === start ? local.end : localPeriod(spec.windowMs, period).end) - endOffsetS
    const toEnd = end * 1_000_000 - now
    if (cost <= spec.limit && count + cost <= spec.limit) {
      return admitted(spec.limit - count - cost, toEnd, 0,
        () => ({ kind: 'calendar-quota', period, count: count + cost }))
    }
    return rejected(Math.max(0, spec.limit - count), cost > spec.limit ? -1 : toEnd, count > 0 ? toEnd : 0)
  }
}
