// The order of stages a request goes through, defined here and nowhere else:
//   client IP -> normalize path -> route -> local level (by IP; also charges 404s and 400s)
//   -> identity (a failure is charged to the IP in the shared store) -> shared limits
//   -> concurrency leases -> forward (HTTP) or tunnel (WebSocket)
// HTTP requests and WebSocket upgrades go through the same admit(); they differ only in how a
// refusal is written (a response, or raw bytes on the socket) and in what follows admission.
// Every stage only looks things up in the runtime compiled at load time.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Duplex } from 'node:stream'
import { normalizePath, requestTargetAuthority, requestTargetPath, requestTargetQuery } from './router/normalize-path.js'
import { normalizeHost } from './router/route-table.js'
import { checkRequestHead, checkTargetAuthority } from './router/request-head.js'
import { looksLikeMisconfiguredProxy } from './identify/client-ip.js'
import { forwardRequest, type ForwardContext, type ForwardErrorKind, type RetryCause } from './proxy/forward.js'
import type { StaticResponse } from './proxy/respond.js'
import type { createWebSocketProxy } from './proxy/websocket.js'
import { offersWebSocket } from './proxy/upgrade-offer.js'
import { hasRequestBody } from './proxy/request-body.js'
import { ERRORS, GatewayError, sendError, sendJsonText, writeError, writeRawJsonText, type ErrorCode } from './errors.js'
import { cutByGateway } from './proxy/shutdown-cut.js'
import { KIND_CODES } from './proxy/upstream-errors.js'
import type { CompiledRoute, Runtime } from './runtime.js'
import { preflightMethod, type CompiledCors } from './router/cors.js'
import type { LimitVerdict, RejectVerdict } from './limit/limiter.js'
import { RequestRecord, type Admission as RecordedAdmission } from './request-record.js'
import type { HeldLease } from './limit/concurrency.js'
import type { IdentityResult } from './identify/identity.js'
import { limitsFor } from './limit/plan.js'
import type { Telemetry } from './telemetry.js'
import type { AccessLog, Logger } from './log.js'
import { traceOf } from './tracing.js'

const ANONYMOUS: IdentityResult = Object.freeze({ ok: true, user: null })

export interface PipelineState {
  /** The live runtime; read once per request so a reload never changes a request mid-way. */
  runtime: Runtime
  readonly telemetry: Telemetry
  readonly logger: Logger
  /** The access line of every request (src/log.ts: serialized without pino's generic path). */
  readonly accessLog: AccessLog
  readonly proto: 'http' | 'https'
  readonly ws: ReturnType<typeof createWebSocketProxy>
  warnedProxyMisconfig: boolean
  /** The last peer checked for that warning: a public peer sending XFF is not re-parsed per request. */
  proxyCheckedPeer: string | undefined
}

// What gateway_upstream_errors_total counts. A 413, a header undici refuses or a client that left
// are the client's doing: counting them would page whoever watches the upstreams.
const UPSTREAM_FAILURES: ReadonlySet<ForwardErrorKind> = new Set<ForwardErrorKind>(['refused', 'dns', 'tls', 'bad_response', 'reset', 'connect_timeout', 'response_timeout', 'no_healthy', 'queue_full', 'queue_timeout'])

/** Each retry by its cause; a failed attempt's failure is the upstream's error too (an answer's status is not). */
function countRetries (telemetry: Telemetry, upstream: string, causes: readonly RetryCause[]): void {
  for (const cause of causes) {
    telemetry.upstreamRetry(upstream, cause)
    if (!cause.startsWith('status_')) telemetry.upstreamError(upstream, cause)
  }
}

/** What the early stages found: the record's admission, with the compiled route. */
interface Admission extends RecordedAdmission {
  readonly route: CompiledRoute
  /** A CORS preflight for `route` (routed by the method it asks for), answered by the gateway. */
  readonly preflight: boolean
}

/** `routed`: a refusal that tells of the routes (404, 405, a route's ";"), not of a malformed request. */
type Early = { ok: true, admission: Admission } | { ok: false, code: ErrorCode, extra?: Record<string, unknown>, headers?: ReadonlyArray<readonly [string, string]>, ipKey: string, clientIp: string, cors?: CompiledCors, routed?: true }

function routeRequest (state: PipelineState, rt: Runtime, req: IncomingMessage): Early {
  // The client IP comes first: a request that fails to route is still charged to its address.
  const xff = req.headers['x-forwarded-for']
  // A getter (net.Socket's remoteAddress goes through _getpeername): read once.
  const peer = req.socket.remoteAddress
  const client = rt.resolveClientIp(peer, xff)
  if (!state.warnedProxyMisconfig && xff !== undefined && rt.trustedProxiesEmpty && peer !== state.proxyCheckedPeer) {
    state.proxyCheckedPeer = peer
    if (looksLikeMisconfiguredProxy(peer, xff)) {
      state.warnedProxyMisconfig = true
      state.logger.warn({ peer }, 'requests arrive with X-Forwarded-For from a private address but trustedProxies is empty: every client behind that proxy shares one IP limit')
    }
  }
  let head = checkRequestHead(req, rt.server.maxHeadersCount)
  // absolute-form (RFC 9112 §3.2.2) is accepted; anything else (e.g. "*") is not routable
  const url = req.url ?? '/'
  const authority = head === null && url.charCodeAt(0) !== 47 /* / */ ? requestTargetAuthority(url) : null
  if (authority !== null) head = checkTargetAuthority(authority)
  if (head !== null) return { ok: false, code: head.code, extra: { reason: head.reason }, headers: head.headers, ipKey: client.key, clientIp: client.ip }
  // RFC 9112 §3.2.2: the target's authority is the host, whatever Host says, and a proxy forwards
  // it as Host. Routed by the Host instead, "GET http://admin.internal/ HTTP/1.1" with "Host:
  // public" would be served by one host's route and read by a cache or an upstream as the other's.
  if (authority !== null) req.headers.host = authority
  const rawPath = requestTargetPath(url)
  if (rawPath === null) return { ok: false, code: 'GW_ERR_BAD_PATH', ipKey: client.key, clientIp: client.ip }
  const normalized = normalizePath(rawPath)
  if (!normalized.ok) return { ok: false, code: 'GW_ERR_BAD_PATH', extra: { reason: normalized.reason }, ipKey: client.key, clientIp: client.ip }
  const host = normalizeHost(req.headers.host)
  let route = rt.routes.match(host, req.method ?? 'GET', normalized.path, req.headers)
  let preflight = false
  if (req.method === 'OPTIONS') {
    // A CORS preflight belongs to the route of the request it announces: routed by the method it
    // asks for. Answered by the gateway when that route has cors; otherwise an OPTIONS as before.
    const asked = preflightMethod(req.method, req.headers.origin, req.headers['access-control-request-method'])
    // A preflight carries none of the script's own fields: the routes' matchHeaders are not asked
    // (and a route with them but no cors does not answer it)
    const forRoute = asked === null ? null : rt.preflightRoutes.match(host, asked, normalized.path, null)
    if (forRoute !== null && forRoute.cors !== null) {
      route = forRoute
      preflight = true
    }
  }
  if (route === null) {
    // A route has this path but not this method: 405 with Allow (RFC 9110 §15.5.6), not 404.
    const allow = rt.routes.allowedMethods(host, normalized.path, req.headers)
    if (allow !== null) {
      // A script's call with a method the path does not take reads its 405 only with the CORS
      // fields: those of the first route with cors a preflight for one of the methods would reach.
      const cors = corsOfPath(rt, host, normalized.path, allow)
      return { ok: false, code: 'GW_ERR_METHOD_NOT_ALLOWED', headers: [['allow', allow.join(', ')]], ipKey: client.key, clientIp: client.ip, routed: true, ...(cors !== null ? { cors } : {}) }
    }
    return { ok: false, code: 'GW_ERR_NOT_FOUND', ipKey: client.key, clientIp: client.ip, routed: true }
  }
  // Servlet containers and others strip ";params" from path segments: "/admin;x=1" would miss an
  // "/admin" route here, fall through to a catch-all and be served as /admin upstream.
  if (!route.allowPathParams && normalized.path.includes(';')) return { ok: false, code: 'GW_ERR_BAD_PATH', extra: { reason: 'path parameters (";") are not allowed on this route (allowPathParams)' }, ipKey: client.key, clientIp: client.ip, routed: true }
  return { ok: true, admission: { route, path: normalized.path + requestTargetQuery(url), clientIp: client.ip, ipKey: client.key, user: null, storeMs: 0, preflight } }
}

/** The cors of the route a preflight for one of `methods` reaches first (a 405 is rare: no index). */
function corsOfPath (rt: Runtime, host: string, path: string, methods: readonly string[]): CompiledCors | null {
  for (const method of methods) {
    const cors = rt.preflightRoutes.match(host, method, path, null)?.cors ?? null
    if (cors !== null) return cors
  }
  return null
}

type HeaderPairs = ReadonlyArray<readonly [string, string]>
type AllowVerdict = Extract<LimitVerdict, { kind: 'allow' }>

/** An error answer from the table, with what it adds to the table's body. */
interface Refusal {
  readonly code: ErrorCode
  readonly extra?: Readonly<Record<string, unknown>>
  readonly headers?: HeaderPairs
}

const BEARER: HeaderPairs = Object.freeze([Object.freeze(['www-authenticate', 'Bearer'] as const)])
const NOT_A_WEBSOCKET_ROUTE: Refusal = Object.freeze({ code: 'GW_ERR_BAD_REQUEST', extra: Object.freeze({ reason: 'this route does not accept WebSocket upgrades' }) })
// RFC 6455 §4.1: the opening handshake is a GET. http-proxy destroys every other upgrade without a
// word, which the access log showed as a client abort (499).
const UPGRADE_NOT_GET: Refusal = Object.freeze({ code: 'GW_ERR_BAD_REQUEST', extra: Object.freeze({ reason: 'a WebSocket upgrade must be a GET request' }) })
// A handshake has no body (RFC 6455 §4.1), and http-proxy withholds one until a 101 comes while
// forwarding its Content-Length: an upstream that reads the announced body waited for bytes that
// never came, and its 504s, charged to the target, ejected it.
const UPGRADE_WITH_BODY: Refusal = Object.freeze({ code: 'GW_ERR_BAD_REQUEST', extra: Object.freeze({ reason: 'a WebSocket handshake carries no body (Content-Length or Transfer-Encoding)' }) })
const LIMITER_UNAVAILABLE: Refusal = Object.freeze({ code: 'GW_ERR_LIMITER_UNAVAILABLE' })
const IP_FORBIDDEN: Refusal = Object.freeze({ code: 'GW_ERR_IP_FORBIDDEN' })
const VARY_ORIGIN = Object.freeze(['vary', 'Origin'] as const)

/**
 * One request while it is admitted: its record (log line, metrics, in-flight count), how a refusal
 * is written (a response, or raw bytes on the socket) and what it holds until the client's side
 * closes. One object per request, whose methods are the stages' continuations: a record, a
 * transport and a closure per stage cost an allocation and an indirect call each, on every
 * request (issue 13: the request path's structure, not its duties, was what the gateway cost
 * over a bare proxy).
 */
abstract class Exchange extends RequestRecord {
  /** Concurrency leases, given back when the client's side closes: finished, failed or abandoned. */
  private lease: HeldLease | null = null
  private clientClosed = false
  /** A CORS route's Access-Control-* fields for this request's origin (null: none to send). */
  protected corsFields: HeaderPairs | null = null
  /** A CORS route whose answers depend on Origin: the gateway's own answers say Vary: Origin. */
  protected corsVaries = false

  constructor (readonly state: PipelineState, readonly runtime: Runtime, req: IncomingMessage, leaveOnFinish: boolean) {
    super(state, runtime, req, leaveOnFinish)
  }

  /** Writes the answer of `refusal` from the error table; returns the body's bytes. */
  protected abstract writeRefusal (refusal: Refusal): number
  /** Writes a limiter's 429 (its body names the dimension, the limit and the wait). */
  protected abstract writeRejection (verdict: RejectVerdict): number
  /** The request has a route: a refusal if this kind of request cannot use it, else null. */
  protected abstract routed (a: Admission): Refusal | null
  /** Every stage said yes: forward the request, or open the tunnel. */
  protected abstract admitted (a: Admission, v: AllowVerdict): void
  /** Answers a CORS preflight (the route has cors). */
  protected abstract answerPreflight (cors: CompiledCors): void

  private corsFor (cors: CompiledCors): void {
    this.corsVaries = cors.variesByOrigin
    this.corsFields = cors.fieldsFor(this.req.headers.origin)
  }

  /** `headers` of one of the gateway's own answers, with the route's CORS fields. */
  protected withCors (headers: HeaderPairs | undefined): HeaderPairs | undefined {
    if (this.corsFields === null && !this.corsVaries) return headers
    const out: Array<readonly [string, string]> = headers === undefined ? [] : [...headers]
    if (this.corsFields !== null) out.push(...this.corsFields)
    if (this.corsVaries) out.push(VARY_ORIGIN)
    return out
  }

  refuse (refusal: Refusal, outcome: string | null = null): void {
    const sent = this.writeRefusal(refusal)
    this.finish({ status: ERRORS[refusal.code].status, outcome, ownBytes: sent })
  }

  reject (v: RejectVerdict): void {
    const sent = this.writeRejection(v)
    this.finish({ status: v.template.status, outcome: 'rejected', limit: v.template.limit, ownBytes: sent })
  }

  /** The client's side closed (the response, or the upgrade's socket). */
  protected clientLeft (): void {
    this.clientClosed = true
    const lease = this.lease
    if (lease !== null) {
      this.lease = null
      this.runtime.limiter.release(lease)
    }
  }

  /**
   * Every stage before forwarding, for HTTP requests and upgrades alike. A refusal is written and
   * finishes the record; an admitted request goes to `admitted` with the limiter's verdict (its
   * RateLimit headers, delay and leases).
   */
  admit (): void {
    const rt = this.runtime
    const early = routeRequest(this.state, rt, this.req)
    // A client the gateway-wide ipRestriction refuses learns nothing of the routes: the same bare
    // 403 on a route's path as on none (no 404, no 405 with Allow, no route's CORS fields), as
    // nginx's server-level deny answers a path no location serves.
    const gatewayAllowed = rt.ipAllowed
    const shut = gatewayAllowed !== null && (early.ok || early.routed === true) && !gatewayAllowed(early.ok ? early.admission.clientIp : early.clientIp)
    // A request refused before it has a route is still logged and shown under its client's address
    // (behind a trusted proxy, not the proxy's): the address the local level charged.
    if (early.ok) {
      this.admission = early.admission
      // before the local level: its 429 is read by the browser script too
      const cors = early.admission.route.cors
      if (cors !== null && !shut) {
        if (!early.admission.preflight) this.corsFor(cors)
        // a preflight's refusals (its 403, the route's ipRestriction, the local level's 429) get
        // none of the policy's fields, but vary by Origin as its grant does: they said no Vary
        else this.corsVaries = cors.variesByOrigin
      }
    } else {
      this.clientIp = early.clientIp
      if (early.cors !== undefined && !shut) this.corsFor(early.cors)
    }
    const shed = rt.limiter.local(early.ok ? early.admission.ipKey : early.ipKey, early.ok ? early.admission.route.name : '-')
    if (shed !== null && shed.kind === 'reject') return this.reject(shed)
    if (!early.ok) return shut ? this.refuse(IP_FORBIDDEN, 'ip_forbidden') : this.refuse(early)
    this.trace()
    const a = early.admission
    // before anything the route would tell (a WebSocket route, a preflight's grant, a 401)
    const ipAllowed = a.route.ipAllowed
    if (shut || (ipAllowed !== null && !ipAllowed(a.clientIp))) return this.refuse(IP_FORBIDDEN, 'ip_forbidden')
    const wrongRoute = this.routed(a)
    if (wrongRoute !== null) return this.refuse(wrongRoute)
    // a preflight carries no credentials (Fetch): neither verified nor charged to the limits
    if (a.preflight && a.route.cors !== null) return this.answerPreflight(a.route.cors)
    this.identify(a)
  }

  /**
   * Identity, then the limiter. Synchronous whenever both are (header or API-key identity, a cached
   * token, the in-process store, a local or deny-cache rejection): no Promise on that path.
   * `failed` receives what a stage or `admitted` throws, so a bug never becomes a crash.
   */
  private identify (a: Admission): void {
    try {
      const auth = a.route.auth
      if (auth === 'none') {
        // Not verified here, so not forwarded either: the upstream must never take an unchecked
        // credential for one the gateway vouched for.
        const header = this.runtime.identity.credentialHeader
        if (header !== null) delete this.req.headers[header]
        this.limit(a, ANONYMOUS)
        return
      }
      // An IP that spent its failure budget is refused whatever credential it sends (a 429, the
      // budget's), before it is verified: a valid key used to pass, so a key-guesser read
      // the right guess as the one 200 among 429s.
      if (this.runtime.identity.offersSecret(this.req.headers)) {
        const held = this.runtime.limiter.heldRefusal(a.route.name, this.runtime.failurePlan, a.ipKey, this.requestId)
        if (held !== null) {
          this.reject(held)
          return
        }
      }
      const found = this.runtime.identity.resolve(this.req.headers, auth === null ? undefined : auth === 'required', this.trustedPeer)
      if (found instanceof Promise) found.then(identity => { this.limit(a, identity) }).catch((err: unknown) => { this.failed(err) })
      else this.limit(a, found)
    } catch (err) {
      this.failed(err)
    }
  }

  private limit (a: Admission, identity: IdentityResult): void {
    const limiter = this.runtime.limiter
    let verdict: LimitVerdict | Promise<LimitVerdict>
    if (!identity.ok) {
      // The identity provider's outage is not the client's guess: a 503, and no budget charged
      // (a 401 told clients with good tokens theirs was bad, then locked their IP out)
      if (identity.unavailable === true) {
        this.refuse({ code: 'GW_ERR_IDENTITY_UNAVAILABLE', extra: { reason: identity.reason } }, 'identity_unavailable')
        return
      }
      // Guessing keys or forging tokens costs budget: the IP is charged (one store call) even
      // though the request will never reach a route limit.
      verdict = limiter.check({ route: a.route.name, plan: this.runtime.failurePlan, ipKey: a.ipKey, user: null, requestId: this.requestId })
    } else {
      a.user = identity.user
      verdict = limiter.check({ route: a.route.name, plan: limitsFor(a.route, identity.plan ?? null), ipKey: a.ipKey, user: a.user, requestId: this.requestId })
    }
    if (verdict instanceof Promise) {
      // the wait is the span's gateway.redis.duration_ms, a failed identity's charge included (it said 0)
      const asked = performance.now()
      // one reaction for both outcomes: a .catch after the .then was a promise and a microtask
      // more for every request the shared level decides through Redis
      verdict.then(v => {
        a.storeMs = performance.now() - asked
        try {
          this.decided(a, identity, v)
        } catch (err) {
          this.failed(err)
        }
      }, (err: unknown) => { this.failed(err) })
    } else this.decided(a, identity, verdict)
  }

  /**
   * For a failed identity, the verdict of charging it (a reject means its budget is spent: 429, not
   * 401); for a verified one, the shared limits' verdict.
   */
  private decided (a: Admission, identity: IdentityResult, v: LimitVerdict): void {
    if (v.kind === 'allow' && v.lease !== null) {
      // the client may have left while the limiter decided
      if (this.clientClosed) this.runtime.limiter.release(v.lease)
      else this.lease = v.lease
    }
    if (v.kind === 'reject') return this.reject(v)
    // before the 401: a failure budget set to onError: deny refuses while Redis is away, as every
    // other limit does (a 401 let each guess through uncounted)
    if (v.kind === 'unavailable') return this.refuse(LIMITER_UNAVAILABLE, 'limiter_unavailable')
    if (!identity.ok) return this.refuse({ code: 'GW_ERR_UNAUTHORIZED', extra: { reason: identity.reason }, headers: BEARER }, 'unauthorized')
    this.admitted(a, v)
  }

  private failed (err: unknown): void {
    // A stage failing must never become a crash: log it with the request id and answer 503,
    // unless the request was answered already (then the answer stands and is logged once).
    this.state.logger.error({ err, requestId: this.requestId }, 'request pipeline failed')
    if (!this.finished) this.refuse(LIMITER_UNAVAILABLE, 'pipeline_error')
  }
}

// A leaky-bucket delay's end: module functions with the exchange as argument, no closure per request.
function forwardAfterDelay (x: HttpExchange, a: Admission, v: AllowVerdict): void { x.delayOver(a, v) }
function upgradeAfterDelay (x: UpgradeExchange, a: Admission, v: AllowVerdict): void { x.delayOver(a, v) }

/**
 * An HTTP request. Its response's one 'close' listener (`closed()`) runs what that close means for
 * every stage: one `once` per stage cost a wrapper and a bound function each, and turned the
 * response's listener slot into an array cloned on every emit.
 */
class HttpExchange extends Exchange {
  /** The route counted in flight until the response closes. */
  private inflightRoute: string | null = null
  /** A leaky-bucket delay holding the request (nginx limit_req without nodelay). */
  private delayTimer: NodeJS.Timeout | null = null

  constructor (state: PipelineState, rt: Runtime, req: IncomingMessage, readonly res: ServerResponse, private readonly onClosed: (req: IncomingMessage, res: ServerResponse) => void) {
    super(state, rt, req, false)
  }

  protected writeRefusal (r: Refusal): number { return sendError(this.res, r.code, this.requestId, r.extra, this.withCors(r.headers)) }
  protected writeRejection (v: RejectVerdict): number {
    const body = v.template.body(v.retryAfterMs, this.requestId)
    const cors = this.withCors(undefined)
    return sendJsonText(this.res, v.template.status, body, v.template.bytesOf(body), this.requestId, cors === undefined ? v.head : [...v.head, ...cors.flat()])
  }

  protected answerPreflight (cors: CompiledCors): void {
    const h = this.req.headers
    const asked = h['access-control-request-headers']
    const answer = cors.preflight(h.origin as string, h['access-control-request-method'] as string, typeof asked === 'string' ? asked : undefined)
    if (!answer.ok) return this.refuse({ code: 'GW_ERR_CORS_REJECTED', extra: { reason: answer.reason } }, 'cors_rejected')
    const res = this.res
    if (!res.headersSent && !res.destroyed) {
      res.writeHead(204, [...answer.headers, 'x-request-id', this.requestId])
      res.end()
    }
    this.finish({ status: 204, outcome: 'preflight' })
  }

  protected routed (a: Admission): null {
    this.state.telemetry.inflight(a.route.name, 1)
    this.inflightRoute = a.route.name
    return null
  }

  /** The response closed: in flight until here (what the shutdown drain and the pool sweep wait for). */
  closed (): void {
    this.leave()
    this.onClosed(this.req, this.res)
    const route = this.inflightRoute
    if (route !== null) {
      this.inflightRoute = null
      this.state.telemetry.inflight(route, -1)
    }
    this.clientLeft()
    if (this.delayTimer !== null) {
      // once dispatched, the forward reports a client that leaves (with what it had sent)
      clearTimeout(this.delayTimer)
      this.delayTimer = null
      // The gateway cut the connection (its shutdown, server.requestTimeout), not the client: logged
      // as the forward logs such a cut (503 shutting_down, 408), where it was a 499 client_abort.
      const cut = cutByGateway.get(this.res)
      const code = cut === undefined ? null : KIND_CODES[cut]
      if (cut === undefined || code === null) this.finish({ status: 499, outcome: 'client_abort' })
      else this.finish({ status: ERRORS[code].status, result: { status: ERRORS[code].status, target: null, bytesIn: 0, bytesOut: 0, errorCode: code, errorKind: cut, retriedAfter: null, error: new GatewayError(code) } })
    }
  }

  protected admitted (a: Admission, v: AllowVerdict): void {
    if (v.delayMs > 0) this.delayTimer = setTimeout(forwardAfterDelay, v.delayMs, this, a, v)
    else this.forward(a, v)
  }

  delayOver (a: Admission, v: AllowVerdict): void {
    this.delayTimer = null
    this.forward(a, v)
  }

  /** A route with respond: its answer, with the fields the request adds (RateLimit, CORS, X-Request-Id). */
  private respondStatically (respond: StaticResponse, v: AllowVerdict): void {
    const res = this.res
    let sent = 0
    if (!res.headersSent && !res.destroyed) {
      const fields = [...respond.fields]
      for (const [name, value] of this.withCors(v.headers ?? undefined) ?? []) fields.push(name, value)
      fields.push('x-request-id', this.requestId)
      res.writeHead(respond.status, fields)
      if (this.req.method === 'HEAD' || respond.body.length === 0) res.end()
      else {
        res.end(respond.body)
        sent = respond.body.length
      }
    }
    this.finish({ status: respond.status, outcome: 'responded', ownBytes: sent })
  }

  private forward (a: Admission, v: AllowVerdict): void {
    const route = a.route
    if (route.respond !== null) return this.respondStatically(route.respond, v)
    const plan = route.forward
    const upstream = route.upstream
    const state = this.state
    // one literal shape (no spread of an optional field): the forward reads it per request
    const ctx: ForwardContext = {
      requestId: this.requestId,
      clientIp: a.clientIp,
      proto: state.proto,
      path: a.path,
      trustedPeer: this.trustedPeer,
      // the route drops the upstream's Access-Control-* and appends Vary: Origin to its Vary
      extraResponseHeaders: this.corsFields === null ? v.headers ?? undefined : [...(v.headers ?? []), ...this.corsFields]
    }
    const dispatched = performance.now()
    forwardRequest(this.req, this.res, plan, ctx, (result) => {
      if (result.target !== null) state.telemetry.upstreamResponse(upstream, (performance.now() - dispatched) / 1e3)
      if (result.errorKind !== null && UPSTREAM_FAILURES.has(result.errorKind)) state.telemetry.upstreamError(upstream, result.errorKind)
      // the failures of the attempts before the last are the upstream's, though a later one answered
      if (result.retriedAfter !== null) countRetries(state.telemetry, upstream, result.retriedAfter)
      if (result.retryOverBudget === true) state.telemetry.upstreamRetryOverBudget(upstream)
      this.finish({ status: result.status, result })
    })
  }
}

// The response's exchange, for its 'close' listener: one function for every request, no closure
// (measured with bench/alloc.js: 40-90 bytes less per request than a closure per response).
const EXCHANGE = Symbol('gateway.exchange')
type ExchangeResponse = ServerResponse & { [EXCHANGE]: HttpExchange }

function responseClosed (this: ServerResponse): void {
  (this as ExchangeResponse)[EXCHANGE].closed()
}

/**
 * `closed` runs when the response closes, from the one 'close' listener every request gets (a
 * response closes once, so `on`, not `once` and its wrapper: this is per request).
 */
export function createRequestHandler (state: PipelineState, closed: (req: IncomingMessage, res: ServerResponse) => void = () => {}): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const x = new HttpExchange(state, state.runtime, req, res, closed)
    ;(res as ExchangeResponse)[EXCHANGE] = x
    res.on('close', responseClosed)
    x.admit()
  }
}

/** A WebSocket upgrade: a request until its handshake is decided; an open tunnel is not one. */
class UpgradeExchange extends Exchange {
  /** The tunnel is open (counted in gateway_websockets_open until the socket closes). */
  private open = false
  private socketClosed = false
  /** A leaky-bucket delay holding the upgrade: its timer, and how the proxy forgets it. */
  private delayTimer: NodeJS.Timeout | null = null
  private unhold: (() => void) | null = null

  constructor (state: PipelineState, rt: Runtime, req: IncomingMessage, readonly socket: Duplex, readonly head: Buffer) {
    super(state, rt, req, true)
  }

  // A HEAD's answer has no content: its JSON read as the start of a next answer (node's client
  // failed the request with "Data after `Connection: close`").
  protected writeRefusal (r: Refusal): number { return writeError(this.socket, r.code, this.requestId, r.extra, r.headers, this.req.method !== 'HEAD') }
  protected writeRejection (v: RejectVerdict): number {
    const body = v.template.body(v.retryAfterMs, this.requestId)
    return writeRawJsonText(this.socket, v.template.status, body, v.template.bytesOf(body), this.requestId, v.head, this.req.method !== 'HEAD')
  }

  /** Not reached: an upgrade that is no GET is refused when routed. */
  protected answerPreflight (): void { this.refuse(UPGRADE_NOT_GET) }

  protected routed (a: Admission): Refusal | null {
    // (a route with respond is never a websocket route: load.ts refuses the two together)
    if (!a.route.websocket || !offersWebSocket(this.req)) return NOT_A_WEBSOCKET_ROUTE
    if (this.req.method !== 'GET') return UPGRADE_NOT_GET
    return hasRequestBody(this.req.headers) ? UPGRADE_WITH_BODY : null
  }

  socketClose (): void {
    this.socketClosed = true
    if (this.open && this.admission !== null) this.state.telemetry.websocketsOpen(this.admission.route.name, -1)
    this.clientLeft()
    // a client gone during the delay is logged now, as an HTTP request's is, not when it ends
    if (this.endDelay()) this.finish({ status: 499, outcome: 'client_abort' })
  }

  protected admitted (a: Admission, v: AllowVerdict): void {
    // leaky-bucket delay mode holds an upgrade until its slot, like every request; a drain ends
    // the wait, and the proxy then answers it 503 shutting_down
    if (v.delayMs > 0) {
      this.delayTimer = setTimeout(upgradeAfterDelay, v.delayMs, this, a, v)
      this.unhold = this.state.ws.hold(() => { this.delayOver(a, v) })
    } else this.upgrade(a, v)
  }

  delayOver (a: Admission, v: AllowVerdict): void {
    this.endDelay()
    if (this.socket.destroyed) this.finish({ status: 499, outcome: 'client_abort' })
    else this.upgrade(a, v)
  }

  /** Stops the delay's timer and hold; false if none was running. */
  private endDelay (): boolean {
    if (this.delayTimer === null) return false
    clearTimeout(this.delayTimer)
    this.delayTimer = null
    this.unhold?.()
    this.unhold = null
    return true
  }

  private upgrade (a: Admission, v: AllowVerdict): void {
    const { state, req, socket } = this
    // Logged and counted once the handshake is decided: 101, or the refusal the client got.
    const route = a.route
    // routed() let through websocket routes alone; this narrows the route to one that forwards
    if (!route.websocket) return this.refuse(NOT_A_WEBSOCKET_ROUTE)
    const plan = route.forward
    const upstream = route.upstream
    state.ws.upgrade(req, socket, this.head, plan, { requestId: this.requestId, clientIp: a.clientIp, proto: state.proto, path: a.path, trustedPeer: this.trustedPeer, extraResponseHeaders: v.headers ?? undefined }, (result) => {
      if (result.errorKind !== null && UPSTREAM_FAILURES.has(result.errorKind)) state.telemetry.upstreamError(upstream, result.errorKind)
      if (result.retriedAfter !== null) countRetries(state.telemetry, upstream, result.retriedAfter)
      if (result.status === 101 && !this.socketClosed) {
        this.open = true
        state.telemetry.websocketsOpen(a.route.name, 1)
      }
      this.finish({ status: result.status, result })
      if (result.status === 101) trackWebSocket(state, this.runtime, req, socket, this.requestId, a, result.target)
    })
  }
}

export function createUpgradeHandler (state: PipelineState): (req: IncomingMessage, socket: Duplex, head: Buffer) => void {
  return (req, socket, head) => {
    const x = new UpgradeExchange(state, state.runtime, req, socket, head)
    // A handshake pipelined behind slower answers starts when they close (src/server.ts), possibly
    // after its client reset the connection: a socket that has closed emits no 'close' again, so
    // a lease taken now would never be given back (the IP or route refused 429 for good).
    if (socket.destroyed) {
      x.finish({ status: 499, outcome: 'client_abort' })
      return
    }
    socket.on('error', () => socket.destroy())
    socket.once('close', () => { x.socketClose() })
    x.admit()
  }
}

/**
 * An open WebSocket: counted while open, and a closing line (duration, bytes both ways on the
 * client connection after the handshake) so a long tunnel is not only its 101.
 */
function trackWebSocket (state: PipelineState, rt: Runtime, req: IncomingMessage, socket: Duplex, requestId: string, a: Admission, target: string | null): void {
  const opened = process.hrtime.bigint()
  const conn = socket as Duplex & { bytesRead?: number, bytesWritten?: number }
  // Frames the client sent with its handshake, or while it waited for the 101, are read but not
  // yet passed on (http-proxy put them back in the socket's buffer): they count as the tunnel's,
  // and were left out of bytesIn, though the upstream got them.
  const readAtOpen = (conn.bytesRead ?? 0) - socket.readableLength
  // http-proxy writes the 101 head right after the listener that reported it: counted from after it
  let writtenAtOpen = conn.bytesWritten ?? 0
  process.nextTick(() => { writtenAtOpen = conn.bytesWritten ?? writtenAtOpen })
  socket.once('close', () => {
    if (!state.logger.isLevelEnabled('info')) return
    state.logger.info({
      requestId,
      traceId: traceOf(req)?.traceId,
      ip: a.clientIp,
      user: a.user ?? undefined,
      path: rt.redactQuery(a.path),
      route: a.route.name,
      target: target ?? undefined,
      durationMs: Math.round(Number(process.hrtime.bigint() - opened) / 1e3) / 1e3,
      bytesIn: (conn.bytesRead ?? 0) - readAtOpen,
      bytesOut: (conn.bytesWritten ?? 0) - writtenAtOpen,
      host: req.headers.host
    }, 'websocket closed')
  })
}
