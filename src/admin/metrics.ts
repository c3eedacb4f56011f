// The only module that knows Prometheus. Label children are cached so the request path does a
// couple of Map lookups instead of prom-client's per-call label hashing.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'
import type { LimitLevel, LimitResult, Telemetry } from '../telemetry.js'

type CounterChild = ReturnType<Counter['labels']>
type HistogramChild = ReturnType<Histogram['labels']>

const STATUS_CLASSES = ['1xx', '2xx', '3xx', '4xx', '5xx'] as const

export interface MetricsSources {
  localKeys: () => number
  /** HTTP requests whose response has not closed yet. */
  inflight?: () => number
  /** Every target of the live upstreams with its health, read when /metrics is scraped. */
  targets?: () => Iterable<{ upstream: string, target: string, healthy: boolean }>
  /** Log lines dropped because stdout stayed blocked past the log buffer's bound. */
  logDropped?: () => number
}

export class GatewayMetrics implements Telemetry {
  readonly registry = new Registry()
  private readonly requests: Counter
  private readonly duration: Histogram
  private readonly upstreamErrors: Counter
  private readonly ejections: Counter
  private readonly reloads: Counter
  private readonly decisions: Counter
  private readonly redisDuration: Histogram
  private readonly redisErrors: Counter
  private readonly breaker: Gauge
  readonly generation: Gauge
  private readonly concurrencyRejections: Counter
  private readonly inflightGauge: Gauge
  private readonly websocketsGauge: Gauge
  private readonly inflightChildren = new Map<string, ReturnType<Gauge['labels']>>()
  private readonly requestChildren = new Map<string, Map<string, CounterChild[]>>()
  private readonly durationChildren = new Map<string, HistogramChild>()
  private readonly decisionChildren = new Map<string, Map<string, Map<string, Map<string, Map<string, CounterChild>>>>>()
  private readonly upstreamDuration: Histogram
  private readonly upstreamDurationChildren = new Map<string, HistogramChild>()
  private readonly concurrencyChildren = new Map<string, Map<string, Map<string, CounterChild>>>()
  private readonly websocketChildren = new Map<string, ReturnType<Gauge['labels']>>()
  private readonly upstreamErrorChildren = new Map<string, Map<string, CounterChild>>()

  constructor (sources: MetricsSources) {
    const registers = [this.registry]
    collectDefaultMetrics({ register: this.registry })
    this.requests = new Counter({ name: 'gateway_requests_total', help: 'Requests answered, by route, method and status class', labelNames: ['route', 'method', 'status_class'], registers })
    this.duration = new Histogram({
      name: 'gateway_request_duration_seconds',
      help: 'Time from request to response end, by route',
      labelNames: ['route'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers
    })
    this.upstreamDuration = new Histogram({
      name: 'gateway_upstream_response_duration_seconds',
      help: 'Forwarded exchanges, from dispatch to the upstream until the response ended, by upstream',
      labelNames: ['upstream'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers
    })
    new Gauge({
      name: 'gateway_requests_in_flight',
      help: 'HTTP requests received whose response has not finished (WebSockets are gateway_websockets_open)',
      registers,
      collect () { this.set(sources.inflight?.() ?? 0) }
    })
    this.upstreamErrors = new Counter({ name: 'gateway_upstream_errors_total', help: 'Upstream failures by upstream and kind', labelNames: ['upstream', 'kind'], registers })
    this.ejections = new Counter({ name: 'gateway_upstream_ejections_total', help: 'Targets ejected by passive health, by upstream, target and reason', labelNames: ['upstream', 'target', 'reason'], registers })
    const targets = sources.targets
    new Gauge({
      name: 'gateway_upstream_target_healthy',
      help: '1 while a target takes traffic, 0 while it is ejected',
      labelNames: ['upstream', 'target'],
      registers,
      collect () {
        this.reset()
        if (targets !== undefined) for (const t of targets()) this.labels(t.upstream, t.target).set(t.healthy ? 1 : 0)
      }
    })
    this.reloads = new Counter({ name: 'gateway_config_reloads_total', help: 'Configuration reloads by result', labelNames: ['result'], registers })
    this.decisions = new Counter({ name: 'gateway_ratelimit_decisions_total', help: 'Rate-limit decisions', labelNames: ['route', 'dimension', 'limit', 'level', 'result'], registers })
    this.redisDuration = new Histogram({
      name: 'gateway_redis_duration_seconds',
      help: 'Duration of limiter calls to Redis',
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1],
      registers
    })
    this.redisErrors = new Counter({ name: 'gateway_redis_errors_total', help: 'Failed limiter calls to Redis by kind', labelNames: ['kind'], registers })
    this.breaker = new Gauge({ name: 'gateway_redis_breaker_state', help: 'Redis circuit breaker: 0 closed, 1 open, 2 half-open', registers })
    this.generation = new Gauge({ name: 'gateway_config_generation', help: 'Generation of the running configuration', registers })
    new Gauge({
      name: 'gateway_ratelimit_local_keys',
      help: 'Client keys held by the local level',
      registers,
      collect () { this.set(sources.localKeys()) }
    })
    const logDropped = sources.logDropped
    new Counter({
      name: 'gateway_log_dropped_lines_total',
      help: 'Log lines dropped because stdout stayed blocked until the log buffer was full',
      registers,
      collect () {
        this.reset()
        this.inc(logDropped === undefined ? 0 : logDropped())
      }
    })
    for (const result of ['success', 'failure']) this.reloads.labels(result).inc(0)
    // issue 10: concurrency limits
    this.concurrencyRejections = new Counter({ name: 'gateway_concurrency_rejected_total', help: 'Requests refused by a concurrency limit, by route, dimension (ip, user, route) and level', labelNames: ['route', 'dimension', 'level'], registers })
    this.inflightGauge = new Gauge({ name: 'gateway_inflight', help: 'HTTP requests in flight on this instance, by route', labelNames: ['route'], registers })
    this.websocketsGauge = new Gauge({ name: 'gateway_websockets_open', help: 'WebSockets open through this instance, by route', labelNames: ['route'], registers })
  }

  concurrencyRejected (route: string, dimension: string, level: LimitLevel): void {
    // every refusal of a concurrency flood passes here: children cached like the decisions'
    let byDimension = this.concurrencyChildren.get(route)
    if (byDimension === undefined) this.concurrencyChildren.set(route, byDimension = new Map())
    let byLevel = byDimension.get(dimension)
    if (byLevel === undefined) byDimension.set(dimension, byLevel = new Map())
    let c = byLevel.get(level)
    if (c === undefined) byLevel.set(level, c = this.concurrencyRejections.labels(route, dimension, level))
    c.inc()
  }

  inflight (route: string, delta: 1 | -1): void {
    let g = this.inflightChildren.get(route)
    if (g === undefined) this.inflightChildren.set(route, g = this.inflightGauge.labels(route))
    g.inc(delta)
  }

  websocketsOpen (route: string, delta: 1 | -1): void {
    let g = this.websocketChildren.get(route)
    if (g === undefined) this.websocketChildren.set(route, g = this.websocketsGauge.labels(route))
    g.inc(delta)
  }

  request (route: string, method: string, status: number, seconds: number): void {
    let byMethod = this.requestChildren.get(route)
    if (byMethod === undefined) this.requestChildren.set(route, byMethod = new Map())
    let byClass = byMethod.get(method)
    if (byClass === undefined) {
      byClass = STATUS_CLASSES.map(c => this.requests.labels(route, method, c))
      byMethod.set(method, byClass)
    }
    const cls = Math.min(4, Math.max(0, Math.floor(status / 100) - 1))
    ;(byClass[cls] as CounterChild).inc()
    let d = this.durationChildren.get(route)
    if (d === undefined) this.durationChildren.set(route, d = this.duration.labels(route))
    d.observe(seconds)
  }

  upstreamError (upstream: string, kind: string): void {
    let byKind = this.upstreamErrorChildren.get(upstream)
    if (byKind === undefined) this.upstreamErrorChildren.set(upstream, byKind = new Map())
    let c = byKind.get(kind)
    if (c === undefined) byKind.set(kind, c = this.upstreamErrors.labels(upstream, kind))
    c.inc()
  }

  upstreamResponse (upstream: string, seconds: number): void {
    let h = this.upstreamDurationChildren.get(upstream)
    if (h === undefined) this.upstreamDurationChildren.set(upstream, h = this.upstreamDuration.labels(upstream))
    h.observe(seconds)
  }

  upstreamEjection (upstream: string, target: string, reason: string): void {
    this.ejections.labels(upstream, target, reason).inc()
  }

  limitDecision (route: string, dimension: string, limit: string, level: LimitLevel, result: LimitResult): void {
    // nested maps: no key string is built per call
    let byDimension = this.decisionChildren.get(route)
    if (byDimension === undefined) this.decisionChildren.set(route, byDimension = new Map())
    let byLimit = byDimension.get(dimension)
    if (byLimit === undefined) byDimension.set(dimension, byLimit = new Map())
    let byLevel = byLimit.get(limit)
    if (byLevel === undefined) byLimit.set(limit, byLevel = new Map())
    let byResult = byLevel.get(level)
    if (byResult === undefined) byLevel.set(level, byResult = new Map())
    let c = byResult.get(result)
    if (c === undefined) byResult.set(result, c = this.decisions.labels(route, dimension, limit, level, result))
    c.inc()
  }

  // Clients are unbounded: they go to the admin page's top-k sketch (live-stats.ts), not to labels.
  clientRejected (): void {}

  redisCall (seconds: number, ok: boolean, errorKind: string | null): void {
    this.redisDuration.observe(seconds)
    if (!ok) this.redisErrors.labels(errorKind ?? 'other').inc()
  }

  breakerState (state: 0 | 1 | 2): void {
    this.breaker.set(state)
  }

  reload (result: 'success' | 'failure'): void {
    this.reloads.labels(result).inc()
  }
}
