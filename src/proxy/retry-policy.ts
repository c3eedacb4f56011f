// When a forwarded request is sent again (upstreams.X.retries, retryOn, retryBudget): nginx's
// proxy_next_upstream and proxy_next_upstream_tries, Envoy's retry_on and retry_budget. Compiled
// once per route at load; src/proxy/forward.ts asks it per failed attempt, never per request.

/**
 * Answer statuses by a name Envoy gives them: `gateway-error` is 502, 503 and 504 (a proxy or a
 * target that cannot serve now), `5xx` every status 500-599. Unlike Envoy's retry_on names, they
 * name answers only: a list wants `connect-failure` and `reset` beside them for connections.
 */
export const STATUS_GROUPS = Object.freeze({
  'gateway-error': Object.freeze([502, 503, 504]),
  '5xx': Object.freeze(Array.from({ length: 100 }, (_, i) => 500 + i))
})
export type StatusGroup = keyof typeof STATUS_GROUPS

/** Statuses as the config lists them (`503`, `gateway-error`), each once, in the order given. */
export function expandStatuses (listed: ReadonlyArray<number | StatusGroup>): number[] {
  const out = new Set<number>()
  for (const s of listed) {
    if (typeof s === 'number') out.add(s)
    else for (const n of STATUS_GROUPS[s]) out.add(n)
  }
  return [...out]
}

/** What may send a request again, as `retryOn` lists it: a condition's name, an answer status 400-599, or a group of them. */
export type RetryCondition = 'connect-failure' | 'reset' | 'timeout' | StatusGroup | number

/**
 * Envoy's retry budget: the retries an upstream has in flight at once are at most `percent` of
 * its requests in flight and waiting, and never held below `minConcurrent`. Without it a failing
 * upstream is sent its load a second time just as it fails: a 503 storm becomes two.
 */
export interface RetryBudget {
  readonly percent: number
  readonly minConcurrent: number
}

export interface RetryPolicy {
  /** Times a request may be sent again, whatever failed (0: never). */
  readonly retries: number
  /** Refused, unresolvable, or not connected in time: no byte reached the upstream. */
  readonly onConnectFailure: boolean
  /** The connection closed before an answer came: the upstream may have begun the request. */
  readonly onReset: boolean
  /** No answer head within timeouts.response. */
  readonly onTimeout: boolean
  /** Answer statuses that send the request again rather than to the client (a 503 of one target). */
  readonly statuses: ReadonlySet<number>
  readonly budget: RetryBudget
  /** How long a retry waits before it is sent (retryBackoff); null: at once. */
  readonly backoff: RetryBackoff | null
}

/** Envoy's retry_back_off, in ms: base > 0, max >= base. */
export interface RetryBackoff {
  readonly baseMs: number
  readonly maxMs: number
  /**
   * The longest wait a dropped answer's Retry-After may ask of its retry (retryBackoff.retryAfter,
   * Envoy's rate_limited_retry_back_off); null: Retry-After is not read.
   */
  readonly retryAfterMs: number | null
}

/** The longest a retry ever waits before it is sent (retryBackoff.base, max and retryAfter, and the wait Retry-After asks). */
export const MAX_BACKOFF_MS = 60_000

export const DEFAULT_RETRY_ON: readonly RetryCondition[] = Object.freeze(['connect-failure', 'reset'])
export const DEFAULT_RETRY_BUDGET: RetryBudget = Object.freeze({ percent: 20, minConcurrent: 3 })

export function compileRetryPolicy (retries: number, on: readonly RetryCondition[] = DEFAULT_RETRY_ON, budget: Partial<RetryBudget> = {}, backoff: RetryBackoff | null = null): RetryPolicy {
  const statuses = new Set(expandStatuses(on.filter(isStatus)))
  return Object.freeze({
    retries,
    onConnectFailure: on.includes('connect-failure'),
    onReset: on.includes('reset'),
    onTimeout: on.includes('timeout'),
    statuses,
    budget: Object.freeze({ percent: budget.percent ?? DEFAULT_RETRY_BUDGET.percent, minConcurrent: budget.minConcurrent ?? DEFAULT_RETRY_BUDGET.minConcurrent }),
    backoff: backoff === null ? null : Object.freeze({ ...backoff })
  })
}

function isStatus (c: RetryCondition): c is number | StatusGroup {
  return typeof c === 'number' || c in STATUS_GROUPS
}

/** Whether one more retry fits the budget, with `retrying` retries and `active` requests (in flight and waiting) now. */
export function withinRetryBudget (budget: RetryBudget, retrying: number, active: number): boolean {
  return retrying < Math.max(budget.minConcurrent, Math.floor(active * budget.percent / 100))
}

/**
 * Envoy's fully jittered exponential back-off: the wait before a request's `nth` retry (1 for the
 * first), drawn by `random` (in [0, 1)) from [0, (2^n - 1) x base), and below max. Full jitter
 * spreads the retries of the requests that failed together (a target restarting) over the whole
 * window; growing windows give a target that fails again longer to recover.
 */
export function retryDelayMs (backoff: RetryBackoff, nth: number, random: number): number {
  return Math.floor(random * Math.min(backoff.maxMs, backoff.baseMs * (2 ** nth - 1)))
}

/**
 * The wait a dropped answer's Retry-After asks (`askedMs`, see retryAfterMs) turned into its
 * retry's: from askedMs up to half again more, drawn by `random` (in [0, 1)), as Envoy's
 * rate-limited back-off draws it, so the retries of the requests one target turned away together
 * do not all come back at the instant it named; never past MAX_BACKOFF_MS.
 */
export function retryAfterDelayMs (askedMs: number, random: number): number {
  return Math.min(MAX_BACKOFF_MS, Math.floor(askedMs + random * askedMs / 2))
}

// RFC 9110 §5.6.7: IMF-fixdate, the one form a sender generates (the obsolete RFC 850 and asctime
// forms are read as no Retry-After: the jittered back-off then applies)
const IMF_FIXDATE = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d{2}:\d{2}:\d{2} GMT$/

/**
 * The wait a Retry-After field value asks, in ms (RFC 9110 §10.2.3: delta-seconds, or an HTTP date,
 * 0 once past), or null when it is neither. What Date.parse would make of anything else (`5.5` is
 * a day in 2001 to V8) is not trusted.
 */
export function retryAfterMs (value: string, nowMs: number): number | null {
  const text = value.trim()
  if (/^\d{1,10}$/.test(text)) return Number(text) * 1000
  if (!IMF_FIXDATE.test(text)) return null
  const at = Date.parse(text)
  return Number.isNaN(at) ? null : Math.max(0, at - nowMs)
}

/** What the access log and gateway_upstream_retries_total call a retry after an answer's status. */
export type StatusRetryCause = `status_${number}`

export function statusRetryCause (status: number): StatusRetryCause {
  return `status_${status}`
}
