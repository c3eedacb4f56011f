// W3C Trace Context (https://www.w3.org/TR/trace-context/): every request gets a trace, the one
// its `traceparent` names or a new one, and the upstream receives a `traceparent` whose parent is
// the gateway's own span. The trace id goes into the access log line; with `tracing.otlp` set, the
// span is also exported (src/otlp.ts). Without it no span object exists: ids only.
import type { IncomingMessage } from 'node:http'
import { randomFillSync } from 'node:crypto'

export interface TraceContext {
  readonly traceId: string
  /** The gateway's span: the parent the upstream sees. */
  readonly spanId: string
  /** The caller's span, when the request carried a valid traceparent. */
  readonly parentSpanId: string | null
  readonly flags: string
  /** The exporter's span handle when spans are exported, else null. */
  readonly span: unknown
}

/** What a request's trace is recorded with when it ends. */
export interface SpanEnd {
  readonly route: string
  readonly method: string
  readonly status: number
  readonly outcome: string | null
  readonly limit: string | null
  readonly upstream: string | null
  readonly target: string | null
  readonly redisMs: number
  readonly error: string | null
}

/** Compiled at load: propagation only, or propagation plus span export. */
export interface RequestTracer {
  /** Reads the incoming traceparent and rewrites it for the upstream. */
  start (req: IncomingMessage, startedAtMs: number): TraceContext
  end (trace: TraceContext, end: SpanEnd): void
}

// version 00 as specified; a higher version is read by its first four fields (§3.2.4: "parse
// them as version 00"), ff is invalid, and all-zero ids are invalid.
const TRACEPARENT_RE = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/
const ZERO_TRACE = '0'.repeat(32)
const ZERO_SPAN = '0'.repeat(16)

export interface ParsedParent { traceId: string, parentSpanId: string, flags: string }

export function parseTraceparent (header: string | string[] | undefined): ParsedParent | null {
  // a repeated traceparent is invalid (§3.2): start a new trace rather than pick one. Node joins a
  // repeated field with ", ", and a later version's extra fields matched the joined pair.
  if (typeof header !== 'string' || header.includes(',')) return null
  const m = TRACEPARENT_RE.exec(header.trim())
  if (m === null) return null
  const [, version, traceId, parentSpanId, flags, rest] = m as unknown as [string, string, string, string, string, string | undefined]
  if (version === 'ff' || (version === '00' && rest !== undefined)) return null
  if (traceId === ZERO_TRACE || parentSpanId === ZERO_SPAN) return null
  // sampled is the one flag of version 00; the others are reserved and "Vendors MUST set those to
  // zero" (§3.2.2.5): a caller's ff went on to the upstream as it came
  return { traceId, parentSpanId, flags: (parseInt(flags, 16) & 1) === 1 ? '01' : '00' }
}

/**
 * The caller's span from the request's traceparent, or null. Without one, the caller's tracestate
 * is removed: it describes a trace the upstream will not see (W3C Trace Context §3.3.1: a
 * tracestate is discarded when the traceparent is invalid).
 */
export function incomingParent (req: IncomingMessage): ParsedParent | null {
  const parent = parseTraceparent(req.headers.traceparent)
  if (parent === null && req.headers.tracestate !== undefined) delete req.headers.tracestate
  return parent
}

// Ids come from a pooled random buffer: one randomFillSync per 256 ids instead of one per request.
const pool = Buffer.alloc(4096)
let offset = pool.length

export function randomHex (bytes: number): string {
  if (offset + bytes > pool.length) {
    randomFillSync(pool)
    offset = 0
  }
  const hex = pool.toString('hex', offset, offset + bytes)
  offset += bytes
  return hex
}

/** The traceparent the upstream gets: same trace, the gateway's span as parent. */
export function traceparentOf (trace: TraceContext): string {
  return `00-${trace.traceId}-${trace.spanId}-${trace.flags}`
}

/** Propagation without export: the default when `tracing.otlp` is not set. */
export const PROPAGATING_TRACER: RequestTracer = Object.freeze({
  start (req: IncomingMessage): TraceContext {
    const parent = incomingParent(req)
    // A new trace is sampled (01): whoever collects downstream should keep what starts here.
    const trace: TraceContext = parent === null
      ? { traceId: randomHex(16), spanId: randomHex(8), parentSpanId: null, flags: '01', span: null }
      : { traceId: parent.traceId, spanId: randomHex(8), parentSpanId: parent.parentSpanId, flags: parent.flags, span: null }
    req.headers.traceparent = traceparentOf(trace)
    return trace
  },
  end () {}
})

// The request's trace rides on the request object: finish() and the forwarders read it without
// one more parameter through every stage.
const TRACE = Symbol('gateway.trace')

export function setTrace (req: IncomingMessage, trace: TraceContext): void {
  (req as IncomingMessage & { [TRACE]?: TraceContext })[TRACE] = trace
}

export function traceOf (req: IncomingMessage): TraceContext | undefined {
  return (req as IncomingMessage & { [TRACE]?: TraceContext })[TRACE]
}
