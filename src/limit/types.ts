// The contract between the limiter pipeline and its stores. Every number is an integer:
// Redis Lua truncates floats on return, so integers are kept end to end (ms and µs).

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
