import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Dispatcher } from 'undici'
import { ERRORS, GatewayError, sendError, type ErrorCode } from '../errors.js'
import { clientResponseHeaders, compileHeaders, upstreamRequestHeaders, type CompiledHeaders, type HeaderRules } from './forward-headers.js'
import { stripPathPrefix } from './forward-path.js'
import { KIND_CODES, classifyUpstreamError, type ForwardErrorKind } from './upstream-errors.js'
import type { UpstreamPool, UpstreamTarget } from './upstream-pool.js'

export type { HeaderRules } from './forward-headers.js'
export type { ForwardErrorKind } from './upstream-errors.js'

/** How a route forwards, built once per route at config load. */
export interface ForwardPlan {
  readonly pool: UpstreamPool
  /** Removed from the start of the path before forwarding (whole segments only). */
  readonly stripPrefix: string | null
  /** Route override or the upstream's default: headers timeout and response body idle timeout. */
  readonly responseTimeoutMs: number
  /** Request body limit in bytes (Infinity = none); beyond it the client gets 413. */
  readonly maxBodySize: number
  readonly requestHeaders: HeaderRules
  readonly responseHeaders: HeaderRules
  /** requestHeaders/responseHeaders compiled once, when the plan is made (createForwardPlan). */
  readonly headers: CompiledHeaders
}

export type ForwardPlanOptions = Omit<ForwardPlan, 'headers'>

/** The one way to make a plan: header rules are compiled here, at config load, not per request. */
export function createForwardPlan (options: ForwardPlanOptions): ForwardPlan {
  return Object.freeze({ ...options, headers: compileHeaders(options.requestHeaders, options.responseHeaders) })
}

/** What the pipeline already knows about the request. */
export interface ForwardContext {
  readonly requestId: string
  readonly clientIp: string
  readonly proto: 'http' | 'https'
  /** Normalized path + '?' + raw query; the query is passed through untouched. */
  readonly path: string
  /** Added to the response (successful or not), e.g. RateLimit headers from the limiter. */
  readonly extraResponseHeaders?: readonly (readonly [string, string])[]
}

/** Reported exactly once per request, for access logs and metrics. */
export interface ForwardResult {
  /** Status sent to the client; 499 when the client went away before a response started. */
  status: number
  /** URL of the last target tried. */
  target: string | null
  /** Request body bytes read from the client and passed upstream. */
  bytesIn: number
  /** Response body bytes written to the client. */
  bytesOut: number
  errorCode: ErrorCode | null
  errorKind: ForwardErrorKind | null
  /** The failure as answered, with the undici error as `cause`; null on success and on client abort. */
  error: GatewayError | null
}

// RFC 9110 §9.2.2; only these are retried on another target, and only when nothing was sent yet.
const IDEMPOTENT: ReadonlySet<string> = new Set(['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE', 'TRACE'])

const CLOSE: ReadonlyArray<readonly [string, string]> = Object.freeze([Object.freeze(['connection', 'close'] as const)])

/**
 * Forwards one request to the plan's upstream, streaming both bodies with backpressure. Never
 * throws; `done` is called exactly once, after the response ended or failed.
 */
export function forwardRequest (
  req: IncomingMessage,
  res: ServerResponse,
  plan: ForwardPlan,
  ctx: ForwardContext,
  done: (result: ForwardResult) => void
): void {
  const forward = new ForwardHandler(req, res, plan, ctx, done)
  try {
    forward.start()
  } catch (err) {
    forward.fail('reset', err)
  }
}

/** One request's forward: an undici dispatch handler, so no stream or promise sits between the two sockets. */
class ForwardHandler implements Dispatcher.DispatchHandler {
  readonly req: IncomingMessage
  readonly res: ServerResponse
  readonly plan: ForwardPlan
  readonly ctx: ForwardContext
  readonly done: (result: ForwardResult) => void
  readonly opts: Dispatcher.DispatchOptions
  path = ''
  target: UpstreamTarget | null = null
  controller: Dispatcher.DispatchController | null = null
  retried = false
  /** undici began writing the request: from here on it is not retried. */
  sent = false
  /** Response headers went to the client: from here on a failure can only cut the connection. */
  responded = false
  settled = false
  clientGone = false
  bodyTooLarge = false
  status = 0
  bytesIn = 0
  bytesOut = 0
  onDrain: (() => void) | null = null
  onBodyData: ((chunk: Buffer) => void) | null = null

  constructor (req: IncomingMessage, res: ServerResponse, plan: ForwardPlan, ctx: ForwardContext, done: (result: ForwardResult) => void) {
    this.req = req
    this.res = res
    this.plan = plan
    this.ctx = ctx
    this.done = done
    const headers = req.headers
    this.opts = {
      path: '',
      method: req.method ?? 'GET',
      headers: null,
      // No length and no chunking means no body (RFC 9112 §6.3); undici then sends none.
      body: (headers['content-length'] !== undefined && headers['content-length'] !== '0') || headers['transfer-encoding'] !== undefined ? req : null,
      headersTimeout: plan.responseTimeoutMs,
      bodyTimeout: plan.responseTimeoutMs
    }
  }

  start (): void {
    const plan = this.plan
    // The client left while an earlier stage was waiting (e.g. a limiter delay): send nothing upstream.
    if (this.res.destroyed) {
      this.clientGone = true
      this.settle('client_abort', null)
      return
    }
    const length = this.req.headers['content-length']
    if (length !== undefined && Number(length) > plan.maxBodySize) {
      this.fail('body_too_large', null)
      return
    }
    const target = plan.pool.pick()
    if (target === null) {
      this.fail('no_healthy', null)
      return
    }
    this.opts.headers = upstreamRequestHeaders(this.req, plan.headers, this.ctx)
    this.path = stripPathPrefix(this.ctx.path, plan.stripPrefix)
    this.res.on('close', this.onClientClose)
    this.dispatch(target)
  }

  dispatch (target: UpstreamTarget): void {
    this.target = target
    this.opts.path = target.basePath === '' ? this.path : target.basePath + this.path
    // Errors, even synchronous ones, come back through onResponseError.
    target.dispatcher.dispatch(this.opts, this)
  }

  // res 'close' before the response finished: the client went away, so the upstream request is aborted.
  readonly onClientClose = (): void => {
    if (this.settled || this.res.writableFinished) return
    this.clientGone = true
    // Without a controller the request is still queued or connecting; onRequestStart aborts it.
    this.controller?.abort(new Error('the client closed the connection'))
  }

  onRequestStart (controller: Dispatcher.DispatchController, _context: unknown): void {
    this.controller = controller
    this.sent = true
    if (this.clientGone) {
      controller.abort(new Error('the client closed the connection'))
      return
    }
    // Counted beside undici's own 'data' listener (added right after this call, in the same tick),
    // so the body flows through one stream with undici's backpressure.
    if (this.opts.body !== null && this.onBodyData === null) {
      this.onBodyData = (chunk: Buffer): void => {
        this.bytesIn += chunk.length
        // Only a chunked body can get here over the limit: node:http enforces Content-Length.
        if (this.bytesIn > this.plan.maxBodySize && !this.bodyTooLarge) {
          this.bodyTooLarge = true
          this.controller?.abort(new GatewayError('GW_ERR_BODY_TOO_LARGE'))
        }
      }
      this.req.on('data', this.onBodyData)
    }
  }

  onResponseStart (controller: Dispatcher.DispatchController, statusCode: number, headers: Record<string, string | string[] | undefined>): void {
    // 1xx: node:http already sent its own 100 Continue; other interim responses are not relayed.
    if (statusCode < 200 || this.clientGone) return
    const raw = controller.rawHeaders
    const out = clientResponseHeaders(Array.isArray(raw) ? raw : flatten(headers), this.plan.headers, this.ctx.requestId, this.ctx.extraResponseHeaders)
    this.status = statusCode
    // A throw here (a header node:http rejects) makes undici abort, and onResponseError answers 502.
    this.res.writeHead(statusCode, out)
    this.responded = true
  }

  onResponseData (controller: Dispatcher.DispatchController, chunk: Buffer): void {
    this.bytesOut += chunk.length
    if (!this.res.write(chunk)) {
      // Backpressure: stop reading the upstream socket until the client drains.
      controller.pause()
      if (this.onDrain === null) {
        this.onDrain = (): void => this.controller?.resume()
        this.res.on('drain', this.onDrain)
      }
    }
  }

  onResponseEnd (): void {
    this.res.end()
    this.settle(null, null)
  }

  onResponseError (_controller: Dispatcher.DispatchController, err: Error): void {
    if (this.settled) return
    if (this.clientGone) {
      this.settle('client_abort', null)
      return
    }
    if (this.bodyTooLarge) {
      this.fail('body_too_large', null)
      return
    }
    const kind = classifyUpstreamError(err)
    const target = this.target
    if ((kind === 'refused' || kind === 'connect_timeout') && target !== null) {
      this.plan.pool.eject(target)
      // Nothing reached the upstream (not even the body), so one more target is safe to try.
      if (!this.sent && !this.retried && IDEMPOTENT.has(this.opts.method)) {
        const next = this.plan.pool.pick(target)
        if (next !== null) {
          this.retried = true
          this.dispatch(next)
          return
        }
      }
    }
    this.fail(kind, err)
  }

  /** Answers the error (or cuts the response if it already started) and settles. */
  fail (kind: ForwardErrorKind, cause: unknown): void {
    if (this.settled) return
    const code = KIND_CODES[kind]
    const error = code === null ? null : new GatewayError(code, undefined, { cause })
    if (code !== null && !this.clientGone) {
      // sendError cuts the connection when headers were already sent: nothing else is honest.
      sendError(this.res, code, this.ctx.requestId, undefined, this.errorHeaders())
    }
    this.settle(kind, error)
  }

  errorHeaders (): ReadonlyArray<readonly [string, string]> | undefined {
    const extra = this.ctx.extraResponseHeaders
    // An unread request body would be parsed as the next request: close instead of draining it.
    if (this.opts.body !== null && !this.req.complete) return extra === undefined ? CLOSE : [...extra, ...CLOSE]
    return extra
  }

  settle (kind: ForwardErrorKind | null, error: GatewayError | null): void {
    if (this.settled) return
    this.settled = true
    const code = kind === null ? null : KIND_CODES[kind]
    let status = this.status
    if (!this.responded) status = code === null ? (kind === 'client_abort' ? 499 : status) : ERRORS[code].status
    try {
      this.done({ status, target: this.target?.url ?? null, bytesIn: this.bytesIn, bytesOut: this.bytesOut, errorCode: code, errorKind: kind, error })
    } catch (err) {
      // A throwing callback must not reach undici's socket handling; report it without crashing.
      process.emitWarning(err instanceof Error ? err : new Error(String(err)), 'GatewayForwardDoneError')
    }
  }
}

function flatten (headers: Record<string, string | string[] | undefined>): string[] {
  const out: string[] = []
  for (const name in headers) {
    const value = headers[name]
    if (typeof value === 'string') out.push(name, value)
    else if (value !== undefined) for (const item of value) out.push(name, item)
  }
  return out
}
