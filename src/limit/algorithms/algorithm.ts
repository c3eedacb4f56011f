import type { AlgorithmName, LimitSpec } from '../types.js'

// The in-process twins of lua/*.lua. Each twin performs the same integer operations in the same
// order as its Lua file (both are IEEE doubles, every value an integer below 2^52), so the
// memory store and the Redis scripts reach identical decisions; test/limit-parity.test.ts checks it.

/** State of one key, per algorithm. Times are µs, bucket amounts are scaled units (see `rateScale`). */
export type AlgorithmState =
  | { readonly kind: 'gcra', readonly tat: number }
  | { readonly kind: 'token-bucket', readonly tokens: number, readonly ts: number }
  | { readonly kind: 'leaky-bucket', readonly water: number, readonly ts: number }
  | { readonly kind: 'sliding-window-log', readonly entries: number[] }
  | { readonly kind: 'sliding-window', readonly window: number, readonly current: number, readonly previous: number }
  | { readonly kind: 'fixed-window', readonly window: number, readonly count: number }
  | { readonly kind: 'calendar-quota', readonly period: number, readonly count: number }
  | { readonly kind: 'lease', readonly held: number }

/** What a check decided; times in µs. */
export interface Evaluation {
  readonly ok: boolean
  /** Whole cost units left (after this request when ok). */
  readonly remaining: number
  /** µs until a retry can pass; 0 when ok; -1 = never. */
  readonly retryUs: number
  /** µs until the budget is whole again. */
  readonly resetUs: number
  /** µs to hold the admitted request (leaky-bucket delay mode). */
  readonly delayUs: number
  /** Only when ok: the state recording the admission. */
  commit(): AlgorithmState
}

export interface AlgorithmTwin {
  readonly name: AlgorithmName
  /** Evaluates one check against `state` (undefined or another algorithm's state = none) without changing it. */
  check(state: AlgorithmState | undefined, spec: LimitSpec, cost: number, nowUs: number): Evaluation
}

const NOTHING_TO_COMMIT = (): never => {
  throw new Error('commit() called on a rejected evaluation')
}

export function rejected (remaining: number, retryUs: number, resetUs: number): Evaluation {
  return { ok: false, remaining, retryUs, resetUs, delayUs: 0, commit: NOTHING_TO_COMMIT }
}

export function admitted (
  remaining: number,
  resetUs: number,
  delayUs: number,
  commit: () => AlgorithmState
): Evaluation {
  return { ok: true, remaining, retryUs: 0, resetUs, delayUs, commit }
}

/** µs to ms rounded up, as lua/common.lua ms_up: a 0.5 ms wait is 1 ms, never 0. */
export function msUp (us: number): number {
  return us <= 0 ? 0 : Math.ceil(us / 1000)
}

export function gcd (a: number, b: number): number {
  while (b !== 0) {
    const r = a % b
    a = b
    b = r
  }
  return a
}

export interface RateScale {
  /** Units per token (w). */
  readonly perToken: number
  /** Units refilled (or drained) per µs (l). */
  readonly perUs: number
}

const scales = new WeakMap<LimitSpec, RateScale>()

/**
 * Exact integer units for a rate of `limit` per `windowMs`: one token is `perToken` units and
 * `perUs` units flow per µs, so a refill of e µs is e * perUs units with no fraction to floor away.
 * Cached per spec (specs are immutable and shared); lua/common.lua `scale` recomputes it per call.
 */
export function rateScale (spec: LimitSpec): RateScale {
  let s = scales.get(spec)
  if (s === undefined) {
    const windowUs = spec.windowMs * 1000
    const g = gcd(windowUs, spec.limit)
    s = { perToken: windowUs / g, perUs: spec.limit / g }
    scales.set(spec, s)
  }
  return s
}
