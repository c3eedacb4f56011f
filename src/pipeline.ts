// The order of stages a request goes through, defined here and nowhere else:
//   client IP -> normalize path -> route -> local level (by IP; also charges 404s and 400s)
//   -> identity (a failure is charged to the IP in the shared store) -> shared limits
//   -> concurrency leases -> forward (HTTP) or tunnel (WebSocket)
// HTTP requests and WebSocket upgrades go through the same admit(); they differ only in how a
// refusal is written (a response, or raw bytes on the socket) and in what follows admission.
// Every stage only looks things up in the runtime compiled at load time.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Duplex } from 'node:stream'
import { normalizePath, requestTargetPath, requestTargetQuery } from './router/normalize-path.js'
import { normalizeHost } from './router/route-table.js'
import { checkRequestHead } from './router/request-head.js'
import { looksLikeMisconfiguredProxy } from './identify/client-ip.js'
import { forwardRequest, type ForwardContext, type ForwardErrorKind } from './proxy/forward.js'
import type { createWebSocketProxy } from './proxy/websocket.js'
import { ERRORS, sendError, sendJsonText, writeError, writeRawJsonText, type ErrorCode } from './errors.js'
import type { CompiledRoute, Runtime } from './runtime.js'
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
const UPSTREAM_FAILURES: ReadonlySet<ForwardErrorKind> = new Set<ForwardErrorKind>(['refused', 'dns', 'bad_response', 'reset', 'connect_timeout', 'response_timeout', 'no_healthy', 'queue_full', 'queue_timeout'])

/** What the early stages found: the record's admission, with the compiled route. */
interface Admission extends RecordedAdmission {
  readonly route: CompiledRoute
}

type Early = { ok: true, admission: Admission } | { ok: false, code: ErrorCode, extra?: Record<string, unknown>, headers?: ReadonlyArray<readonly [string, string]>, ipKey: string, clientIp: string }

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
  const head = checkRequestHead(req, rt.server.maxHeadersCount)
  if (head !== null) return { ok: false, code: head.code, extra: { reason: head.reason }, ipKey: client.key, clientIp: client.ip }
  // absolute-form (RFC 9112 §3.2.2) is accepted; anything else (e.g. "*") is not routable
  const url = req.url ?? '/'
  const rawPath = requestTargetPath(url)
  if (rawPath === null) return { ok: false, code: 'GW_ERR_BAD_PATH', ipKey: client.key, clientIp: client.ip }
  const normalized = normalizePath(rawPath)
  if (!normalized.ok) return { ok: false, code: 'GW_ERR_BAD_PATH', extra: { reason: normalized.reason }, ipKey: client.key, clientIp: client.ip }
  const host = normalizeHost(req.headers.host)
  const route = rt.routes.match(host, req.method ?? 'GET', normalized.path)
  if (route === null) {
    // A route has this path but not this method: 405 with Allow (RFC 9110 §15.5.6), not 404.
    const allow = rt.routes.allowedMethods(host, normalized.path)
    if (allow !== null) return { ok: false, code: 'GW_ERR_METHOD_NOT_ALLOWED', headers: [['allow', allow.join(', ')]], ipKey: client.key, clientIp: client.ip }
    return { ok: false, code: 'GW_ERR_NOT_FOUND', ipKey: client.key, clientIp: client.ip }
  }
  // Servlet containers and others strip ";params" from path segments: "/admin;x=1" would miss an
  // "/admin" route here, fall through to a catch-all and be served as /admin upstream.
  if (!route.allowPathParams && normalized.path.includes(';')) return { ok: false, code: 'GW_ERR_BAD_PATH', extra: { reason: 'path parameters (";") are not allowed on this route (allowPathParams)' }, ipKey: client.key, clientIp: client.ip }
  return { ok: true, admission: { route, path: normalized.path + requestTargetQuery(url), clientIp: client.ip, ipKey: client.key, user: null, storeMs: 0 } }
}

/**
 * For a failed identity, the verdict of charging it (a reject means its budget is spent: 429, not
 * 401); for a verified one, the shared limits' verdict.
 */
type Admitted = (identity: IdentityResult, verdict: LimitVerdict) => void

/**
 * Identity, then the limiter. Synchronous whenever both are (header or API-key identity, a cached
 * token, the in-process store, a local or deny-cache rejection): no Promise on that path.
 * `fail` receives anything a stage or `next` throws, so a bug never becomes a crash.
 */
function identifyAndLimit (rt: Runtime, req: IncomingMessage, a: Admission, record: RequestRecord, next: Admitted, fail: (err: unknown) => void): void {
  const requestId = record.requestId
  const limit = (identity: IdentityResult): void => {
    if (!identity.ok) {
      // Guessing keys or forging tokens costs budget: the IP is charged (one store call) even
      // though the request will never reach a route limit.
      const charged = rt.limiter.check({ route: a.route.name, plan: rt.failurePlan, ipKey: a.ipKey, user: null, requestId })
      if (charged instanceof Promise) charged.then(v => next(identity, v)).catch(fail)
      else next(identity, charged)
      return
    }
    a.user = identity.user
    const verdict = rt.limiter.check({ route: a.route.name, plan: limitsFor(a.route, identity.plan ?? null), ipKey: a.ipKey, user: a.user, requestId })
    if (verdict instanceof Promise) {
      const asked = performance.now()
      verdict.then(v => {
        a.storeMs = performance.now() - asked
        next(identity, v)
      }).catch(fail)
    }
    else next(identity, verdict)
  }
  try {
    const auth = a.route.auth
    if (auth === 'none') {
      // Not verified here, so not forwarded either: the upstream must never take an unchecked
      // credential for one the gateway vouched for.
      const header = rt.identity.credentialHeader
      if (header !== null) delete req.headers[header]
      limit(ANONYMOUS)
      return
    }
    const found = rt.identity.resolve(req.headers, auth === null ? undefined : auth === 'required', record.trustedPeer)
    if (found instanceof Promise) found.then(limit).catch(fail)
    else limit(found)
  } catch (err) {
    fail(err)
  }
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
// RFC 6455 §4.1: the opening handshake is a GET. http-proxy destroys any other upgrade without a
// word, which the access log showed as a client abort (499).
const UPGRADE_NOT_GET: Refusal = Object.freeze({ code: 'GW_ERR_BAD_REQUEST', extra: Object.freeze({ reason: 'a WebSocket upgrade must be a GET request' }) })

/**
 * What differs between an HTTP request and a WebSocket upgrade while it is being admitted: how a
 * refusal is written (a response, or raw bytes on the socket) and when the client is gone.
 */
interface Transport {
  /** Writes the answer of `refusal` from the error table; returns the body's bytes. */
  refuse (refusal: Refusal, requestId: string): number
  /** Writes a limiter's 429 (its body names the dimension, the limit and the wait). */
  reject (verdict: RejectVerdict, requestId: string): number
  /** Calls `f` once, when the client's side closes (the response, or the socket). Called once per request. */
  onClose (f: () => void): void
  /** The request has a route: a refusal if this transport cannot use it, else null. */
  routed (a: Admission): Refusal | null
}

/**
 * A response runs what its close means from the request's one 'close' listener (`closed()`, called
 * by createRequestHandler): one `once` per stage cost a wrapper and a bound function each, and
 * turned the response's listener slot into an array cloned on every emit.
 */
class HttpTransport implements Transport {
  private closeHook: (() => void) | null = null
  /** The route counted in flight until the response closes. */
  private inflightRoute: string | null = null
  constructor (private readonly res: ServerResponse, private readonly telemetry: Telemetry) {}
  refuse (r: Refusal, requestId: string): number { return sendError(this.res, r.code, requestId, r.extra, r.headers) }
  reject (v: RejectVerdict, requestId: string): number {
    const body = v.template.body(v.retryAfterMs, requestId)
    return sendJsonText(this.res, v.template.status, body, v.template.bytesOf(body), requestId, v.head)
  }
  onClose (f: () => void): void { this.closeHook = f }
  routed (a: Admission): null {
    this.telemetry.inflight(a.route.name, 1)
    this.inflightRoute = a.route.name
    return null
  }
  /** The response closed. */
  closed (): void {
    const route = this.inflightRoute
    if (route !== null) {
      this.inflightRoute = null
      this.telemetry.inflight(route, -1)
    }
    const hook = this.closeHook
    if (hook !== null) {
      this.closeHook = null
      hook()
    }
  }
}

class UpgradeTransport implements Transport {
  constructor (private readonly req: IncomingMessage, private readonly socket: Duplex) {}
  refuse (r: Refusal, requestId: string): number { return writeError(this.socket, r.code, requestId, r.extra, r.headers) }
  reject (v: RejectVerdict, requestId: string): number {
    const body = v.template.body(v.retryAfterMs, requestId)
    return writeRawJsonText(this.socket, v.template.status, body, v.template.bytesOf(body), requestId, v.head)
  }
  onClose (f: () => void): void { this.socket.once('close', f) }
  routed (a: Admission): Refusal | null {
    if (!a.route.websocket || (this.req.headers.upgrade ?? '').toLowerCase() !== 'websocket') return NOT_A_WEBSOCKET_ROUTE
    return this.req.method === 'GET' ? null : UPGRADE_NOT_GET
  }
}

// Module functions, not closures in admit(): a flood's rejection allocates none (issue 13 item 5).
function refuse (transport: Transport, record: RequestRecord, refusal: Refusal, outcome: string | null = null): void {
  const sent = transport.refuse(refusal, record.requestId)
  record.finish({ status: ERRORS[refusal.code].status, outcome, ownBytes: sent })
}

function reject (transport: Transport, record: RequestRecord, v: RejectVerdict): void {
  const sent = transport.reject(v, record.requestId)
  record.finish({ status: v.template.status, outcome: 'rejected', limit: v.template.limit, ownBytes: sent })
}

/**
 * Every stage before forwarding, for HTTP requests and upgrades alike. A refusal is written by
 * `transport` and finishes the record; an admitted request goes to `admitted` with the limiter's
 * verdict (its RateLimit headers, delay and leases, which go back when the client's side closes).
 */
function admit (state: PipelineState, rt: Runtime, record: RequestRecord, transport: Transport, admitted: (a: Admission, v: AllowVerdict) => void): void {
  const { req, requestId } = record
  const early = routeRequest(state, rt, req)
  // A request refused before it has a route is still logged and shown under its client's address
  // (behind a trusted proxy, not the proxy's): the address the local level charged.
  if (early.ok) record.admission = early.admission
  else record.clientIp = early.clientIp
  const shed = rt.limiter.local(early.ok ? early.admission.ipKey : early.ipKey, early.ok ? early.admission.route.name : '-')
  if (shed !== null && shed.kind === 'reject') return reject(transport, record, shed)
  if (!early.ok) return refuse(transport, record, early)
  record.trace()
  const a = early.admission
  const wrongRoute = transport.routed(a)
  if (wrongRoute !== null) return refuse(transport, record, wrongRoute)
  // Concurrency leases go back when the client's side closes: finished, failed or abandoned.
  let lease: HeldLease | null = null
  let closed = false
  transport.onClose(() => {
    closed = true
    if (lease !== null) rt.limiter.release(lease)
  })
  identifyAndLimit(rt, req, a, record, (identity, v) => {
    if (v.kind === 'allow' && v.lease !== null) {
      // the client may have left while the limiter decided
      if (closed) rt.limiter.release(v.lease)
      else lease = v.lease
    }
    if (v.kind === 'reject') return reject(transport, record, v)
    if (!identity.ok) return refuse(transport, record, { code: 'GW_ERR_UNAUTHORIZED', extra: { reason: identity.reason }, headers: BEARER }, 'unauthorized')
    if (v.kind === 'unavailable') return refuse(transport, record, { code: 'GW_ERR_LIMITER_UNAVAILABLE' }, 'limiter_unavailable')
    admitted(a, v)
  }, (err: unknown) => {
    // A stage failing must never become a crash: log it with the request id and answer 503,
    // unless the request was answered already (then the answer stands and is logged once).
    state.logger.error({ err, requestId }, 'request pipeline failed')
    if (!record.finished) refuse(transport, record, { code: 'GW_ERR_LIMITER_UNAVAILABLE' }, 'pipeline_error')
  })
}

/**
 * `closed` runs when the response closes, from the one 'close' listener every request gets (a
 * response closes once, so `on`, not `once` and its wrapper: this is per request).
 */
export function createRequestHandler (state: PipelineState, closed: (req: IncomingMessage, res: ServerResponse) => void = () => {}): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const rt = state.runtime
    const record = new RequestRecord(state, rt, req, false)
    const transport = new HttpTransport(res, state.telemetry)
    // In flight until the response closes: what the shutdown drain and the pool sweep wait for.
    res.on('close', () => {
      record.leave()
      closed(req, res)
      transport.closed()
    })
    admit(state, rt, record, transport, (a, v) => {
      // one literal shape (no spread of an optional field): the forward reads it per request
      const ctx: ForwardContext = {
        requestId: record.requestId,
        clientIp: a.clientIp,
        proto: state.proto,
        path: a.path,
        trustedPeer: record.trustedPeer,
        extraResponseHeaders: v.headers ?? undefined
      }
      const go = (): void => {
        const dispatched = performance.now()
        forwardRequest(req, res, a.route.forward, ctx, (result) => {
          if (result.target !== null) state.telemetry.upstreamResponse(a.route.upstream, (performance.now() - dispatched) / 1e3)
          if (result.errorKind !== null && UPSTREAM_FAILURES.has(result.errorKind)) state.telemetry.upstreamError(a.route.upstream, result.errorKind)
          record.finish({ status: result.status, result })
        })
      }
      if (v.delayMs > 0) {
        // leaky-bucket delay mode: hold the request until its slot (nginx limit_req without nodelay)
        let held = true
        const timer = setTimeout(() => { held = false; go() }, v.delayMs)
        // once dispatched, the forward reports a client that leaves (with what it had sent)
        res.once('close', () => {
          if (!held) return
          clearTimeout(timer)
          record.finish({ status: 499, outcome: 'client_abort' })
        })
      } else {
        go()
      }
    })
  }
}

export function createUpgradeHandler (state: PipelineState): (req: IncomingMessage, socket: Duplex, head: Buffer) => void {
  return (req, socket, head) => {
    const rt = state.runtime
    // An upgrade is a request until its handshake is decided; an open tunnel is not one.
    const record = new RequestRecord(state, rt, req, true)
    socket.on('error', () => socket.destroy())
    let closed = false
    let open = false
    socket.once('close', () => {
      closed = true
      if (open && record.admission !== null) state.telemetry.websocketsOpen(record.admission.route.name, -1)
    })
    admit(state, rt, record, new UpgradeTransport(req, socket), (a, v) => {
      // Logged and counted once the handshake is decided: 101, or the refusal the client got.
      const upgrade = (): void => state.ws.upgrade(req, socket, head, a.route.forward, { requestId: record.requestId, clientIp: a.clientIp, proto: state.proto, path: a.path, trustedPeer: record.trustedPeer, extraResponseHeaders: v.headers ?? undefined }, (result) => {
        if (result.errorKind !== null && UPSTREAM_FAILURES.has(result.errorKind)) state.telemetry.upstreamError(a.route.upstream, result.errorKind)
        if (result.status === 101 && !closed) {
          open = true
          state.telemetry.websocketsOpen(a.route.name, 1)
        }
        record.finish({ status: result.status, result })
        if (result.status === 101) trackWebSocket(state, rt, req, socket, record.requestId, a, result.target)
      })
      // leaky-bucket delay mode holds an upgrade until its slot, like any request
      if (v.delayMs > 0) setTimeout(() => { if (socket.destroyed) record.finish({ status: 499, outcome: 'client_abort' }); else upgrade() }, v.delayMs)
      else upgrade()
    })
  }
}

/**
 * An open WebSocket: counted while open, and a closing line (duration, bytes both ways on the
 * client connection after the handshake) so a long tunnel is not only its 101.
 */
function trackWebSocket (state: PipelineState, rt: Runtime, req: IncomingMessage, socket: Duplex, requestId: string, a: Admission, target: string | null): void {
  const opened = process.hrtime.bigint()
  const conn = socket as Duplex & { bytesRead?: number, bytesWritten?: number }
  const readAtOpen = conn.bytesRead ?? 0
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
