import { LRUCache } from 'lru-cache'
import { ALGORITHMS, assertDecidable, followsWallClock, msUp, type AlgorithmState, type Evaluation } from './algorithms/index.js'
import { LRU_CALL } from './lru.js'
import { NO_CHECKS, longer, type LimitCheck, type LimitDecision, type LimitStore, type PeekResult, type SharedDecision, type SharedLevel } from './types.js'

// The in-process store: the TypeScript twins of lua/*.lua over a bounded LRU. It decides
// synchronously (it is on the hot path) and all-or-nothing, like lua/limit.lua.

/** Where decideAt reads and writes per-key state. */
export interface LimitStateMap {
  get(key: string): AlgorithmState | undefined
  set(key: string, state: AlgorithmState): void
}


/**
 * Decides `checks` at `nowUs` against `state`, with exactly the rules of lua/limit.lua: phase 1
 * evaluates every check without writing; only if all admit does phase 2 record all of them.
 * Calendar quotas are evaluated at `wallUs` instead (followsWallClock): both clocks are read once,
 * before phase 1, so a request mixing a rate and a quota is still one all-or-nothing decision.
 * Deciding check: the rejecting one with the longest wait, or when allowed the one with the
 * least remaining (first on ties). `requestId` is unused here (the log keeps timestamps only);
 * it is in the signature so both stores are driven alike.
 */
export function decideAt (state: LimitStateMap, checks: readonly LimitCheck[], _requestId: string, nowUs: number, wallUs = nowUs): LimitDecision {
  const n = checks.length
  if (n === 0) return NO_CHECKS
  const evaluations: Evaluation[] = new Array(n)
  let rejecting = -1
  let tightest = -1
  for (let i = 0; i < n; i++) {
    const check = checks[i] as LimitCheck
    const ev = ALGORITHMS[check.spec.algorithm].check(state.get(check.key), check.spec, check.cost, followsWallClock(check.spec) ? wallUs : nowUs)
    evaluations[i] = ev
    if (!ev.ok) {
      if (rejecting < 0 || longer(ev.retryUs, (evaluations[rejecting] as Evaluation).retryUs)) rejecting = i
    } else if (tightest < 0 || ev.remaining < (evaluations[tightest] as Evaluation).remaining) {
      tightest = i
    }
  }
  if (rejecting >= 0) {
    const ev = evaluations[rejecting] as Evaluation
    return {
      allowed: false,
      remaining: ev.remaining,
      retryAfterMs: ev.retryUs < 0 ? -1 : Math.max(1, msUp(ev.retryUs)),
      resetMs: msUp(ev.resetUs),
      limitingIndex: rejecting,
      delayMs: 0
    }
  }
  let delayMs = 0
  const remainings: number[] = new Array(n)
  for (let i = 0; i < n; i++) {
    const ev = evaluations[i] as Evaluation
    state.set((checks[i] as LimitCheck).key, ev.commit())
    delayMs = Math.max(delayMs, msUp(ev.delayUs))
    remainings[i] = Math.max(0, ev.remaining)
  }
  const ev = evaluations[tightest] as Evaluation
  return { allowed: true, remaining: ev.remaining, retryAfterMs: 0, resetMs: msUp(ev.resetUs), limitingIndex: tightest, delayMs, remainings }
}

export interface MemoryStoreOptions {
  /** Upper bound on keys held; the least recently used key is evicted beyond it. */
  readonly maxKeys: number
  /** The rates' clock in µs, for tests. Default: a monotonic clock (never steps back with NTP). */
  readonly now?: () => number
  /**
   * The calendar quotas' clock in µs, for tests. Default: `now` when a test gives one (one test
   * clock drives every check), else Date.now(), the date a period is named after.
   */
  readonly wallNow?: () => number
}

export interface MemoryStore extends LimitStore {
  readonly kind: 'memory'
  /** Synchronous: never returns a Promise. */
  decide(checks: readonly LimitCheck[], requestId: string): LimitDecision
  /** Keys currently held, whether or not their state is still in effect (nothing expires; see createMemoryStore). */
  readonly size: number
  /** Forgets every key (the Redis fallback starts each outage afresh). */
  clear(): void
  /**
   * Forgets every key but the concurrency leases still held: the Redis fallback's leases are given
   * back to it (`release`) whenever their requests finish, during a later outage too.
   */
  clearBudgets(): void
  /** Forgets one key's budget (a concurrency lease count is kept: it counts requests still in flight); true when it held one. */
  forget(key: string): boolean
  /** Gives back `units` of a concurrency lease count (issue 10); a count reaching 0 is deleted. */
  release(key: string, units: number): void
  /** What each check would get now, consuming nothing (the admin API). */
  peek(checks: readonly LimitCheck[]): PeekResult[]
}

// Where the admin API's callers have always imported it from.
export type { PeekResult } from './types.js'

/** A key's state in the cache, replaced in place by a decision that admits (see readBoxes). */
interface StateBox {
  state: AlgorithmState
}

const monotonicUs = (): number => Math.floor((performance.timeOrigin + performance.now()) * 1000)
const wallUs = (): number => Date.now() * 1000

export function createMemoryStore (options: MemoryStoreOptions): MemoryStore {
  const { maxKeys } = options
  if (!Number.isSafeInteger(maxKeys) || maxKeys < 1) throw new RangeError('maxKeys must be an integer >= 1')
  const now = options.now ?? monotonicUs
  const wallNow = options.wallNow ?? options.now ?? wallUs
  // No TTL: state is self-validating (it carries its own times), so an entry past its time
  // decides exactly like a missing one, and lru-cache (without autopurge) only dropped an expired
  // entry when it was read again, just before it is written anew; deleting it then could clear
  // the whole cache (see deleteUnlessLast). An evicted entry does not decide like a missing one
  // (its key starts over with a whole budget), hence maxKeys must be sized.
  const cache = new LRUCache<string, StateBox>({ max: maxKeys })
  // Concurrency lease counts are not budgets: evicted, a count would start again at 0 (more than
  // the cap in flight) and the old requests' releases would then take from the new holders'. So
  // they live apart, never evicted: a count exists only while requests hold it (bounded by the
  // requests in flight) and is deleted when the last one gives its lease back.
  const leases = new Map<string, AlgorithmState>()
  // decideAt reads every key of a decision (phase 1), then writes the same keys (phase 2). The
  // boxes it read are kept for the writes, so a key already held costs one lru-cache call per
  // decision instead of a get and a set (the set was about 300 instructions). Safe while the
  // cache holds at least a decision's keys: the writes of new keys then evict only entries older
  // than every box read, never one of them.
  // Counted rather than emptied: `length = 0` gave back their storage, and the next decision's
  // pushes grew it again (about 300 instructions per request of (f)). They hold one decision's
  // boxes until the next one, which writes only the boxes it read itself (below its count).
  const readKeys: string[] = []
  const readBoxes: StateBox[] = []
  let readCount = 0
  let keepBoxes = false
  const map: LimitStateMap = {
    get: (key) => {
      if (leases.size > 0) {
        const lease = leases.get(key)
        if (lease !== undefined) return lease
      }
      const box = cache.get(key, LRU_CALL)
      if (box === undefined) return undefined
      if (keepBoxes) {
        readKeys[readCount] = key
        readBoxes[readCount++] = box
      }
      return box.state
    },
    set: (key, state) => {
      if (state.kind === 'lease') {
        if (state.held > 0) leases.set(key, state)
        else leases.delete(key)
        return
      }
      for (let i = 0; i < readCount; i++) {
        if (readKeys[i] === key) {
          (readBoxes[i] as StateBox).state = state
          return
        }
      }
      cache.set(key, { state }, LRU_CALL)
    }
  }
  return {
    kind: 'memory',
    decide (checks, requestId) {
      if (checks.length === 0) return NO_CHECKS
      assertDecidable(checks)
      // more keys decided than held: a write could evict a box read (see readBoxes)
      keepBoxes = checks.length <= maxKeys
      readCount = 0
      const decision = decideAt(map, checks, requestId, now(), wallNow())
      keepBoxes = false
      return decision
    },
    get size () { return cache.size + leases.size },
    clear () {
      cache.clear()
      leases.clear()
    },
    clearBudgets () { cache.clear() },
    // A lease count is the requests in flight, not a budget to forgive: an admin reset keeps it.
    forget (key) { return cache.delete(key) },
    peek (checks) {
      const t = now()
      const wall = wallNow()
      // the same arithmetic as lua/peek.lua
      return checks.map((c) => {
        const state = map.get(c.key)
        const ev = ALGORITHMS[c.spec.algorithm].check(state, c.spec, c.cost, followsWallClock(c.spec) ? wall : t)
        if (c.spec.algorithm === 'lease') {
          // a concurrency cap: its places left (an admitting lease check reports an unbounded
          // remaining, so that the RateLimit headers describe the tightest rate limit)
          const held = state?.kind === 'lease' ? state.held : 0
          return { remaining: Math.max(0, c.spec.limit - held), resetMs: 0, retryAfterMs: ev.ok ? 0 : 1000 }
        }
        if (ev.ok) {
          const remaining = ev.remaining + c.cost
          return { remaining, resetMs: remaining >= c.spec.burst ? 0 : msUp(ev.resetUs), retryAfterMs: 0 }
        }
        return { remaining: Math.max(0, ev.remaining), resetMs: msUp(ev.resetUs), retryAfterMs: ev.retryUs < 0 ? -1 : Math.max(1, msUp(ev.retryUs)) }
      })
    },
    release (key, units) {
      const state = leases.get(key)
      if (state?.kind !== 'lease') return
      if (state.held > units) leases.set(key, { kind: 'lease', held: state.held - units })
      else leases.delete(key)
    },
    async close () {
      cache.clear()
      leases.clear()
    }
  }
}

/**
 * The shared level without Redis: the in-process store decides, synchronously. It is never
 * unavailable, so `onError` does not apply, and its rejections are cached whole.
 */
export function createInProcessLevel (store: MemoryStore): SharedLevel {
  return {
    denyCacheMaxMs: Infinity,
    decide (checks, _limits, requestId): SharedDecision {
      return { decision: store.decide(checks, requestId), level: 'memory', unavailable: false, leaseId: '', share: 1 }
    }
  }
}
