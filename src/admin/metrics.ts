// The only module that knows Prometheus. The request path only adds to plain numbers ("cells"),
// each resolved once per label set; prom-client is the exposition layer: the cells are read into
// its shape only when /metrics is scraped (or, under `workers: N`, when the primary asks this
// worker's registry for its JSON). prom-client's own Counter.inc / Histogram.observe hash the
// label object on every call, even on a cached child, and cost about 8 µs per fully limited
// request (issue 13).
import { Counter, Gauge, Registry, collectDefaultMetrics, type Metric } from 'prom-client'
import type { DecisionCounter, LimitLevel, LimitResult, Telemetry } from '../telemetry.js'

const STATUS_CLASSES = ['1xx', '2xx', '3xx', '4xx', '5xx'] as const
const LEVELS: readonly LimitLevel[] = ['local', 'redis', 'fallback', 'memory']
const RESULTS: readonly LimitResult[] = ['allowed', 'rejected', 'shadow']
const REQUEST_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
const REDIS_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1]

export interface MetricsSources {
  localKeys: () => number
  /** HTTP requests whose response has not closed yet. */
  inflight?: () => number
  /** Every target of the live upstreams with its health, read when /metrics is scraped. */
  targets?: () => Iterable<{ upstream: string, target: string, healthy: boolean }>
  /** Requests waiting for a connection, per live upstream, read when /metrics is scraped. */
  pending?: () => Iterable<{ upstream: string, pending: number }>
  /** Log lines dropped because stdout stayed blocked past the log buffer's bound. */
  logDropped?: () => number
  /** Promise rejections with no handler the process served on (src/stray-rejections.ts). */
  strayRejections?: () => number
  /** Client connections open on the public listener. */
  connections?: () => number
  /** Answers being compressed now (an encoder each). */
  encoders?: () => number
}

type Labels = Readonly<Record<string, string>>
type LabelsWithLe = Readonly<Record<string, string | number>>

/** One exported sample, as prom-client's own metrics give them from get(). */
interface Sample {
  readonly value: number
  readonly labels: LabelsWithLe
  readonly metricName?: string
}

function labelsOf (names: readonly string[], values: readonly string[]): Labels {
  const labels: Record<string, string> = {}
  for (let i = 0; i < names.length; i++) labels[names[i] as string] = values[i] as string
  return labels
}

/** A counter or gauge of one label set. */
class Cell {
  value = 0
  constructor (readonly labels: Labels) {}
}

/** A histogram of one label set: per-bucket counts (the last one is +Inf), sum and count. */
class HistogramCell {
  sum = 0
  count = 0
  readonly buckets: Float64Array
  constructor (readonly labels: Labels, private readonly bounds: readonly number[]) {
    this.buckets = new Float64Array(bounds.length + 1)
  }

  observe (value: number): void {
    // prom-client throws on a non-finite value: a metric must never throw into a request
    if (!Number.isFinite(value)) return
    const bounds = this.bounds
    // `le` is inclusive, as in prom-client's findBound; durations mostly fall in the first buckets
    let i = 0
    while (i < bounds.length && value > (bounds[i] as number)) i++
    ;(this.buckets[i] as number)++
    this.sum += value
    this.count++
  }
}

/**
 * A metric registered in the prom-client registry in place of a prom-client Counter, Gauge or
 * Histogram: get() returns the same MetricObject shape theirs do (samples with labels, histogram
 * samples with metricName `_bucket`/`_sum`/`_count`, aggregator 'sum'), so the registry prints
 * it and AggregatorRegistry sums it across workers exactly as it would theirs.
 */
class CellMetric {
  readonly aggregator = 'sum'
  // not readonly: the registry renames counters in place for OpenMetrics (registry.metrics())
  constructor (public name: string, readonly help: string, readonly type: 'counter' | 'gauge' | 'histogram', private readonly samples: () => Sample[]) {}

  async get (): Promise<{ name: string, help: string, type: 'counter' | 'gauge' | 'histogram', values: Sample[], aggregator: string }> {
    return { name: this.name, help: this.help, type: this.type, values: this.samples(), aggregator: this.aggregator }
  }

  // Registry.resetMetrics() calls reset() on every metric (nothing in the gateway does). A no-op:
  // the request path holds its cells (the limiter its decision counters), so dropping them here
  // would leave it counting into cells nobody exports.
  reset (): void {}

  register (registry: Registry): void {
    // prom-client types registerMetric with its own classes only; the registry itself reads
    // name, get() and reset() (node_modules/prom-client/lib/registry.js)
    registry.registerMetric(this as unknown as Metric)
  }
}

/** Counters are exported once counted: a label set never incremented does not appear, as in prom-client. */
function counterSamples (cells: readonly Cell[]): Sample[] {
  const out: Sample[] = []
  for (const c of cells) if (c.value !== 0) out.push({ value: c.value, labels: c.labels })
  return out
}

/** Gauges are exported once touched, also back at 0 (a route with nothing in flight). */
function gaugeSamples (cells: readonly Cell[]): Sample[] {
  return cells.map(c => ({ value: c.value, labels: c.labels }))
}

function histogramSamples (name: string, bounds: readonly number[], cells: readonly HistogramCell[]): Sample[] {
  const out: Sample[] = []
  const bucket = `${name}_bucket`
  for (const c of cells) {
    let acc = 0
    for (let i = 0; i < bounds.length; i++) {
      acc += c.buckets[i] as number
      // `le` first, then the cell's labels: the order prom-client's Histogram.get() gives them
      out.push({ value: acc, labels: { le: bounds[i] as number, ...c.labels }, metricName: bucket })
    }
    out.push({ value: c.count, labels: { le: '+Inf', ...c.labels }, metricName: bucket })
    out.push({ value: c.sum, labels: c.labels, metricName: `${name}_sum` })
    out.push({ value: c.count, labels: c.labels, metricName: `${name}_count` })
  }
  return out
}

/** An unlabelled counter whose value is read from elsewhere at each scrape (0 without a source). */
function readCounter (registry: Registry, name: string, help: string, read: (() => number) | undefined): void {
  new Counter({
    name,
    help,
    registers: [registry],
    collect () {
      this.reset()
      this.inc(read === undefined ? 0 : read())
    }
  })
}

function levelIndex (level: LimitLevel): number {
  switch (level) {
    case 'local': return 0
    case 'redis': return 1
    case 'fallback': return 2
    default: return 3
  }
}

function resultIndex (result: LimitResult): number {
  return result === 'allowed' ? 0 : result === 'rejected' ? 1 : 2
}

/** The decisions of one limit of one route: one count per (level, result), index level * 3 + result. */
class DecisionCells implements DecisionCounter {
  readonly counts = new Float64Array(LEVELS.length * RESULTS.length)
  constructor (readonly route: string, readonly dimension: string, readonly limit: string) {}

  count (level: LimitLevel, result: LimitResult): void {
    (this.counts[levelIndex(level) * 3 + resultIndex(result)] as number)++
  }
}

/** Everything counted per route, found with one Map lookup; cells are made on first use. */
interface RouteCells {
  /** Per method, one counter per status class. */
  readonly requests: Map<string, Cell[]>
  duration: HistogramCell | null
  inflight: Cell | null
  websockets: Cell | null
  /** Per dimension, one counter per level. */
  readonly concurrency: Map<string, Array<Cell | null>>
}

interface UpstreamCells {
  duration: HistogramCell | null
  readonly errors: Map<string, Cell>
}

export class GatewayMetrics implements Telemetry {
  readonly registry = new Registry()
  private readonly ejections: Counter
  private readonly retries: Counter
  private readonly retriesOverBudget: Counter
  private readonly healthChecks: Counter
  private readonly proxyProtocolRefusals: Counter
  private readonly connectionDrops: Counter
  private readonly tlsHandshakeTimeouts: Counter
  private readonly clientConnectionDrops: Counter
  private readonly httpsRedirects: Counter
  private readonly reloads: Counter
  private readonly breaker: Gauge
  readonly generation: Gauge

  // Cells per family, in creation order (the order of the exported samples). Label values come
  // from the configuration (route, upstream, limit names, seen across reloads), from fixed sets
  // (methods Node parses, status classes, levels, error kinds): bounded, as prom-client's label
  // children were; a route renamed by a reload keeps its old cells, as its children did.
  private readonly requestCells: Cell[] = []
  private readonly durationCells: HistogramCell[] = []
  private readonly upstreamDurationCells: HistogramCell[] = []
  private readonly upstreamErrorCells: Cell[] = []
  private readonly decisionCells: DecisionCells[] = []
  private readonly redisDuration = new HistogramCell({}, REDIS_BUCKETS)
  private readonly redisErrorCells = new Map<string, Cell>()
  private readonly concurrencyCells: Cell[] = []
  private readonly inflightCells: Cell[] = []
  private readonly websocketCells: Cell[] = []

  private readonly routes = new Map<string, RouteCells>()
  private readonly upstreams = new Map<string, UpstreamCells>()
  private readonly decisionsByRoute = new Map<string, Map<string, Map<string, DecisionCells>>>()

  constructor (sources: MetricsSources) {
    const registry = this.registry
    const registers = [registry]
    collectDefaultMetrics({ register: registry })
    // registered in the order the prom-client metrics were, so /metrics lists them as before
    new CellMetric('gateway_requests_total', 'Requests answered, by route, method and status class', 'counter',
      () => counterSamples(this.requestCells)).register(registry)
    new CellMetric('gateway_request_duration_seconds', 'Time from request to response end, by route', 'histogram',
      () => histogramSamples('gateway_request_duration_seconds', REQUEST_BUCKETS, this.durationCells)).register(registry)
    new CellMetric('gateway_upstream_response_duration_seconds', 'Forwarded exchanges, from dispatch to the upstream until the response ended, by upstream', 'histogram',
      () => histogramSamples('gateway_upstream_response_duration_seconds', REQUEST_BUCKETS, this.upstreamDurationCells)).register(registry)
    new Gauge({
      name: 'gateway_requests_in_flight',
      help: 'HTTP requests received whose response has not finished (WebSockets are gateway_websockets_open)',
      registers,
      collect () { this.set(sources.inflight?.() ?? 0) }
    })
    new CellMetric('gateway_upstream_errors_total', 'Upstream failures by upstream and kind', 'counter',
      () => counterSamples(this.upstreamErrorCells)).register(registry)
    this.retries = new Counter({ name: 'gateway_upstream_retries_total', help: 'Requests sent to an upstream again, by upstream and what ended the attempt before (a failure kind, or status_503 for an answer of a retryOn status)', labelNames: ['upstream', 'reason'], registers })
    this.retriesOverBudget = new Counter({ name: 'gateway_upstream_retries_over_budget_total', help: 'Retries not sent because the upstream\'s retryBudget was spent: the client got the failed attempt\'s answer', labelNames: ['upstream'], registers })
    this.ejections = new Counter({ name: 'gateway_upstream_ejections_total', help: 'Targets ejected by passive health, by upstream, target and reason', labelNames: ['upstream', 'target', 'reason'], registers })
    this.healthChecks = new Counter({ name: 'gateway_health_checks_total', help: 'Active health check probes of upstream targets, by upstream, target and result (pass, fail)', labelNames: ['upstream', 'target', 'result'], registers })
    this.proxyProtocolRefusals = new Counter({ name: 'gateway_proxy_protocol_refused_total', help: 'Connections from a proxyProtocol peer closed for want of a valid PROXY header, by reason (missing, malformed, timeout)', labelNames: ['reason'], registers })
    this.connectionDrops = new Counter({ name: 'gateway_connections_dropped_total', help: 'Client connections closed as they arrived, unanswered: server.maxConnections were open', registers })
    this.tlsHandshakeTimeouts = new Counter({ name: 'gateway_tls_handshake_timeouts_total', help: 'Client connections closed because their TLS handshake was not finished within server.headersTimeout (its value at start)', registers })
    new Gauge({
      name: 'gateway_connections_open',
      help: 'Client connections open on the public listener (server.maxConnections caps them)',
      registers,
      collect () { this.set(sources.connections?.() ?? 0) }
    })
    new Gauge({
      name: 'gateway_compression_encoders_open',
      help: 'Answers being compressed now, an encoder each (compression.maxConcurrent caps them)',
      registers,
      collect () { this.set(sources.encoders?.() ?? 0) }
    })
    this.httpsRedirects = new Counter({ name: 'gateway_https_redirects_total', help: 'Requests to tls.redirectHttp\'s plain-HTTP listener answered with a redirect to HTTPS', registers })
    this.clientConnectionDrops = new Counter({ name: 'gateway_client_connections_dropped_total', help: 'Client connections closed as they arrived, unanswered: their client held server.maxConnectionsPerClient', registers })
    const targets = sources.targets
    new Gauge({
      name: 'gateway_upstream_target_healthy',
      help: '1 while a target takes traffic, 0 while passive health ejected it or active health checks hold it out',
      labelNames: ['upstream', 'target'],
      registers,
      // workers: N sums each metric over the workers; a state is not a count: 0 once one worker ejects it
      aggregator: 'min',
      collect () {
        this.reset()
        if (targets !== undefined) for (const t of targets()) this.labels(t.upstream, t.target).set(t.healthy ? 1 : 0)
      }
    })
    const pending = sources.pending
    new Gauge({
      name: 'gateway_upstream_pending',
      help: 'Requests waiting for a connection while every target of the upstream is at maxConnections',
      labelNames: ['upstream'],
      registers,
      collect () {
        this.reset()
        if (pending !== undefined) for (const p of pending()) this.labels(p.upstream).set(p.pending)
      }
    })
    this.reloads = new Counter({ name: 'gateway_config_reloads_total', help: 'Configuration reloads by result', labelNames: ['result'], registers })
    new CellMetric('gateway_ratelimit_decisions_total', 'Rate-limit decisions', 'counter',
      () => this.decisionSamples()).register(registry)
    // unlabelled: exported from the start, zeros included, as prom-client's unlabelled Histogram is
    new CellMetric('gateway_redis_duration_seconds', 'Duration of limiter calls to Redis', 'histogram',
      () => histogramSamples('gateway_redis_duration_seconds', REDIS_BUCKETS, [this.redisDuration])).register(registry)
    new CellMetric('gateway_redis_errors_total', 'Failed limiter calls to Redis by kind', 'counter',
      () => counterSamples([...this.redisErrorCells.values()])).register(registry)
    this.breaker = new Gauge({ name: 'gateway_redis_breaker_state', help: 'Redis circuit breaker: 0 closed, 1 open, 2 half-open', registers, aggregator: 'max' })
    this.generation = new Gauge({ name: 'gateway_config_generation', help: 'Generation of the running configuration', registers, aggregator: 'max' })
    new Gauge({
      name: 'gateway_ratelimit_local_keys',
      help: 'Client keys held by the local level',
      registers,
      collect () { this.set(sources.localKeys()) }
    })
    readCounter(registry, 'gateway_log_dropped_lines_total', 'Log lines dropped because stdout stayed blocked until the log buffer was full', sources.logDropped)
    readCounter(registry, 'gateway_stray_rejections_total', 'Promise rejections no code handled, logged with GW_ERR_STRAY_REJECTION; the process served on', sources.strayRejections)
    for (const result of ['success', 'failure']) this.reloads.labels(result).inc(0)
    // issue 10: concurrency limits
    new CellMetric('gateway_concurrency_rejected_total', 'Requests refused by a concurrency limit, by route, dimension (ip, user, route) and level', 'counter',
      () => counterSamples(this.concurrencyCells)).register(registry)
    new CellMetric('gateway_inflight', 'HTTP requests in flight on this instance, by route', 'gauge',
      () => gaugeSamples(this.inflightCells)).register(registry)
    new CellMetric('gateway_websockets_open', 'WebSockets open through this instance, by route', 'gauge',
      () => gaugeSamples(this.websocketCells)).register(registry)
  }

  private routeCells (route: string): RouteCells {
    let r = this.routes.get(route)
    if (r === undefined) {
      r = { requests: new Map(), duration: null, inflight: null, websockets: null, concurrency: new Map() }
      this.routes.set(route, r)
    }
    return r
  }

  private upstreamCells (upstream: string): UpstreamCells {
    let u = this.upstreams.get(upstream)
    if (u === undefined) this.upstreams.set(upstream, u = { duration: null, errors: new Map() })
    return u
  }

  concurrencyRejected (route: string, dimension: string, level: LimitLevel): void {
    const byDimension = this.routeCells(route).concurrency
    let byLevel = byDimension.get(dimension)
    if (byLevel === undefined) byDimension.set(dimension, byLevel = LEVELS.map(() => null))
    const i = levelIndex(level)
    let c = byLevel[i]
    if (c == null) {
      byLevel[i] = c = new Cell(labelsOf(['route', 'dimension', 'level'], [route, dimension, level]))
      this.concurrencyCells.push(c)
    }
    c.value++
  }

  inflight (route: string, delta: 1 | -1): void {
    this.routeGauge(route, 'inflight', this.inflightCells).value += delta
  }

  websocketsOpen (route: string, delta: 1 | -1): void {
    this.routeGauge(route, 'websockets', this.websocketCells).value += delta
  }

  /** A per-route gauge's cell, made (and listed in `family`) on first use. */
  private routeGauge (route: string, gauge: 'inflight' | 'websockets', family: Cell[]): Cell {
    const r = this.routeCells(route)
    let g = r[gauge]
    if (g === null) {
      r[gauge] = g = new Cell({ route })
      family.push(g)
    }
    return g
  }

  request (route: string, method: string, status: number, seconds: number): void {
    const r = this.routeCells(route)
    let byClass = r.requests.get(method)
    if (byClass === undefined) {
      // all five made at once, exported only once counted (counterSamples)
      byClass = STATUS_CLASSES.map(c => new Cell(labelsOf(['route', 'method', 'status_class'], [route, method, c])))
      r.requests.set(method, byClass)
      this.requestCells.push(...byClass)
    }
    const cls = Math.min(4, Math.max(0, Math.floor(status / 100) - 1))
    ;(byClass[cls] as Cell).value++
    let d = r.duration
    if (d === null) {
      r.duration = d = new HistogramCell({ route }, REQUEST_BUCKETS)
      this.durationCells.push(d)
    }
    d.observe(seconds)
  }

  upstreamError (upstream: string, kind: string): void {
    const errors = this.upstreamCells(upstream).errors
    let c = errors.get(kind)
    if (c === undefined) {
      errors.set(kind, c = new Cell({ upstream, kind }))
      this.upstreamErrorCells.push(c)
    }
    c.value++
  }

  upstreamResponse (upstream: string, seconds: number): void {
    const u = this.upstreamCells(upstream)
    let h = u.duration
    if (h === null) {
      u.duration = h = new HistogramCell({ upstream }, REQUEST_BUCKETS)
      this.upstreamDurationCells.push(h)
    }
    h.observe(seconds)
  }

  upstreamRetry (upstream: string, cause: string): void {
    this.retries.labels(upstream, cause).inc()
  }

  upstreamRetryOverBudget (upstream: string): void {
    this.retriesOverBudget.labels(upstream).inc()
  }

  upstreamEjection (upstream: string, target: string, reason: string): void {
    this.ejections.labels(upstream, target, reason).inc()
  }

  healthCheck (upstream: string, target: string, result: 'pass' | 'fail'): void {
    this.healthChecks.labels(upstream, target, result).inc()
  }

  connectionDropped (): void {
    this.connectionDrops.inc()
  }

  tlsHandshakeTimedOut (): void {
    this.tlsHandshakeTimeouts.inc()
  }

  httpsRedirected (): void {
    this.httpsRedirects.inc()
  }

  clientConnectionDropped (): void {
    this.clientConnectionDrops.inc()
  }

  proxyProtocolRefused (reason: string): void {
    this.proxyProtocolRefusals.labels(reason).inc()
  }

  /**
   * The cells of one limit of one route. The limiter resolves this once per planned limit, so a
   * decision is an index and an increment; the same cells are returned for the same labels, so
   * the limiters of successive reloads add to one series.
   */
  decisionCounter (route: string, dimension: string, limit: string): DecisionCells {
    let byDimension = this.decisionsByRoute.get(route)
    if (byDimension === undefined) this.decisionsByRoute.set(route, byDimension = new Map())
    let byLimit = byDimension.get(dimension)
    if (byLimit === undefined) byDimension.set(dimension, byLimit = new Map())
    let cells = byLimit.get(limit)
    if (cells === undefined) {
      byLimit.set(limit, cells = new DecisionCells(route, dimension, limit))
      this.decisionCells.push(cells)
    }
    return cells
  }

  limitDecision (route: string, dimension: string, limit: string, level: LimitLevel, result: LimitResult): void {
    this.decisionCounter(route, dimension, limit).count(level, result)
  }

  private decisionSamples (): Sample[] {
    const out: Sample[] = []
    for (const d of this.decisionCells) {
      for (let i = 0; i < d.counts.length; i++) {
        const value = d.counts[i] as number
        if (value === 0) continue
        const level = LEVELS[Math.floor(i / 3)] as LimitLevel
        const result = RESULTS[i % 3] as LimitResult
        out.push({ value, labels: { route: d.route, dimension: d.dimension, limit: d.limit, level, result } })
      }
    }
    return out
  }

  // Clients are unbounded: they go to the admin page's top-k sketch (live-stats.ts), not to labels.
  clientRejected (): void {}

  redisCall (seconds: number, ok: boolean, errorKind: string | null): void {
    this.redisDuration.observe(seconds)
    if (!ok) {
      const kind = errorKind ?? 'other'
      let c = this.redisErrorCells.get(kind)
      if (c === undefined) this.redisErrorCells.set(kind, c = new Cell({ kind }))
      c.value++
    }
  }

  breakerState (state: 0 | 1 | 2): void {
    this.breaker.set(state)
  }

  reload (result: 'success' | 'failure'): void {
    this.reloads.labels(result).inc()
  }
}
