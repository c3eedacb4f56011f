// What the admin page shows live, counted per second in each process. A `LiveTelemetry` sits in
// front of the Prometheus telemetry (it forwards every event) and keeps only the current second:
// per route a request count and a latency histogram, per route and dimension the decisions, and
// the clients rejected in that second in a bounded top-k sketch. Once a second the frame is taken
// and handed to a `LiveFeed` (src/admin/live-feed.ts), in this process or, under `workers: N`,
// in the primary, which sums the workers' frames. Frames are plain JSON so they cross IPC as is.
import type { DecisionCounter, LimitLevel, LimitResult, Telemetry } from '../telemetry.js'

/** Latency buckets: bucket i holds durations up to LATENCY_BASE_MS * LATENCY_FACTOR^i. */
export const LATENCY_BASE_MS = 0.05
export const LATENCY_FACTOR = 1.25
export const LATENCY_BUCKETS = 64 // 0.05 ms .. about 80 s; the last bucket holds everything longer

/** Decisions per dimension: [allowed, rejected, shadow, decided by the fallback]. */
export type DecisionCounts = [number, number, number, number]

export interface RouteSecond {
  /** Requests answered (any status). */
  n: number
  /** Answers by status class 4xx and 5xx. */
  s4: number
  s5: number
  /** Sparse latency histogram: [bucket, count] pairs. */
  lat: Array<[number, number]>
}

export interface LiveFrame {
  /** Per route (the route's name, "-" for requests that matched none). */
  routes: Record<string, RouteSecond>
  /** Per route, per dimension. */
  decisions: Record<string, Record<string, DecisionCounts>>
  /** Rejected clients ("ip 203.0.113.9", "user alice") with their rejections, at most SKETCH_SIZE. */
  rejected: Array<[string, number]>
}

const LOG_LATENCY_FACTOR = Math.log(LATENCY_FACTOR)

export function latencyBucket (ms: number): number {
  if (!(ms > LATENCY_BASE_MS)) return 0
  const i = Math.ceil(Math.log(ms / LATENCY_BASE_MS) / LOG_LATENCY_FACTOR)
  return i >= LATENCY_BUCKETS ? LATENCY_BUCKETS - 1 : i
}

/** The upper edge of a bucket, in ms: what a percentile read from the histogram reports. */
export function bucketUpperMs (i: number): number {
  return LATENCY_BASE_MS * LATENCY_FACTOR ** i
}

/**
 * Space-saving top-k (Metwally et al., 2005): at most `capacity` counters whatever the number of
 * distinct clients. A new client takes over the smallest counter and inherits its count, so a
 * heavy hitter is never missed and counts are overestimated by at most the evicted minimum.
 */
export class SpaceSaving {
  private readonly counts = new Map<string, number>()
  constructor (readonly capacity: number) {}

  add (key: string, by = 1): void {
    const c = this.counts.get(key)
    if (c !== undefined) {
      this.counts.set(key, c + by)
      return
    }
    if (this.counts.size < this.capacity) {
      this.counts.set(key, by)
      return
    }
    // O(capacity) eviction: only rejected requests get here, and the capacity is small
    let minKey = ''
    let min = Infinity
    for (const [k, v] of this.counts) {
      if (v < min) { min = v; minKey = k }
    }
    this.counts.delete(minKey)
    this.counts.set(key, min + by)
  }

  get size (): number { return this.counts.size }

  /** The counters, largest first. */
  top (n = this.capacity): Array<[string, number]> {
    return [...this.counts].sort((a, b) => b[1] - a[1]).slice(0, n)
  }

  clear (): void { this.counts.clear() }
}

export const SKETCH_SIZE = 64

class RouteAccumulator {
  n = 0
  s4 = 0
  s5 = 0
  readonly lat = new Uint32Array(LATENCY_BUCKETS)

  frame (): RouteSecond {
    const lat: Array<[number, number]> = []
    for (let i = 0; i < LATENCY_BUCKETS; i++) if (this.lat[i] !== 0) lat.push([i, this.lat[i] as number])
    return { n: this.n, s4: this.s4, s5: this.s5, lat }
  }
}

function countInto (c: DecisionCounts, level: LimitLevel, result: LimitResult): void {
  (c[result === 'allowed' ? 0 : result === 'rejected' ? 1 : 2] as number)++
  if (level === 'fallback') (c[3] as number)++
}

/** A limit's counter in the metrics, and its dimension's counts of the current second. */
class LiveDecisionCounter implements DecisionCounter {
  constructor (private readonly next: DecisionCounter, private readonly counts: DecisionCounts) {}

  count (level: LimitLevel, result: LimitResult): void {
    this.next.count(level, result)
    countInto(this.counts, level, result)
  }
}

/** Forwards every event to `next` (the metrics) and counts the current second for the page. */
export class LiveTelemetry implements Telemetry {
  private routes = new Map<string, RouteAccumulator>()
  // Kept across seconds, unlike `routes`: the limiter holds counters that point into these
  // arrays (decisionCounter). takeFrame copies and zeroes them, and a frame lists only the
  // dimensions decided in its second, so a route removed by a reload still leaves the page.
  private readonly decisions = new Map<string, Map<string, DecisionCounts>>()
  private readonly rejected = new SpaceSaving(SKETCH_SIZE)

  constructor (private readonly next: Telemetry) {}

  request (route: string, method: string, status: number, seconds: number): void {
    this.next.request(route, method, status, seconds)
    let r = this.routes.get(route)
    if (r === undefined) this.routes.set(route, r = new RouteAccumulator())
    r.n++
    if (status >= 500) r.s5++
    else if (status >= 400) r.s4++
    ;(r.lat[latencyBucket(seconds * 1000)] as number)++
  }

  upstreamError (upstream: string, kind: string): void { this.next.upstreamError(upstream, kind) }
  upstreamResponse (upstream: string, seconds: number): void { this.next.upstreamResponse(upstream, seconds) }
  upstreamRetry (upstream: string, cause: string): void { this.next.upstreamRetry(upstream, cause) }
  upstreamRetryOverBudget (upstream: string): void { this.next.upstreamRetryOverBudget(upstream) }
  upstreamEjection (upstream: string, target: string, reason: string): void { this.next.upstreamEjection(upstream, target, reason) }
  healthCheck (upstream: string, target: string, result: 'pass' | 'fail'): void { this.next.healthCheck(upstream, target, result) }

  limitDecision (route: string, dimension: string, limit: string, level: LimitLevel, result: LimitResult): void {
    this.next.limitDecision(route, dimension, limit, level, result)
    countInto(this.countsOf(route, dimension), level, result)
  }

  decisionCounter (route: string, dimension: string, limit: string): DecisionCounter {
    return new LiveDecisionCounter(this.next.decisionCounter(route, dimension, limit), this.countsOf(route, dimension))
  }

  private countsOf (route: string, dimension: string): DecisionCounts {
    let byDimension = this.decisions.get(route)
    if (byDimension === undefined) this.decisions.set(route, byDimension = new Map())
    let c = byDimension.get(dimension)
    if (c === undefined) byDimension.set(dimension, c = [0, 0, 0, 0])
    return c
  }

  concurrencyRejected (route: string, dimension: string, level: LimitLevel): void {
    this.next.concurrencyRejected(route, dimension, level)
    // on the page a refused lease is a rejection of its dimension like any other
    countInto(this.countsOf(route, `concurrency.${dimension}`), level, 'rejected')
  }

  inflight (route: string, delta: 1 | -1): void { this.next.inflight(route, delta) }
  websocketsOpen (route: string, delta: 1 | -1): void { this.next.websocketsOpen(route, delta) }

  clientRejected (ip: string, user: string | null): void {
    this.next.clientRejected(ip, user)
    this.rejected.add(`ip ${ip}`)
    if (user !== null) this.rejected.add(`user ${user}`)
  }

  redisCall (seconds: number, ok: boolean, errorKind: string | null): void { this.next.redisCall(seconds, ok, errorKind) }
  breakerState (state: 0 | 1 | 2): void { this.next.breakerState(state) }
  reload (result: 'success' | 'failure'): void { this.next.reload(result) }

  /** The second counted so far; counting starts over. */
  takeFrame (): LiveFrame {
    const routes: Record<string, RouteSecond> = {}
    for (const [name, r] of this.routes) routes[name] = r.frame()
    const decisions: Record<string, Record<string, DecisionCounts>> = {}
    for (const [route, byDimension] of this.decisions) {
      let ofRoute: Record<string, DecisionCounts> | null = null
      for (const [dimension, c] of byDimension) {
        // every decision adds to c[0], c[1] or c[2]: all three 0 = not decided this second
        if (c[0] === 0 && c[1] === 0 && c[2] === 0) continue
        ;(ofRoute ??= {})[dimension] = [c[0], c[1], c[2], c[3]]
        c[0] = c[1] = c[2] = c[3] = 0
      }
      if (ofRoute !== null) decisions[route] = ofRoute
    }
    const frame: LiveFrame = { routes, decisions, rejected: this.rejected.top() }
    // a new map each second: a route removed by a reload does not linger in the page
    this.routes = new Map()
    this.rejected.clear()
    return frame
  }
}
