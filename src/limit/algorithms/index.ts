import { ALGORITHM_CODES, type AlgorithmName, type LimitCheck, type LimitSpec } from '../types.js'
import { gcd, type AlgorithmTwin } from './algorithm.js'
import { fixedWindow } from './fixed-window.js'
import { calendarQuota, OFFSET_BASE, PERIOD_WINDOW_MS } from './calendar-quota.js'
import { gcra } from './gcra.js'
import { leakyBucket } from './leaky-bucket.js'
import { slidingWindow } from './sliding-window.js'
import { slidingWindowLog } from './sliding-window-log.js'
import { tokenBucket } from './token-bucket.js'
import { lease } from './lease.js'

export type { AlgorithmState, AlgorithmTwin, Evaluation } from './algorithm.js'
export { msUp, rateScale } from './algorithm.js'

export const ALGORITHMS: Readonly<Record<AlgorithmName, AlgorithmTwin>> = Object.freeze({
  gcra,
  'token-bucket': tokenBucket,
  'leaky-bucket': leakyBucket,
  'sliding-window-log': slidingWindowLog,
  'sliding-window': slidingWindow,
  'fixed-window': fixedWindow,
  'calendar-quota': calendarQuota,
  lease
})

/**
 * Whether a check is decided on the wall clock: a calendar quota's period is a date (lua/calendar-quota.lua
 * reads Redis TIME), which an NTP step or a host suspend moves away from the monotonic clock that
 * rates are measured on.
 */
export function followsWallClock (spec: LimitSpec): boolean {
  return spec.algorithm === 'calendar-quota'
}

/** Largest intermediate value allowed: 2^50 keeps every sum of two values below 2^52, where doubles divide exactly. */
export const MAX_EXACT = 2 ** 50

/**
 * One sliding-window-log entry is stored per admitted cost unit (a ZSET member of ~40 bytes in
 * Redis): 10^4 keeps a client's log near 1 MB and its ZADD short; beyond it use sliding-window.
 */
export const MAX_LOG_LIMIT = 10_000

const isCount = (n: number, min: number): boolean => Number.isSafeInteger(n) && n >= min

/**
 * Why `spec` cannot be decided exactly with integer arithmetic, or undefined when it can.
 * For the config layer to report at load time; the stores also refuse such specs.
 */
export function validateLimitSpec (spec: LimitSpec): string | undefined {
  if (!Object.hasOwn(ALGORITHM_CODES, spec.algorithm)) return `unknown algorithm "${String(spec.algorithm)}"`
  if (!isCount(spec.limit, 1)) return 'limit must be an integer >= 1'
  if (!isCount(spec.windowMs, 1)) return 'windowMs must be an integer >= 1'
  if (!isCount(spec.burst, 1)) return 'burst must be an integer >= 1'
  if (!isCount(spec.maxDelayMs, 0)) return 'maxDelayMs must be an integer >= 0'
  const windowUs = spec.windowMs * 1000
  if (windowUs > MAX_EXACT) return 'windowMs is too large'
  const g = gcd(windowUs, spec.limit)
  const perToken = windowUs / g
  const perUs = spec.limit / g
  switch (spec.algorithm) {
    case 'gcra':
      if (spec.limit > windowUs) return 'gcra allows at most one request per µs (limit <= windowMs * 1000)'
      if (spec.burst * Math.ceil(windowUs / spec.limit) > MAX_EXACT) return 'burst * windowMs / limit is too large'
      return undefined
    case 'token-bucket':
    case 'leaky-bucket':
      if (spec.burst * perToken > MAX_EXACT) return 'burst is too large for this rate (burst * windowMs * 1000 / gcd(windowMs * 1000, limit) > 2^50)'
      if (spec.maxDelayMs * 1000 * perUs > MAX_EXACT) return 'maxDelayMs is too large for this rate'
      return undefined
    case 'sliding-window':
      if (spec.limit * spec.windowMs > MAX_EXACT) return 'limit * windowMs is too large (> 2^50)'
      return undefined
    case 'sliding-window-log':
      if (spec.limit > MAX_LOG_LIMIT) return `sliding-window-log stores one entry per admitted unit: limit must be <= ${MAX_LOG_LIMIT} (use sliding-window for larger limits)`
      return undefined
    case 'fixed-window':
    case 'lease':
      if (spec.limit > MAX_EXACT) return 'limit is too large'
      return undefined
    case 'calendar-quota':
      if (spec.limit > MAX_EXACT) return 'limit is too large'
      if (!Object.values(PERIOD_WINDOW_MS).includes(spec.windowMs)) return 'a calendar quota\'s windowMs names its period (hour, day, week or month)'
      // two offsets (calendar-quota.ts): each minutes + 1440, at most 2880
      if (spec.maxDelayMs % OFFSET_BASE > 2880 || Math.floor(spec.maxDelayMs / OFFSET_BASE) > 2880) return 'a calendar quota\'s maxDelayMs carries its UTC offsets (minutes + 1440, at most 2880)'
      return undefined
  }
}

const validSpecs = new WeakSet<LimitSpec>()

/**
 * Throws a RangeError for checks no store can decide: an invalid spec, a cost that is not an
 * integer >= 1, or the same key twice in one request (phase 1 would evaluate both against the same
 * state and over-admit). Specs are validated once each; they are immutable and shared.
 */
export function assertDecidable (checks: readonly LimitCheck[]): void {
  for (let i = 0; i < checks.length; i++) {
    const check = checks[i] as LimitCheck
    if (!validSpecs.has(check.spec)) {
      const problem = validateLimitSpec(check.spec)
      if (problem !== undefined) throw new RangeError(`limit ${check.spec.id}: ${problem}`)
      validSpecs.add(check.spec)
    }
    if (!Number.isSafeInteger(check.cost) || check.cost < 1 || check.cost > MAX_EXACT) {
      throw new RangeError(`limit ${check.spec.id}: cost must be an integer >= 1, got ${check.cost}`)
    }
    for (let j = 0; j < i; j++) {
      if ((checks[j] as LimitCheck).key === check.key) throw new RangeError(`duplicate limit key in one request: ${check.key}`)
    }
  }
}
