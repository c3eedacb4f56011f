import { admitted, rejected, type AlgorithmTwin } from './algorithm.js'

// Twin of lua/gcra.lua. One integer of state: the theoretical arrival time (TAT) in µs.
// The emission interval is rounded up to whole µs (exact when limit divides windowUs, otherwise
// at most 1 µs per token slower than configured, never faster).

export const gcra: AlgorithmTwin = {
  name: 'gcra',
  check (state, spec, cost, now) {
    const t = Math.ceil((spec.windowMs * 1000) / spec.limit)
    const tau = spec.burst * t
    let tat = state?.kind === 'gcra' ? state.tat : now
    if (tat < now) tat = now
    const held = tat - now
    const available = Math.max(0, Math.floor((tau - held) / t))
    if (cost > spec.burst) return rejected(available, -1, held)
    const next = tat + cost * t
    if (next - now > tau) return rejected(available, next - tau - now, held)
    return admitted(Math.floor((tau - (next - now)) / t), next - now, 0,
      () => ({ kind: 'gcra', tat: next }))
  }
}
