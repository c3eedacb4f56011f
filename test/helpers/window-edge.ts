// Waits that keep a test's stateful part inside one window of the clock. Fixed windows
// (fixed-window, sliding-window) are aligned on the Unix epoch and quotas on the calendar, so a
// test that asserts state kept across requests ("the 4th is refused", "the counter holds 40") sees
// a fresh window if the clock crosses hh:00:00 or midnight mid-test (test/ratelimit-reload.test.ts
// failed that way at 19:00:00). Call one right before that part: it returns at once unless the
// window has less than `marginMs` left, and then waits for the next one to start.
import { calendarPeriod, PERIOD_WINDOW_MS, utcOffsetMinutes, type QuotaPeriod } from '../../src/limit/algorithms/calendar-quota.js'

// The gateway (and Redis TIME) read the same clock a moment later than this process: start a
// little after the boundary so that no decision can still fall in the old window.
const PAST_BOUNDARY_MS = 50

async function until (targetMs: number): Promise<void> {
  // timers may fire a little early: poll the last stretch
  while (Date.now() < targetMs) await new Promise(resolve => setTimeout(resolve, Math.max(1, targetMs - Date.now())))
}

/**
 * Returns at once when the current epoch-aligned window of `windowMs` has at least `marginMs`
 * left; otherwise waits until the next window has begun. Resolves to the ms waited.
 */
export async function awayFromWindowEdge (windowMs: number, marginMs: number): Promise<number> {
  if (marginMs >= windowMs) throw new RangeError(`margin ${marginMs} ms must be shorter than the window (${windowMs} ms)`)
  const now = Date.now()
  const left = windowMs - (now % windowMs)
  if (left >= marginMs) return 0
  await until(now + left + PAST_BOUNDARY_MS)
  return Date.now() - now
}

/**
 * The same for a calendar quota period (hour, day, ISO week, month) in UTC, or in `timeZone` as
 * `quotaTimezone` sets it. Resolves to the ms waited.
 */
export async function awayFromQuotaEdge (period: QuotaPeriod, marginMs: number, timeZone?: string): Promise<number> {
  const now = Date.now()
  const offsetS = timeZone === undefined ? 0 : utcOffsetMinutes(timeZone, now) * 60
  const { end } = calendarPeriod(PERIOD_WINDOW_MS[period], now * 1000, offsetS)
  const left = end * 1000 - now
  if (left >= marginMs) return 0
  await until(end * 1000 + PAST_BOUNDARY_MS)
  return Date.now() - now
}
