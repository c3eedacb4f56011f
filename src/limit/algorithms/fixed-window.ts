import { admitted, rejected, type AlgorithmTwin } from './algorithm.js'

// Twin of lua/fixed-window.lua: a counter per fixed window aligned to the Unix epoch. The window
// index is part of the state, so decisions never depend on when a key happens to expire.

export const fixedWindow: AlgorithmTwin = {
  name: 'fixed-window',
  check (state, spec, cost, now) {
    const windowUs = spec.windowMs * 1000
    const stored = state?.kind === 'fixed-window' ? state : undefined
    // A stored window ahead of now: the clock stepped back; keep counting in the later window.
    const k = Math.max(Math.floor(now / windowUs), stored?.window ?? -Infinity)
    const count = stored !== undefined && stored.window === k ? stored.count : 0
    const toEnd = (k + 1) * windowUs - now
    if (cost <= spec.limit && count + cost <= spec.limit) {
      return admitted(spec.limit - count - cost, toEnd, 0,
        () => ({ kind: 'fixed-window', window: k, count: count + cost }))
    }
    const reset = count > 0 ? toEnd : 0
    return rejected(Math.max(0, spec.limit - count), cost > spec.limit ? -1 : toEnd, reset)
  }
}
