// Level 1 of the limiter: in process, no I/O. It sheds floods before they cost a Redis call.
// It can only reject: whatever it lets through still has to pass the shared level.
import { LRUCache } from 'lru-cache'
import { LRU_CALL, deleteUnlessLast } from './lru.js'

/**
 * A token bucket refilled continuously: `rate` tokens per ms up to `capacity`.
 * Floats are fine here (nothing leaves the process); the shared level keeps integers for Lua.
 */
export class TokenBucket {
  tokens: number
  updatedAt: number
  constructor (capacity: number, nowMs: number) {
    this.tokens = capacity
    this.updatedAt = nowMs
  }

  /** Takes `cost` tokens; returns 0 when taken, else the ms until they will be there. */
  take (cost: number, capacity: number, ratePerMs: number, nowMs: number): number {
    const elapsed = nowMs - this.updatedAt
    if (elapsed > 0) {
      this.tokens = Math.min(capacity, this.tokens + elapsed * ratePerMs)
      this.updatedAt = nowMs
    }
    if (this.tokens >= cost) {
      this.tokens -= cost
      return 0
    }
    return Math.max(1, Math.ceil((cost - this.tokens) / ratePerMs))
  }
}

export interface LocalLevelOptions {
  readonly limit: number
  readonly windowMs: number
  readonly burst: number
  readonly maxKeys: number
}

export class LocalLevel {
  readonly options: LocalLevelOptions
  private readonly buckets: LRUCache<string, TokenBucket>
  private readonly ratePerMs: number
  /** RateLimit-Policy of the local level, built once. */
  readonly policy: string

  constructor (options: LocalLevelOptions) {
    this.options = options
    this.policy = `"local";q=${options.limit};w=${Math.max(1, Math.ceil(options.windowMs / 1000))}`
    this.ratePerMs = options.limit / options.windowMs
    // No TTL: a bucket idle long enough to be full again decides like a fresh one, so an old entry
    // is harmless until LRU eviction reclaims it (why the in-process store keeps none either, see
    // createMemoryStore in ./memory-store.ts).
    this.buckets = new LRUCache({ max: options.maxKeys })
  }

  /** 0 = pass on to the shared level; otherwise the ms after which this client may retry. */
  take (clientKey: string, nowMs: number): number {
    let bucket = this.buckets.get(clientKey, LRU_CALL)
    if (bucket === undefined) {
      bucket = new TokenBucket(this.options.burst, nowMs)
      this.buckets.set(clientKey, bucket, LRU_CALL)
    }
    return bucket.take(1, this.options.burst, this.ratePerMs, nowMs)
  }

  get size (): number {
    return this.buckets.size
  }

  /**
   * The client's bucket as a request now would find it, without taking a token or moving the
   * client in the LRU (the admin API's lookup): whole tokens left, ms until one is there (0: a
   * request passes), ms until the bucket is full again.
   */
  peek (clientKey: string, nowMs: number): { remaining: number, retryAfterMs: number, resetMs: number } {
    const { burst } = this.options
    const bucket = this.buckets.peek(clientKey)
    const tokens = bucket === undefined ? burst : Math.min(burst, bucket.tokens + Math.max(0, nowMs - bucket.updatedAt) * this.ratePerMs)
    return {
      remaining: Math.floor(tokens),
      retryAfterMs: tokens >= 1 ? 0 : Math.max(1, Math.ceil((1 - tokens) / this.ratePerMs)),
      resetMs: Math.ceil((burst - tokens) / this.ratePerMs)
    }
  }

  /** Gives the client a whole bucket again (admin reset). */
  forget (clientKey: string): void {
    this.buckets.delete(clientKey)
  }
}

/**
 * A quota refusal's two deadlines. The store measures a quota's period on a wall clock (Date.now()
 * in process, Redis TIME in front of Redis), so the entry must end when the wall clock passes its
 * deadline: CLOCK_MONOTONIC does not count a host suspend, and held on performance.now() alone the
 * refusal would outlast its period by the suspend's length. But the gateway's wall clock is not
 * the store's: stepped back by NTP, Date.now() alone would hold the refusal that much longer than
 * Redis (whose clock did not step) refuses, past retryAfterMs and denyCacheMaxMs. Held on both, it
 * ends at the earlier one: a suspend ends it, a step back cannot stretch it past the time it was
 * added for, a step forward ends it early (the store decides again, which is always correct).
 */
export interface WallDeadline {
  readonly mono: number
  readonly wall: number
}

/**
 * Keys the shared level rejected, with the time until which they stay rejected. Consulted before
 * Redis so a client hammering a key it is locked out of costs no round trip (envoy's
 * "over_limit_with_local_cache"). It can only reject, never grant.
 *
 * A rate's entry is a number, its deadline on the monotonic clock (no allocation per refusal); a
 * quota's is a WallDeadline (one small object per quota refusal). Reading allocates nothing.
 */
export class DenyCache {
  private readonly until: LRUCache<string, number | WallDeadline>
  /**
   * The latest monotonic deadline ever added. Past it no entry can be live (a quota's wall
   * deadline can only end one earlier), so a limiter with nobody denied lately skips its lookups:
   * one comparison per request instead of one key lookup per limit.
   */
  private horizon = -Infinity
  constructor (maxKeys: number) {
    this.until = new LRUCache({ max: maxKeys })
  }

  /** True when no entry can be live at `monoNow` (performance.now()): every `remaining` would be 0. */
  quietAt (monoNow: number): boolean {
    return monoNow >= this.horizon
  }

  /**
   * ms left on the deny for this key, or 0. `monoNow` is performance.now(); `wallNow` is Date.now(),
   * read here when not given (a caller checking several keys reads it once).
   */
  remaining (key: string, monoNow: number, wallNow?: number): number {
    const until = this.until.get(key, LRU_CALL)
    if (until === undefined) return 0
    const left = typeof until === 'number' ? until - monoNow : Math.min(until.mono - monoNow, until.wall - (wallNow ?? Date.now()))
    if (left > 0) return left
    // Lapsed: deleted, leaving its slot to live denies; the last entry held stays, answering 0
    // like a missing one.
    deleteUnlessLast(this.until, key)
    return 0
  }

  /**
   * Denies `key` until `monoUntil` on performance.now(), and, when `wallUntil` is given (a quota),
   * also no later than `wallUntil` on Date.now() (see WallDeadline).
   */
  add (key: string, monoUntil: number, wallUntil?: number): void {
    if (monoUntil > this.horizon) this.horizon = monoUntil
    this.until.set(key, wallUntil === undefined ? monoUntil : { mono: monoUntil, wall: wallUntil }, LRU_CALL)
  }

  /** Lifts a deny (admin reset). */
  forget (key: string): void {
    this.until.delete(key)
  }

  get size (): number {
    return this.until.size
  }
}
