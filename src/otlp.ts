// `tracing: { otlp: URL }`: one span per request, exported over OTLP/HTTP with the OpenTelemetry
// JS SDK in batches (a collector that is slow or down costs a dropped batch, never a request).
// Only this module imports the SDK; the pipeline sees the RequestTracer interface of tracing.ts.
import { Agent as HttpAgent, type IncomingMessage } from 'node:http'
import { Agent as HttpsAgent } from 'node:https'
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, TraceFlags, trace as otelTrace, type Span, type Tracer } from '@opentelemetry/api'
import { BatchSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace'
import { resourceFromAttributes } from '@opentelemetry/resources'
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http'
import { hideTargetUserinfo } from './log.js'
import { incomingParent, traceparentOf, type RequestTracer, type SpanEnd, type TraceContext } from './tracing.js'
import { waitAtMost } from './wait-at-most.js'

export interface OtlpTracer extends RequestTracer {
  /** Exports what is buffered, then stops. */
  shutdown (): Promise<void>
}

/** A bare collector address (`http://collector:4318`) gets the OTLP/HTTP traces path. */
export function otlpTracesUrl (url: string): string {
  const u = new URL(url)
  if (u.pathname === '/' || u.pathname === '') u.pathname = '/v1/traces'
  return u.toString()
}

/**
 * Longest the shutdown waits for the last export. The SDK's own wait is its exporter's timeout and
 * retries (about 10 s against a collector that accepts and never answers), which used up a whole
 * `docker stop` grace period: the gateway was SIGKILLed before its last log lines were written.
 */
export const OTLP_SHUTDOWN_MS = 1000
/**
 * Longest one export may take (the SDK's default is 10 s). An export still in flight keeps the
 * process alive after the shutdown's bound, so this is also the most the exit can wait for it.
 */
export const OTLP_EXPORT_TIMEOUT_MS = 2000

/**
 * The exporter's agent: one connection per export, destroyed OTLP_EXPORT_TIMEOUT_MS after it was
 * opened whatever the collector sends. The exporter's `timeoutMillis` is the socket's idle timeout:
 * a collector answering a byte at a time never reached it, its exports never ended, and after
 * SIGTERM the process never exited. Without keep-alive, a connection's bound is its one export's.
 */
function boundedAgent (protocol: string): HttpAgent {
  const agent = protocol === 'https:' ? new HttpsAgent({ keepAlive: false }) : new HttpAgent({ keepAlive: false })
  const connect = agent.createConnection.bind(agent)
  agent.createConnection = (options, callback) => {
    const socket = connect(options, callback)
    if (socket != null) {
      const cut = setTimeout(() => socket.destroy(new Error(`OTLP export cut after ${OTLP_EXPORT_TIMEOUT_MS} ms`)), OTLP_EXPORT_TIMEOUT_MS)
      cut.unref()
      socket.once('close', () => { clearTimeout(cut) })
    }
    return socket
  }
  return agent
}

export function createOtlpTracer (url: string, serviceName: string): OtlpTracer {
  const exporter = new OTLPTraceExporter({ url: otlpTracesUrl(url), timeoutMillis: OTLP_EXPORT_TIMEOUT_MS, httpAgentOptions: boundedAgent })
  const provider = new TracerProvider({
    resource: resourceFromAttributes({ 'service.name': serviceName }),
    spanProcessors: [new BatchSpanProcessor({ exporter, scheduledDelayMillis: 500 })]
  })
  const tracer: Tracer = provider.getTracer('edge-gateway')
  return {
    start (req: IncomingMessage, startedAtMs: number): TraceContext {
      const parent = incomingParent(req)
      const context = parent === null
        ? ROOT_CONTEXT
        : otelTrace.setSpanContext(ROOT_CONTEXT, { traceId: parent.traceId, spanId: parent.parentSpanId, traceFlags: parseInt(parent.flags, 16), isRemote: true })
      const span = tracer.startSpan(req.method ?? 'GET', {
        kind: SpanKind.SERVER,
        startTime: startedAtMs,
        attributes: { 'http.request.method': req.method ?? 'GET', 'url.path': hideTargetUserinfo(req.url ?? '/').split('?')[0] ?? '/' }
      }, context)
      const sc = span.spanContext()
      // the SDK decides sampling (parent-based): the flags sent on are its decision
      const flags = (sc.traceFlags & TraceFlags.SAMPLED) === TraceFlags.SAMPLED ? '01' : '00'
      const trace: TraceContext = { traceId: sc.traceId, spanId: sc.spanId, parentSpanId: parent?.parentSpanId ?? null, flags, span }
      req.headers.traceparent = traceparentOf(trace)
      return trace
    },
    end (trace: TraceContext, e: SpanEnd): void {
      const span = trace.span as Span
      span.updateName(`${e.method} ${e.route}`)
      span.setAttribute('http.route', e.route)
      span.setAttribute('http.response.status_code', e.status)
      span.setAttribute('gateway.redis.duration_ms', Math.round(e.redisMs * 1000) / 1000)
      if (e.outcome !== null) span.setAttribute('gateway.outcome', e.outcome)
      if (e.limit !== null) span.setAttribute('gateway.limit', e.limit)
      if (e.upstream !== null) span.setAttribute('gateway.upstream', e.upstream)
      if (e.target !== null) span.setAttribute('gateway.upstream.target', e.target)
      if (e.error !== null) span.setAttribute('error.type', e.error)
      // OTel HTTP semantic conventions: a server span is an error for 5xx only
      if (e.status >= 500) span.setStatus({ code: SpanStatusCode.ERROR })
      span.end()
    },
    shutdown: async () => {
      // a failing export must not fail the gateway's close either: the spans are lost, nothing else
      await waitAtMost(provider.shutdown(), OTLP_SHUTDOWN_MS)
    }
  }
}
