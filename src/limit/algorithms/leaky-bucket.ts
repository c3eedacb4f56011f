import { admitted, rateScale, rejected, type AlgorithmTwin } from './algorithm.js'

// Twin of lua/leaky-bucket.lua. A meter (maxDelayMs = 0: reject when full) or a shaper
// (maxDelayMs > 0): virtual scheduling like nginx limit_req without nodelay, where a request's
// slot comes when the water already in the bucket has drained; it is admitted with that delay,
// or rejected when the delay would exceed maxDelayMs or the bucket would overflow.

export const leakyBucket: AlgorithmTwin = {
  name: 'leaky-bucket',
  check (state, spec, cost, now) {
    const { perToken, perUs } = rateScale(spec)
    const cap = spec.burst * perToken
    let water = 0
    let ts = now
    if (state?.kind === 'leaky-bucket') ({ water, ts } = state)
    if (now > ts) {
      if (water > 0) water = now - ts >= Math.ceil(water / perUs) ? 0 : water - (now - ts) * perUs
      ts = now
    }
    const lead = ts - now
    const remaining = Math.max(0, Math.floor((cap - water) / perToken))
    const reset = lead + Math.ceil(water / perUs)
    if (cost > spec.burst) return rejected(remaining, -1, reset)
    const need = cost * perToken
    const maxDelayUs = spec.maxDelayMs * 1000
    let delay = 0
    // The highest water level at which this request may enter.
    let target = cap - need
    if (maxDelayUs > 0) {
      delay = lead + Math.ceil(water / perUs)
      target = Math.min(target, maxDelayUs * perUs)
    }
    if (water > target || delay > maxDelayUs) {
      return rejected(remaining, lead + Math.max(0, Math.ceil((water - target) / perUs)), reset)
    }
    const after = water + need
    const resetUs = lead + Math.ceil(after / perUs)
    return admitted(Math.floor((cap - after) / perToken), resetUs, delay,
      () => ({ kind: 'leaky-bucket', water: after, ts }))
  }
}
