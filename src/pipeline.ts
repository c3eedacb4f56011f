// The order of stages a request goes through, defined here and nowhere else:
//   client IP -> normalize path -> route -> local level (by IP; also charges 404s and 400s)
//   -> identity (a failure is charged to the IP in the shared store) -> shared limits -> forward
// Every stage only looks things up in the runtime compiled at load time.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Duplex } from 'node:stream'
import { randomUUID } from 'node:crypto'
import { normalizePath } from './router/normalize-path.js'
import { normalizeHost } from './router/route-table.js'
import { checkRequestHead } from './router/request-head.js'
import { looksLikeMisconfiguredProxy } from './identify/client-ip.js'
import { forwardRequest, type ForwardContext, type ForwardErrorKind, type ForwardResult } from './proxy/forward.js'
import type { createWebSocketProxy } from './proxy/websocket.js'
import { ERRORS, sendError, sendJson, writeRawError, type ErrorCode } from './errors.js'
import type { CompiledRoute, Runtime } from './runtime.js'
import type { LimitVerdict } from './limit/limiter.js'
import type { HeldLease } from './limit/concurrency.js'
import type { IdentityResult } from './identify/identity.js'
import { limitsFor } from './limit/plan.js'

const ANONYMOUS: IdentityResult = Object.freeze({ ok: true, user: null })
import type { Telemetry } from './telemetry.js'
import type { Logger } from './log.js'
import { setTrace, traceOf } from './tracing.js'

export interface PipelineState {
  /** The live runtime; read once per request so a reload never changes a request mid-way. */
  runtime: Runtime
  readonly telemetry: Telemetry
  readonly logger: Logger
  readonly proto: 'http' | 'https'
  readonly ws: ReturnType<typeof createWebSocketProxy>
  warnedProxyMisconfig: boolean
  /** The last peer checked for that warning: a public peer sending XFF is not re-parsed per request. */
  proxyCheckedPeer: string | undefined
}

const REQUEST_ID_RE = /^[A-Za-z0-9._:@/+=-]{1,128}$/

// What gateway_upstream_errors_total counts. A 413, a header undici refuses or a client that left
// are the client's doing: counting them would page whoever watches the upstreams.
const UPSTREAM_FAILURES: ReadonlySet<ForwardErrorKind> = new Set<ForwardErrorKind>(['refused', 'dns', 'bad_response', 'reset', 'connect_timeout', 'response_timeout', 'no_healthy'])

// A client-chosen id would let it forge or collide with other requests' log lines: only our own
// proxies (trustedProxies) may hand one over.
function requestIdOf (req: IncomingMessage, trustedPeer: boolean): string {
  const given = trustedPeer ? req.headers['x-request-id'] : undefined
  return typeof given === 'string' && REQUEST_ID_RE.test(given) ? given : randomUUID()
}

/** What the early stages found, or the error that ended the request. */
interface Admission {
  route: CompiledRoute
  path: string
  clientIp: string
  ipKey: string
  user: string | null
  /** Milliseconds the limiter waited on its store (Redis) for this request; 0 when decided in process. */
  storeMs: number
}

type Early = { ok: true, admission: Admission } | { ok: false, code: ErrorCode, extra?: Record<string, unknown>, headers?: ReadonlyArray<readonly [string, string]>, ipKey: string }

function routeRequest (state: PipelineState, rt: Runtime, req: IncomingMessage): Early {
  // The client IP comes first: a request that fails to route is still charged to its address.
  const xff = req.headers['x-forwarded-for']
  const client = rt.resolveClientIp(req.socket.remoteAddress, xff)
  const peer = req.socket.remoteAddress
  if (!state.warnedProxyMisconfig && xff !== undefined && rt.trustedProxiesEmpty && peer !== state.proxyCheckedPeer) {
    state.proxyCheckedPeer = peer
    if (looksLikeMisconfiguredProxy(peer, xff)) {
      state.warnedProxyMisconfig = true
      state.logger.warn({ peer }, 'requests arrive with X-Forwarded-For from a private address but trustedProxies is empty: every client behind that proxy shares one IP limit')
    }
  }
  const head = checkRequestHead(req, rt.server.maxHeadersCount)
  if (head !== null) return { ok: false, code: head.code, extra: { reason: head.reason }, ipKey: client.key }
  const url = req.url ?? '/'
  let rawPath = url
  let query = ''
  const q = url.indexOf('?')
  if (q !== -1) {
    rawPath = url.slice(0, q)
    query = url.slice(q)
  }
  if (rawPath.charCodeAt(0) !== 47 /* / */) {
    // absolute-form (RFC 9112 §3.2.2) is accepted; anything else (e.g. "*") is not routable
    if (!/^https?:\/\//i.test(rawPath)) return { ok: false, code: 'GW_ERR_BAD_PATH', ipKey: client.key }
    const slash = rawPath.indexOf('/', rawPath.indexOf('//') + 2)
    rawPath = slash === -1 ? '/' : rawPath.slice(slash)
  }
  const normalized = normalizePath(rawPath)
  if (!normalized.ok) return { ok: false, code: 'GW_ERR_BAD_PATH', extra: { reason: normalized.reason }, ipKey: client.key }
  const host = normalizeHost(req.headers.host)
  const route = rt.routes.match(host, req.method ?? 'GET', normalized.path)
  if (route === null) {
    // A route has this path but not this method: 405 with Allow (RFC 9110 §15.5.6), not 404.
    const allow = rt.routes.allowedMethods(host, normalized.path)
    if (allow !== null) return { ok: false, code: 'GW_ERR_METHOD_NOT_ALLOWED', headers: [['allow', allow.join(', ')]], ipKey: client.key }
    return { ok: false, code: 'GW_ERR_NOT_FOUND', ipKey: client.key }
  }
  // Servlet containers and others strip ";params" from path segments: "/admin;x=1" would miss an
  // "/admin" route here, fall through to a catch-all and be served as /admin upstream.
  if (!route.allowPathParams && normalized.path.includes(';')) return { ok: false, code: 'GW_ERR_BAD_PATH', extra: { reason: 'path parameters (";") are not allowed on this route (allowPathParams)' }, ipKey: client.key }
  return { ok: true, admission: { route, path: normalized.path + query, clientIp: client.ip, ipKey: client.key, user: null, storeMs: 0 } }
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
function identifyAndLimit (rt: Runtime, req: IncomingMessage, a: Admission, requestId: string, next: Admitted, fail: (err: unknown) => void): void {
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
    const found = rt.identity.resolve(req.headers, auth === null ? undefined : auth === 'required')
    if (found instanceof Promise) found.then(limit).catch(fail)
    else limit(found)
  } catch (err) {
    fail(err)
  }
}

export function createRequestHandler (state: PipelineState): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const started = process.hrtime.bigint()
    const rt = state.runtime
    rt.activity.inflight++
    const trustedPeer = rt.isTrustedPeer(req.socket.remoteAddress)
    const requestId = requestIdOf(req, trustedPeer)
    setTrace(req, rt.tracer.start(req, Date.now()))
    const early = routeRequest(state, rt, req)
    const shed = rt.limiter.local(early.ok ? early.admission.ipKey : early.ipKey, early.ok ? early.admission.route.name : '-')
    if (shed !== null && shed.kind === 'reject') {
      const sent = sendJson(res, shed.status, { ...shed.body, requestId }, requestId, shed.headers)
      finish(state, rt, req, requestId, started, early.ok ? early.admission : null, null, shed.status, 'rejected', shed.body.limit, sent)
      return
    }
    if (!early.ok) {
      const sent = sendError(res, early.code, requestId, early.extra, early.headers)
      finish(state, rt, req, requestId, started, null, null, ERRORS[early.code].status, null, null, sent)
      return
    }
    const a = early.admission
    // Concurrency leases go back when the response closes: finished, failed or abandoned.
    let lease: HeldLease | null = null
    let closed = false
    state.telemetry.inflight(a.route.name, 1)
    res.once('close', () => {
      closed = true
      state.telemetry.inflight(a.route.name, -1)
      if (lease !== null) rt.limiter.release(lease)
    })
    identifyAndLimit(rt, req, a, requestId, (identity, v) => {
      if (v.kind === 'allow' && v.lease !== null) {
        // the client may have left while the limiter decided
        if (closed) rt.limiter.release(v.lease)
        else lease = v.lease
      }
      if (!identity.ok) {
        if (v.kind === 'reject') {
          const sent = sendJson(res, v.status, { ...v.body, requestId }, requestId, v.headers)
          finish(state, rt, req, requestId, started, a, null, v.status, 'rejected', v.body.limit, sent)
          return
        }
        const sent = sendError(res, 'GW_ERR_UNAUTHORIZED', requestId, { reason: identity.reason }, [['www-authenticate', 'Bearer']])
        finish(state, rt, req, requestId, started, a, null, 401, 'unauthorized', null, sent)
        return
      }
      if (v.kind === 'reject') {
        const sent = sendJson(res, v.status, { ...v.body, requestId }, requestId, v.headers)
        finish(state, rt, req, requestId, started, a, null, v.status, 'rejected', v.body.limit, sent)
        return
      }
      if (v.kind === 'unavailable') {
        const sent = sendError(res, 'GW_ERR_LIMITER_UNAVAILABLE', requestId)
        finish(state, rt, req, requestId, started, a, null, 503, 'limiter_unavailable', null, sent)
        return
      }
      const ctx: ForwardContext = {
        requestId,
        clientIp: a.clientIp,
        proto: state.proto,
        path: a.path,
        trustedPeer,
        ...(v.headers !== null ? { extraResponseHeaders: v.headers } : {})
      }
      const go = (): void => {
        const dispatched = process.hrtime.bigint()
        forwardRequest(req, res, a.route.forward, ctx, (result) => {
          if (result.target !== null) state.telemetry.upstreamResponse(a.route.upstream, Number(process.hrtime.bigint() - dispatched) / 1e9)
          if (result.errorKind !== null && UPSTREAM_FAILURES.has(result.errorKind)) state.telemetry.upstreamError(a.route.upstream, result.errorKind)
          finish(state, rt, req, requestId, started, a, result, result.status, null)
        })
      }
      if (v.delayMs > 0) {
        // leaky-bucket delay mode: hold the request until its slot (nginx limit_req without nodelay)
        let held = true
        const timer = setTimeout(() => { held = false; go() }, v.delayMs)
        res.once('close', () => {
          if (!held) return
          clearTimeout(timer)
          finish(state, rt, req, requestId, started, a, null, 499, 'client_abort')
        })
      } else {
        go()
      }
    }, (err: unknown) => {
      // A stage failing must never become a crash: log it with the request id and answer 503.
      state.logger.error({ err, requestId }, 'request pipeline failed')
      const sent = sendError(res, 'GW_ERR_LIMITER_UNAVAILABLE', requestId)
      finish(state, rt, req, requestId, started, a, null, 503, 'pipeline_error', null, sent)
    })
  }
}

export function createUpgradeHandler (state: PipelineState): (req: IncomingMessage, socket: Duplex, head: Buffer) => void {
  return (req, socket, head) => {
    const started = process.hrtime.bigint()
    const rt = state.runtime
    rt.activity.inflight++
    const trustedPeer = rt.isTrustedPeer(req.socket.remoteAddress)
    const requestId = requestIdOf(req, trustedPeer)
    setTrace(req, rt.tracer.start(req, Date.now()))
    socket.on('error', () => socket.destroy())
    const fail = (status: number, payload: Record<string, unknown>, a: Admission | null, headers?: ReadonlyArray<readonly [string, string]>, outcome: string | null = null, limit: string | null = null): void => {
      const sent = writeRawError(socket, status, { ...payload, requestId }, requestId, headers)
      finish(state, rt, req, requestId, started, a, null, status, outcome, limit, sent)
    }
    const early = routeRequest(state, rt, req)
    const shed = rt.limiter.local(early.ok ? early.admission.ipKey : early.ipKey, early.ok ? early.admission.route.name : '-')
    if (shed !== null && shed.kind === 'reject') {
      fail(shed.status, { ...shed.body }, early.ok ? early.admission : null, shed.headers, 'rejected', shed.body.limit)
      return
    }
    if (!early.ok) {
      fail(ERRORS[early.code].status, { error: early.code, message: ERRORS[early.code].message, ...early.extra }, null, early.headers)
      return
    }
    const a = early.admission
    if (!a.route.websocket || (req.headers.upgrade ?? '').toLowerCase() !== 'websocket') {
      fail(400, { error: 'GW_ERR_BAD_REQUEST', message: 'this route does not accept WebSocket upgrades' }, a)
      return
    }
    // A WebSocket holds its leases until the tunnel closes, from either side.
    let lease: HeldLease | null = null
    let open = false
    let closed = false
    socket.once('close', () => {
      closed = true
      if (lease !== null) rt.limiter.release(lease)
      if (open) state.telemetry.websocketsOpen(a.route.name, -1)
    })
    identifyAndLimit(rt, req, a, requestId, (identity, v) => {
      if (v.kind === 'allow' && v.lease !== null) {
        if (closed) rt.limiter.release(v.lease)
        else lease = v.lease
      }
      if (!identity.ok) {
        if (v.kind === 'reject') return fail(v.status, { ...v.body }, a, v.headers, 'rejected', v.body.limit)
        return fail(401, { error: 'GW_ERR_UNAUTHORIZED', message: identity.reason }, a, undefined, 'unauthorized')
      }
      if (v.kind === 'reject') return fail(v.status, { ...v.body }, a, v.headers, 'rejected', v.body.limit)
      if (v.kind === 'unavailable') return fail(503, { error: 'GW_ERR_LIMITER_UNAVAILABLE', message: ERRORS.GW_ERR_LIMITER_UNAVAILABLE.message }, a, undefined, 'limiter_unavailable')
      // Logged and counted once the handshake is decided: 101, or the refusal the client got.
      const upgrade = (): void => state.ws.upgrade(req, socket, head, a.route.forward, { requestId, clientIp: a.clientIp, proto: state.proto, path: a.path, trustedPeer }, (result) => {
        if (result.errorKind !== null && UPSTREAM_FAILURES.has(result.errorKind)) state.telemetry.upstreamError(a.route.upstream, result.errorKind)
        if (result.status === 101 && !closed) {
          open = true
          state.telemetry.websocketsOpen(a.route.name, 1)
        }
        finish(state, rt, req, requestId, started, a, result, result.status, null)
        if (result.status === 101) trackWebSocket(state, rt, req, socket, requestId, a, result.target)
      })
      // leaky-bucket delay mode holds an upgrade until its slot, like any request
      if (v.delayMs > 0) setTimeout(() => { if (socket.destroyed) finish(state, rt, req, requestId, started, a, null, 499, 'client_abort'); else upgrade() }, v.delayMs)
      else upgrade()
    }, (err: unknown) => {
      state.logger.error({ err, requestId }, 'upgrade pipeline failed')
      fail(503, { error: 'GW_ERR_LIMITER_UNAVAILABLE', message: ERRORS.GW_ERR_LIMITER_UNAVAILABLE.message }, a)
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

/**
 * One access-log line and the request metrics, whatever way the request ended. `outcome` is what
 * the gateway decided when it answered itself (rejected, unauthorized, ...), `limit` the name of
 * the limit that rejected, `ownBytes` the body of that answer.
 */
function finish (
  state: PipelineState,
  rt: Runtime,
  req: IncomingMessage,
  requestId: string,
  started: bigint,
  a: Admission | null,
  result: ForwardResult | null,
  status: number,
  outcome: string | null,
  limit: string | null = null,
  ownBytes = 0
): void {
  if (rt.activity.inflight > 0) rt.activity.inflight--
  const seconds = Number(process.hrtime.bigint() - started) / 1e9
  const route = a?.route.name ?? '-'
  state.telemetry.request(route, req.method ?? 'GET', status, seconds)
  if (outcome === 'rejected') state.telemetry.clientRejected(a?.clientIp ?? req.socket.remoteAddress ?? '-', a?.user ?? null)
  const trace = traceOf(req)
  if (trace !== undefined && trace.span !== null) {
    rt.tracer.end(trace, {
      route,
      method: req.method ?? 'GET',
      status,
      outcome,
      limit,
      upstream: a?.route.upstream ?? null,
      target: result?.target ?? null,
      redisMs: a?.storeMs ?? 0,
      error: result?.errorKind ?? null
    })
  }
  if (state.logger.isLevelEnabled('info')) {
    state.logger.info({
      requestId,
      traceId: trace?.traceId,
      ip: a?.clientIp ?? req.socket.remoteAddress,
      user: a?.user ?? undefined,
      method: req.method,
      host: req.headers.host,
      path: rt.redactQuery(a?.path ?? req.url ?? '/'),
      route,
      target: result?.target ?? undefined,
      status,
      sentStatus: result?.sentStatus,
      durationMs: Math.round(seconds * 1e6) / 1e3,
      bytesIn: result?.bytesIn ?? 0,
      bytesOut: result?.bytesOut ?? ownBytes,
      error: result?.errorKind ?? undefined,
      outcome: outcome ?? undefined,
      limit: limit ?? undefined,
      userAgent: req.headers['user-agent']
    }, 'request')
  }
}
