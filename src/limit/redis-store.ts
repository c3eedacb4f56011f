import { randomBytes } from 'node:crypto'
import { Cluster, type Redis } from 'ioredis'
import { assertDecidable } from './algorithms/index.js'
import { keySlot } from './keys.js'
import { NO_CHECKS, longer } from './memory-store.js'
import { LIMIT_SCRIPT, REFUND_SCRIPT, limitArgs, parseLimitReply, refundArgs, type LimitReply } from './scripts.js'
import type { LimitCheck, LimitDecision, LimitStore } from './types.js'

// The shared store: every check of a request decided by one call of lua/limit.lua.
//
// Standalone / Sentinel: one atomic call decides all checks, all or nothing.
// Redis Cluster: one script call can only touch one hash slot, and the keys deliberately spread
// over slots (src/limit/keys.ts). Checks are grouped by slot and the groups decided in parallel;
// if any group rejects, lua/refund.lua undoes exactly what the admitting groups recorded.
// Guarantee: never over-admit. At worst a concurrent request is rejected while a refund is in
// flight (a brief under-admit), or, if a refund fails, the budget stays consumed until it expires.
//
// No timeouts, circuit breaking or fallbacks here: a failed call rejects with the ioredis error
// and the caller (src/limit/redis-guard.ts) decides what to do.

export { limitKey } from './keys.js'

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
}

export interface RedisStore extends LimitStore {
  readonly kind: 'redis'
  decide(checks: readonly LimitCheck[], requestId: string): Promise<LimitDecision>
}

interface ScriptCommands {
  gatewayLimit(numKeys: number, ...keysAndArgs: Array<string | number>): Promise<unknown>
  gatewayLimitRefund(numKeys: number, ...keysAndArgs: Array<string | number>): Promise<unknown>
}

interface Group {
  /** Indexes into the request's checks, ascending. */
  readonly indexes: number[]
  readonly keys: string[]
  readonly checks: LimitCheck[]
}

export function createRedisStore (options: RedisStoreOptions): RedisStore {
  const { client, keyPrefix = '', nowUs, onBackgroundError } = options
  // defineCommand sends EVALSHA and falls back to EVAL on NOSCRIPT (a restarted or flushed
  // server), per connection; the script text is only sent when the server lacks it.
  client.defineCommand('gatewayLimit', { lua: LIMIT_SCRIPT })
  client.defineCommand('gatewayLimitRefund', { lua: REFUND_SCRIPT })
  const commands = client as unknown as ScriptCommands
  const isCluster = client instanceof Cluster

  // Request ids are not trusted to be unique (a client may send its own X-Request-Id, or the
  // same one twice): a per-store tag and counter make every call's log members unique, and the
  // id is truncated so a huge header cannot bloat the sorted sets.
  const tag = randomBytes(4).toString('hex')
  let sequence = 0
  const callId = (requestId: string): string => `${requestId.slice(0, 64)}~${tag}${(sequence++).toString(36)}`

  async function limit (keys: readonly string[], checks: readonly LimitCheck[], id: string, now: number): Promise<LimitReply> {
    const reply = await commands.gatewayLimit(keys.length, ...keys, ...limitArgs(checks, id, now))
    return parseLimitReply(reply, checks.length)
  }

  async function decideAcrossSlots (keys: string[], checks: readonly LimitCheck[], id: string, now: number): Promise<LimitDecision> {
    const bySlot = new Map<number, Group>()
    keys.forEach((key, i) => {
      const slot = keySlot(key)
      let group = bySlot.get(slot)
      if (group === undefined) bySlot.set(slot, group = { indexes: [], keys: [], checks: [] })
      group.indexes.push(i)
      group.keys.push(key)
      group.checks.push(checks[i] as LimitCheck)
    })
    const groups = [...bySlot.values()]
    if (groups.length === 1) return (await limit(keys, checks, id, now)).decision

    const settled = await Promise.allSettled(groups.map((g) => limit(g.keys, g.checks, id, now)))
    let failure: { reason: unknown } | undefined
    let rejecting: { index: number, decision: LimitDecision } | undefined
    let tightest: { index: number, decision: LimitDecision } | undefined
    let delayMs = 0
    const admitted: Array<{ group: Group, receipts: readonly number[] }> = []
    settled.forEach((s, g) => {
      const group = groups[g] as Group
      if (s.status === 'rejected') {
        failure ??= { reason: s.reason }
        return
      }
      const { decision, receipts } = s.value
      const index = group.indexes[decision.limitingIndex] as number
      if (!decision.allowed) {
        if (rejecting === undefined || longer(decision.retryAfterMs, rejecting.decision.retryAfterMs) ||
          (decision.retryAfterMs === rejecting.decision.retryAfterMs && index < rejecting.index)) {
          rejecting = { index, decision }
        }
        return
      }
      admitted.push({ group, receipts })
      delayMs = Math.max(delayMs, decision.delayMs)
      if (tightest === undefined || decision.remaining < tightest.decision.remaining ||
        (decision.remaining === tightest.decision.remaining && index < tightest.index)) {
        tightest = { index, decision }
      }
    })

    if (failure === undefined && rejecting === undefined) {
      const t = tightest as { index: number, decision: LimitDecision }
      return { ...t.decision, limitingIndex: t.index, delayMs }
    }
    // All or nothing: give back what the admitting groups recorded before answering.
    const refunds = await Promise.allSettled(admitted.map(({ group, receipts }) =>
      commands.gatewayLimitRefund(group.keys.length, ...group.keys, ...refundArgs(group.checks, receipts, id, now))))
    for (const r of refunds) if (r.status === 'rejected') onBackgroundError?.(r.reason)
    // A known rejection is the answer even if another group failed: throwing would send the
    // caller to its fallback, which might admit what Redis already refused.
    if (rejecting !== undefined) {
      if (failure !== undefined) onBackgroundError?.(failure.reason)
      return { ...rejecting.decision, limitingIndex: rejecting.index }
    }
    throw (failure as { reason: unknown }).reason
  }

  return {
    kind: 'redis',
    async decide (checks, requestId) {
      if (checks.length === 0) return NO_CHECKS
      assertDecidable(checks)
      const id = callId(requestId)
      const now = nowUs?.() ?? 0
      const keys = checks.map((c) => keyPrefix + c.key)
      if (isCluster) return await decideAcrossSlots(keys, checks, id, now)
      return (await limit(keys, checks, id, now)).decision
    },
    async close () {
      // Nothing of its own to release: the client belongs to the caller.
    }
  }
}
