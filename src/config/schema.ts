// The gateway.yaml contract. The schema only validates (no transforms) so that the same object
// yields the JSON Schema editors use (`gateway schema`); defaults are applied in defaults.ts
// and conversion to runtime values in src/runtime.ts. Every object is strict: a typo must never silently disable a limit.
import { isIP } from 'node:net'
import { z } from 'zod'
import { corsOriginProblem } from '../router/cors.js'
import { normalizePath } from '../router/normalize-path.js'
import { ENCODINGS, mediaRangeProblem } from '../proxy/compression.js'
import { MAX_BACKOFF_MS } from '../proxy/retry-policy.js'
import { MAX_TIMER_MS } from '../wait-at-most.js'

export const DURATION_RE = /^(\d+)(ms|s|m|h)$/
export const SIZE_RE = /^(\d+)(b|kb|mb|gb)$/i

const duration = z.string().regex(DURATION_RE, 'expected a duration like "250ms", "1s", "1m" or "1h"')
/** The longest wait setTimeout takes: Node fires a longer one after 1 ms (TimeoutOverflowWarning). */
export { MAX_TIMER_MS }
const DURATION_UNIT_MS: Readonly<Record<string, number>> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }
/** A written duration in ms, or null when it is not one (its own issue says so). */
function durationMs (text: string): number | null {
  const m = DURATION_RE.exec(text)
  return m === null ? null : Number(m[1]) * (DURATION_UNIT_MS[m[2] as string] as number)
}
/** A duration a timer waits: limit windows are arithmetic and keep `duration`. */
const timer = duration.refine(text => (durationMs(text) ?? 0) <= MAX_TIMER_MS, 'at most 596h (2147483647ms, the longest a timer can wait: a longer one would fire after 1ms)')
/** A timer whose 0 would fire at once, where the key promises a wait. */
const wait = timer.refine(text => durationMs(text) !== 0, 'must be more than 0: a timer of 0 fires at once')
const size = z.union([
  z.int().nonnegative(),
  z.string().regex(SIZE_RE, 'expected a size like 1048576, "512kb", "10mb" or "1gb"')
])
/**
 * A port written after the last ":" that TCP can have (the regexes take up to 5 digits). No port
 * (`listen: localhost`) is the pattern's issue alone: it also said "the port must be at most 65535".
 */
const portInRange = (hp: string): boolean => !(Number(hp.slice(hp.lastIndexOf(':') + 1)) > 65535)
/**
 * A host written as an address is one: "999.1.1.1" or "[::g]" passed the pattern and failed at
 * start (a DNS lookup of a name made of digits). A name is left to the resolver.
 */
const addressIsValid = (hp: string): boolean => {
  const host = hp.slice(0, hp.lastIndexOf(':'))
  if (host.startsWith('[')) return isIP(host.slice(1, -1)) === 6
  return !/^[\d.]+$/.test(host) || isIP(host) === 4
}
const hostPort = z.string().regex(/^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]*):\d{1,5}$/, { message: 'expected "host:port", e.g. "0.0.0.0:8080"', abort: true })
  .refine(portInRange, 'the port must be at most 65535')
  .refine(addressIsValid, 'the host is not a valid IP address (IPv4 as 4 numbers of 0-255, IPv6 in brackets)')

/** Whether `value` is a "host:port" as `listen` and `admin` take it (the CLI's --admin). */
export const isHostPort = (value: string): boolean => hostPort.safeParse(value).success

/** A redis:// URL the client can connect with: it parses, port included, and its password's %-escapes decode. */
function connectableRedisUrl (value: string): boolean {
  try {
    decodeURIComponent(new URL(value).password)
    return true
  } catch {
    return false
  }
}
const redisUrl = (message: string): z.ZodType<string> => z.string().regex(/^rediss?:\/\//, message)
  .refine(connectableRedisUrl, 'not a usable URL: a port above 65535, a malformed host, or a bad %-escape in the password')
const httpUrl = z.string().regex(/^https?:\/\/[^\s/]+(\/[^\s]*)?$/, 'expected an http:// or https:// URL')

export const ALGORITHMS = ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'sliding-window', 'fixed-window'] as const
export const BUCKET_ALGORITHMS: ReadonlySet<string> = new Set(['gcra', 'token-bucket', 'leaky-bucket'])
export const ON_ERROR = ['local', 'allow', 'deny'] as const

export const limitSchema = z.strictObject({
  algorithm: z.enum(ALGORITHMS).optional().describe('default gcra'),
  limit: z.int().positive().describe('at most `limit` (in cost units) per window'),
  window: duration,
  burst: z.int().positive().optional().describe('bucket capacity (gcra, token-bucket, leaky-bucket); default = limit'),
  cost: z.int().positive().optional().describe('what one request takes; default 1'),
  mode: z.enum(['enforce', 'shadow']).optional().describe('shadow: count and report, never reject'),
  status: z.int().min(400).max(599).optional().describe('status of a rejection; default 429'),
  onLimit: z.enum(['reject', 'delay']).optional().describe('leaky-bucket only: delay holds the request until its slot'),
  maxDelay: timer.optional().describe('with onLimit: delay, the longest wait before rejecting'),
  onError: z.enum(ON_ERROR).optional().describe('when Redis fails; default redis.onError')
})

// Plans, consumers and quotas (issue 9). Plan names cannot hold "." or ":" so that a plan's limit
// names ("free:user", "free:login.user", "free:quota") never read two ways.
export const PLAN_NAME_RE = /^[A-Za-z0-9_-]+$/
export const QUOTA_PERIODS = ['hour', 'day', 'week', 'month'] as const

export const quotaSchema = z.strictObject({
  limit: z.int().positive().describe('requests (in cost units) per calendar period'),
  period: z.enum(QUOTA_PERIODS).describe('calendar period in UTC: hour, day, week (from Monday) or month'),
  cost: z.int().positive().optional().describe('what one request takes; default 1'),
  status: z.int().min(400).max(599).optional().describe('status of a rejection; default 429'),
  onError: z.enum(ON_ERROR).optional().describe('when Redis fails; default redis.onError')
})

export const planSchema = z.strictObject({
  limits: z.strictObject({
    user: limitSchema.optional().describe("replaces the gateway-wide limits.user for this plan's consumers"),
    quota: quotaSchema.optional()
  }).optional(),
  routes: z.record(z.string(), z.strictObject({ user: limitSchema })).optional()
    .describe("per route name: replaces that route's user limit for this plan's consumers")
})

// Concurrency limits (issue 10): requests in flight, or WebSockets open, at once.
const inFlight = z.int().positive()
const concurrencySchema = z.strictObject({
  ip: inFlight.optional().describe('in flight at once per client IP, across all instances'),
  user: inFlight.optional().describe('in flight at once per user, across all instances')
})
const routeConcurrencySchema = z.strictObject({
  ip: inFlight.optional().describe('in flight at once per client IP on this route (open WebSockets on a websocket route)'),
  user: inFlight.optional().describe('in flight at once per user on this route (open WebSockets on a websocket route)'),
  route: inFlight.optional().describe('the route\'s total in flight, across all instances')
})

// RFC 9110 §5.1 (field-name = token) and §5.5 (field-value: no CR, LF or NUL; node:http also
// refuses other controls). A rule breaking either would make every request on the route fail.
const HEADER_NAME_RE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/
const HEADER_NAME_MESSAGE = 'expected a header name (letters, digits and !#$%&\'*+.^_`|~-)'
const headerName = z.string().regex(HEADER_NAME_RE, HEADER_NAME_MESSAGE)
const MATCH_VALUE = 'expected a value (text: quote one that YAML reads as a number), a list of values, true (present) or false (absent)'
const headerValue = z.string().regex(/^[\t\x20-\x7e\x80-\xff]*$/, 'a header value cannot contain CR, LF, NUL or other control characters')
const headerRules = z.strictObject({
  // Names checked here rather than as the record's key schema: zod would only say "Invalid key in record".
  set: z.record(z.string(), headerValue).superRefine((rules, ctx) => {
    for (const name of Object.keys(rules)) {
      if (!HEADER_NAME_RE.test(name)) ctx.addIssue({ code: 'custom', message: HEADER_NAME_MESSAGE, path: [name] })
    }
  }).optional(),
  remove: z.array(headerName).optional()
})

/**
 * Why a probe path is not one the gateway sends as written: it must be a normalized path (what
 * the router would route it as: no "..", "//", "%2F" or raw space), optionally with a query.
 * Null when it is one.
 */
function probePathProblem (text: string): string | null {
  if (!text.startsWith('/')) return 'expected a path starting with "/", e.g. /healthz'
  const q = text.indexOf('?')
  const path = q === -1 ? text : text.slice(0, q)
  const normal = normalizePath(path)
  if (!normal.ok) return `not a valid path: ${normal.reason}`
  if (normal.path !== path) return `not a normalized path: write ${normal.path}`
  // eslint-disable-next-line no-control-regex
  if (q !== -1 && /[\x00-\x20\x7f#]/.test(text.slice(q))) return 'the query cannot hold a space, a control character or "#"'
  return null
}
const probePath = z.string().superRefine((text, ctx) => {
  const problem = probePathProblem(text)
  if (problem !== null) ctx.addIssue({ code: 'custom', message: problem })
})
/** "200-399": an inclusive range of statuses. */
export const STATUS_RANGE_RE = /^([1-5]\d\d)-([1-5]\d\d)$/
const statusSpec = z.union([
  z.int().min(100).max(599),
  z.string().regex(STATUS_RANGE_RE, 'expected a status (204) or a range of statuses ("200-399")')
    // not a range at all is the pattern's issue alone
    .refine(text => { const m = STATUS_RANGE_RE.exec(text); return m === null || Number(m[1]) <= Number(m[2]) }, 'a range goes from the lower status to the higher')
])

/** healthCheck.interval when not configured. */
export const DEFAULT_HEALTH_INTERVAL = '5s'

export const healthCheckSchema = z.strictObject({
  path: probePath.describe('what a probe GETs, e.g. /healthz (a query may follow)'),
  interval: wait.optional().describe('between two probes of one target; default 5s'),
  timeout: wait.optional().describe('a probe with no complete answer in this time fails; less than interval; default 2s (half the interval when that is shorter)'),
  unhealthyAfter: z.int().min(1).max(100).optional().describe('failed probes in a row that take a target out of rotation; default 2'),
  healthyAfter: z.int().min(1).max(100).optional().describe('passed probes in a row that bring it back; default 2'),
  host: z.string().regex(/^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?$/, 'expected a host name, optionally with ":port"').optional()
    .describe('the Host header of a probe; default the target\'s host:port'),
  expectStatus: z.union([statusSpec, z.array(statusSpec).min(1)]).optional()
    .describe('statuses a passing probe answers with: 200, "200-299", or a list of them; default "200-399"')
}).superRefine((check, ctx) => {
  if (check.timeout === undefined) return
  const timeout = durationMs(check.timeout)
  const interval = durationMs(check.interval ?? DEFAULT_HEALTH_INTERVAL)
  if (timeout !== null && interval !== null && timeout >= interval) {
    ctx.addIssue({ code: 'custom', message: `must be less than the interval (${check.interval ?? DEFAULT_HEALTH_INTERVAL}): a probe ends before the next one of its target starts`, path: ['timeout'] })
  }
})
const target = z.union([httpUrl, z.strictObject({ url: httpUrl, weight: z.int().min(1).max(1000).optional() })])

/** The most `retries` an upstream may ask: each one waits for a connection (and its timeouts) again. */
export const MAX_RETRIES = 5

/** What sends a request again (upstreams.X.retryOn): src/proxy/retry-policy.ts reads them. */
export const RETRY_CONDITIONS = ['connect-failure', 'reset', 'timeout'] as const
/** Groups of answer statuses by Envoy's names, in retryOn and failureStatuses: STATUS_GROUPS in src/proxy/retry-policy.ts. */
export const STATUS_GROUP_NAMES = ['gateway-error', '5xx'] as const
const RETRY_CONDITION = 'expected connect-failure, reset, timeout, an answer status 400-599, gateway-error (502, 503, 504) or 5xx'
const retryCondition = z.union([
  z.enum([...RETRY_CONDITIONS, ...STATUS_GROUP_NAMES], { error: RETRY_CONDITION }),
  z.int({ error: RETRY_CONDITION }).min(400, RETRY_CONDITION).max(599, RETRY_CONDITION)
], { error: RETRY_CONDITION })

const FAILURE_STATUS = 'a failure status is a 5xx, gateway-error (502, 503, 504) or 5xx'
const failureStatus = z.union([
  z.enum(STATUS_GROUP_NAMES, { error: FAILURE_STATUS }),
  z.int({ error: FAILURE_STATUS }).min(500, FAILURE_STATUS).max(599, FAILURE_STATUS)
], { error: FAILURE_STATUS })

/**
 * Envoy's retry_back_off: a retry waits a random time first, up to (2^n - 1) x base before the
 * nth retry and never more than max, so the retries of many clients do not reach a target that
 * just failed in one wave. Absent: a retry is sent at once, as nginx does.
 */
const backoffWait = wait.refine(text => (durationMs(text) ?? 0) <= MAX_BACKOFF_MS, 'at most 60s: the client waits through every retry\'s back-off')
const retryBackoff = z.strictObject({
  base: backoffWait.describe('the first retry waits up to this (a random time from 0), the second up to 3 times it, the third up to 7 times, ...; Envoy\'s default is 25ms'),
  max: backoffWait.optional().describe('no retry waits longer; default 10 times base (at most 60s)'),
  retryAfter: backoffWait.optional().describe('an answer dropped for its retryOn status whose Retry-After (seconds, or an HTTP date) asks at most this long makes its retry wait that long, up to half again more at random, unless the wait above drawn is longer (Envoy\'s rate_limited_retry_back_off; at most 60s in all; Retry-After: 0 never shortens the wait); asking longer, or none: the wait above; absent: Retry-After is not read')
}).superRefine((backoff, ctx) => {
  if (backoff.max === undefined) return
  const base = durationMs(backoff.base)
  const max = durationMs(backoff.max)
  if (base !== null && max !== null && max < base) ctx.addIssue({ code: 'custom', message: `must be at least base (${backoff.base})`, path: ['max'] })
})

export const upstreamSchema = z.strictObject({
  targets: z.array(target).min(1),
  timeouts: z.strictObject({
    connect: wait.optional(),
    response: wait.optional().describe('until the response headers; default 30s'),
    idle: timer.optional().describe('longest pause between two reads of the response body; default 60s'),
    queue: timer.optional().describe('longest a request waits for a connection while every target is at maxConnections; then 503; default 10s')
  }).optional(),
  ejectFor: timer.optional().describe('passive health: how long a failing target is left out; default 10s'),
  consecutiveFailures: z.int().positive().optional().describe('outlier detection: response timeouts or resets in a row that eject a target; default 5'),
  failureStatuses: z.array(failureStatus).optional().describe('answer statuses that count toward consecutiveFailures like a reset: 5xx statuses, gateway-error (502, 503, 504: Envoy\'s consecutive_gateway_failure) or 5xx (Envoy\'s consecutive_5xx); default none'),
  maxConnections: z.int().positive().optional().describe('per target; default 256'),
  maxPending: z.int().nonnegative().optional().describe('requests that may wait for a connection while every target is at maxConnections; beyond it 503 at once; default 1024'),
  retries: z.int().min(0).max(MAX_RETRIES).optional().describe('times a request may be sent again (on the conditions of retryOn, when that is safe); default 1; 0: never'),
  retryOn: z.array(retryCondition).min(1).optional().describe('what sends a request again: connect-failure (no byte reached the upstream), reset (closed before an answer), timeout (no answer within timeouts.response), an answer status 400-599 (503), gateway-error (502, 503, 504) or 5xx (500-599; unlike Envoy\'s, answers only); default [connect-failure, reset]'),
  retryBudget: z.strictObject({
    percent: z.number().min(0).max(100).optional().describe('retries in flight at most this share of the upstream\'s requests in flight and waiting; default 20'),
    minConcurrent: z.int().min(0).optional().describe('retries in flight allowed whatever the share; default 3')
  }).optional().describe('bounds the retries after a timeout or an answer\'s status an upstream has in flight, so that an overloaded upstream is not sent its load again (Envoy\'s retry_budget); default { percent: 20, minConcurrent: 3 }'),
  retryBackoff: retryBackoff.optional().describe('a retry first waits a random time, growing with each retry of a request (Envoy\'s fully jittered exponential back-off): { base: 25ms, max: 250ms }; absent: a retry is sent at once'),
  healthCheck: healthCheckSchema.optional().describe('active health checks: each target is probed every interval; absent: none (passive health only)')
})

// A route's CORS (src/router/cors.ts): the gateway answers its preflights and puts the
// Access-Control-* fields on every answer to an allowed origin, its own 401/429/5xx included.
const corsSchema = z.strictObject({
  origins: z.array(z.string().superRefine((origin, ctx) => {
    const problem = corsOriginProblem(origin)
    if (problem !== null) ctx.addIssue({ code: 'custom', message: problem })
  })).min(1)
    .describe('origins whose browser scripts may call the route: "*", "https://app.example.com", "https://*.example.com"'),
  methods: z.array(z.string().regex(/^[A-Za-z]+$/)).min(1).optional().describe('methods a preflight may ask for; default every method the route takes'),
  headers: z.array(headerName).optional().describe('request headers a preflight may ask for; absent or "*": the ones it asks for'),
  exposeHeaders: z.array(headerName).optional().describe('response headers a script may read, besides RateLimit, RateLimit-Policy, Retry-After and X-Request-Id (always)'),
  credentials: z.boolean().optional().describe('let scripts send cookies and Authorization (Access-Control-Allow-Credentials); default false'),
  maxAge: timer.optional().describe('how long a browser may reuse a preflight\'s answer; default 10m')
}).refine(c => c.credentials !== true || !c.origins.includes('*'), {
  message: 'credentials: true with origins "*" would let every site read its visitors\' answers: list the origins',
  path: ['credentials']
})

// Which client addresses may use a route (src/identify/ip-restriction.ts). The ranges are checked
// strictly in load.ts (crossChecks), where a range's host bits can be named.
const ipRestrictionSchema = z.strictObject({
  allow: z.array(z.string()).min(1, 'an empty allow list would refuse every client: list who may pass, or remove "allow"').optional()
    .describe('only clients in these addresses or CIDRs (or loopback, linklocal, uniquelocal) may pass; others get 403'),
  deny: z.array(z.string()).optional().describe('clients in these addresses or CIDRs get 403, even when allow lists them')
}).refine(r => r.allow !== undefined || r.deny !== undefined, { message: 'give "allow", "deny" or both' })

/** The longest body a route's `respond` may hold: it is kept in memory and written whole. */
export const MAX_RESPOND_BODY = 64 * 1024
const RESPOND_BODY_TOO_LONG = `at most ${MAX_RESPOND_BODY} bytes (UTF-8)`

// A route the gateway answers itself (src/proxy/respond.ts): after its admission (address,
// credentials, limits), as a forward would be.
const respondSchema = z.strictObject({
  status: z.int().min(200, 'expected a final status, 200 to 599').max(599, 'expected a final status, 200 to 599').describe('the status of every answer'),
  // bytes as sent (UTF-8): a length in characters let 40000 "é" through, 80 KB. The character
  // bound stays first for the editor's schema (maxLength), and a string over it is not measured.
  body: z.string().max(MAX_RESPOND_BODY, { message: RESPOND_BODY_TOO_LONG, abort: true })
    .refine(body => Buffer.byteLength(body) <= MAX_RESPOND_BODY, RESPOND_BODY_TOO_LONG).optional().describe('default none'),
  contentType: headerValue.min(1).optional().describe('default text/plain; charset=utf-8 when there is a body'),
  headers: z.record(headerName, headerValue, { error: `not a header name: ${HEADER_NAME_MESSAGE}` }).optional().describe('more response header fields')
})

/** Response compression: gateway-wide under `compression:`, per route under routes[].compression. */
const compressionSchema = z.strictObject({
  encodings: z.array(z.enum(ENCODINGS as ['br', 'gzip'])).min(1).optional().describe('the codings offered, in the order preferred when a client accepts several equally; default [br, gzip]'),
  minSize: size.optional().describe('a response whose Content-Length is smaller passes uncompressed (one of unknown length is compressed); default 1kb'),
  types: z.array(z.string().superRefine((range, ctx) => {
    const problem = mediaRangeProblem(range)
    if (problem !== null) ctx.addIssue({ code: 'custom', message: problem })
  })).min(1).optional().describe('media types compressed: text/html, text/*, application/*+json; default: text, JSON, JavaScript, XML, SVG and WebAssembly types'),
  gzipLevel: z.int().min(1).max(9).optional().describe('default 5'),
  maxConcurrent: z.int().positive().optional().describe('answers the process compresses at once (each encoder holds 0.6-1.3 MB while its answer goes out); beyond it they go out uncompressed; default 256'),
  brotliQuality: z.int().min(0).max(11).optional().describe('default 4; 11 costs over a hundred times the CPU of 4 for a body about a third smaller')
})

export const routeSchema = z.strictObject({
  name: z.string().regex(/^[A-Za-z0-9_.-]+$/, 'expected a name of letters, digits, "_", "." or "-"'),
  host: z.string().regex(/^(\*\.)?[A-Za-z0-9.-]+$/, 'expected a host name, optionally "*.example.com"').optional(),
  path: z.string().startsWith('/').optional(),
  pathPrefix: z.string().startsWith('/').optional(),
  methods: z.array(z.string().regex(/^[A-Za-z]+$/)).min(1).optional(),
  matchHeaders: z.record(headerName, z.union([z.string({ error: MATCH_VALUE }), z.array(z.string()).min(1), z.boolean()]), { error: `not a header name: ${HEADER_NAME_MESSAGE}` }).optional()
    .describe('request headers the route needs to match: { x-canary: "1", x-version: [v1, v2], x-debug: true (present), x-legacy: false (absent) }'),
  upstream: z.string().optional().describe('the upstream the route forwards to; a route has an upstream or a respond'),
  respond: respondSchema.optional().describe('the gateway answers itself, nothing is forwarded (maintenance, a retired path): { status, body, contentType, headers }'),
  stripPrefix: z.string().startsWith('/').optional(),
  websocket: z.boolean().optional(),
  caseInsensitive: z.boolean().optional().describe('match the path ignoring case (/Admin is /admin); default routing.caseInsensitive'),
  matchTrailingSlash: z.boolean().optional().describe('path: /a also matches /a/, pathPrefix: /a/ also matches /a; default routing.matchTrailingSlash'),
  allowPathParams: z.boolean().optional().describe('accept ";" in the path (matrix/path parameters); otherwise 400; default routing.allowPathParams'),
  timeouts: z.strictObject({ response: wait.optional() }).optional(),
  retries: z.int().min(0).max(MAX_RETRIES).optional().describe('this route\'s retries, over its upstream\'s (0: its requests are sent once)'),
  retryOn: z.array(retryCondition).min(1).optional().describe('this route\'s retryOn, over its upstream\'s (its retryBudget is the upstream\'s)'),
  retryBackoff: z.union([retryBackoff, z.literal(false)]).optional().describe('this route\'s retryBackoff, over its upstream\'s (max: 10 times its own base unless set); false: this route\'s retries are sent at once'),
  maxBodySize: size.optional(),
  headers: z.strictObject({ request: headerRules.optional(), response: headerRules.optional() }).optional(),
  limits: z.strictObject({ api: limitSchema.optional(), ip: limitSchema.optional(), user: limitSchema.optional() }).optional(),
  auth: z.enum(['required', 'optional', 'none']).optional()
    .describe('required: 401 without credentials; optional: verified when present; none: not verified, the credential header is removed; default from identity.required'),
  concurrency: routeConcurrencySchema.optional(),
  cors: corsSchema.optional(),
  ipRestriction: ipRestrictionSchema.optional().describe('client addresses that may use the route, besides the gateway-wide ipRestriction (both must let a client pass)'),
  compression: z.union([z.boolean(), compressionSchema]).optional().describe('false: this route\'s responses pass uncompressed; true: compressed as `compression:` says (its defaults when absent); an object: its keys override the gateway-wide ones; default: as `compression:` says')
})

// Requests that fail identity are charged to their IP here and against the gateway-wide ip limit.
const failureLimit = limitSchema.optional().describe('budget of failed identity checks per client IP; default 10 per 1m')

const identitySchema = z.union([
  z.strictObject({ header: z.string().min(1), required: z.boolean().optional(), failureLimit }),
  z.strictObject({
    apiKeys: z.strictObject({
      header: z.string().min(1),
      keys: z.record(z.string(), z.string()).optional().describe('API key -> consumer'),
      file: z.string().min(1).optional().describe('more "key: consumer" lines, relative to this file; re-read on SIGHUP')
    }),
    required: z.boolean().optional(),
    failureLimit
  }),
  z.strictObject({
    jwt: z.strictObject({
      secret: z.string().min(1).optional(),
      publicKey: z.string().min(1).optional(),
      jwksUrl: httpUrl.optional(),
      claim: z.string().optional(),
      planClaim: z.string().min(1).optional().describe('a claim naming the plan of the token\'s consumer'),
      header: z.string().optional(),
      issuer: z.string().optional(),
      audience: z.string().optional(),
      algorithms: z.array(z.string()).optional()
    }),
    required: z.boolean().optional(),
    failureLimit
  })
])

export const redisSchema = z.strictObject({
  url: redisUrl('expected a redis:// or rediss:// URL').optional(),
  cluster: z.array(redisUrl('expected a redis:// URL')).min(1).optional(),
  sentinels: z.array(z.string().regex(/^[^:\s]+:\d+$/, 'expected "host:port"').refine(portInRange, 'the port must be at most 65535')).min(1).optional(),
  name: z.string().optional().describe('sentinel master name'),
  password: z.string().optional(),
  tls: z.union([
    z.boolean(),
    // No option turns verification off: a private CA is given with `ca`, a name other than the
    // host connected to with `servername`.
    z.strictObject({
      ca: z.string().min(1).optional().describe('PEM file of the CA certificate(s) the Redis server certificates are checked against, instead of Node\'s default CAs; read when the config is loaded'),
      cert: z.string().min(1).optional().describe('PEM file of a client certificate, for a server with tls-auth-clients yes (with key)'),
      key: z.string().min(1).optional().describe('PEM file of the client certificate\'s private key (with cert)'),
      servername: z.string().min(1).optional().describe('name the server certificate must hold (and SNI); default the host connected to')
    }).refine(t => (t.cert === undefined) === (t.key === undefined), { message: 'cert and key go together: give both or neither', path: ['cert'] })
  ]).optional().describe('true: TLS checked against Node\'s default CAs (rediss:// URLs imply it); an object: TLS with those settings'),
  sentinelTls: z.boolean().optional()
    .describe('with sentinels: true asks the sentinels over TLS too (sentinels serving tls-port), with the same tls settings (CA, servername, client certificate), so tls must be set; default false: the sentinels over plain TCP, the master and replicas over TLS when tls is set'),
  keyPrefix: z.string().regex(/^[A-Za-z0-9_.:-]+$/).optional().describe('default "gw"'),
  timeout: wait.optional().describe('bound on every Redis call; default 50ms'),
  onError: z.enum(ON_ERROR).optional().describe('default local'),
  autoPipelining: z.boolean().optional(),
  leaseTtl: timer.optional().describe('concurrency leases of an instance that died are reclaimed within this; default 10s'),
  expectedInstances: z.int().min(1).max(1024).optional()
    .describe('gateway instances sharing the budget: the least the onError: local fallback divides each limit by; default 1')
})

export const configSchema = z.strictObject({
  $schema: z.string().optional(),
  listen: hostPort.optional().describe('default 0.0.0.0:8080'),
  admin: z.union([
    hostPort,
    z.strictObject({
      listen: hostPort.optional().describe('default 127.0.0.1:9901'),
      // visible ASCII: a header carries it as Latin-1, so a token with "€" could never match
      token: z.string().min(16, 'expected a token of at least 16 characters').regex(/^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/, 'expected visible ASCII characters only, spaces inside (a header cannot carry others as written)').optional()
        .describe('Bearer token every mutating admin endpoint requires (DELETE /limits)'),
      reads: z.enum(['open', 'token']).optional()
        .describe('open (default): reads need no token; token: every endpoint but /healthz, /readyz and the page\'s files needs Authorization: Bearer <token> too')
    })
  ]).optional().describe('address (default 127.0.0.1:9901), or { listen, token, reads }; /healthz /readyz /metrics /config /limits /consumers'),
  workers: z.int().min(1).max(256).optional(),
  trustedProxies: z.array(z.string()).optional().describe('CIDRs whose X-Forwarded-For is believed'),
  proxyProtocol: z.strictObject({
    from: z.array(z.string()).min(1, 'expected at least one address or CIDR: the load balancers that send the header')
      .describe('peers (addresses, CIDRs, loopback...) that open every connection with a PROXY protocol header (v1 or v2); others are served as they come'),
    timeout: wait.optional().describe('longest wait for the header once connected; default 5s')
  }).optional().describe('read the client address from the PROXY protocol header of a TCP load balancer (AWS NLB, HAProxy)'),
  ipRestriction: ipRestrictionSchema.optional().describe('client addresses that may use any route: { allow: [CIDR], deny: [CIDR] }; a route\'s own ipRestriction applies too'),
  ipv6Prefix: z.int().min(1).max(128).optional().describe('IPv6 clients are limited per prefix; default 64'),
  legacyHeaders: z.boolean().optional().describe('also send X-RateLimit-Limit/Remaining/Reset'),
  routing: z.strictObject({
    caseInsensitive: z.boolean().optional().describe('default for every route; false'),
    matchTrailingSlash: z.boolean().optional().describe('default for every route; false'),
    allowPathParams: z.boolean().optional().describe('default for every route; false')
  }).optional(),
  log: z.strictObject({
    level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).optional(),
    redactQuery: z.array(z.string().min(1)).optional().describe('query parameters whose values the access log shows as [redacted]; default token, key, api_key, password, secret, signature, access_token, client_secret, apikey, sig and the AWS and Google signed-URL fields; [] logs every query as sent')
  }).optional(),
  server: z.strictObject({
    headersTimeout: timer.optional(),
    requestTimeout: timer.optional(),
    keepAliveTimeout: timer.optional(),
    maxHeaderSize: z.int().min(1024).max(1048576).optional(),
    maxHeadersCount: z.int().min(8).max(10000).optional().describe('more header fields than this get 431; default 100'),
    shutdownTimeout: timer.optional(),
    bufferBodies: size.optional().describe('request bodies up to this size are read whole before an upstream connection is taken; 0 streams every body; default 1mb'),
    bufferBodiesTotal: size.optional().describe('gateway-wide cap on bytes held by bufferBodies; beyond it bodies stream; default 64mb'),
    clientBodyTimeout: wait.optional().describe('longest pause between two reads of a request body; default 60s'),
    sendTimeout: wait.optional().describe('longest a response write may wait for the client to read; default 60s'),
    websocketIdleTimeout: timer.optional().describe('a WebSocket tunnel with no traffic either way for this long is closed; default 5m'),
    maxConnections: z.int().positive().optional().describe('client connections open at once per process (per worker with workers: N); one more is closed as it arrives, unanswered, and counted in gateway_connections_dropped_total; default: half the open-file limit the process runs with, so the other half is left for upstream and Redis connections'),
    maxConnectionsPerClient: z.int().positive().optional().describe('client connections one client address (an IPv6 client by its ipv6Prefix) holds at once per process (per worker with workers: N); one more is closed as it arrives, unanswered, and counted in gateway_client_connections_dropped_total; peers in trustedProxies are exempt (they carry many clients); behind proxyProtocol the address is the one the header names; default: no cap'),
    maxWebSockets: z.int().positive().optional().describe('open WebSocket tunnels per process (per worker with workers: N); an upgrade beyond it gets 503; default 10000'),
    underscoresInHeaders: z.boolean().optional().describe('pass request headers whose names hold "_" (X_User_Id) to upstreams; default false: dropped, as nginx does, since CGI, WSGI and PHP read them as X-User-Id')
  }).optional(),
  tls: z.strictObject({
    cert: z.string(),
    key: z.string(),
    redirectHttp: z.strictObject({
      listen: hostPort.describe('the plain-HTTP address, e.g. 0.0.0.0:80'),
      port: z.int().min(1).max(65535).optional().describe('the HTTPS port clients are sent to; default the port of listen (443 is left out of the Location)')
    }).optional().describe('a plain-HTTP listener that answers every request with 308 to the same host and path over HTTPS')
  }).optional(),
  redis: redisSchema.optional(),
  tracing: z.strictObject({
    otlp: httpUrl.describe('OTLP/HTTP collector: one span per request is exported there (http://collector:4318 gets /v1/traces)'),
    serviceName: z.string().min(1).optional().describe('service.name of the exported spans; default edge-gateway')
  }).optional(),
  identity: identitySchema.optional(),
  local: z.strictObject({
    limit: z.int().positive(),
    window: duration,
    burst: z.int().positive().optional(),
    maxKeys: z.int().positive().optional()
  }).optional(),
  limits: z.strictObject({ global: limitSchema.optional(), ip: limitSchema.optional(), user: limitSchema.optional() }).optional(),
  consumers: z.record(z.string().min(1).max(256), z.strictObject({ plan: z.string() })).optional(),
  defaultPlan: z.string().optional().describe('plan of identified consumers without an entry; anonymous requests have no plan'),
  quotaTimezone: z.string().optional().describe('IANA time zone (e.g. Europe/Berlin) whose calendar quota periods follow; default UTC'),
  plans: z.record(z.string().regex(PLAN_NAME_RE, 'expected a plan name of letters, digits, "_" or "-"'), planSchema).optional(),
  concurrency: concurrencySchema.optional().describe('gateway-wide: at most N requests in flight per client, across all instances'),
  compression: compressionSchema.optional().describe('compress forwarded responses for clients that accept gzip or Brotli; absent: responses pass as the upstream sent them (a route may still turn it on)'),
  upstreams: z.record(z.string().regex(/^[A-Za-z0-9_.-]+$/), upstreamSchema),
  routes: z.array(routeSchema).min(1)
})

export type GatewayConfig = z.infer<typeof configSchema>
export type LimitConfig = z.infer<typeof limitSchema>
export type RouteConfig = z.infer<typeof routeSchema>
export type UpstreamConfigInput = z.infer<typeof upstreamSchema>
export type HealthCheckInput = z.infer<typeof healthCheckSchema>
export type RedisConfig = z.infer<typeof redisSchema>
export type QuotaConfig = z.infer<typeof quotaSchema>
export type PlanConfig = z.infer<typeof planSchema>
export type CompressionConfig = z.infer<typeof compressionSchema>

/** The JSON Schema editors use to autocomplete gateway.yaml (committed as gateway.schema.json). */
export function gatewayJsonSchema (): Record<string, unknown> {
  const schema = z.toJSONSchema(configSchema, { io: 'input' }) as Record<string, unknown>
  acceptEnvReferences(schema)
  return schema
}

/**
 * `${VAR}` / `${VAR:-default}` is substituted in string values before validation (load.ts), so
 * the editor schema must accept a reference where a pattern applies, or it flags valid files.
 */
export const ENV_REFERENCE_PATTERN = '\\$\\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\\}'

function acceptEnvReferences (node: unknown): void {
  if (Array.isArray(node)) {
    for (const item of node) acceptEnvReferences(item)
    return
  }
  if (node === null || typeof node !== 'object') return
  const obj = node as Record<string, unknown>
  if (typeof obj.pattern === 'string') obj.pattern = `(${obj.pattern})|${ENV_REFERENCE_PATTERN}`
  for (const value of Object.values(obj)) acceptEnvReferences(value)
}
