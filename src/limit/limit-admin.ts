// What the admin API does to the shared level (issue 9): read a client's limits without consuming
// anything, reset them, and tell every gateway instance to drop its local state for that client.
import { createHash } from 'node:crypto'
import { Cluster, type Redis } from 'ioredis'
import { PEEK_SCRIPT, limitArgs } from './scripts.js'
import { replyCode } from './redis-client.js'
import type { LimitCheck, PeekResult } from './types.js'

const PEEK_SHA = createHash('sha1').update(PEEK_SCRIPT).digest('hex')

/**
 * Bound on each admin call to Redis. The gateway's clients fail at once while disconnected
 * (enableOfflineQueue: false), but a Redis that stalls (paused, overloaded) keeps the connection
 * and would leave the operator's request hanging.
 */
export const ADMIN_REDIS_TIMEOUT_MS = 1000

async function bounded<T> (p: Promise<T>, what: string, ms = ADMIN_REDIS_TIMEOUT_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`Redis did not answer ${what} within ${ms} ms`)), ms)
  })
  try {
    return await Promise.race([p, late])
  } finally {
    clearTimeout(timer)
  }
}

/**
 * Each check read by lua/peek.lua through EVALSHA_RO: Redis refuses any write from it, so reading
 * can never spend budget. One key per call keeps every call in one slot (Redis Cluster).
 */
export async function peekRedis (client: Redis | Cluster, checks: readonly LimitCheck[], nowOverrideUs = 0): Promise<PeekResult[]> {
  return await bounded(Promise.all(checks.map(async (check) => {
    const args = [1, check.key, ...limitArgs([check], 'peek', nowOverrideUs)]
    let reply: unknown
    try {
      reply = await client.call('EVALSHA_RO', PEEK_SHA, ...args)
    } catch (err) {
      if (replyCode(err) !== 'NOSCRIPT') throw err
      reply = await client.call('EVAL_RO', PEEK_SCRIPT, ...args)
    }
    if (!Array.isArray(reply) || reply.length !== 3 || !reply.every(v => typeof v === 'number')) {
      throw new TypeError(`unexpected reply from peek.lua: ${JSON.stringify(reply)}`)
    }
    const [remaining, resetMs, retryAfterMs] = reply as [number, number, number]
    return { remaining, resetMs, retryAfterMs }
  })), 'the read')
}

/** Deletes the keys one by one (each its own slot under Cluster); resolves with how many existed. */
export async function deleteRedisKeys (client: Redis | Cluster, keys: readonly string[]): Promise<number> {
  const counts = await bounded(Promise.all(keys.map(async (k) => await client.del(k))), 'the deletion')
  return counts.reduce((a, b) => a + b, 0)
}

/** What a reset did: the Redis keys that existed, the instances told, or why Redis could not be reached. */
export interface ResetOutcome {
  /** Keys deleted; null when Redis did not answer (then the keys may still hold the old state). */
  readonly deleted: number | null
  /** Instances that received the reset over pub/sub; null on Cluster or when Redis did not answer. */
  readonly instances: number | null
  /** Set when Redis failed: only this process's local state (and its Redis fallback) was reset. */
  readonly redisError?: string
}

/** What one reset asks every instance to forget. */
export interface ResetMessage {
  /** The client's address key: its local-level bucket is refilled. Null = no IP given. */
  readonly ipKey: string | null
  /** Deny-cache entries to lift (src/limit/limiter.ts denyKey). */
  readonly denyKeys: readonly string[]
  /** Limit keys (the in-process stores forget them too). */
  readonly keys: readonly string[]
}

export function parseResetMessage (text: string): ResetMessage | null {
  try {
    const m = JSON.parse(text) as Partial<ResetMessage>
    const strings = (v: unknown): v is string[] => Array.isArray(v) && v.every(s => typeof s === 'string')
    if ((m.ipKey !== null && typeof m.ipKey !== 'string') || !strings(m.denyKeys) || !strings(m.keys)) return null
    return { ipKey: m.ipKey, denyKeys: m.denyKeys, keys: m.keys }
  } catch {
    return null
  }
}

/**
 * Resets travel over Redis pub/sub: every instance subscribes with its own connection (a
 * subscribed connection can run nothing else) and applies what it receives, its own resets included.
 */
export class ResetBus {
  private subscriber: Redis | Cluster | null = null

  constructor (
    private readonly client: Redis | Cluster,
    readonly channel: string,
    private readonly apply: (message: ResetMessage) => void,
    private readonly onError: (err: Error) => void
  ) {}

  start (): void {
    const c = this.client
    // ioredis's own resubscription after a reconnect is off: it sends SUBSCRIBE with nobody to
    // catch its failure, and when the bus is stopped during a reconnect's handshake (a reload
    // after a Redis blip) Redis still answers INFO, the connection turns ready with its stream
    // closed, and the rejected call ended the process. The 'ready' listener below does its work.
    // Under Cluster, SUBSCRIBE (idempotent, unlike a limit call) is sent again when its connection
    // closes under it: ioredis's default, which the limit client turns off (retryDelayOnFailover).
    const sub: Redis | Cluster = c instanceof Cluster
      ? c.duplicate([], { retryDelayOnFailover: 100 })
      : c.duplicate({ autoResubscribe: false })
    sub.on('error', this.onError)
    sub.on('message', (channel: string, text: string) => {
      if (channel !== this.channel) return
      const message = parseResetMessage(text)
      if (message !== null) this.apply(message)
    })
    // The gateway's clients queue nothing while disconnected (enableOfflineQueue: false), so the
    // subscription is made once connected, and again after every reconnect.
    sub.on('ready', () => { sub.subscribe(this.channel).catch(this.onError) })
    this.subscriber = sub
  }

  /**
   * Resolves with the number of instances that received it (PUBLISH's answer), or null on Redis
   * Cluster: there PUBLISH reaches every node but counts only the subscribers of the node it ran on.
   */
  async publish (message: ResetMessage): Promise<number | null> {
    const received = await bounded(this.client.publish(this.channel, JSON.stringify(message)), 'the publish')
    return this.client instanceof Cluster ? null : received
  }

  stop (): void {
    this.subscriber?.disconnect()
    this.subscriber = null
  }
}
