import { admitted, rejected, type AlgorithmTwin } from './algorithm.js'

// Twin of lua/sliding-window-log.lua: exact, one entry (admission time in µs) per admitted cost
// unit, kept sorted. The window is (now - windowUs, now]; only admissions are recorded.

/** Index of the first entry inside the window, i.e. the number of entries older than it. */
function firstInside (entries: readonly number[], after: number): number {
  let lo = 0
  let hi = entries.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if ((entries[mid] as number) > after) hi = mid
    else lo = mid + 1
  }
  return lo
}

export const slidingWindowLog: AlgorithmTwin = {
  name: 'sliding-window-log',
  check (state, spec, cost, now) {
    const windowUs = spec.windowMs * 1000
    const entries = state?.kind === 'sliding-window-log' ? state.entries : []
    const stale = firstInside(entries, now - windowUs)
    const count = entries.length - stale
    if (cost <= spec.limit && count + cost <= spec.limit) {
      return admitted(spec.limit - count - cost, windowUs, 0, () => {
        // Mutates in place: the memory store owns the array and re-stores it right away.
        entries.splice(0, stale)
        const sorted = entries.length === 0 || (entries[entries.length - 1] as number) <= now
        for (let u = 0; u < cost; u++) entries.push(now)
        if (!sorted) entries.sort((a, b) => a - b)
        return { kind: 'sliding-window-log', entries }
      })
    }
    const remaining = Math.max(0, spec.limit - count)
    const reset = count > 0 ? (entries[entries.length - 1] as number) + windowUs - now : 0
    if (cost > spec.limit) return rejected(remaining, -1, reset)
    // The request fits once the k oldest entries in the window have left it.
    const k = count + cost - spec.limit
    return rejected(remaining, (entries[stale + k - 1] as number) + windowUs - now, reset)
  }
}
