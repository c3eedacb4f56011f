import { randomBytes } from 'node:crypto'
import { Cluster, type Redis } from 'ioredis'
import { assertDecidable } from './algorithms/index.js'
import { keySlot } from './keys.js'
import { createLimitBatcher, DEFAULT_MAX_BATCH } from './redis-batch.js'
import { createScriptCommands } from './redis-functions.js'
import { chargeArgs, limitArgs, parseLimitReply, refundArgs, type LimitReply, type ReleaseCarrier } from './scripts.js'
import { NO_CHECKS, longer, type LimitCheck, type LimitDecision, type LimitStore } from './types.js'

// The shared store: every check of a request decided by one call of lua/limit.lua.
//
// Standalone / Sentinel: one atomic call decides all checks, all or nothing.
// Redis Cluster: one script call can only touch one hash slot, and the keys deliberately spread
// over slots (src/limit/keys.ts). Checks are grouped by slot and the groups decided in parallel;
// if one group rejects, lua/refund.lua undoes exactly what the admitting groups recorded.
// Guarantee: never over-admit. At worst a concurrent request is rejected while a refund is in
// flight (a brief under-admit), or, if a refund fails, the budget stays consumed until it expires.
//
// No timeouts, circuit breaking or fallbacks here: a failed call rejects with the ioredis error
// and the caller (src/limit/redis-guard.ts) decides what to do.

export { limitKey } from './keys.js'

const decisionOf = (d: DetailedDecision): LimitDecision => d.decision
const NONE: DetailedDecision = Object.freeze({ decision: NO_CHECKS, remainings: [], callId: '' })

export interface RedisStoreOptions {
  /** Used, not owned: close() leaves it connected (whoever created it disconnects it). */
  readonly client: Redis | Cluster
  /** Prepended verbatim to every check key (e.g. an environment namespace). Default: none. */
  readonly keyPrefix?: string
  /** Tests only: a clock in µs passed to the scripts as their now override. Production reads Redis TIME. */
  readonly nowUs?: () => number
  /**
   * Receives errors that did not change the answer (Cluster only): a failed refund, or a slot
   * group that failed while another had already rejected the request.
   */
  readonly onBackgroundError?: (err: unknown) => void
  /** Namespace of the refund markers (lua/refund.lua). Default 'gw'. */
  readonly markerPrefix?: string
  /**
   * Most limit requests of one event-loop turn sent in one call (lua/limit-batch.lua); 1 sends
   * one call per request. Standalone and Sentinel only; Cluster always calls per slot group.
   */
  readonly maxBatch?: number
  /** The server refused the function library (src/limit/redis-functions.ts): told once, with its error. */
  readonly onFunctionsRefused?: (reason: unknown) => void
}

/** Redis Cluster: slot groups whose call failed (a check of each), the first reason and each one's. */
export interface FailedGroups {
  readonly checks: readonly number[]
  readonly reason: unknown
  readonly reasons: readonly unknown[]
}

/** A decision and every check's budget left, in the order of the checks (-1 = unknown). */
export interface DetailedDecision {
  readonly decision: LimitDecision
  readonly remainings: readonly number[]
  /** The id this call recorded under: the member of every concurrency lease it took (lua/lease.lua). */
  readonly callId: string
  /**
   * Redis Cluster: a check of each slot group that failed while another group's rejection is the
   * answer, the first failure and every group's. Their masters did not answer: the guard counts a
   * failure on their breakers.
   */
  readonly failed?: FailedGroups
}

export interface RedisStore extends LimitStore {
  readonly kind: 'redis'
  decide(checks: readonly LimitCheck[], requestId: string): Promise<LimitDecision>
  /**
   * As decide, with every check's remaining (a Cluster slot that failed reports -1): what the
   * `onError: local` fallback starts from when Redis goes away.
   */
  decideDetailed(checks: readonly LimitCheck[], requestId: string): Promise<DetailedDecision>
  /**
   * The id the last decide or decideDetailed call recorded under (its leases' member), read right
   * after the call: a call whose answer is lost still names the leases Redis may have taken.
   */
  readonly lastCallId: string
  /**
   * Records units admitted elsewhere (each check's cost = the units), even beyond the limit:
   * the `onError: local` fallback's debt, written back once Redis answers again. Written in
   * pieces; a piece that fails rejects the whole with a ChargeError naming its checks.
   */
  charge(checks: readonly LimitCheck[]): Promise<void>
  /**
   * Lets lease releases ride with the limit calls (one script call carries both): the carrier is
   * asked for the waiting releases as each call is sent, and told of a call that failed with them.
   * False when this store does not batch (Redis Cluster, maxBatch 1): the caller then sends its
   * releases itself.
   */
  carryReleases(carrier: ReleaseCarrier): boolean
}

// A short hash tag per Cluster slot, found once by search: a refund's marker key must live in the
// slot of the keys it refunds, which carry no hash tag of their own (src/limit/keys.ts).
let slotTags: string[] | null = null
function slotTag (slot: number): string {
  if (slotTags === null) {
    const tags: string[] = new Array(16384)
    let found = 0
    for (let i = 0; found < 16384; i++) {
      const tag = i.toString(36)
      const s = keySlot(tag)
      if (tags[s] === undefined) {
        tags[s] = tag
        found++
      }
    }
    slotTags = tags
  }
  return slotTags[slot] as string
}

/** Most keys per charge call: a long outage's debt is written in bounded pieces. */
const CHARGE_BATCH = 256

/** A charge whose pieces did not all land: `unwritten` are the checks of the pieces that failed. */
export class ChargeError extends Error {
  constructor (readonly unwritten: readonly LimitCheck[], readonly reason: unknown) {
    super(reason instanceof Error ? reason.message : String(reason))
  }
}

/**
 * Redis Cluster: a decision that failed in some slot groups (and was refused by none). `failed`
 * holds a check of each failing group: only their masters failed, the others answered. `reason`
 * is the first group's failure, `reasons` every failing group's, in the order of `failed`.
 */
export class SlotGroupError extends Error {
  constructor (readonly failed: readonly number[], readonly reasons: readonly unknown[]) {
    const reason = reasons[0]
    super(reason instanceof Error ? reason.message : String(reason))
  }

  get reason (): unknown { return this.reasons[0] }
}

interface Group {
  /** Indexes into the request's checks, ascending. */
  readonly indexes: number[]
  readonly keys: string[]
  readonly checks: LimitCheck[]
}

export function createRedisStore (options: RedisStoreOptions): RedisStore {
  const { client, keyPrefix = '', nowUs, onBackgroundError, markerPrefix = 'gw', maxBatch = DEFAULT_MAX_BATCH, onFunctionsRefused } = options
  // FCALL of the function library, or EVALSHA of the same code where functions are not to be had
  const commands = createScriptCommands(client, onFunctionsRefused)
  const isCluster = client instanceof Cluster
  let releaseCarrier: ReleaseCarrier | null = null
  const batched = isCluster || maxBatch <= 1
    ? null
    : createLimitBatcher(commands, maxBatch, {
      take: () => releaseCarrier?.take() ?? null,
      failed: (releases, err) => releaseCarrier?.failed(releases, err)
    })

  // Request ids are not trusted to be unique (a client may send its own X-Request-Id, or the
  // same one twice): a per-store tag and counter make every call's log members unique, and the
  // id is truncated so a huge header cannot bloat the sorted sets.
  const tag = randomBytes(4).toString('hex')
  let sequence = 0
  let lastCallId = ''
  const callId = (requestId: string): string => `${requestId.slice(0, 64)}~${tag}${(sequence++).toString(36)}`

  async function limit (keys: readonly string[], checks: readonly LimitCheck[], id: string, now: number): Promise<LimitReply> {
    const reply = await commands.gatewayLimit(keys.length, ...keys, ...limitArgs(checks, id, now))
    return parseLimitReply(reply, checks.length, id)
  }

  async function decideAcrossSlots (keys: string[], checks: readonly LimitCheck[], id: string, now: number): Promise<DetailedDecision> {
    const bySlot = new Map<number, Group>()
    keys.forEach((key, i) => {
      const slot = keySlot(key)
      let group = bySlot.get(slot)
      if (group === undefined) bySlot.set(slot, group = { indexes: [], keys: [], checks: [] })
      group.indexes.push(i)
      group.keys.push(key)
      group.checks.push(checks[i] as LimitCheck)
    })
    const groups = [...bySlot.entries()]
    if (groups.length === 1) return await limit(keys, checks, id, now)
    const remainings: number[] = new Array(checks.length).fill(-1)

    const settled = await Promise.allSettled(groups.map(([, g]) => limit(g.keys, g.checks, id, now)))
    let failure: { reason: unknown } | undefined
    const failed: number[] = []
    const reasons: unknown[] = []
    let rejecting: { index: number, decision: LimitDecision } | undefined
    let tightest: { index: number, decision: LimitDecision } | undefined
    let delayMs = 0
    const admitted: Array<{ slot: number, group: Group, receipts: readonly number[] }> = []
    settled.forEach((s, g) => {
      const [slot, group] = groups[g] as [number, Group]
      if (s.status === 'rejected') {
        failure ??= { reason: s.reason }
        failed.push(group.indexes[0] as number)
        reasons.push(s.reason)
        return
      }
      const { decision, receipts } = s.value
      group.indexes.forEach((checkIndex, j) => { remainings[checkIndex] = s.value.remainings[j] as number })
      const index = group.indexes[decision.limitingIndex] as number
      if (!decision.allowed) {
        if (rejecting === undefined || longer(decision.retryAfterMs, rejecting.decision.retryAfterMs) ||
          (decision.retryAfterMs === rejecting.decision.retryAfterMs && index < rejecting.index)) {
          rejecting = { index, decision }
        }
        return
      }
      admitted.push({ slot, group, receipts })
      delayMs = Math.max(delayMs, decision.delayMs)
      if (tightest === undefined || decision.remaining < tightest.decision.remaining ||
        (decision.remaining === tightest.decision.remaining && index < tightest.index)) {
        tightest = { index, decision }
      }
    })

    if (failure === undefined && rejecting === undefined) {
      const t = tightest as { index: number, decision: LimitDecision }
      return { decision: { ...t.decision, limitingIndex: t.index, delayMs, remainings }, remainings, callId: id }
    }
    // All or nothing: give back what the admitting groups recorded. Not waited for: a master that
    // stops answering after it admitted would hold the answer past the guard's timeout, whose
    // fallback might admit what Redis refused. Each refund is queued on its master's connection
    // before the answer, so this instance's next call to that master comes after it. The admitting
    // groups' remainings count units about to come back: conservative.
    for (const { slot, group, receipts } of admitted) {
      commands.gatewayLimitRefund(group.keys.length + 1, ...group.keys, `${markerPrefix}:refund:{${slotTag(slot)}}:${id}`,
        ...refundArgs(group.checks, receipts, id, now)).catch((err: unknown) => { onBackgroundError?.(err) })
    }
    // A known rejection is the answer even if another group failed: throwing would send the
    // caller to its fallback, which might admit what Redis already refused.
    if (rejecting !== undefined) {
      const decision = { ...rejecting.decision, limitingIndex: rejecting.index }
      if (failure === undefined) return { decision, remainings, callId: id }
      onBackgroundError?.(failure.reason)
      return { decision, remainings, callId: id, failed: { checks: failed, reason: failure.reason, reasons } }
    }
    throw new SlotGroupError(failed, reasons)
  }

  // Not an async function: the gateway's request already waits in the guard's and the limiter's
  // async frames, and one more activation per decision showed in the batcher's profile.
  function decideDetailed (checks: readonly LimitCheck[], requestId: string): Promise<DetailedDecision> {
    if (checks.length === 0) {
      lastCallId = ''
      return Promise.resolve(NONE)
    }
    try {
      assertDecidable(checks)
    } catch (err) {
      lastCallId = ''
      return Promise.reject(err)
    }
    const id = lastCallId = callId(requestId)
    const now = nowUs?.() ?? 0
    const keys = checks.map((c) => keyPrefix + c.key)
    if (isCluster) return decideAcrossSlots(keys, checks, id, now)
    // a script's reply is the detailed decision itself (LimitReply): no promise more to map it
    return batched !== null ? batched(keys, checks, id, now) : limit(keys, checks, id, now)
  }

  return {
    kind: 'redis',
    decide (checks, requestId) {
      return decideDetailed(checks, requestId).then(decisionOf)
    },
    decideDetailed,
    get lastCallId () { return lastCallId },
    async charge (checks) {
      if (checks.length === 0) return
      assertDecidable(checks)
      const now = nowUs?.() ?? 0
      const batches: LimitCheck[][] = []
      if (isCluster) {
        const bySlot = new Map<number, LimitCheck[]>()
        for (const c of checks) {
          const slot = keySlot(keyPrefix + c.key)
          let batch = bySlot.get(slot)
          if (batch === undefined) bySlot.set(slot, batch = [])
          batch.push(c)
        }
        for (const batch of bySlot.values()) for (let i = 0; i < batch.length; i += CHARGE_BATCH) batches.push(batch.slice(i, i + CHARGE_BATCH))
      } else {
        for (let i = 0; i < checks.length; i += CHARGE_BATCH) batches.push(checks.slice(i, i + CHARGE_BATCH))
      }
      const settled = await Promise.allSettled(batches.map((batch) =>
        commands.gatewayLimitCharge(batch.length, ...batch.map((c) => keyPrefix + c.key), ...chargeArgs(batch, callId('debt'), now))))
      const unwritten: LimitCheck[] = []
      let reason: unknown = null
      for (let i = 0; i < settled.length; i++) {
        const s = settled[i] as PromiseSettledResult<unknown>
        if (s.status === 'fulfilled') continue
        reason ??= s.reason
        for (const c of batches[i] as LimitCheck[]) unwritten.push(c)
      }
      if (unwritten.length > 0) throw new ChargeError(unwritten, reason)
    },
    carryReleases (carrier) {
      if (batched === null) return false
      releaseCarrier = carrier
      return true
    },
    async close () {
      // Nothing of its own to release: the client belongs to the caller.
    }
  }
}
