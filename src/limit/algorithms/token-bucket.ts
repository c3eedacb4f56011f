import { admitted, rateScale, rejected, type AlgorithmTwin } from './algorithm.js'
import type { LimitSpec } from '../types.js'

// Twin of lua/token-bucket.lua. Tokens are kept in exact units (rateScale), so refills over
// many small steps add up to exactly the same as one large step.

interface Bucket { readonly tokens: number, readonly ts: number }

/** Refills to `now`; `ts` only moves forward (a clock stepping back refills nothing). */
export function refillTokens (bucket: Bucket | undefined, spec: LimitSpec, now: number): Bucket {
  const { perToken, perUs } = rateScale(spec)
  const cap = spec.burst * perToken
  let tokens = bucket === undefined ? cap : Math.min(bucket.tokens, cap)
  let ts = bucket === undefined ? now : bucket.ts
  if (now > ts) {
    const gap = cap - tokens
    // Compare in µs before multiplying so a long idle time never overflows 2^53.
    if (gap > 0) tokens = now - ts >= Math.ceil(gap / perUs) ? cap : tokens + (now - ts) * perUs
    ts = now
  }
  return { tokens, ts }
}

export const tokenBucket: AlgorithmTwin = {
  name: 'token-bucket',
  check (state, spec, cost, now) {
    const { perToken, perUs } = rateScale(spec)
    const cap = spec.burst * perToken
    const { tokens, ts } = refillTokens(state?.kind === 'token-bucket' ? state : undefined, spec, now)
    const lead = ts - now
    const remaining = Math.floor(tokens / perToken)
    const reset = lead + Math.ceil((cap - tokens) / perUs)
    if (cost > spec.burst) return rejected(remaining, -1, reset)
    const need = cost * perToken
    if (tokens < need) return rejected(remaining, lead + Math.ceil((need - tokens) / perUs), reset)
    const left = tokens - need
    const resetUs = lead + Math.ceil((cap - left) / perUs)
    return admitted(Math.floor(left / perToken), resetUs, 0,
      () => ({ kind: 'token-bucket', tokens: left, ts }))
  }
}
