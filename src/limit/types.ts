// The contract between the limiter pipeline and its stores. Every number is an integer:
// Redis Lua truncates floats on return, so integers are kept end to end (ms and µs).
import type { OnError } from './plan.js'

export type AlgorithmName =
  | 'gcra'
  | 'token-bucket'
  | 'leaky-bucket'
  | 'sliding-window-log'
  | 'sliding-window'
  | 'fixed-window'
  | 'calendar-quota'
  /** A concurrency lease (issue 10): limit = leases held at once, window = lease TTL. Never in config. */
  | 'lease'

/** Numeric code of each algorithm as passed to the Lua scripts (ARGV). */
export const ALGORITHM_CODES: Readonly<Record<AlgorithmName, number>> = Object.freeze({
  gcra: 1,
  'token-bucket': 2,
  'leaky-bucket': 3,
  'sliding-window-log': 4,
  'sliding-window': 5,
  'fixed-window': 6,
  'calendar-quota': 7,
  lease: 8
})

/** A limit compiled from config. Immutable; shared by every request that it applies to. */
export interface LimitSpec {
  /** Stable across reloads while the parameters stay the same; part of every key. */
  readonly id: string
  readonly algorithm: AlgorithmName
  /** At most `limit` admissions (in cost units) per `windowMs`. */
  readonly limit: number
  readonly windowMs: number
  /** Capacity of bucket-like algorithms (gcra, token-bucket, leaky-bucket); equals `limit` for window algorithms. */
  readonly burst: number
  /** leaky-bucket with `onLimit: delay`: the longest a request may be held for its slot. 0 = reject instead. */
  readonly maxDelayMs: number
}

/** One limit applied to one key for one request. */
export interface LimitCheck {
  readonly key: string
  readonly spec: LimitSpec
  readonly cost: number
}

export interface LimitDecision {
  readonly allowed: boolean
  /** Budget left (in cost units) of the check that decided: the rejecting one, or the tightest when allowed. */
  readonly remaining: number
  /** 0 when allowed; otherwise ms until a retry can succeed; -1 = never (cost above burst/limit). */
  readonly retryAfterMs: number
  /** ms until the deciding check's budget is whole again. */
  readonly resetMs: number
  /** Index into the checks of the deciding check; -1 when there were no checks. */
  readonly limitingIndex: number
  /** leaky-bucket delay mode: how long to hold the admitted request before forwarding (0 otherwise). */
  readonly delayMs: number
  /**
   * Every check's budget left, in the order of the checks, when the store knows them (admitted
   * requests): a plan's quota is reported in the headers beside the tightest limit (issue 9).
   */
  readonly remainings?: readonly number[]
}

/**
 * A shared-level store. `decide` is all-or-nothing: either every check admits and every one
 * is recorded, or nothing is recorded at all (rejected requests never consume budget).
 */
export interface LimitStore {
  readonly kind: 'memory' | 'redis'
  decide(checks: readonly LimitCheck[], requestId: string): LimitDecision | Promise<LimitDecision>
  close(): Promise<void>
}

/** The answer to a request with no checks: allowed, nothing to report. */
export const NO_CHECKS: LimitDecision = Object.freeze({
  allowed: true, remaining: 0, retryAfterMs: 0, resetMs: 0, limitingIndex: -1, delayMs: 0
})

/** Whether wait `a` is longer than `b`; -1 (never) is the longest of all. */
export function longer (a: number, b: number): boolean {
  if (a < 0) return b >= 0
  return b >= 0 && a > b
}

/** A shared level's answer for one request. */
export interface SharedDecision {
  readonly decision: LimitDecision
  /** Which store decided: the in-process one, Redis, or the in-process fallback while Redis is away. */
  readonly level: 'memory' | 'redis' | 'fallback'
  /** A limit with `onError: deny` could not be decided: answer 503. */
  readonly unavailable: boolean
  /** Redis: the id any concurrency lease was taken under ('' otherwise). */
  readonly leaseId: string
  /** Units each lease took: 1, or the live instances n in the Redis fallback (its 1/n share). */
  readonly share: number
}

/**
 * The one interface the limiter (src/limit/limiter.ts) talks to for the limits shared across
 * requests: decide every check of a request, all-or-nothing. Implemented in process
 * (`createInProcessLevel`, synchronous: the hot path allocates no Promise) and over Redis
 * (`RedisGuard`: timeouts, breaker and `onError` fallback around the Redis store).
 * test/store-contract.test.ts runs one suite against every implementation.
 */
export interface SharedLevel {
  /** `limits[i].onError` says what check i falls back to when its store is unavailable. */
  decide(checks: readonly LimitCheck[], limits: readonly { readonly onError: OnError }[], requestId: string): SharedDecision | Promise<SharedDecision>
  /**
   * Longest the deny cache may hold a rejection this level decided (Infinity: its whole wait).
   * Redis Cluster's rejections can come from a refund race and must not be cached whole.
   */
  readonly denyCacheMaxMs: number
}

/** A check read without consuming (the admin API): units left now, ms until whole, ms until a request of its cost passes (-1 never). */
export interface PeekResult {
  readonly remaining: number
  readonly resetMs: number
  readonly retryAfterMs: number
}
