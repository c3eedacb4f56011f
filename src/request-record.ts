// One request from its arrival to its access-log line: what the pipeline learnt about it, whether
// it is still in flight on its runtime, and how it ended. Finishing is idempotent by construction:
// whichever ending comes first (answered, forwarded, timed out, failed, abandoned) is the one
// logged and counted; a later one is dropped, so no request is ever logged or counted twice.
import type { IncomingMessage } from 'node:http'
import { randomUUID } from 'node:crypto'
import type { ForwardResult } from './proxy/forward.js'
import type { Telemetry } from './telemetry.js'
import { hideTargetUserinfo, type AccessLog } from './log.js'
import { PROPAGATING_TRACER, setTrace, traceOf, type RequestTracer, type TraceContext } from './tracing.js'

/** What the early stages found about an admitted request. */
export interface Admission {
  readonly route: {
    readonly name: string
    readonly upstream: string | null
  }
  /** Normalized path + raw query. */
  readonly path: string
  readonly clientIp: string
  readonly ipKey: string
  user: string | null
  /** Milliseconds the limiter waited on its store (Redis) for this request; 0 when decided in process. */
  storeMs: number
}

/** The parts of a runtime a record reads: where it is counted, traced and how its path is logged. */
export interface RecordRuntime {
  /** Requests in flight on this runtime: the one counter the shutdown drain and the pool sweep wait on. */
  readonly activity: { inflight: number }
  readonly tracer: RequestTracer
  readonly redactQuery: (path: string) => string
  readonly isTrustedPeer: (peer: string | undefined) => boolean
}

/** How a request ended. */
export interface Ending {
  readonly status: number
  /** What the gateway decided when it answered itself: rejected, unauthorized, client_abort... */
  readonly outcome?: string | null
  /** The name of the limit that rejected. */
  readonly limit?: string | null
  /** The body bytes of the gateway's own answer (the access log's bytesOut). */
  readonly ownBytes?: number
  /** The forward's report, when the request went upstream. */
  readonly result?: ForwardResult | null
}

const REQUEST_ID_RE = /^[A-Za-z0-9._:@/+=-]{1,128}$/

// A client-chosen id would let it forge or collide with other requests' log lines: only our own
// proxies (trustedProxies) may hand one over.
function requestIdOf (req: IncomingMessage, trustedPeer: boolean): string {
  const given = trustedPeer ? req.headers['x-request-id'] : undefined
  return typeof given === 'string' && REQUEST_ID_RE.test(given) ? given : randomUUID()
}

export class RequestRecord {
  /** performance.now() at arrival. */
  readonly started = performance.now()
  readonly trustedPeer: boolean
  readonly requestId: string
  admission: Admission | null = null
  /** The client's address when the request has no admission (refused before routing). */
  clientIp: string | null = null
  private phase: 'open' | 'finished' = 'open'
  private counted = true

  /**
   * Counts the request in flight on `rt` until `leave()`. `leaveOnFinish`: an Upgrade stops being
   * a request once its handshake is decided (a tunnel is not a request); an HTTP request leaves
   * when its response closes, which can be after its log line.
   */
  constructor (
    private readonly sink: { readonly telemetry: Telemetry, readonly accessLog: AccessLog },
    readonly rt: RecordRuntime,
    readonly req: IncomingMessage,
    private readonly leaveOnFinish: boolean
  ) {
    rt.activity.inflight++
    this.trustedPeer = rt.isTrustedPeer(req.socket.remoteAddress)
    this.requestId = requestIdOf(req, this.trustedPeer)
  }

  /**
   * Starts the request's trace (rewriting the traceparent the upstream gets) unless started: the
   * pipeline calls it once a request passes the local level. A request refused before that gets
   * one only if something reads it (the access log, an exporting tracer): a flood's rejection
   * makes no ids (issue 13 item 5).
   */
  trace (): TraceContext {
    const started = traceOf(this.req)
    if (started !== undefined) return started
    const trace = this.rt.tracer.start(this.req, performance.timeOrigin + this.started)
    setTrace(this.req, trace)
    return trace
  }

  get finished (): boolean {
    return this.phase === 'finished'
  }

  /** No longer in flight on its runtime. Idempotent. */
  leave (): void {
    if (!this.counted) return
    this.counted = false
    this.rt.activity.inflight--
  }

  /**
   * One access-log line and the request metrics, for the first ending only. Returns false when
   * the request had already finished (the later ending is not logged).
   */
  finish (end: Ending): boolean {
    if (this.phase === 'finished') return false
    this.phase = 'finished'
    if (this.leaveOnFinish) this.leave()
    const { req, rt, admission: a } = this
    const { telemetry, accessLog } = this.sink
    const { status, outcome = null, limit = null, ownBytes = 0, result = null } = end
    const seconds = (performance.now() - this.started) / 1e3
    const route = a?.route.name ?? '-'
    telemetry.request(route, req.method ?? 'GET', status, seconds)
    if (outcome === 'rejected') telemetry.clientRejected(a?.clientIp ?? this.clientIp ?? req.socket.remoteAddress ?? '-', a?.user ?? null)
    const logged = accessLog.enabled()
    const trace = logged || rt.tracer !== PROPAGATING_TRACER ? this.trace() : traceOf(req)
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
    if (!logged) return true
    accessLog({
      requestId: this.requestId,
      traceId: trace?.traceId,
      ip: a?.clientIp ?? this.clientIp ?? req.socket.remoteAddress,
      user: a?.user ?? undefined,
      method: req.method,
      host: req.headers.host,
      path: rt.redactQuery(a?.path ?? hideTargetUserinfo(req.url ?? '/')),
      route,
      target: result?.target ?? undefined,
      status,
      sentStatus: result?.sentStatus,
      durationMs: Math.round(seconds * 1e6) / 1e3,
      bytesIn: result?.bytesIn ?? 0,
      bytesOut: result?.bytesOut ?? ownBytes,
      encoding: result?.encoding,
      error: result?.errorKind ?? undefined,
      retriedAfter: result?.retriedAfter?.[0],
      outcome: outcome ?? undefined,
      limit: limit ?? undefined,
      userAgent: req.headers['user-agent']
    })
    return true
  }
}
