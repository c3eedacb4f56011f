// What the stages report. Only src/admin/metrics.ts turns these into Prometheus series, so the
// request path never imports prom-client and tests can run stages without a registry.

export type LimitLevel = 'local' | 'redis' | 'fallback' | 'memory'
export type LimitResult = 'allowed' | 'rejected' | 'shadow'

/**
 * The decisions of one limit of one route, resolved once (by the limiter, per planned limit) so
 * that counting a decision costs an index and an increment, not a lookup of its labels.
 */
export interface DecisionCounter {
  count (level: LimitLevel, result: LimitResult): void
}

export interface Telemetry {
  request (route: string, method: string, status: number, seconds: number): void
  upstreamError (upstream: string, kind: string): void
  /** A forwarded exchange finished: dispatch to the upstream until the response ended. */
  upstreamResponse (upstream: string, seconds: number): void
  /** A request sent again to the upstream: `cause` is what ended the attempt before (`reset`, `status_503`). */
  upstreamRetry (upstream: string, cause: string): void
  /** A retry the conditions allowed that the upstream's retryBudget refused: the client got that attempt's failure. */
  upstreamRetryOverBudget (upstream: string): void
  /** A target left out of balancing (passive health / outlier detection). */
  upstreamEjection (upstream: string, target: string, reason: string): void
  /** One active health check probe of a target, passed or failed. */
  healthCheck (upstream: string, target: string, result: 'pass' | 'fail'): void
  /** `limit` is the limit's name as the 429 body gives it (`ip`, `login.ip`, `local`). */
  limitDecision (route: string, dimension: string, limit: string, level: LimitLevel, result: LimitResult): void
  /** What limitDecision(route, dimension, limit, …) counts into, for a caller that decides the same limit often. */
  decisionCounter (route: string, dimension: string, limit: string): DecisionCounter
  /** A request refused by a limit (the admin page's top limited clients; never a metric label). */
  clientRejected (ip: string, user: string | null): void
  redisCall (seconds: number, ok: boolean, errorKind: string | null): void
  breakerState (state: 0 | 1 | 2): void
  reload (result: 'success' | 'failure'): void
  /** A request refused by a concurrency limit (issue 10); dimension is ip, user or route. */
  concurrencyRejected (route: string, dimension: string, level: LimitLevel): void
  /** HTTP requests of a route in flight on this instance: +1 when routed, -1 when the response closed. */
  inflight (route: string, delta: 1 | -1): void
  /** WebSockets of a route open on this instance: +1 on 101, -1 when the tunnel closed. */
  websocketsOpen (route: string, delta: 1 | -1): void
}

const NOOP_DECISION_COUNTER: DecisionCounter = Object.freeze({ count () {} })

export const NOOP_TELEMETRY: Telemetry = Object.freeze({
  request () {},
  upstreamError () {},
  upstreamResponse () {},
  upstreamRetry () {},
  upstreamRetryOverBudget () {},
  upstreamEjection () {},
  healthCheck () {},
  limitDecision () {},
  decisionCounter: () => NOOP_DECISION_COUNTER,
  clientRejected () {},
  redisCall () {},
  breakerState () {},
  reload () {},
  concurrencyRejected () {},
  inflight () {},
  websocketsOpen () {}
})
