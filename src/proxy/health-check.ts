// Active health checks: a GET of a configured path to each target of an upstream, every interval,
// on a connection of its own (never one of the forwarding pool's, never counted against
// maxConnections, never queued, limited or access-logged). `unhealthyAfter` failed probes in a
// row take a target out of rotation, `healthyAfter` passed ones bring it back. The state sits on
// the target beside passive ejection (src/proxy/upstream-pool.ts): a target takes traffic only
// while neither says no.
import http from 'node:http'
import https from 'node:https'
import { MAX_TIMER_MS } from '../wait-at-most.js'

/** An upstream's `healthCheck` as compiled from the config; every field is defaulted. */
export interface HealthCheckConfig {
  /** Path (and query) of the probe, sent as written. */
  readonly path: string
  readonly intervalMs: number
  /** A probe without its complete answer (head and the capped body) in this time fails. */
  readonly timeoutMs: number
  readonly unhealthyAfter: number
  readonly healthyAfter: number
  /** The Host header of a probe; null: the target's authority. */
  readonly host: string | null
  /** Inclusive [low, high] status ranges a passing probe answers with. */
  readonly expectStatus: ReadonlyArray<readonly [number, number]>
}

/** What probes decided about one target, kept across reloads for a target that persists. */
export interface ActiveHealth {
  /** False while failed probes hold the target out of rotation. */
  healthy: boolean
  /** Probes passed in a row (0 after a failure). */
  passes: number
  /** Probes failed in a row (0 after a pass). */
  failures: number
  /** Why the last failed probe failed ("status 503", "timeout", "connect refused"); null before any failure. */
  lastFailure: string | null
}

/** The state every target starts in: healthy, so that the gateway serves at once. */
export function initialActiveHealth (): ActiveHealth {
  return { healthy: true, passes: 0, failures: 0, lastFailure: null }
}

/**
 * Counts one probe's result into `state`. Returns 'down' or 'up' when the target changes sides,
 * null otherwise: a healthy target leaves after `unhealthyAfter` failures in a row, an unhealthy
 * one returns after `healthyAfter` passes in a row.
 */
export function countProbe (state: ActiveHealth, failure: string | null, config: Pick<HealthCheckConfig, 'unhealthyAfter' | 'healthyAfter'>): 'down' | 'up' | null {
  if (failure === null) {
    state.failures = 0
    state.passes++
    if (!state.healthy && state.passes >= config.healthyAfter) {
      state.healthy = true
      return 'up'
    }
    return null
  }
  state.passes = 0
  state.failures++
  state.lastFailure = failure
  if (state.healthy && state.failures >= config.unhealthyAfter) {
    state.healthy = false
    return 'down'
  }
  return null
}

/** Whether `status` is one of the expected ones. */
export function statusPasses (status: number, expect: HealthCheckConfig['expectStatus']): boolean {
  for (const [low, high] of expect) if (status >= low && status <= high) return true
  return false
}

/**
 * The wait before a target's next probe: the interval, give or take 10%, so that the targets of
 * an upstream (and the workers of a gateway, which probe on their own) drift apart instead of
 * probing in lockstep. The first probe of a target waits at most a tenth of the interval.
 */
export function probeDelay (intervalMs: number, first: boolean, random: () => number = Math.random): number {
  // at most the longest a timer waits: the schema takes an interval up to that, and 10% more of
  // one near it fired after 1 ms, so a target was probed as fast as the loop turned
  return Math.min(MAX_TIMER_MS, Math.round(first ? random() * intervalMs * 0.1 : intervalMs * (0.9 + 0.2 * random())))
}

/** Body bytes a probe reads before it stops listening: the status decides, the body is discarded. */
export const PROBE_BODY_CAP = 64 * 1024

/** Where and how to probe one target (the target's own fields, see UpstreamTarget). */
export interface ProbeTarget {
  readonly secure: boolean
  readonly hostname: string
  readonly port: number
  /** The target's authority (host[:port]), the default Host. */
  readonly authority: string
  /** TLS server name of an https target named by a host name (null for an address), as forwarding sends it. */
  readonly servername: string | null
}

/**
 * A probe the gateway could not send: no file descriptor was left for its connection (EMFILE,
 * ENFILE). The gateway's shortage, not the target's answer: neither a pass nor a failure.
 */
export const PROBE_NOT_SENT = 'not sent: out of file descriptors'

/** The reason a probe's request failed, as the log and /readyz give it. */
export function probeErrorReason (err: NodeJS.ErrnoException, timedOut: boolean): string {
  if (timedOut) return 'timeout'
  if (err.code === 'EMFILE' || err.code === 'ENFILE') return PROBE_NOT_SENT
  if (err.code === 'ECONNREFUSED') return 'connect refused'
  return `connect failed: ${err.code ?? err.message}`
}

/**
 * One probe: GET `config.path` on a new connection (so a probe also checks that the target takes
 * connections), the answer's body drained up to PROBE_BODY_CAP. Resolves null when it passed,
 * or why it failed. Never rejects; `signal` aborts it (the pool closing), which counts as nothing.
 */
export async function probe (target: ProbeTarget, config: HealthCheckConfig, signal: AbortSignal): Promise<string | null> {
  return await new Promise<string | null>(resolve => {
    let timedOut = false
    let settled = false
    const settle = (failure: string | null): void => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      signal.removeEventListener('abort', onAbort)
      req.destroy()
      resolve(failure)
    }
    const onAbort = (): void => settle('aborted')
    const options: https.RequestOptions = {
      host: target.hostname,
      port: target.port,
      path: config.path,
      method: 'GET',
      // agent false: a connection of its own, closed after the answer (nothing kept between probes)
      agent: false,
      headers: { host: config.host ?? target.authority, 'user-agent': 'edge-gateway-health-check', accept: '*/*', connection: 'close' },
      ...(target.servername === null ? {} : { servername: target.servername })
    }
    const req = (target.secure ? https : http).request(options, res => {
      let read = 0
      res.on('data', (chunk: Buffer) => {
        read += chunk.length
        // enough read: the status decides, the rest of a large body is not waited for
        if (read >= PROBE_BODY_CAP) settle(verdict(res.statusCode ?? 0))
      })
      res.on('end', () => settle(verdict(res.statusCode ?? 0)))
      res.on('error', (err: NodeJS.ErrnoException) => settle(probeErrorReason(err, timedOut)))
    })
    const verdict = (status: number): string | null => statusPasses(status, config.expectStatus) ? null : `status ${status}`
    req.on('error', (err: NodeJS.ErrnoException) => settle(probeErrorReason(err, timedOut)))
    const timer = setTimeout(() => {
      timedOut = true
      settle('timeout')
    }, config.timeoutMs)
    timer.unref()
    if (signal.aborted) settle('aborted')
    else signal.addEventListener('abort', onAbort, { once: true })
    req.end()
  })
}

/** Told of each probe's result and of each change of side. */
export interface HealthCheckListener {
  probed (target: string, failure: string | null): void
  changed (target: string, healthy: boolean, reason: string | null): void
}

/** A target as the checker sees it: where to probe it and where its state lives. */
export interface CheckedTarget extends ProbeTarget {
  readonly url: string
  active: ActiveHealth
}

/**
 * Probes each target of one pool on its own timer (unref'd: probes never hold the process open)
 * until stop(), which also aborts the probes in flight. A target is never probed twice at once:
 * its next probe is scheduled when the previous one ended.
 */
export class HealthChecker {
  readonly #timers = new Map<CheckedTarget, NodeJS.Timeout>()
  readonly #abort = new AbortController()
  #stopped = false

  constructor (
    private readonly config: HealthCheckConfig,
    private readonly targets: readonly CheckedTarget[],
    private readonly onChange: (target: CheckedTarget, change: 'down' | 'up') => void,
    private readonly listener: HealthCheckListener | null
  ) {}

  start (): void {
    for (const target of this.targets) this.#schedule(target, probeDelay(this.config.intervalMs, true))
  }

  stop (): void {
    this.#stopped = true
    for (const timer of this.#timers.values()) clearTimeout(timer)
    this.#timers.clear()
    this.#abort.abort()
  }

  #schedule (target: CheckedTarget, delayMs: number): void {
    const timer = setTimeout(() => { void this.#probe(target) }, delayMs)
    timer.unref()
    this.#timers.set(target, timer)
  }

  async #probe (target: CheckedTarget): Promise<void> {
    const started = Date.now()
    const failure = await probe(target, this.config, this.#abort.signal)
    if (this.#stopped) return
    // A probe not sent gives no verdict. Counted as a failure, a gateway out of descriptors took
    // every target out of rotation, and kept them out for healthyAfter probes once it had some again.
    if (failure !== PROBE_NOT_SENT) {
      this.listener?.probed(target.url, failure)
      const change = countProbe(target.active, failure, this.config)
      if (change !== null) {
        this.onChange(target, change)
        this.listener?.changed(target.url, change === 'up', failure)
      }
    }
    // the interval runs from one probe's start to the next one's
    this.#schedule(target, Math.max(0, probeDelay(this.config.intervalMs, false) - (Date.now() - started)))
  }
}
