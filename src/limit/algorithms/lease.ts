import { admitted, rejected, type AlgorithmTwin } from './algorithm.js'

// The in-process twin of lua/lease.lua: a count of leases held. In process there is no expiry to
// keep (a dead process takes its leases with it), so the count goes down only by release
// (MemoryStore.release). Remaining and waits are those of the Lua side.

/** What an admitted lease reports as remaining: never the tightest limit (see lua/lease.lua). */
export const LEASE_UNBOUNDED = 2 ** 50
const RETRY_US = 1_000_000

export const lease: AlgorithmTwin = {
  name: 'lease',
  check (state, spec, cost) {
    const held = state?.kind === 'lease' ? state.held : 0
    if (held + cost <= spec.limit) {
      return admitted(LEASE_UNBOUNDED, 0, 0, () => ({ kind: 'lease', held: held + cost }))
    }
    return rejected(Math.max(0, spec.limit - held), RETRY_US, RETRY_US)
  }
}
