// Concurrency leases (issue 10): what a request holds while it is in flight, and their return.
//
// A lease is taken by the limiter's one store call, beside the rate limits (lua/lease.lua in
// Redis, the `lease` twin in process), so a request refused by either takes nothing from the
// other. This module keeps the leases taken afterwards:
//   - release: when the response finished or failed or the client left (the pipeline calls it on
//     the response's or the socket's 'close'). Releases wait for the next call to Redis that takes
//     leases or rate-limit units (the limiter calls flushReleases first), or RELEASE_WAIT_MS at
//     most, and then go in one call (lua/lease-release.lua), one per hash slot under Cluster;
//   - renewal: every third of the lease TTL, one call pushes the expiry of every lease this
//     instance still holds (lua/lease-renew.lua), so a long download or an open WebSocket keeps
//     its lease while the leases of an instance that died expire within the TTL;
//   - reconnection: releases that found no connection are sent again, and the held leases renewed
//     (a Redis restarted empty lost them), as soon as the client is ready again.
import { Cluster, type Redis } from 'ioredis'
import { keySlot } from './keys.js'
import { classifyRedisError, replyCode } from './redis-client.js'
import { LEASE_RELEASE_SCRIPT, LEASE_RENEW_SCRIPT, type LeaseReleases, type ReleaseCarrier } from './scripts.js'
import type { MemoryStore } from './memory-store.js'
import type { RedisGuard } from './redis-guard.js'
import { waitAtMost } from '../wait-at-most.js'

/** Leases one admitted request holds, one per concurrency limit that applied to it. */
export interface HeldLease {
  /** The lease keys, as passed to the store. */
  readonly keys: readonly string[]
  /** Redis: the lease id (the member in every key); '' in process. */
  readonly member: string
  /** Where the leases were taken: Redis, the `onError: local` fallback, or the in-process store. */
  readonly level: 'redis' | 'fallback' | 'memory'
  /** What each lease counts in its key: 1, or the fallback's share n (1/n of the cap per instance). */
  readonly units: number
  released: boolean
  /** Where LeaseKeeper keeps it among the leases it renews; -1 when it is not kept there. */
  heldAt: number
}

export interface LeaseKeeperOptions {
  /** No Redis configured: the in-process store holds the counts. */
  readonly memory?: MemoryStore
  readonly redis?: {
    readonly client: Redis | Cluster
    readonly guard: RedisGuard
    /** The limit store on the same client: releases ride with its calls when it batches. */
    readonly store?: { carryReleases(carrier: ReleaseCarrier): boolean }
    /** Prepended to every key, as the Redis store does (default none). */
    readonly keyPrefix?: string
  }
  /** Lease TTL in ms (`redis.leaseTtl`); renewals run every third of it. */
  readonly ttlMs: number
  /** A release or renewal Redis did not take: the lease then expires within the TTL. */
  readonly onError?: (err: unknown, what: 'release' | 'renew') => void
  /** Most releases (lease keys) kept to be sent again; default MAX_UNSENT_RELEASES. */
  readonly maxUnsent?: number
}

interface LeaseCommands {
  gatewayLeaseRelease(numKeys: number, ...keysAndArgs: string[]): Promise<unknown>
  gatewayLeaseRenew(numKeys: number, ...keysAndArgs: string[]): Promise<unknown>
}

/** Most leases per release or renewal call: a large fleet of held leases goes in bounded pieces. */
const BATCH = 512

/**
 * Most release sends, and apart from them most renewal rounds, waiting for one Redis node at once (see send; under Cluster
 * each master has its own bound, so a stalled one drops none of another's). A send is one flush of
 * releases or one renewal round with all its calls: under Cluster that is one call per hash slot,
 * hundreds on a busy instance, which must all go out or the leases beyond the bound expire while
 * their requests run.
 */
export const MAX_WAITING_SENDS = 64

/**
 * Longest a release waits for a limit call to ride with. Riding with it, the release is written
 * with that call and its reply read with that call's, rather than costing the process a wake-up of
 * its own, which was most of a concurrency limit's CPU on the Redis path (issue 10; figures in
 * bench/README.md). Another instance sees the lease at most this much longer; this instance never
 * does (flushReleases).
 */
export const RELEASE_WAIT_MS = 10

/**
 * Most releases (one per lease key) kept to be sent again while Redis takes none: a few MB. They
 * wait for as long as their leases may live (leaseTtl may be hours), so a Redis refusing them for
 * that long at thousands of requests a second grew them without end; beyond it the oldest go,
 * whose leases expire soonest.
 */
export const MAX_UNSENT_RELEASES = 100_000

/** How often releases Redis did not take (see releaseWorthRetrying) are tried again. */
export const RELEASE_RETRY_MS = 250

/**
 * A release that failed is sent again unless Redis refused it for good (an error reply of the
 * script's own, kind 'other'). Everything else passes: a lost connection, a guard timeout on the
 * limit call it rode with, a slot moving, a Redis busy with a script, loading or read-only for a
 * while, and a Cluster failing over, which ioredis ends after its redirections with a plain Error
 * (kind 'other' with no reply code). Only a lost connection was retried before, and such a release
 * was dropped: its lease stayed counted for up to a leaseTtl after its request ended, and a client
 * at its cap with nothing in flight was refused. Removing a lease twice is harmless.
 */
function releaseWorthRetrying (err: unknown): boolean {
  return replyCode(err) === null || classifyRedisError(err) !== 'other'
}

export class LeaseKeeper {
  /**
   * Leases held in Redis, renewed until released: an array with each lease's index on the lease,
   * not a Set. A Set that every request adds to and deletes from made V8 promote whole request
   * graphs out of the young generation (see src/server.ts, openResponses).
   */
  private readonly held: HeldLease[] = []
  /** How many of `held` hold each key: the `onError: local` fallback counts them (heldFor). */
  private readonly heldByKey = new Map<string, number>()
  /** Redis releases of this event-loop turn. */
  private pending: HeldLease[] = []
  private flushing: NodeJS.Timeout | null = null
  private renewer: NodeJS.Timeout | null = null
  private renewEveryMs = 0
  #ttlMs: number
  /**
   * The longest leaseTtl this keeper has had: a lease renewed under it may live that long in Redis
   * after its last renewal, so its release is tried again that long (a reload that shortens the TTL
   * cannot shorten a lease renewal failed to reach).
   */
  #longestTtlMs: number
  /** Calls to Redis this keeper made (releases and renewals), for tests and the benchmark. */
  calls = 0
  /** Releases that rode with a limit call instead (see takeReleases). */
  carried = 0
  /** True when the limit store carries the releases (standalone Redis, Sentinel). */
  private readonly riding: boolean
  /** Sends (a flush of releases, a renewal round) with a call not answered yet. */
  waiting = 0
  /** Sends with a call not answered yet, by the node it waits for ('' standalone or Sentinel). */
  private readonly waitingFor = new Map<string, number>()
  /**
   * Releases Redis did not take (no connection, Redis restarting or busy, a failover; see
   * releaseWorthRetrying): sent again, until their leases would have expired anyway (`at` + the
   * longest TTL).
   */
  private unsent: Array<readonly [key: string, member: string, at: number]> = []
  private retrying: NodeJS.Timeout | null = null
  private closed = false
  /** Renewal rounds not answered yet, each with the releases it is followed by (releaseAgain). */
  private readonly roundsOut = new Set<Promise<unknown>>()
  /**
   * Sends not made, whole or to a node, because MAX_WAITING_SENDS were waiting for it; and times
   * releases kept to be sent again were dropped beyond maxUnsent.
   */
  dropped = 0

  constructor (private readonly options: LeaseKeeperOptions) {
    this.#ttlMs = options.ttlMs
    this.#longestTtlMs = options.ttlMs
    const client = options.redis?.client
    if (client !== undefined) {
      client.defineCommand('gatewayLeaseRelease', { lua: LEASE_RELEASE_SCRIPT })
      client.defineCommand('gatewayLeaseRenew', { lua: LEASE_RENEW_SCRIPT })
      // Back: the releases it missed go first, ahead of the next request's call. Then the held leases
      // are renewed at once: a Redis restarted empty, or a replica promoted before it had them,
      // lost them, and until the next renewal (a third of the TTL) the cap admitted that many more.
      client.on('ready', () => {
        if (this.unsent.length > 0) this.retryUnsent()
        if (this.held.length > 0) this.renew()
      })
    }
    this.riding = options.redis?.store?.carryReleases({
      take: () => this.takeReleases(),
      failed: (releases, err) => this.carriedReleasesFailed(releases, err)
    }) ?? false
  }

  /** `redis.leaseTtl`. */
  get ttlMs (): number {
    return this.#ttlMs
  }

  /**
   * A reload that changes `redis.leaseTtl` sets it here. The held leases are renewed at once under
   * the new TTL: the renewal interval restarts at the new period, and a lease last renewed under a
   * shorter TTL would otherwise expire before the first renewal at the longer one.
   */
  set ttlMs (ms: number) {
    if (ms === this.#ttlMs) return
    this.#ttlMs = ms
    this.#longestTtlMs = Math.max(this.#longestTtlMs, ms)
    if (this.renewer !== null) this.renew()
  }

  /** Leases held in Redis by this instance right now. */
  get heldInRedis (): number {
    return this.held.length
  }

  /** Leases this instance holds in Redis under `key` (a key as passed to the store). */
  heldFor (key: string): number {
    return this.heldByKey.get(key) ?? 0
  }

  /** Resolved once no lease is held in Redis (its connection can then close with none to give back). */
  whenNoneHeld (): Promise<void> {
    if (this.held.length === 0) return Promise.resolve()
    return new Promise(resolve => this.noneHeld.push(resolve))
  }

  private readonly noneHeld: Array<() => void> = []

  private settleNoneHeld (): void {
    if (this.held.length > 0 || this.noneHeld.length === 0) return
    for (const resolve of this.noneHeld.splice(0)) resolve()
  }

  /** Starts keeping a lease the limiter just took. */
  hold (lease: HeldLease): void {
    if (lease.level !== 'redis' || lease.heldAt !== -1) return
    lease.heldAt = this.held.length
    this.held.push(lease)
    for (const key of lease.keys) this.heldByKey.set(key, (this.heldByKey.get(key) ?? 0) + 1)
    this.startRenewing()
  }

  /** Stops renewing `lease`: the last lease takes its place. */
  private unhold (lease: HeldLease): void {
    const at = lease.heldAt
    if (at === -1) return
    lease.heldAt = -1
    for (const key of lease.keys) {
      const n = this.heldByKey.get(key) ?? 0
      if (n > 1) this.heldByKey.set(key, n - 1)
      else this.heldByKey.delete(key)
    }
    const last = this.held.pop() as HeldLease
    if (last !== lease) {
      this.held[at] = last
      last.heldAt = at
    }
    this.settleNoneHeld()
  }

  /** Gives a request's leases back; a second call does nothing. */
  release (lease: HeldLease): void {
    if (lease.released) return
    lease.released = true
    switch (lease.level) {
      case 'memory':
        for (const key of lease.keys) this.options.memory?.release(key, lease.units)
        return
      case 'fallback':
        for (const key of lease.keys) this.options.redis?.guard.releaseFallback(key, lease.units)
        return
      case 'redis':
        this.unhold(lease)
        this.queueRelease(lease)
    }
  }

  private queueRelease (lease: HeldLease): void {
    this.pending.push(lease)
    if (this.flushing === null) {
      this.flushing = setTimeout(() => this.flush(), RELEASE_WAIT_MS)
      this.flushing.unref()
    }
  }

  /**
   * Sends the waiting releases now. The limiter calls it before each call to Redis: on the same
   * connection the releases then reach Redis first, so a request following a finished one from the
   * same client is never refused by the lease that finished one still seemed to hold.
   */
  flushReleases (): void {
    // riding: the store's next call takes them (takeReleases), ahead of its decisions
    if (this.riding || this.pending.length === 0) return
    if (this.flushing !== null) clearTimeout(this.flushing)
    this.flush()
  }

  /**
   * The releases waiting, for the limit store's call about to be sent (at most BATCH; the rest
   * wait for the next call or the timer). A release that rides costs no call and no reply of its
   * own: that separate release call was most of a concurrency limit's CPU (bench/README.md).
   */
  private takeReleases (): LeaseReleases | null {
    if (this.pending.length === 0) return null
    // a call with no connection fails at once and takes them with it: left to flush (send keeps them)
    if (this.options.redis?.client.status !== 'ready') return null
    const prefix = this.options.redis?.keyPrefix ?? ''
    const pairs: Array<readonly [string, string]> = []
    let taken = 0
    while (taken < this.pending.length && pairs.length < BATCH) {
      const lease = this.pending[taken++] as HeldLease
      for (const key of lease.keys) pairs.push([prefix + key, lease.member])
    }
    this.pending = taken === this.pending.length ? [] : this.pending.slice(taken)
    if (this.pending.length === 0 && this.flushing !== null) {
      clearTimeout(this.flushing)
      this.flushing = null
    }
    this.carried += pairs.length
    return pairs
  }

  /**
   * The limit call that carried `releases` failed: they are kept and sent again, as a release call
   * of their own would be (send, releaseWorthRetrying): Redis restarted with its data, or a
   * failed-over replica that had the leases, refused those clients otherwise for up to a whole
   * leaseTtl. A call that timed out may yet run: removing a lease twice is harmless.
   */
  private carriedReleasesFailed (releases: LeaseReleases, err: unknown): void {
    if (!releaseWorthRetrying(err)) return
    const cut = (this.options.redis?.keyPrefix ?? '').length
    const pairs: Array<readonly [string, string]> = []
    for (const [key, member] of releases) pairs.push([key.slice(cut), member])
    this.keepUnsent(pairs, null)
  }

  private flush (): Array<Promise<unknown>> {
    this.flushing = null
    const batch = this.pending
    this.pending = []
    const pairs: Array<[string, string]> = []
    for (let i = 0; i < batch.length; i++) {
      const lease = batch[i] as HeldLease
      for (let k = 0; k < lease.keys.length; k++) pairs.push([lease.keys[k] as string, lease.member])
    }
    return this.send(pairs, [], 'release')
  }

  private startRenewing (): void {
    const every = Math.max(100, Math.floor(this.ttlMs / 3))
    if (this.renewer !== null && every === this.renewEveryMs) return
    if (this.renewer !== null) clearInterval(this.renewer)
    this.renewEveryMs = every
    this.renewer = setInterval(() => this.renew(), every)
    this.renewer.unref()
  }

  private renew (): void {
    if (this.held.length === 0) {
      if (this.renewer !== null) clearInterval(this.renewer)
      this.renewer = null
      return
    }
    const pairs: Array<[string, string]> = []
    const leases = this.held.slice()
    for (const lease of leases) for (const key of lease.keys) pairs.push([key, lease.member])
    const sent = this.send(pairs, [String(this.ttlMs)], 'renew')
    // A lease released while this round is out is released again once it is answered: the round
    // sent back to Redis after the release (as EVAL after NOSCRIPT, from a Redis that lost its
    // scripts, or again on reconnection) adds it again, as a renewal adds every lease Redis no
    // longer has, and the cap counted a request that had ended until the lease expired. A lease
    // in two rounds out at once is released after each (removing it twice is harmless).
    // close() waits for the rounds out, and sends such releases itself.
    if (sent.length > 0) {
      const round: Promise<unknown> = Promise.allSettled(sent).then(async () => {
        this.roundsOut.delete(round)
        await this.releaseAgain(leases)
      })
      this.roundsOut.add(round)
    }
    // a reload may have changed the TTL
    if (Math.max(100, Math.floor(this.ttlMs / 3)) !== this.renewEveryMs) this.startRenewing()
  }

  /**
   * A renewal round of `leases` is answered: those released while it was out go again, with the
   * next releases, or at once after close() (whose wait for the rounds out includes this send).
   */
  private async releaseAgain (leases: readonly HeldLease[]): Promise<void> {
    if (!this.closed) {
      for (const lease of leases) if (lease.released) this.queueRelease(lease)
      return
    }
    for (const lease of leases) if (lease.released) this.pending.push(lease)
    await Promise.allSettled(this.flush())
  }

  /** One call per batch (per hash slot under Cluster): KEYS = the keys, ARGV = `head` then the members. */
  private send (pairs: ReadonlyArray<readonly [string, string]>, head: readonly string[], what: 'release' | 'renew', releasedAt: ReadonlyMap<string, number> | null = null): Array<Promise<unknown>> {
    const redis = this.options.redis
    const sent: Array<Promise<unknown>> = []
    if (redis === undefined || pairs.length === 0) return sent
    const prefix = redis.keyPrefix ?? ''
    // No connection (the client sends nothing until it is ready again): a release waits for it.
    // Dropped, its lease stayed counted after its request ended, up to a whole leaseTtl: a Redis
    // restarted with its data or a failed-over replica refused that client meanwhile.
    if (what === 'release' && !(redis.client instanceof Cluster) && redis.client.status !== 'ready') {
      this.keepUnsent(pairs, releasedAt)
      return sent
    }
    // by the node the calls go to ('' for a standalone or Sentinel master), then by hash slot
    const byNode = new Map<string, Array<ReadonlyArray<readonly [string, string]>>>()
    const client = redis.client
    if (client instanceof Cluster) {
      const bySlot = new Map<number, Array<readonly [string, string]>>()
      for (const pair of pairs) {
        const slot = keySlot(prefix + pair[0])
        let group = bySlot.get(slot)
        if (group === undefined) bySlot.set(slot, group = [])
        group.push(pair)
      }
      for (const [slot, group] of bySlot) {
        const node = client.slots[slot]?.[0] ?? ''
        let groups = byNode.get(node)
        if (groups === undefined) byNode.set(node, groups = [])
        groups.push(group)
      }
    } else {
      byNode.set('', [pairs])
    }
    const commands = client as unknown as LeaseCommands
    let dropped: string | null = null
    for (const [node, groups] of byNode) {
      // A Redis that is stalled but still connected (paused, SIGSTOPped) answers nothing and fails
      // nothing: these calls would wait in the client without end. Beyond a bound of sends waiting
      // for one node (all of a send's calls to it, never some: a healthy Cluster master gets one
      // per slot) its calls are dropped, as a failed call is: those leases expire within leaseTtl.
      // Counted per node: under Cluster a send also holds calls to the healthy masters, which a
      // bound on whole sends dropped with the stalled one's.
      // Releases and renewals are bounded apart: releases sent every 10 ms through a stall filled
      // the bound shared with renewals, and every renewal round was dropped. A dropped release
      // only leaves its lease counted a while longer; a dropped renewal lets a lease of a request
      // still running expire, and the other instances admit past the cap.
      const slot = what === 'renew' ? `renew ${node}` : node
      const waiting = this.waitingFor.get(slot) ?? 0
      if (waiting >= MAX_WAITING_SENDS) {
        dropped = node
        continue
      }
      const calls: Array<Promise<unknown>> = []
      for (const group of groups) {
        for (let i = 0; i < group.length; i += BATCH) {
          const part = group.slice(i, i + BATCH)
          const args: string[] = []
          for (const [key] of part) args.push(prefix + key)
          args.push(...head)
          for (const [, member] of part) args.push(member)
          this.calls++
          const call = what === 'release' ? commands.gatewayLeaseRelease(part.length, ...args) : commands.gatewayLeaseRenew(part.length, ...args)
          calls.push(call.catch((err: unknown) => {
            if (what === 'release' && releaseWorthRetrying(err)) this.keepUnsent(part, releasedAt)
            this.options.onError?.(err, what)
          }))
        }
      }
      this.waitingFor.set(slot, waiting + 1)
      void Promise.allSettled(calls).then(() => {
        const left = (this.waitingFor.get(slot) ?? 1) - 1
        if (left > 0) this.waitingFor.set(slot, left)
        else this.waitingFor.delete(slot)
      })
      sent.push(...calls)
    }
    if (dropped !== null) {
      this.dropped++
      this.options.onError?.(new Error(`${MAX_WAITING_SENDS} lease ${what === 'release' ? 'releases' : 'renewals'} already wait for Redis${dropped === '' ? '' : ` (${dropped})`}: this ${what} dropped there, the leases expire within leaseTtl`), what)
    }
    if (sent.length > 0) {
      this.waiting++
      void Promise.allSettled(sent).then(() => { this.waiting-- })
    }
    return sent
  }

  /** `releasedAt`: when each lease (by member) was released, for releases sent again; else now. */
  private keepUnsent (pairs: ReadonlyArray<readonly [string, string]>, releasedAt: ReadonlyMap<string, number> | null): void {
    // after close: the connection is gone for good
    if (this.closed) return
    const now = Date.now()
    for (const [key, member] of pairs) this.unsent.push([key, member, releasedAt?.get(member) ?? now])
    const excess = this.unsent.length - (this.options.maxUnsent ?? MAX_UNSENT_RELEASES)
    if (excess > 0) {
      this.unsent.splice(0, excess)
      this.dropped++
      this.options.onError?.(new Error(`${this.unsent.length} releases already wait to be sent again: the ${excess} oldest dropped, their leases expire within leaseTtl`), 'release')
    }
    if (this.retrying !== null) return
    this.retrying = setTimeout(() => this.retryUnsent(), RELEASE_RETRY_MS)
    this.retrying.unref()
  }

  /** Sends again, in one send, the releases Redis could not take but those whose leases have expired by now. */
  private retryUnsent (): Array<Promise<unknown>> {
    if (this.retrying !== null) clearTimeout(this.retrying)
    this.retrying = null
    const now = Date.now()
    const pairs: Array<readonly [string, string]> = []
    const releasedAt = new Map<string, number>()
    for (const [key, member, at] of this.unsent) {
      if (now - at >= this.#longestTtlMs) continue
      pairs.push([key, member])
      releasedAt.set(member, at)
    }
    this.unsent = []
    return this.send(pairs, [], 'release', releasedAt)
  }

  /**
   * Stops renewing and gives back every lease still held or queued, waiting (at most `timeoutMs`)
   * for Redis to take them: a gateway that stops does not leave its leases to expire. The renewal
   * rounds still out are waited for too, and their leases given back again once they are answered
   * (a round sent again after the release put its lease back: releaseAgain).
   */
  async close (timeoutMs = 1000): Promise<void> {
    if (this.renewer !== null) clearInterval(this.renewer)
    this.renewer = null
    if (this.flushing !== null) clearTimeout(this.flushing)
    for (const lease of this.held) {
      lease.released = true
      lease.heldAt = -1
      this.pending.push(lease)
    }
    this.held.length = 0
    this.heldByKey.clear()
    this.settleNoneHeld()
    const sent = [...this.flush(), ...this.retryUnsent(), ...this.roundsOut]
    this.closed = true
    if (sent.length === 0) return
    await waitAtMost(Promise.allSettled(sent), timeoutMs)
  }
}
