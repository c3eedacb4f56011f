import type { IncomingMessage, ServerResponse } from 'node:http'
import { PassThrough } from 'node:stream'
import { errors as undiciErrors, type Dispatcher } from 'undici'
import { ERRORS, GatewayError, sendError, type ErrorCode } from '../errors.js'
import { clientResponseHeaders, compileHeaders, upstreamRequestHeaders, withoutContentLength, type CompiledHeaders, type HeaderRules } from './forward-headers.js'
import { stripPathPrefix } from './forward-path.js'
import { KIND_CODES, KIND_MESSAGES, classifyUpstreamError, isConnectFailure, type ForwardErrorKind } from './upstream-errors.js'
import { DEFAULT_RETRIES, UpstreamTarget, type BackingOffRequest, type BackOffPlace, type PendingRequest, type UpstreamPool } from './upstream-pool.js'
import { compileRetryPolicy, retryAfterDelayMs, retryAfterMs, retryDelayMs, statusRetryCause, withinRetryBudget, type RetryBackoff, type RetryPolicy, type StatusRetryCause } from './retry-policy.js'
import { BodyBudget } from './body-budget.js'
import { cutByGateway } from './shutdown-cut.js'
import { sendContinue } from './expect-continue.js'
import { hasRequestBody } from './request-body.js'
import { dropRestOfBody } from './lingering-close.js'
import { cutUnlessWritten } from './send-deadline.js'
import { CONNECTION_CLOSE } from './hop-by-hop.js'
import { createEncoder, decideCompression, flushEncoder, type CompressionPolicy, type Encoder, type Encoding } from './compression.js'

export type { HeaderRules } from './forward-headers.js'
export type { ForwardErrorKind } from './upstream-errors.js'

/** How a route forwards, built once per route at config load. */
export interface ForwardPlan extends BodyHandling, TunnelHandling {
  readonly pool: UpstreamPool
  /** Removed from the start of the path before forwarding (whole segments only). */
  readonly stripPrefix: string | null
  /** Route override or the upstream's default: until the response headers arrive. */
  readonly responseTimeoutMs: number
  /** Longest pause between two reads of the response body (upstreams.X.timeouts.idle). */
  readonly idleTimeoutMs: number
  /** The final head's deadline is the gateway's own timer (responseTimeoutMs below EXACT_DEADLINE_MS), decided at load. */
  readonly exactHeadDeadline: boolean
  /** The body's idle deadline kept by the gateway's own timer, in ms; 0: undici's (idle 0, or from EXACT_DEADLINE_MS up). */
  readonly exactIdleMs: number
  /** When a failed attempt, or an answer of a listed status, sends the request again (upstreams.X.retries, retryOn, retryBudget). */
  readonly retry: RetryPolicy
  /** Request body limit in bytes (Infinity = none); beyond it the client gets 413. */
  readonly maxBodySize: number
  readonly requestHeaders: HeaderRules
  readonly responseHeaders: HeaderRules
  /** Client request headers whose names hold "_" are passed upstream (server.underscoresInHeaders). */
  readonly underscoresInHeaders: boolean
  /** requestHeaders/responseHeaders compiled once, when the plan is made (createForwardPlan). */
  readonly headers: CompiledHeaders
  /** Response bodies compressed for clients that accept it (`compression`); null: relayed as they come. */
  readonly compression: CompressionPolicy | null
}

/** How request bodies and slow clients are handled (server.bufferBodies and the client-side timeouts). */
export interface BodyHandling {
  /** Bodies up to this many bytes are read whole before an upstream connection is taken; 0 = stream all. */
  readonly bufferBodies: number
  /** The gateway-wide cap on buffered bytes (server.bufferBodiesTotal); beyond it bodies stream. */
  readonly bodyBudget: BodyBudget
  /** Longest pause between two reads of the request body. */
  readonly clientBodyTimeoutMs: number
  /** Longest a response write may wait for the client to read. */
  readonly sendTimeoutMs: number
}

/** WebSocket tunnels (server.websocketIdleTimeout, server.maxWebSockets). */
export interface TunnelHandling {
  /** A tunnel with no byte either way for this long is closed. */
  readonly websocketIdleTimeoutMs: number
  /** Open (or opening) tunnels, gateway-wide; an upgrade beyond it gets 503. */
  readonly maxWebSockets: number
}

export type ForwardPlanOptions = Omit<ForwardPlan, 'headers' | 'exactHeadDeadline' | 'exactIdleMs' | 'idleTimeoutMs' | 'underscoresInHeaders' | 'retry' | 'compression' | keyof BodyHandling | keyof TunnelHandling> & Partial<BodyHandling & TunnelHandling> & { readonly idleTimeoutMs?: number, readonly underscoresInHeaders?: boolean, readonly retry?: RetryPolicy, readonly compression?: CompressionPolicy | null }

const DEFAULT_RETRY_POLICY = compileRetryPolicy(DEFAULT_RETRIES)

/** The one way to make a plan: header rules are compiled here, at config load, not per request. */
export function createForwardPlan (options: ForwardPlanOptions): ForwardPlan {
  const idleTimeoutMs = options.idleTimeoutMs ?? options.responseTimeoutMs
  return Object.freeze({
    idleTimeoutMs,
    bufferBodies: 1024 * 1024,
    bodyBudget: new BodyBudget(64 * 1024 * 1024),
    clientBodyTimeoutMs: 60_000,
    sendTimeoutMs: 60_000,
    websocketIdleTimeoutMs: 300_000,
    maxWebSockets: 10_000,
    underscoresInHeaders: false,
    retry: DEFAULT_RETRY_POLICY,
    compression: null,
    ...options,
    headers: compileHeaders(options.requestHeaders, options.responseHeaders, options.underscoresInHeaders ?? false),
    exactHeadDeadline: options.responseTimeoutMs < EXACT_DEADLINE_MS,
    // 0: no timeout (undici's bodyTimeout 0)
    exactIdleMs: idleTimeoutMs > 0 && idleTimeoutMs < EXACT_DEADLINE_MS ? idleTimeoutMs : 0
  })
}

/** What the pipeline already knows about the request. */
export interface ForwardContext {
  readonly requestId: string
  readonly clientIp: string
  readonly proto: 'http' | 'https'
  /** Normalized path + '?' + raw query; the query is passed through untouched. */
  readonly path: string
  /** The peer is one of trustedProxies: its X-Request-Id and Forwarded/X-Real-IP/... are kept. */
  readonly trustedPeer?: boolean
  /** Added to the response (successful or not), e.g. RateLimit headers from the limiter. */
  readonly extraResponseHeaders?: readonly (readonly [string, string])[] | undefined
}

/** Reported exactly once per request, for access logs and metrics. */
export interface ForwardResult {
  /** Status sent to the client; 499 when the client went away before a response started. */
  status: number
  /** URL of the last target tried. */
  target: string | null
  /** Request body bytes read from the client for the upstream (a streamed body's as they enter its pipe). */
  bytesIn: number
  /** Response body bytes relayed to the client, as the upstream sent them (before compression). */
  bytesOut: number
  /** The coding the body was compressed with (plan.compression); absent when it went as it came. */
  encoding?: Encoding | undefined
  errorCode: ErrorCode | null
  errorKind: ForwardErrorKind | null
  /**
   * Why the attempts before the last were sent again, in order (their failures, or `status_503`
   * for an answer of a retryOn status); null when the request was sent once.
   */
  retriedAfter: readonly RetryCause[] | null
  /** A retry the conditions allowed was not sent: the upstream's retry budget was spent. */
  retryOverBudget?: boolean
  /**
   * Set when the response failed after its headers went out (cut mid-body): the status those
   * headers carried. `status` is then the failure's (502, 503, 504), so it counts as an error.
   */
  sentStatus?: number | undefined
  /** The failure as answered, with the undici error as `cause`; null on success and on client abort. */
  error: GatewayError | null
}

/** Why an attempt was followed by another: its failure, or the status it was answered with. */
export type RetryCause = ForwardErrorKind | StatusRetryCause

// RFC 9110 §9.2.2: what the upstream may have begun (a reset, a timeout, an answer) is sent again for these only.
const IDEMPOTENT: ReadonlySet<string> = new Set(['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE', 'TRACE'])

/**
 * Whether a request whose connection failed may go to another target. Never once undici began
 * writing it (`sent`): an EHOSTUNREACH on a reused keep-alive socket comes after the upstream may
 * have the request, and a POST must not reach two targets. Before that, a body the gateway holds
 * whole (or none) can be sent again for any method; a streamed one only for an idempotent method.
 */
export function mayRetry (sent: boolean, method: string, bodyResendable: boolean): boolean {
  return !sent && (bodyResendable || IDEMPOTENT.has(method))
}

/** Whether a request the upstream may have begun (its connection reset before an answer) may be sent again. */
export function mayResend (method: string, bodyResendable: boolean): boolean {
  return bodyResendable && IDEMPOTENT.has(method)
}

/**
 * The wait a dropped answer's Retry-After asks of its retry (its first such field, as the upstream
 * sent it, before the route's header rules), when retryBackoff.retryAfter reads it and the wait is
 * within it; -1 otherwise: the jittered back-off decides. A target that names when it can serve
 * again (a 503 in a deploy, a 429) is then asked again when it said, where the jittered windows
 * would have spent every retry inside its pause.
 */
function askedRetryWait (backoff: RetryBackoff | null, rawHeaders: readonly Buffer[]): number {
  if (backoff === null || backoff.retryAfterMs === null) return -1
  for (let i = 0; i < rawHeaders.length; i += 2) {
    if ((rawHeaders[i] as Buffer).toString('latin1').toLowerCase() !== 'retry-after') continue
    const ms = retryAfterMs((rawHeaders[i + 1] as Buffer).toString('latin1'), Date.now())
    return ms !== null && ms <= backoff.retryAfterMs ? ms : -1
  }
  return -1
}

/**
 * undici's dispatch options with the TLS server name, which undici 7's Request reads from them
 * (lib/core/request.js) although its types do not list it; null lets undici take it from Host.
 * test/proxy-https-upstream.test.ts fails if undici stops reading it.
 */
type DispatchToTarget = Dispatcher.DispatchOptions & { servername: string | null }


// A module function with the handler as argument: no closure per request for its timers.
function onIdleTimer (forward: ForwardHandler, kind: 'client_timeout' | 'send_timeout'): void {
  forward.onIdle(kind)
}

/**
 * Below this, timeouts.response and timeouts.idle are kept by the gateway's own timers, to the
 * millisecond (one more timer per request: 1.5% of a fully limited request's instructions; the
 * idle one refreshed on every body chunk). From it up, by undici's, which fire up to a second
 * late: a tenth of the timeout at most.
 */
const EXACT_DEADLINE_MS = 10_000

function onHeadDeadline (forward: ForwardHandler): void {
  forward.headTimer = null
  // undici's own kind of error for a head that did not come in time: counted and answered as one (504)
  if (!forward.settled && !forward.responded) forward.abortUpstream?.(new undiciErrors.HeadersTimeoutError())
}

function onBodyIdle (forward: ForwardHandler): void {
  forward.bodyTimer = null
  // undici's own error for a body that paused too long: the response is cut, counted as undici's
  if (!forward.settled) forward.abortUpstream?.(new undiciErrors.BodyTimeoutError())
}

const BAD_BODY = Object.freeze({ reason: 'the chunked request body cannot be parsed' })

/** Why a request's body ends its forward: too large, or not parsable. */
type BodyRefusal = 'body_too_large' | 'bad_request'

function bodyRefusalCode (kind: BodyRefusal): ErrorCode {
  return kind === 'bad_request' ? 'GW_ERR_BAD_REQUEST' : 'GW_ERR_BODY_TOO_LARGE'
}

/** The forward of each request with a body, for the server to tell it the body cannot be parsed. */
const bodyForwards = new WeakMap<ServerResponse, ForwardHandler>()

/**
 * The server's parser failed in `res`'s request body. True when its answer is the forward's to
 * give, now (its upstream call given up) or as it starts (the request is still in an earlier
 * stage); false when that answer has begun, or was given (the connection must then be cut).
 */
export function refuseUnparsableBody (res: ServerResponse): boolean {
  const forward = bodyForwards.get(res)
  if (forward !== undefined) return forward.refuseBadBody()
  return !res.headersSent
}

// Heads that came this turn: most have their body in the same read and go out with it; the rest
// go out alone once the turn's I/O is done. One setImmediate per turn, not per request.
let heldHeads: ForwardHandler[] = []
let spareHeads: ForwardHandler[] = []

function holdHead (forward: ForwardHandler): void {
  if (heldHeads.length === 0) setImmediate(flushPendingHeads)
  heldHeads.push(forward)
}

function flushPendingHeads (): void {
  const list = heldHeads
  heldHeads = spareHeads
  spareHeads = list
  for (let i = 0; i < list.length; i++) {
    const forward = list[i] as ForwardHandler
    // Nothing here has a caller to catch for it: a throw would end the process, or leave the
    // list unemptied and no flush scheduled again. That one response is cut instead.
    try {
      forward.flushHead()
    } catch (err) {
      forward.res.destroy()
      process.emitWarning(err instanceof Error ? err : new Error(String(err)), 'GatewayHeadFlushError')
    }
  }
  list.length = 0
}

/** What the encoder holds goes to the client at the end of the turn its bytes came in (flushEncoder). */
function flushAtTurnEnd (forward: ForwardHandler): void {
  forward.flushQueued = false
  if (forward.encoder !== null) flushEncoder(forward.encoder, forward.encoding)
}

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

/**
 * One request's forward: an undici dispatch handler, so no stream or promise sits between the two
 * sockets. It implements undici 7's callback API (onConnect, onHeaders, onData, onComplete,
 * onError), which its docs mark deprecated but which is what undici 7's core calls: a handler of
 * the newer API (onRequestStart, onResponseStart, ...) is wrapped per request in an UnwrapHandler
 * and a controller, and its response headers are parsed into an object that the gateway does not
 * read (it relays the raw bytes). Every forwarding test fails if undici stops calling them.
 */
class ForwardHandler implements Dispatcher.DispatchHandler, BackingOffRequest {
  readonly req: IncomingMessage
  readonly res: ServerResponse
  readonly plan: ForwardPlan
  readonly ctx: ForwardContext
  readonly done: (result: ForwardResult) => void
  readonly opts: DispatchToTarget
  path = ''
  target: UpstreamTarget | null = null
  /** The target whose connection this request holds (counted in its inFlight), until it settles. */
  holding: UpstreamTarget | null = null
  /** The request's place while it waits for a connection (every target at maxConnections). */
  waiting: PendingRequest | null = null
  /** A retry's place while it waits out its back-off (retryBackoff), before it asks for a connection. */
  backingOff: BackOffPlace | null = null
  /** undici's abort for this request, from onConnect; null until the request has a connection. */
  abortUpstream: ((err?: Error) => void) | null = null
  /** Resumes reading the upstream response after onData answered false (backpressure). */
  resumeUpstream: (() => void) | null = null
  /** Why the attempts before this one were followed by another, once the request was sent again (at most the plan's retries). */
  retriedAfter: RetryCause[] | null = null
  /** The targets of the attempts before this one: a retry goes to another when one has a connection free (nginx tries each once). */
  tried: UpstreamTarget[] | null = null
  /** Counted in the pool's `retrying` (the retry budget) from its first budgeted retry until an answer is relayed or it settles. */
  retrying = false
  /** A retry was refused by the budget (ForwardResult.retryOverBudget). */
  overBudget = false
  /** An answer of this retryOn status was dropped to send the request again (onError sends it). */
  retryStatus = 0
  /** The wait that answer's Retry-After asked, when retryBackoff.retryAfter lets it decide the retry's; -1: none. */
  retryAfterWait = -1
  /** undici began writing the request: from here on it is not retried. */
  sent = false
  /** The upstream's final head came (its status is `status`). */
  responded = false
  /**
   * That head, relayable, not yet given to node:http: it goes out with the first body bytes (one
   * write, as before), or alone at the end of the event-loop turn (flushPendingHeads).
   */
  head: string[] | null = null
  /** The head was given to node:http: from here on a failure can only cut the connection. */
  headWritten = false
  /** The held head waits for its response's turn on the connection (flushHead). */
  headAwaitsSocket = false
  settled = false
  clientGone = false
  bodyTooLarge = false
  /** The upstream's status or transfer coding cannot be relayed (502). */
  badResponse = false
  /** The client's chunked body cannot be parsed (refuseUnparsableBody): answered 400. */
  badBody = false
  /** The error answer went out (answer): it may precede the request's end (giveUp). */
  answered = false
  status = 0
  bytesIn = 0
  bytesOut = 0
  onDrain: (() => void) | null = null
  /** Compresses the response body on its way to the client (plan.compression); null: relayed as it comes. */
  encoder: Encoder | null = null
  encoding: Encoding = 'gzip'
  /** The encoder's flush at the end of this turn is scheduled (flushAtTurnEnd). */
  flushQueued = false
  /** Backpressured before node gave the response its socket (pipelined behind another). */
  awaitingSocket = false
  onBodyData: ((chunk: Buffer) => void) | null = null
  /** Detaches bufferBody's listeners while it reads the body into memory; null once it stopped. */
  stopBuffering: (() => void) | null = null
  /** Bytes of this request's body counted in plan.bodyBudget, released when the request settles. */
  heldBytes = 0
  /** The body is a Buffer read whole: it can be sent again to another target. */
  replayable = false
  /**
   * Fire after clientBodyTimeoutMs without a body chunk, and after sendTimeoutMs without a drain.
   * Two timers: a client may stop reading the response while its body still arrives, and a body
   * chunk or its end must not cancel the send timeout (the client then held both connections).
   */
  clientTimer: NodeJS.Timeout | null = null
  sendTimer: NodeJS.Timeout | null = null
  timedOut: 'client_timeout' | 'send_timeout' | null = null
  /**
   * The final head's deadline (timeouts.response) kept by the gateway, armed once the request is
   * sent: like undici's headersTimeout it runs from the request's end (an upload still being sent
   * is not late). Armed for a short timeout (below EXACT_DEADLINE_MS), and once an interim
   * response (103, 102) came, whatever the timeout: undici keeps its own on timers that tick every
   * half second, so 300ms fired after 1 s (a `retryOn: [timeout]` of three attempts took 3 s), and
   * starts it again at each interim response, so an upstream sending one a second never timed
   * out. undici's stays armed beneath: it still bounds an upload the upstream stops reading.
   */
  headTimer: NodeJS.Timeout | null = null
  /**
   * The longest pause between two body chunks (timeouts.idle) kept by the gateway, for a short
   * one (below EXACT_DEADLINE_MS): undici's ticks every half second (an idle of 2s cut a pause
   * after up to 3 s). Like undici's, it does not run while the gateway stops reading because its
   * client is slow (sendTimeout bounds that): cleared at backpressure, armed again at the drain.
   */
  bodyTimer: NodeJS.Timeout | null = null
  /** An interim response came (the deadline is armed once the request is sent). */
  interim = false
  /** undici wrote the whole request (onRequestSent). */
  requestSent = false

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
      body: hasRequestBody(headers) ? req : null,
      headersTimeout: plan.responseTimeoutMs,
      bodyTimeout: plan.idleTimeoutMs,
      servername: null
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
    this.res.on('close', this.onClientClose)
    if (this.opts.body !== null) {
      // its body could not be parsed while an earlier stage (a limit through Redis) decided
      if (cutByGateway.get(this.res) === 'bad_request') {
        this.badBody = true
        this.fail('bad_request', null)
        return
      }
      bodyForwards.set(this.res, this)
      // the client that asked for 100 Continue sends its body now
      sendContinue(this.req, this.res)
    }
    // Like nginx's proxy_request_buffering: a body that trickles in holds no upstream connection.
    if (this.opts.body !== null && plan.bufferBodies > 0) this.bufferBody()
    else {
      // undici destroys the body stream it was given when the exchange ends before the body does
      // (an upstream's early answer, an abort). Given the request itself, that destroyed the
      // client's connection, and with it the answer on its way; piped, the request stays the
      // gateway's to drain (src/proxy/lingering-close.ts).
      if (this.opts.body !== null) this.streamBody(new PassThrough())
      this.proceed()
    }
  }

  proceed (): void {
    if (this.settled) return
    const plan = this.plan
    // Before a connection is taken: nothing between acquire and dispatch may throw.
    this.opts.headers = upstreamRequestHeaders(this.req, plan.headers, this.ctx)
    this.path = stripPathPrefix(this.ctx.path, plan.stripPrefix)
    const got = plan.pool.acquire(this)
    if (got === null) {
      this.fail('no_healthy', null)
      return
    }
    if (got === 'full') {
      this.fail('queue_full', null)
      return
    }
    if (got instanceof UpstreamTarget) this.dispatch(got)
    else this.waiting = got
  }

  granted (target: UpstreamTarget): void {
    this.waiting = null
    this.dispatch(target)
  }

  refused (kind: 'queue_timeout' | 'no_healthy' | 'shutting_down'): void {
    this.waiting = null
    this.backingOff = null
    this.fail(kind, null)
  }

  backedOff (): void {
    this.backingOff = null
    const refused = this.sendAgain(null)
    if (refused !== null) this.fail(refused, null)
  }

  /**
   * Reads the body into memory, taking each chunk from the gateway-wide budget as it arrives. A body
   * larger than bufferBodies, or one the budget cannot hold, is streamed from the point reached:
   * what was read goes first, the rest follows from the client.
   */
  bufferBody (): void {
    const req = this.req
    const plan = this.plan
    const chunks: Buffer[] = []
    const stop = (): void => {
      this.stopBuffering = null
      req.off('data', onData)
      req.off('end', onEnd)
      req.off('error', onError)
    }
    const onData = (chunk: Buffer): void => {
      this.armIdle('client_timeout', plan.clientBodyTimeoutMs)
      this.bytesIn += chunk.length
      if (this.bytesIn > plan.maxBodySize) {
        stop()
        this.fail('body_too_large', null)
        return
      }
      if (this.heldBytes + chunk.length <= plan.bufferBodies && plan.bodyBudget.take(chunk.length)) {
        this.heldBytes += chunk.length
        chunks.push(chunk)
        return
      }
      // Too large to buffer, or the budget is spent: stream what was read, then the rest.
      stop()
      req.pause()
      const body = new PassThrough()
      for (const c of chunks) body.write(c)
      body.write(chunk)
      // What was read stays counted until the request has a connection and undici takes it from
      // the PassThrough (onConnect), or the request settles: released here, it sat in memory
      // uncounted while the request waited for a connection, and 40 such uploads held 42 MB past
      // a 4 MB bufferBodiesTotal.
      this.streamBody(body)
      // The body's idle timer starts again at onConnect: waiting for a connection is not the client's pause.
      this.clearIdle('client_timeout')
      this.proceed()
    }
    const onEnd = (): void => {
      stop()
      this.clearIdle('client_timeout')
      this.opts.body = Buffer.concat(chunks)
      this.replayable = true
      this.proceed()
    }
    // The client left mid-body: res 'close' follows and settles it as client_abort.
    const onError = (): void => stop()
    req.on('data', onData)
    req.on('end', onEnd)
    req.on('error', onError)
    this.stopBuffering = stop
    this.armIdle('client_timeout', plan.clientBodyTimeoutMs)
  }

  armIdle (kind: 'client_timeout' | 'send_timeout', ms: number): void {
    const timer = kind === 'client_timeout' ? this.clientTimer : this.sendTimer
    if (timer !== null) {
      timer.refresh()
      return
    }
    if (kind === 'client_timeout') this.clientTimer = setTimeout(onIdleTimer, ms, this, kind)
    else this.sendTimer = setTimeout(onIdleTimer, ms, this, kind)
  }

  clearIdle (kind: 'client_timeout' | 'send_timeout' | 'both' = 'both'): void {
    if (kind !== 'send_timeout' && this.clientTimer !== null) {
      clearTimeout(this.clientTimer)
      this.clientTimer = null
    }
    if (kind !== 'client_timeout' && this.sendTimer !== null) {
      clearTimeout(this.sendTimer)
      this.sendTimer = null
    }
  }

  onIdle (kind: 'client_timeout' | 'send_timeout'): void {
    if (kind === 'client_timeout') this.clientTimer = null
    else this.sendTimer = null
    if (this.settled) return
    this.timedOut = kind
    if (kind === 'send_timeout') {
      // The client stopped reading: cut it, which aborts the upstream request and frees its connection.
      this.res.destroy()
      return
    }
    if (this.abortUpstream !== null) this.abortUpstream(new GatewayError('GW_ERR_CLIENT_TIMEOUT'))
    else this.fail('client_timeout', null)
  }

  /** `target` was acquired for this request: it holds one of its connections until it settles. */
  dispatch (target: UpstreamTarget): void {
    this.target = target
    this.holding = target
    this.opts.path = target.basePath === '' ? this.path : target.basePath + this.path
    this.opts.servername = target.servername
    // Errors, even synchronous ones, come back through onError.
    target.dispatcher.dispatch(this.opts, this)
  }

  // res 'close' before the response finished: the client went away, so the upstream request is aborted.
  readonly onClientClose = (): void => {
    if (this.settled || this.res.writableFinished) return
    this.clientGone = true
    // Still reading the body into memory: nothing went upstream, so the request ends here.
    if (this.target === null) {
      this.settle('client_abort', null)
      return
    }
    // Without an abort the request is still queued or connecting; onConnect aborts it.
    this.abortUpstream?.(new Error('the client closed the connection'))
  }

  onConnect (abort: (err?: Error) => void): void {
    this.abortUpstream = abort
    this.sent = true
    // a streamed body's first bytes, read before it outgrew bufferBodies, now go to the upstream
    // (a body held whole stays counted: it may be sent again to another target)
    if (!this.replayable) this.releaseHeldBytes()
    if (this.clientGone) {
      abort(new Error('the client closed the connection'))
      return
    }
    // past maxBodySize, or unparsable, while its connection was being made: answered now, through onError
    if (this.bodyTooLarge || this.badBody) {
      abort(new GatewayError(bodyRefusalCode(this.badBody ? 'bad_request' : 'body_too_large')))
      return
    }
    if (this.onBodyData !== null && !this.req.complete) this.armIdle('client_timeout', this.plan.clientBodyTimeoutMs)
  }

  /**
   * Pipes the rest of the request's body into `body`, the stream undici sends, counting each chunk
   * as it leaves the request: from the first, also those the pipe moves while the request waits
   * for its connection (counted from onConnect, up to a pipe's buffer went past maxBodySize
   * uncounted). The body's idle timer runs once the request has its connection: waiting for one
   * is not the client's pause.
   */
  streamBody (body: PassThrough): void {
    this.onBodyData = (chunk: Buffer): void => {
      if (this.abortUpstream !== null) this.armIdle('client_timeout', this.plan.clientBodyTimeoutMs)
      this.bytesIn += chunk.length
      // Only a chunked body can get here over the limit: node:http enforces Content-Length.
      if (this.bytesIn > this.plan.maxBodySize && !this.bodyTooLarge) {
        this.bodyTooLarge = true
        this.giveUp('body_too_large')
      }
    }
    this.req.on('data', this.onBodyData)
    this.req.once('end', () => { if (this.timedOut === null) this.clearIdle('client_timeout') })
    this.req.pipe(body)
    this.opts.body = body
  }

  /** An upstream head the gateway will not relay: the request fails as `bad_response` (502). */
  private refuseHead (): boolean {
    this.badResponse = true
    this.abortUpstream?.(new GatewayError('GW_ERR_UPSTREAM_BAD_RESPONSE'))
    return true
  }

  /** Returns false to stop reading the upstream response (only onData does, under backpressure). */
  onHeaders (statusCode: number, rawHeaders: Buffer[], resume: () => void): boolean {
    // RFC 9110 §15: a status is three digits, 1xx-5xx. Below 100 (a status 000), undici would
    // take it for an interim response and fail on an assertion at its end, counted as a reset.
    // A 101 to a request that asked for no upgrade (this path never does: upgrades go through
    // websocket.ts), without the Upgrade and Connection fields undici refuses it by: undici took it
    // for an interim response and failed on an assertion at its end, counted as a reset and retried.
    if ((statusCode < 100 || statusCode === 101) && !this.clientGone) return this.refuseHead()
    // 1xx: node:http already sent its own 100 Continue; other interim responses are not relayed.
    if (statusCode < 200 || this.clientGone) {
      if (!this.interim && !this.clientGone) {
        this.interim = true
        // the final head is due within timeouts.response of the first interim one (armed at the
        // request's end for a short timeout: it starts again, once)
        if (this.requestSent) {
          this.clearHeadTimer()
          this.armHeadDeadline()
        }
      }
      return true
    }
    if (this.headTimer !== null) this.clearHeadTimer()
    this.resumeUpstream = resume
    // A status node:http would relay as is (600), or headers clientResponseHeaders cannot relay
    // (a transfer coding other than chunked): 502.
    let out = statusCode > 599 ? null : clientResponseHeaders(rawHeaders, this.plan.headers, this.ctx.requestId, this.ctx.extraResponseHeaders)
    if (out === null) return this.refuseHead()
    if (this.target !== null) this.plan.pool.answered(this.target, statusCode)
    // A retryOn status (a 503 of a target being deployed) from an attempt that may be repeated:
    // nothing of it has reached the client, so it is dropped and the request sent to another target
    // (onError). The last attempt's answer goes to the client whatever its status, as nginx's does.
    // Only when the pool can take the retry now: dropped for a retry that finds no target, the
    // answer would become the gateway's own 503.
    if (this.plan.retry.statuses.has(statusCode) && this.abortUpstream !== null && mayResend(this.opts.method, this.replayable || this.opts.body === null) && this.plan.pool.canTakeRetry(this.holding) && this.mayRetryAgain()) {
      this.retryStatus = statusCode
      this.retryAfterWait = askedRetryWait(this.plan.retry.backoff, rawHeaders)
      this.abortUpstream(new GatewayError('GW_ERR_UPSTREAM_UNAVAILABLE'))
      return true
    }
    // answered: this request sends the upstream nothing more, its place in the budget is free
    if (this.retrying) this.leaveRetryBudget()
    // RFC 9110 §8.6: a 204 never carries Content-Length (nginx drops it too); a 304's may stay
    if (statusCode === 204) out = withoutContentLength(out)
    if (this.plan.compression !== null) out = this.compressing(this.plan.compression, statusCode, out)
    this.status = statusCode
    // A refusal that comes while the client's body is still arriving (an upload refused early)
    // no longer reads it: the connection closes after it, the rest of the body read and dropped
    // (src/proxy/lingering-close.ts). Kept alive, the client's next request waited behind an
    // unread body until the keep-alive timeout cut it. A 2xx sent early is a full-duplex
    // exchange (an echo, a stream), whose upstream reads the body on: kept alive.
    if (statusCode >= 300 && this.opts.body !== null && !this.req.complete) this.res.shouldKeepAlive = false
    this.responded = true
    this.head = out
    holdHead(this)
    this.armBodyIdle()
    return true
  }

  armBodyIdle (): void {
    const ms = this.plan.exactIdleMs
    if (ms !== 0 && !this.settled) this.bodyTimer = setTimeout(onBodyIdle, ms, this)
  }

  clearBodyIdle (): void {
    if (this.bodyTimer === null) return
    clearTimeout(this.bodyTimer)
    this.bodyTimer = null
  }

  /** The head the response goes out with; its body goes through an encoder when it is compressed. */
  private compressing (policy: CompressionPolicy, status: number, head: string[]): string[] {
    const headers = this.req.headers
    const decided = decideCompression(policy, this.opts.method, { acceptEncoding: headers['accept-encoding'], ifNoneMatch: headers['if-none-match'] }, status, head)
    if (decided === null) return head
    if (decided.encoding !== null) {
      const encoder = createEncoder(policy, decided.encoding, decided.length)
      this.encoding = decided.encoding
      // zlib does not fail on its input; should it, the response is cut as a broken upstream's is
      encoder.on('error', () => { this.res.destroy() })
      encoder.pipe(this.res)
      // a client gone before the end: the encoder's zlib memory is freed now, not when collected
      this.res.once('close', () => { if (!encoder.readableEnded) encoder.destroy() })
      this.encoder = encoder
    }
    return decided.head
  }

  /**
   * Gives the held head to node:http. False when it rejects a header: the upstream's answer is not
   * relayable (502), and nothing reached the client. undici's parser refuses such bytes first
   * (a control character in a value is its 502); this guards the end-of-turn flush, where a throw
   * would reach no handler.
   */
  writeHead (): boolean {
    const head = this.head
    this.head = null
    try {
      this.res.writeHead(this.status, head as string[])
    } catch {
      this.badResponse = true
      return false
    }
    this.headWritten = true
    return true
  }

  /**
   * The end of the turn in which the head came, without a body byte (a stream, a long poll, an
   * event source): the head goes out alone, as nginx sends it, so the client learns the status
   * now. node:http would keep it until the first body write, minutes later for an event stream.
   */
  flushHead (): void {
    if (this.head === null || this.settled || this.clientGone) return
    // Pipelined behind an answer still going out: the client cannot see this head before that
    // answer ends. Held till its turn, it can still become the 400 of a body found unparsable
    // meanwhile (refuseBadBody); given to node:http now, it went out before the cut.
    if (this.res.socket === null) {
      if (!this.headAwaitsSocket) {
        this.headAwaitsSocket = true
        this.res.once('socket', () => { this.flushHead() })
      }
      return
    }
    if (this.writeHead()) this.res.flushHeaders()
    else this.abortUpstream?.(new GatewayError('GW_ERR_UPSTREAM_BAD_RESPONSE'))
  }

  /** Called by undici 7's core (lib/core/request.js) once the whole request is written, though its types do not list it. */
  onRequestSent (): void {
    this.requestSent = true
    if (this.interim || this.plan.exactHeadDeadline) this.armHeadDeadline()
  }

  armHeadDeadline (): void {
    if (this.headTimer === null && !this.settled && !this.responded) this.headTimer = setTimeout(onHeadDeadline, this.plan.responseTimeoutMs, this)
  }

  onData (chunk: Buffer): boolean {
    // undici aborts on a throw, and onError answers the bad response
    if (this.head !== null) {
      if (!this.writeHead()) throw new GatewayError('GW_ERR_UPSTREAM_BAD_RESPONSE')
      // node:http keeps the head until the first body write, and the encoder's first output comes
      // a zlib round trip later: an upstream that failed meanwhile cut a client that got nothing
      if (this.encoder !== null) this.res.flushHeaders()
    }
    this.bytesOut += chunk.length
    if (this.bodyTimer !== null) this.bodyTimer.refresh()
    const sink = this.encoder ?? this.res
    const written = sink.write(chunk)
    if (this.encoder !== null && !this.flushQueued) {
      this.flushQueued = true
      setImmediate(flushAtTurnEnd, this)
    }
    if (written) return true
    // not reading is no pause of the upstream's: its idle deadline starts again at the drain
    this.clearBodyIdle()
    // Backpressure: stop reading the upstream socket until the client drains, for at most
    // sendTimeout. A response pipelined behind an earlier one has no socket yet: its client is not
    // slow, it is not its turn; the timer starts when the socket is its (a client reading
    // everything had its second response cut as a slow reader).
    if (this.res.socket !== null) this.armIdle('send_timeout', this.plan.sendTimeoutMs)
    else if (!this.awaitingSocket) {
      this.awaitingSocket = true
      this.res.once('socket', () => {
        this.awaitingSocket = false
        if (sink.writableNeedDrain && !this.settled) this.armIdle('send_timeout', this.plan.sendTimeoutMs)
      })
    }
    if (this.onDrain === null) {
      this.onDrain = (): void => {
        this.clearIdle('send_timeout')
        if (this.bodyTimer === null) this.armBodyIdle()
        this.resumeUpstream?.()
      }
      sink.on('drain', this.onDrain)
    }
    return false
  }

  onComplete (): void {
    // Its body could not be parsed (src/server.ts) after the upstream took the head: the
    // connection is closing, and the answer is not the client's to get
    if (cutByGateway.get(this.res) === 'bad_request') {
      this.res.destroy()
      this.settle('bad_request', null)
      return
    }
    // The answer is whole while the client's body still arrives (an upstream that answered
    // without reading it all): the rest is read and dropped, as node drops a body nobody read, so
    // that the connection's next request is read. Left in the pipe undici closed, it held the
    // connection until the keep-alive timeout reset it.
    // While it keeps coming, for a bounded time: past maxBodySize and every timer of a settled
    // request, a client sending on would hold the connection until server.requestTimeout. A body
    // that ends in time leaves the connection kept alive.
    if (this.opts.body !== null && !this.req.complete) dropRestOfBody(this.req, this.req.socket)
    if (this.head !== null && !this.writeHead()) {
      this.fail('bad_response', null)
      return
    }
    // the encoder's end ends the response (pipe), once its last bytes are out
    if (this.encoder !== null) this.encoder.end()
    else this.res.end()
    // What is left to write (the encoder's output, or a last chunk the client has not taken)
    // would have no timer once the request settles: a client that stopped reading held the
    // connection, and the encoder, for good
    // (after end(), writableNeedDrain is false however much is held: the length tells)
    if (this.encoder !== null || this.res.writableLength > 0) cutUnlessWritten(this.res, this.plan.sendTimeoutMs)
    this.settle(null, null)
  }

  onError (err: Error): void {
    if (this.settled) return
    if (this.badBody) {
      this.fail('bad_request', null)
      return
    }
    // A 304 (or 204) carries no body whatever its Content-Length says (RFC 9110 §6.4.1), but
    // undici counts the missing bytes as a length mismatch: the response is complete.
    const lengthMismatch = (err as { code?: unknown }).code === 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH'
    if (lengthMismatch && this.responded && (this.status === 304 || this.status === 204)) {
      this.onComplete()
      return
    }
    // undici reports a length mismatch for a body cut short by the upstream's close (a reset, as
    // the upstream-errors table has it), and in place of the parser's error for a head it could
    // not parse that has a Content-Length (one beside a Transfer-Encoding, whose framing is a
    // guess: an answer the gateway cannot relay, as nginx judges it too)
    if (lengthMismatch && !this.responded) this.badResponse = true
    if (this.badResponse) {
      // a head the gateway would not relay (a status 600, a transfer coding it cannot keep) counts
      // toward the target's ejection as an answer that is not HTTP does: it was neither
      if (this.target !== null) this.plan.pool.failed(this.target)
      this.fail('bad_response', err)
      return
    }
    if (this.timedOut !== null) {
      this.fail(this.timedOut, null)
      return
    }
    if (this.clientGone) {
      this.settle('client_abort', null)
      return
    }
    if (this.bodyTooLarge) {
      this.fail('body_too_large', null)
      return
    }
    if (this.retryStatus !== 0) {
      // the connection answered: no failure of the target's; the budget was checked in onHeaders
      const cause = statusRetryCause(this.retryStatus)
      this.retryStatus = 0
      const refused = this.resend(cause, this.target)
      if (refused !== null) this.fail(refused, null)
      return
    }
    const kind = classifyUpstreamError(err)
    const policy = this.plan.retry
    const target = this.target
    // A target answering what is not HTTP (pointed at another service) counts toward its ejection
    // too. A reset while a streamed body is still being sent does not: that is how a healthy
    // upstream refuses a body early (a 413 or 401, then close: Go's net/http, node's
    // Connection: close), and every client could otherwise eject a target with a few large POSTs.
    const refusedBody = kind === 'reset' && this.opts.body !== null && !this.replayable && !this.req.complete
    if ((kind === 'response_timeout' || kind === 'reset' || kind === 'bad_response') && target !== null && !refusedBody) this.plan.pool.failed(target)
    if (isConnectFailure(kind) && target !== null) {
      this.plan.pool.eject(target)
      // Nothing reached the upstream: one more target is safe to try for an idempotent method, and
      // for any method once the body is in memory (a refused connection carried no byte of it).
      // The failed target was just ejected: another target, now or, if all are busy, when one frees.
      if (policy.onConnectFailure && mayRetry(this.sent, this.opts.method, this.replayable || this.opts.body === null) && this.retry(kind, target, false)) return
    } else if (((kind === 'reset' && policy.onReset) || (kind === 'response_timeout' && policy.onTimeout)) && target !== null && !this.responded && mayResend(this.opts.method, this.replayable || this.opts.body === null)) {
      // The connection closed with no answer: a target shutting down (a rolling deploy) or closing
      // an idle keep-alive connection as the request went out on it; or no head came in time
      // (retryOn: timeout). The upstream may have begun the request, so only an idempotent one is
      // sent again (RFC 9110 §9.2.2; nginx's proxy_next_upstream error does the same), to another
      // target when one is free. A closed connection is a target going away (a rolling deploy
      // closes many at once), not one overloaded: outside the retry budget, as a refused one is.
      // A timeout is an overloaded target's sign: budgeted.
      if (this.retry(kind, target, kind === 'response_timeout')) return
    }
    this.fail(kind, err)
  }

  /**
   * Whether one more attempt is allowed: fewer than the plan's retries so far, and, when
   * `budgeted`, room in the upstream's retry budget. The request takes its place in the budget
   * here, once (its later retries are within it), until an answer is relayed or it settles. The
   * budget is for the retries that send an overloaded upstream its load again (a timeout, a 503);
   * a connection never made, or closed before an answer, is not budgeted.
   */
  private mayRetryAgain (budgeted = true): boolean {
    const policy = this.plan.retry
    if ((this.retriedAfter?.length ?? 0) >= policy.retries) return false
    if (this.retrying || !budgeted) return true
    const pool = this.plan.pool
    if (!withinRetryBudget(policy.budget, pool.retrying, pool.active)) {
      this.overBudget = true
      return false
    }
    this.retrying = true
    pool.retrying++
    return true
  }

  leaveRetryBudget (): void {
    this.retrying = false
    this.plan.pool.retrying--
  }

  /** Sends the request once more when mayRetryAgain, to a target not tried yet when one is free. */
  private retry (after: ForwardErrorKind, failed: UpstreamTarget, budgeted: boolean): boolean {
    return this.mayRetryAgain(budgeted) && this.resend(after, failed) === null
  }

  /**
   * Sends the request again, at once or after its back-off (retryBackoff); null once sent (or
   * waiting for a connection, or backing off), else why it cannot be.
   */
  private resend (after: RetryCause, failed: UpstreamTarget | null): 'no_healthy' | 'queue_full' | null {
    this.releaseTarget()
    if (failed !== null) {
      if (this.tried === null) this.tried = [failed]
      else if (!this.tried.includes(failed)) this.tried.push(failed)
    }
    // the attempt to come has written nothing yet: a refused connection of its own may be retried
    this.sent = false
    this.abortUpstream = null
    // the next attempt is timed as a request of its own, from its own request's end: an interim
    // answer of the first (a 103 before the reset) does not arm its final head's deadline
    this.clearHeadTimer()
    this.interim = false
    this.requestSent = false
    const backoff = this.plan.retry.backoff
    const asked = this.retryAfterWait
    this.retryAfterWait = -1
    // a Retry-After lengthens the jittered wait, never shortens it: "0", or a date past, from a
    // target that says so while overloaded would have sent every retry it turned away at once
    const jittered = backoff === null ? 0 : retryDelayMs(backoff, (this.retriedAfter?.length ?? 0) + 1, Math.random())
    const delayMs = asked > 0 ? Math.max(jittered, retryAfterDelayMs(asked, Math.random())) : jittered
    if (delayMs === 0) return this.sendAgain(after)
    // decided: counted and logged as a retry even if its client leaves before it is sent
    this.recordRetry(after)
    // holds no connection: a client that leaves now ends it at once (onClientClose)
    this.target = null
    this.backingOff = this.plan.pool.backOff(this, delayMs)
    return null
  }

  private recordRetry (after: RetryCause): void {
    if (this.retriedAfter === null) this.retriedAfter = [after]
    else this.retriedAfter.push(after)
  }

  /**
   * A connection (or a place in the queue) for the next attempt, recorded as a retry after `after`
   * unless its back-off recorded it; null once taken, else why none.
   */
  private sendAgain (after: RetryCause | null): 'no_healthy' | 'queue_full' | null {
    const next = this.plan.pool.acquire(this, this.tried ?? undefined)
    if (next === null) return 'no_healthy'
    if (next === 'full') return 'queue_full'
    // before the dispatch, which may fail at once and ask whether one more retry is allowed
    if (after !== null) this.recordRetry(after)
    if (next instanceof UpstreamTarget) this.dispatch(next)
    else {
      // waiting again: a client that leaves now ends it at once (onClientClose)
      this.target = null
      this.waiting = next
    }
    return null
  }

  /** Answers the error (or cuts the response if it already started) and settles. */
  fail (kind: ForwardErrorKind, cause: unknown): void {
    if (this.settled) return
    const code = KIND_CODES[kind]
    const message = KIND_MESSAGES[kind]
    const error = code === null ? null : new GatewayError(code, message, { cause })
    if (code !== null) this.answer(code, message)
    this.settle(kind, error)
  }

  errorHeaders (): ReadonlyArray<readonly [string, string]> | undefined {
    let extra = this.ctx.extraResponseHeaders
    // a CORS route's Vary: Origin goes on its 413 and 5xx as on the upstream's answers
    const append = this.plan.headers.responseAppend
    if (append.length > 0) {
      const fields: Array<readonly [string, string]> = extra === undefined ? [] : [...extra]
      for (let i = 0; i < append.length; i += 2) fields.push([append[i] as string, append[i + 1] as string])
      extra = fields
    }
    // An unread request body would be parsed as the next request: close instead of draining it.
    if (this.opts.body !== null && !this.req.complete) return extra === undefined ? CONNECTION_CLOSE : [...extra, ...CONNECTION_CLOSE]
    return extra
  }

  /**
   * The server's parser failed in this request's body (a bad chunk size): nothing more of it will
   * come. False when its answer has begun (the connection is then cut after the answers before it);
   * else the upstream call is given up and the answer is a 400 that closes the connection.
   */
  refuseBadBody (): boolean {
    if (this.settled || this.headWritten) return false
    this.badBody = true
    this.giveUp('bad_request')
    return true
  }

  /**
   * The request cannot go on (its body is too large, or cannot be parsed): its upstream call is
   * given up, through onError once it has a connection. Not dispatched yet (waiting for one of the
   * pool's), it settles here. Dispatched and still connecting, it stays undici's until onConnect
   * aborts it (settled now, its connection would be counted free while undici still queued the
   * request, and the next one queued behind it in undici, where no queue timeout reaches it): the
   * client is answered now, and the request settles when the attempt ends.
   */
  giveUp (kind: BodyRefusal): void {
    if (this.abortUpstream !== null) this.abortUpstream(new GatewayError(bodyRefusalCode(kind)))
    else if (this.target === null) this.fail(kind, null)
    else this.answer(bodyRefusalCode(kind))
  }

  /** Sends the error answer, once; the request settles apart from it (fail, settle). */
  answer (code: ErrorCode, message?: string): void {
    if (this.answered || this.clientGone) return
    this.answered = true
    // sendError cuts the connection when headers were already sent: nothing else is honest.
    // Its body is what the client got (the access line's bytesOut): it was logged as 0.
    this.bytesOut += sendError(this.res, code, this.ctx.requestId, this.badBody ? BAD_BODY : message === undefined ? undefined : { message }, this.errorHeaders())
  }

  /** Gives this request's buffered bytes back to the gateway-wide body budget. Idempotent. */
  releaseHeldBytes (): void {
    if (this.heldBytes === 0) return
    this.plan.bodyBudget.release(this.heldBytes)
    this.heldBytes = 0
  }

  /** Gives the held connection back to the pool, which hands it to the oldest waiting request. */
  releaseTarget (): void {
    const held = this.holding
    if (held === null) return
    this.holding = null
    this.plan.pool.release(held)
  }

  clearHeadTimer (): void {
    if (this.headTimer === null) return
    clearTimeout(this.headTimer)
    this.headTimer = null
  }

  settle (kind: ForwardErrorKind | null, error: GatewayError | null): void {
    if (this.settled) return
    this.settled = true
    // a body still flowing is counted no more, and arms no timer of a settled request
    if (this.onBodyData !== null) this.req.off('data', this.onBodyData)
    // nor taken from the body budget after releaseHeldBytes below: a 408 (clientBodyTimeout) left
    // bufferBody reading, and what came after it was held by nobody, never given back
    this.stopBuffering?.()
    this.clearIdle()
    this.clearHeadTimer()
    this.clearBodyIdle()
    if (this.waiting !== null) {
      this.plan.pool.cancel(this.waiting)
      this.waiting = null
    }
    if (this.backingOff !== null) {
      this.plan.pool.cancelBackOff(this.backingOff)
      this.backingOff = null
    }
    this.releaseTarget()
    this.releaseHeldBytes()
    if (this.retrying) this.leaveRetryBudget()
    // a response cut or given up: what the encoder holds goes nowhere
    if (kind !== null && this.encoder !== null) this.encoder.destroy()
    // The connection was closed by the gateway (its shutdown, server.requestTimeout), not by the client.
    if (kind === 'client_abort') kind = cutByGateway.get(this.res) ?? kind
    const code = kind === null ? null : KIND_CODES[kind]
    let status = this.status
    let sentStatus: number | undefined
    if (!this.headWritten) {
      status = code === null ? (kind === 'client_abort' ? 499 : status) : ERRORS[code].status
    } else if (code !== null) {
      // Cut mid-body: the client got a 2xx head and half a body, which is a failure to count.
      sentStatus = status
      status = ERRORS[code].status
    }
    try {
      this.done({ status, target: this.target?.url ?? null, bytesIn: this.bytesIn, bytesOut: this.bytesOut, errorCode: code, errorKind: kind, retriedAfter: this.retriedAfter, retryOverBudget: this.overBudget, error, sentStatus, encoding: this.encoder === null ? undefined : this.encoding })
    } catch (err) {
      // A throwing callback must not reach undici's socket handling; report it without crashing.
      process.emitWarning(err instanceof Error ? err : new Error(String(err)), 'GatewayForwardDoneError')
    }
  }
}
