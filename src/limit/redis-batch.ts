// One Redis call per event-loop turn instead of one per request (issue 13). Limit requests made
// in the same turn wait in a queue that is sent when the turn's I/O callbacks are done
// (setImmediate): a lone request waits for no timer, and under load the requests parsed in one
// turn share one lua/limit-batch.lua call, decided in arrival order, each all or nothing, as one
// limit.lua call per request in that order would decide them. Standalone Redis and Sentinel
// only: under Cluster a batch would span hash slots (src/limit/redis-store.ts groups by slot).
import { batchKeysAndArgs, limitArgs, parseBatchReply, parseLimitReply, type BatchedRequest, type LimitReply, type ReleaseCarrier } from './scripts.js'
import type { LimitCheck } from './types.js'

/** The script calls the batcher makes: limit.lua for a lone request, limit-batch.lua for more. */
export interface BatchCommands {
  gatewayLimit(numKeys: number, ...keysAndArgs: Array<string | number>): Promise<unknown>
  /** limit-batch.lua with its reply as bytes (ioredis makes a *Buffer twin of every script command) */
  gatewayLimitBatchBuffer(numKeys: number, ...keysAndArgs: Array<string | number>): Promise<unknown>
}

export type DecideOne = (keys: readonly string[], checks: readonly LimitCheck[], id: string, nowOverrideUs: number) => Promise<LimitReply>

interface Waiting extends BatchedRequest {
  resolve (reply: LimitReply): void
  reject (err: unknown): void
}

/** Most requests in one call: bounds the script's run time (Redis runs nothing else meanwhile). */
export const DEFAULT_MAX_BATCH = 64

/**
 * `releases`: the lease releases waiting to be sent (src/limit/concurrency.ts). They ride with the
 * next call, removed by the script before it decides anything, instead of costing a call and a
 * reply of their own; a call that fails hands them back (`failed`), as a failed release call of
 * their own would be kept for the connection's return.
 */
export function createLimitBatcher (commands: BatchCommands, maxBatch = DEFAULT_MAX_BATCH, releases: ReleaseCarrier | null = null): DecideOne {
  let queue: Waiting[] = []
  let queueNow = 0
  let scheduled = false

  const send = (): void => {
    const batch = queue
    queue = []
    if (batch.length === 0) return
    const now = queueNow
    const riding = releases?.take() ?? null
    if (batch.length === 1 && riding === null) {
      const r = batch[0] as Waiting
      commands.gatewayLimit(r.keys.length, ...r.keys, ...limitArgs(r.checks, r.id, now)).then(
        (reply) => { settleOne(r, reply) },
        (err: unknown) => { r.reject(err) })
      return
    }
    const { numKeys, keysAndArgs } = batchKeysAndArgs(batch, now, riding ?? undefined)
    commands.gatewayLimitBatchBuffer(numKeys, ...keysAndArgs).then((reply) => {
      let replies: LimitReply[]
      try {
        replies = parseBatchReply(reply, batch)
      } catch (err) {
        for (const r of batch) r.reject(err)
        return
      }
      for (let i = 0; i < batch.length; i++) (batch[i] as Waiting).resolve(replies[i] as LimitReply)
    }, (err: unknown) => {
      if (riding !== null) (releases as ReleaseCarrier).failed(riding, err)
      // a failed batch fails each of its requests: each goes to its own onError path, as one call would
      for (const r of batch) r.reject(err)
    })
  }

  const onTurnEnd = (): void => {
    scheduled = false
    send()
  }

  return (keys, checks, id, nowOverrideUs) => new Promise<LimitReply>((resolve, reject) => {
    // a test clock that moved between two requests of one turn: they are not one instant
    if (queue.length > 0 && nowOverrideUs !== queueNow) send()
    queue.push({ keys, checks, id, resolve, reject })
    queueNow = nowOverrideUs
    if (queue.length >= maxBatch) send()
    else if (!scheduled) {
      scheduled = true
      setImmediate(onTurnEnd)
    }
  })
}

function settleOne (r: Waiting, reply: unknown): void {
  let parsed: LimitReply
  try {
    parsed = parseLimitReply(reply, r.checks.length, r.id)
  } catch (err) {
    r.reject(err)
    return
  }
  r.resolve(parsed)
}
