// Each instance announces itself every `intervalMs`; the live count is remembered so that it is
// still known (last value seen) while Redis is unreachable, which is exactly when it is needed.
import { readFileSync } from 'node:fs'
import { randomUUID } from 'node:crypto'
import type { Cluster, Redis } from 'ioredis'
import { waitAtMost } from '../wait-at-most.js'

const SCRIPT = readFileSync(new URL('../../lua/heartbeat.lua', import.meta.url), 'utf8')

export class InstanceHeartbeat {
  readonly id = randomUUID()
  private count = 1
  /** When readings below `count` began (null: the last reading was not below it). */
  private lowSince: number | null = null
  private timer: NodeJS.Timeout | null = null

  constructor (
    private readonly client: Redis | Cluster,
    private readonly key: string,
    private readonly intervalMs = 2000
  ) {}

  start (): void {
    if (this.timer !== null) return
    void this.beat()
    this.timer = setInterval(() => { void this.beat() }, this.intervalMs)
    this.timer.unref()
  }

  /** Live instances at the last successful heartbeat (1 before the first). */
  get instances (): number {
    return this.count
  }

  /**
   * Beats wait for nothing else: a Redis that is stalled but connected (paused, SIGSTOPped)
   * answers no beat and fails none, so a beat is not sent while the one before it waits; they
   * piled up in the client, one per interval, for as long as the stall lasted.
   */
  private beating: Promise<void> | null = null

  /** Resolved once this beat, or the one still waiting when it was asked for, is answered or failed. */
  beat (): Promise<void> {
    this.beating ??= this.beatOnce().finally(() => { this.beating = null })
    return this.beating
  }

  private async beatOnce (): Promise<void> {
    try {
      const n = await this.client.eval(SCRIPT, 1, this.key, this.id, String(this.intervalMs * 3))
      if (typeof n === 'number' && n > 0) this.observe(n, Date.now())
    } catch {
      // Redis away: keep the last known count (see RedisGuard).
    }
  }

  /**
   * A lower count is believed only once it has held for a whole interval: a Redis restarted empty
   * (or a replica promoted before every instance beat on it) shows this instance alone until the
   * others beat again, and the fallback would then hand each instance the whole budget.
   */
  observe (n: number, nowMs: number): void {
    if (n >= this.count) {
      this.count = n
      this.lowSince = null
    } else if (this.lowSince === null) {
      this.lowSince = nowMs
    } else if (nowMs - this.lowSince >= this.intervalMs) {
      this.count = n
      this.lowSince = null
    }
  }

  /**
   * Takes this instance off the count, waiting at most `timeoutMs`: a stalled Redis (paused,
   * SIGSTOPped, still connected) never answers, and a shutdown that waited for it never ended
   * (SIGTERM left the gateway running until the supervisor's SIGKILL).
   */
  async stop (timeoutMs = 1000): Promise<void> {
    if (this.timer !== null) clearInterval(this.timer)
    this.timer = null
    // best effort: the entry expires by itself
    await waitAtMost(this.client.zrem(this.key, this.id), timeoutMs)
  }
}
