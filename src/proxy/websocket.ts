import { Agent as HttpAgent, STATUS_CODES, type ClientRequest, type IncomingMessage } from 'node:http'
import type { Duplex } from 'node:stream'
import { connect as netConnect, isIP, Socket } from 'node:net'
import { connect as tlsConnect } from 'node:tls'
import httpProxy from 'http-proxy'
import { CLOSE_GRACE_MS, ERRORS, GatewayError, closeSoon, writeError, type ErrorCode } from '../errors.js'
import type { ForwardContext, ForwardPlan, ForwardResult, RetryCause } from './forward.js'
import { retryDelayMs } from './retry-policy.js'
import { upstreamRequestHeaders } from './forward-headers.js'
import { HOP_BY_HOP, connectionTokens } from './hop-by-hop.js'
import { stripPathPrefix } from './forward-path.js'
import { KIND_CODES, KIND_MESSAGES, classifyUpstreamError, isConnectFailure, type ForwardErrorKind } from './upstream-errors.js'
import type { UpstreamTarget } from './upstream-pool.js'

/** Proxies `Upgrade: websocket` requests; one per gateway server. */
export interface WebSocketProxy {
  /**
   * Tunnels the upgrade to a target of the plan's pool. `done`, if given, is called once when the
   * handshake is decided: 101 (tunnel open), the upstream's own refusal status, or the error answered.
   */
  upgrade (req: IncomingMessage, socket: Duplex, head: Buffer, plan: ForwardPlan, ctx: ForwardContext, done?: (result: ForwardResult) => void): void
  /**
   * An upgrade held before its handshake (a leaky-bucket delay): `wake` runs at drain() or close()
   * if the delay has not ended first, and its upgrade() is then answered 503 GW_ERR_SHUTTING_DOWN.
   * Returns the function that forgets it (the delay ended, the client left).
   */
  hold (wake: () => void): () => void
  /** Answers later upgrades 503 GW_ERR_SHUTTING_DOWN; open tunnels stay until close(). */
  drain (): void
  /** Destroys every tunnel, open or opening; later upgrades are answered 503. */
  close (): void
}

export function createWebSocketProxy (): WebSocketProxy {
  // toProxy: http-proxy then sends req.url as is; otherwise it re-parses it with url.parse,
  // which escapes some characters and would not leave the query untouched.
  const proxy = httpProxy.createProxyServer({ ws: true, xfwd: false, changeOrigin: false, toProxy: true })
  const tunnels = new Map<Duplex, Tunnel>()
  const held = new Set<() => void>()
  let closed = false
  // A held upgrade waited out its whole delay (up to maxDelay) past the drain: its client was cut
  // without an answer at shutdownTimeout, logged 499 client_abort, and its timer kept the process
  // from exiting until the delay ended.
  const wakeHeld = (): void => {
    const waking = [...held]
    held.clear()
    for (const wake of waking) wake()
  }

  // Emitted synchronously inside proxy.ws(), before http-proxy adds its own listeners: ours run first.
  proxy.on('proxyReqWs', (proxyReq, req, socket) => {
    // http-proxy joins the path with its urlJoin, which collapses "//" and turns the first "http:/"
    // into "http://"; node writes the request line at the end(), from this property
    if (req.url !== undefined) proxyReq.path = req.url
    tunnels.get(socket)?.opening(proxyReq)
  })

  return {
    upgrade (req, socket, head, plan, ctx, done) {
      if (socket.destroyed) return done === undefined ? undefined : report(done, outcome(499, null, 'client_abort', null))
      if (closed) return refuse(socket, 'GW_ERR_SHUTTING_DOWN', 'shutting_down', ctx, done)
      // Tunnels outlive every request timeout: without a cap, idle ones pile up past maxConnections.
      if (tunnels.size >= plan.maxWebSockets) return refuse(socket, 'GW_ERR_TOO_MANY_TUNNELS', 'too_many_tunnels', ctx, done)
      const target = plan.pool.pick()
      if (target === null) return refuse(socket, 'GW_ERR_NO_HEALTHY_UPSTREAM', 'no_healthy', ctx, done)
      // No prototype: a client header named "constructor" or "toString" found an inherited value
      // and reached the upstream joined with it.
      const headers = Object.create(null) as Record<string, string>
      const flat = upstreamRequestHeaders(req, plan.headers, ctx)
      for (let i = 0; i < flat.length; i += 2) {
        const name = flat[i] as string
        const value = flat[i + 1] as string
        headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`
      }
      // Connection and Upgrade are hop-by-hop (RFC 9110 §7.6.1) but are the request here: each hop asks for it anew.
      headers.connection = 'Upgrade'
      headers.upgrade = 'websocket'
      req.headers = headers
      const path = stripPathPrefix(ctx.path, plan.stripPrefix)
      // The connection is made here, not by http-proxy, which ends the client's socket when its
      // own fails: a refused one could not be tried again on another target.
      const tunnel = new Tunnel(socket, plan, ctx, target, done ?? null, () => tunnels.delete(socket), headers.host, (to, upstream) => {
        req.url = to.basePath + path
        try {
          // over the connection made (TLS included): http-proxy writes the handshake on it
          proxy.ws(req, socket, head, {
            target: { protocol: 'ws:', host: to.hostname, hostname: to.hostname, port: to.port },
            agent: new HandOver(upstream)
          }, (err) => tunnel.failed(err))
        } catch (err) {
          // node:http refused to build the upstream request (e.g. a header value it rejects); the
          // connection made for it is held by nothing else
          upstream.destroy()
          tunnel.failed(err instanceof Error ? err : new Error(String(err)))
        }
      })
      tunnels.set(socket, tunnel)
      tunnel.connect()
    },
    hold (wake) {
      if (closed) {
        wake()
        return noop
      }
      held.add(wake)
      return () => { held.delete(wake) }
    },
    drain () {
      closed = true
      wakeHeld()
    },
    close () {
      closed = true
      wakeHeld()
      for (const tunnel of tunnels.values()) tunnel.destroy()
      tunnels.clear()
    }
  }
}

/** One client socket, its upstream request and, once upgraded, the upstream socket. */
class Tunnel {
  readonly socket: Duplex
  readonly plan: ForwardPlan
  readonly ctx: ForwardContext
  /** The target of the attempt now (the last one tried once settled). */
  target: UpstreamTarget
  /** The Host the handshake is sent with: a target given as an address takes its TLS server name from it, as node:https does. */
  readonly host: string | undefined
  /** Sends the handshake over a connection made to the target. */
  readonly open: (target: UpstreamTarget, upstream: Socket) => void
  /** The connection being made to `target`, until it is handed to the handshake. */
  connecting: Socket | null = null
  /** The targets of the attempts before this one (connections refused, not resolved, or not made in time). */
  tried: UpstreamTarget[] | null = null
  retriedAfter: RetryCause[] | null = null
  proxyReq: ClientRequest | null = null
  upstream: Duplex | null = null
  upgraded = false
  /** The upstream refused the upgrade and its answer is being relayed: the client has its head. */
  responded = false
  /** The client's socket closed: an upstream request failing after it failed because we cut it. */
  clientGone = false
  /** Cut by the gateway's shutdown (destroy()): a pending handshake ends as the gateway's doing. */
  shutDown = false
  timer: NodeJS.Timeout | null = null
  timeoutKind: ForwardErrorKind | null = null
  done: ((result: ForwardResult) => void) | null

  constructor (socket: Duplex, plan: ForwardPlan, ctx: ForwardContext, target: UpstreamTarget, done: ((result: ForwardResult) => void) | null, forget: () => void, host: string | undefined, open: (target: UpstreamTarget, upstream: Socket) => void) {
    this.socket = socket
    this.plan = plan
    this.ctx = ctx
    this.target = target
    this.done = done
    this.host = host
    this.open = open
    // An 'error' without a listener would crash the process; 'close' follows it and tears down.
    socket.on('error', noop)
    socket.once('close', () => {
      // before the destroy below: node reports it as 'socket hang up' through http-proxy's
      // callback, which would charge a healthy target with a reset (consecutiveFailures eject it)
      this.clientGone = true
      forget()
      this.clearTimer()
      if (this.upstream !== null) closeSoon(this.upstream)
      else this.proxyReq?.destroy()
      this.connecting?.destroy()
      if (this.shutDown) this.settleShutDown()
      else this.settle(499, 'client_abort', null)
    })
  }

  /**
   * Connects to `target` (through TLS for an https:// one, with its server name checked), then
   * hands the connection to the handshake. Nothing is sent before it is made, so a refused one,
   * a name that does not resolve or one not made within timeouts.connect goes to another target
   * as an HTTP request's does (retries, retryOn: connect-failure, retryBackoff).
   */
  connect (): void {
    const target = this.target
    const upstream = target.secure
      ? tlsConnect({ host: target.hostname, port: target.port, servername: target.servername ?? serverNameOf(this.host, target.hostname), ALPNProtocols: ['http/1.1'] })
      : netConnect({ host: target.hostname, port: target.port })
    this.connecting = upstream
    const refused = (err: Error): void => { this.connectFailed(err) }
    upstream.once('error', refused)
    // made once TLS is too: a certificate refused is a connection never made (nothing was sent),
    // retried on another target as a refused one is, where on 'connect' it failed the handshake
    upstream.once(target.secure ? 'secureConnect' : 'connect', () => {
      this.connecting = null
      // later errors are the handshake's: its request reports them
      upstream.off('error', refused)
      upstream.on('error', noop)
      this.open(this.target, upstream)
    })
    this.startTimer('connect_timeout', this.plan.pool.config.connectTimeoutMs)
  }

  private connectFailed (err: Error): void {
    this.connecting = null
    this.clearTimer()
    if (this.shutDown) {
      this.settleShutDown()
      return
    }
    if (this.clientGone) return
    const kind = this.timeoutKind ?? classifyUpstreamError(err)
    this.timeoutKind = null
    this.charge(kind)
    if (isConnectFailure(kind) && this.retry(kind)) return
    this.giveUp(kind, err)
  }

  /**
   * Sends the handshake to another target (one not tried yet, else any in rotation) when the
   * retry policy allows one more: a GET without a body, so always safe to repeat. Not budgeted,
   * as an HTTP request's connection never made is not.
   */
  private retry (after: ForwardErrorKind): boolean {
    const policy = this.plan.retry
    if (!policy.onConnectFailure || (this.retriedAfter?.length ?? 0) >= policy.retries) return false
    const pool = this.plan.pool
    if (this.tried === null) this.tried = [this.target]
    else if (!this.tried.includes(this.target)) this.tried.push(this.target)
    const next = pool.pick(this.tried) ?? pool.pick()
    if (next === null) return false
    if (this.retriedAfter === null) this.retriedAfter = [after]
    else this.retriedAfter.push(after)
    this.target = next
    const delayMs = policy.backoff === null ? 0 : retryDelayMs(policy.backoff, this.retriedAfter.length, Math.random())
    if (delayMs === 0) this.connect()
    else {
      // the back-off's timer is the tunnel's: a client that leaves, or the shutdown, clears it
      this.timer = setTimeout(() => {
        this.timer = null
        this.connect()
      }, delayMs)
    }
    return true
  }

  opening (proxyReq: ClientRequest): void {
    this.proxyReq = proxyReq
    const config = this.plan.pool.config
    this.startTimer('connect_timeout', config.connectTimeoutMs)
    proxyReq.once('socket', (upstream) => {
      if (upstream.connecting) upstream.once('connect', () => this.startTimer('response_timeout', this.plan.responseTimeoutMs))
      else this.startTimer('response_timeout', this.plan.responseTimeoutMs)
    })
    proxyReq.once('upgrade', (res: IncomingMessage, upstream: Duplex) => {
      this.clearTimer()
      this.plan.pool.succeeded(this.target)
      this.upgraded = true
      this.upstream = upstream
      switched(res)
      this.answerHeaders(res)
      this.settle(101, null, null)
      upstream.on('error', noop)
      // http-proxy pipes both ways, which ends a side on a clean end but not on an error or a destroy.
      upstream.once('close', () => closeSoon(this.socket))
      // A WebSocket has no use for a half-open TCP connection: when the client ends its side, both
      // sides are closed. Otherwise its socket stays in CLOSE-WAIT for as long as the upstream
      // keeps its side open (node:http sockets allow half-open). An upstream end already reaches
      // the client through http-proxy's pipe, and the client closes.
      // http-proxy's pipe passes the client's end on; an upstream that answers it closes, and
      // its 'close' (above) closes the client side. One that does not gets CLOSE_GRACE_MS.
      this.socket.once('end', () => {
        setTimeout(() => {
          upstream.destroy()
          this.socket.destroy()
        }, CLOSE_GRACE_MS).unref()
      })
      // Any byte either way is a write or a read on the client socket, so its inactivity timer
      // is the tunnel's idle timer (websocketIdleTimeout).
      if (this.socket instanceof Socket) {
        this.socket.setTimeout(this.plan.websocketIdleTimeoutMs, () => {
          closeSoon(upstream)
          closeSoon(this.socket)
        })
      }
      if (this.socket.destroyed) closeSoon(upstream)
    })
    // Not upgraded (e.g. 403 or 404 from the upstream): http-proxy relays that answer as is.
    proxyReq.once('response', (res: IncomingMessage) => {
      this.clearTimer()
      // node's client takes a 101 for an upgrade when it names the protocol (RFC 9110 §15.2.2: a
      // 101 has an Upgrade header); without one it switched to nothing the client asked for.
      // Relayed, the client read a 101 and a closed connection, logged and counted as an open
      // WebSocket and as the target's success.
      const status = res.statusCode ?? 0
      const refusal = status === 101
        ? 'the upstream answered 101 without an Upgrade header'
        // RFC 9110 §15: three digits, 1xx-5xx (an HTTP request's answer gets the same 502); a 000
        // or a 600 went to the client as it came, logged with that status and counted as the
        // target's success
        : status < 200 || status > 599 ? `the upstream answered status ${status}` : null
      if (refusal !== null) {
        // http-proxy's own 'response' listener, run after this one, relays every answer whose
        // `upgrade` is false (node:http leaves it false here): its head and body written after
        // our 502 are writes after the end, whose error destroys the socket, flushed or not.
        ;(res as IncomingMessage & { upgrade: boolean }).upgrade = true
        // With `upgrade` set, node's client then emits 'upgrade' on the request: our listener
        // would count the target's success (undoing the failure) and http-proxy's would write a
        // 101 to the client. Without listeners node destroys the socket itself.
        proxyReq.removeAllListeners('upgrade')
        this.failed(new Error(refusal), 'bad_response')
        proxyReq.destroy()
        return
      }
      // http-proxy writes the reason phrase as it came: one with control bytes (NUL, \x01) is
      // replaced by the status's own, as node:http would refuse to write it
      if (!REASON_PHRASE.test(res.statusMessage ?? '')) res.statusMessage = STATUS_CODES[status] ?? ''
      // a status failureStatuses lists counts as the answer to an HTTP request does
      this.plan.pool.answered(this.target, status)
      this.responded = true
      notUpgraded(res)
      this.answerHeaders(res)
      this.settle(status, null, null)
      // http-proxy pipes the answer and ends the client socket, which then waits for the client's
      // own end (allowHalfOpen): closeSoon does not wait for a client that never sends it. An
      // answer the upstream broke off (its connection closed before the body's end) never ends:
      // the client is cut at once, so it sees a truncated answer rather than waiting for the rest.
      res.once('close', () => {
        if (res.complete) closeSoon(this.socket)
        else this.socket.destroy()
      })
      // A body that stops (an upstream that stalls, a client that stops reading) is cut after the
      // upstream's idle timeout, as an HTTP response body is: no timer watched it.
      if (this.socket instanceof Socket) {
        this.socket.setTimeout(this.plan.idleTimeoutMs, () => {
          this.proxyReq?.destroy()
          this.socket.destroy()
        })
      }
    })
  }

  // http-proxy writes these headers to the client right after our listener returns.
  answerHeaders (res: IncomingMessage): void {
    delete res.headers['x-request-id']
    const rules = this.plan.responseHeaders
    for (const name of rules.remove) delete res.headers[name]
    for (const [name, value] of rules.set) res.headers[name] = value
    if (this.ctx.extraResponseHeaders !== undefined) for (const [name, value] of this.ctx.extraResponseHeaders) res.headers[name.toLowerCase()] = value
    // as on an HTTP answer: the gateway's id, unless the route's rules remove or set the field
    // (it was written over their choice); an id the upstream echoed is never relayed
    if (this.plan.headers.echoRequestId) res.headers['x-request-id'] = this.ctx.requestId
  }

  /** http-proxy's callback: the upstream request failed, or the upstream socket after the upgrade. */
  failed (err: Error, known: ForwardErrorKind | null = null): void {
    this.clearTimer()
    if (this.upgraded) {
      closeSoon(this.socket)
      return
    }
    // The upstream's refusal is being relayed: an answer of the gateway's own written now would
    // land inside that body (a client reading by Content-Length took it for the upstream's bytes).
    if (this.responded) {
      this.socket.destroy()
      return
    }
    // Our own destroy() at shutdown cut the upstream request (it failed first, as 'socket hang
    // up'): no reset of the target's, and the README's 503 for what a shutdown cuts, never a 502.
    if (this.shutDown) {
      this.settleShutDown()
      return
    }
    // The client left first and its close cut the upstream request: a client abort, as a plain
    // HTTP request's is, never the upstream's failure.
    if (this.clientGone) {
      this.settle(499, 'client_abort', null)
      return
    }
    const kind = known ?? this.timeoutKind ?? classifyUpstreamError(err)
    this.charge(kind)
    this.giveUp(kind, err)
  }

  /** The target's part in a failure: ejected when no connection was made, an outlier's failure when it accepted and then failed. */
  private charge (kind: ForwardErrorKind): void {
    if (isConnectFailure(kind)) this.plan.pool.eject(this.target)
    // a target that accepts and then never answers, or resets, is an outlier for upgrades too
    else if (kind === 'response_timeout' || kind === 'reset' || kind === 'bad_response') this.plan.pool.failed(this.target)
  }

  private giveUp (kind: ForwardErrorKind, err: Error): void {
    const code = KIND_CODES[kind] ?? 'GW_ERR_UPSTREAM_UNAVAILABLE'
    const message = KIND_MESSAGES[kind]
    // The client may already be gone (its close settled the tunnel); then nobody is answered.
    answer(this.socket, code, this.ctx, message)
    this.settle(ERRORS[code].status, kind, new GatewayError(code, message, { cause: err }))
  }

  settleShutDown (): void {
    this.settle(ERRORS.GW_ERR_SHUTTING_DOWN.status, 'shutting_down', new GatewayError('GW_ERR_SHUTTING_DOWN'))
  }

  settle (status: number, kind: ForwardErrorKind | null, error: GatewayError | null): void {
    const done = this.done
    if (done === null) return
    this.done = null
    report(done, outcome(status, this.target.url, kind, error, this.retriedAfter))
  }

  startTimer (kind: ForwardErrorKind, ms: number): void {
    this.clearTimer()
    this.timer = setTimeout(() => {
      this.timeoutKind = kind
      this.proxyReq?.destroy()
      this.connecting?.destroy(new Error(`no connection within ${ms} ms`))
    }, ms)
  }

  clearTimer (): void {
    if (this.timer !== null) clearTimeout(this.timer)
    this.timer = null
  }

  destroy (): void {
    this.shutDown = true
    this.clearTimer()
    // A handshake still waiting for its upstream can be told why it ends; once a head went out
    // (a 101, an upstream's refusal) the connection can only be cut.
    const pending = !this.upgraded && !this.responded && this.done !== null && this.socket.writable
    this.proxyReq?.destroy()
    this.connecting?.destroy()
    this.upstream?.destroy()
    if (pending) answer(this.socket, 'GW_ERR_SHUTTING_DOWN', this.ctx)
    else this.socket.destroy()
  }
}

function refuse (socket: Duplex, code: ErrorCode, kind: ForwardErrorKind, ctx: ForwardContext, done: ((result: ForwardResult) => void) | undefined): void {
  answer(socket, code, ctx)
  if (done !== undefined) report(done, outcome(ERRORS[code].status, null, kind, new GatewayError(code)))
}

// A throwing callback must not break socket handling; it is reported without crashing.
function report (done: (result: ForwardResult) => void, result: ForwardResult): void {
  try {
    done(result)
  } catch (err) {
    process.emitWarning(err instanceof Error ? err : new Error(String(err)), 'GatewayWebSocketDoneError')
  }
}

function outcome (status: number, target: string | null, kind: ForwardErrorKind | null, error: GatewayError | null, retriedAfter: RetryCause[] | null = null): ForwardResult {
  return { status, target, bytesIn: 0, bytesOut: 0, errorCode: error?.code ?? null, errorKind: kind, retriedAfter, error }
}

/** A plain HTTP/1.1 error answer on the raw socket (the upgrade never happened), then the socket is destroyed. */
function answer (socket: Duplex, code: ErrorCode, ctx: ForwardContext, message?: string): void {
  writeError(socket, code, ctx.requestId, message === undefined ? undefined : { message }, ctx.extraResponseHeaders)
}

/**
 * An upstream's answer that is not an upgrade, as http-proxy relays it: its headers, then its body
 * as node:http decoded it (de-chunked), then the end of the connection. So the hop-by-hop fields
 * go (a `Transfer-Encoding: chunked` over a decoded body breaks the client's parse), and without a
 * Content-Length the end of the connection delimits the body (RFC 9112 §6.3).
 */
function notUpgraded (res: IncomingMessage): void {
  const named = res.headers.connection
  if (named !== undefined) for (const token of connectionTokens(named)) delete res.headers[token]
  for (const name of HOP_BY_HOP) delete res.headers[name]
  res.headers.connection = 'close'
}

/**
 * The upstream's 101 as http-proxy writes it to the client (its headers verbatim): the switch is
 * this hop's, so it keeps `Connection: Upgrade` and the upstream's `Upgrade`, and loses the other
 * hop-by-hop fields and those its `Connection` names, as an HTTP answer does (a `Keep-Alive`, an
 * internal field the upstream meant for the gateway alone reached the client).
 */
function switched (res: IncomingMessage): void {
  const upgrade = res.headers.upgrade
  const named = res.headers.connection
  if (named !== undefined) for (const token of connectionTokens(named)) delete res.headers[token]
  for (const name of HOP_BY_HOP) delete res.headers[name]
  res.headers.connection = 'Upgrade'
  if (upgrade !== undefined) res.headers.upgrade = upgrade
}

function noop (): void {}

/** A reason phrase node:http would write (RFC 9112 §4: HTAB, SP, VCHAR, obs-text). */
const REASON_PHRASE = /^[\t\x20-\x7e\x80-\xff]*$/

/**
 * The TLS server name for a target given as an address: the Host the handshake is sent with, as
 * node:https takes it (its calculateServerName); none when that is an address too ('': no SNI,
 * the certificate checked against the address connected to).
 */
function serverNameOf (host: string | undefined, address: string): string {
  const name = host === undefined || host === '' ? address : host.startsWith('[') ? host.slice(1, host.indexOf(']')) : host.split(':', 1)[0] ?? ''
  return isIP(name) === 0 ? name : ''
}

/** An agent that gives its one request the connection already made, and keeps nothing: an upgraded socket leaves its agent. */
class HandOver extends HttpAgent {
  readonly #upstream: Socket
  constructor (upstream: Socket) {
    super({ keepAlive: false })
    this.#upstream = upstream
  }

  override createConnection (): Socket {
    return this.#upstream
  }
}
