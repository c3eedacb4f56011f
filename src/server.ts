// Wires the stages: config -> runtime, the public listener (HTTP or TLS), the admin listener,
// reload (SIGHUP) and graceful shutdown. The per-request order lives in pipeline.ts.
import { createServer as createHttpServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import { createServer as createHttpsServer, type Server as HttpsServer } from 'node:https'
import { randomUUID } from 'node:crypto'
import type { AddressInfo, Socket } from 'node:net'
import { formatProblem, loadConfigFile, loadConfigText, reloadProblems, REPORTED_PROBLEMS, type LoadedConfig, type NamedFiles } from './config/load.js'
import type { ResolvedConfig } from './config/defaults.js'
import { compileRuntime, type Runtime, type TlsFiles } from './runtime.js'
import { ResourceCache, type RedisStatus } from './runtime-resources.js'
import { createRequestHandler, createUpgradeHandler, type PipelineState } from './pipeline.js'
import { refuseUnparsableBody } from './proxy/forward.js'
import { createWebSocketProxy } from './proxy/websocket.js'
import { declineUpgrade, offersWebSocket } from './proxy/upgrade-offer.js'
import { holdContinue } from './proxy/expect-continue.js'
import { isDroppingBody, lingerAfterAnswer } from './proxy/lingering-close.js'
import { hasRequestBody } from './proxy/request-body.js'
import { GatewayMetrics } from './admin/metrics.js'
import { createAdminServer, healthOf, isLoopback, json, warnOpenAdmin, type AdminSource } from './admin/admin-server.js'
import { createLimitsApi, createLimitsOps, type LimitsApiDeps } from './admin/limits-api.js'
import { LiveTelemetry } from './admin/live-stats.js'
import { LiveFeed } from './admin/live-feed.js'
import { describeRoutes } from './admin/dashboard.js'
import { answerAdminRequests, sendLiveFrames } from './workers.js'
import { redactConfig } from './admin/redact.js'
import { cutByGateway } from './proxy/shutdown-cut.js'
import { createAccessLog, createLogger, droppedLogLines, type Logger, type LogLevel } from './log.js'
import { strayRejectionCount } from './stray-rejections.js'
import { writeError } from './errors.js'
import { clientLeft, parserErrorAnswer, writeParserError } from './parser-errors.js'
import { adminListen, adminReadToken } from './config/defaults.js'
import { waitAtMost } from './wait-at-most.js'
import { acceptProxyProtocol, type ProxyProtocolListener } from './identify/proxy-protocol.js'
import { capConnections, capConnectionsPerClient, type ConnectionCap } from './proxy/connection-cap.js'
import { createRedirectHandler } from './proxy/https-redirect.js'
import { openEncoderCount } from './proxy/compression.js'

/** A warning about connections closed as they came (a PROXY header missing, the cap) comes at most this often. */
const CONNECTION_WARN_EVERY_MS = 10_000

/** `message` at warn, at most once every CONNECTION_WARN_EVERY_MS: the counter beside it has every occurrence. */
function warnSparingly (logger: Logger, message: string): (fields: Record<string, unknown>) => void {
  let warnedAt = -Infinity
  return (fields) => {
    const now = Date.now()
    if (now - warnedAt < CONNECTION_WARN_EVERY_MS) return
    warnedAt = now
    logger.warn(fields, message)
  }
}

export interface GatewayOptions {
  readonly configFile: string
  /** Overrides `log.level` from the file (the CLI's --log-level). */
  readonly logLevel?: LogLevel
  readonly logger?: Logger
  readonly env?: NodeJS.ProcessEnv
  /** false in `workers: N` mode: the primary serves the admin listener for all workers. */
  readonly adminListener?: boolean
  /**
   * The config to start with instead of reading `configFile` (a worker gets the one its primary
   * last accepted: src/workers.ts acceptedConfig). Reloads read `configFile`, unless given a
   * ReloadSource.
   */
  readonly initial?: LoadedConfig
  /** The generation `initial` is (the primary's count, for a worker that replaces a crashed one); default 1. */
  readonly initialGeneration?: number
  /**
   * The config the gateway started with, when `initial` came later (a workers primary's, for a
   * worker that replaces a crashed one): the listener is bound to its `listen`, with TLS on or off
   * as it had it, as the worker's siblings are, and reloads are compared with it.
   */
  readonly startedWith?: ResolvedConfig
  /**
   * The certificate and key to serve when `startedWith` has TLS and `initial` has none (a reload
   * turned it off, which waits for a restart): those the worker's siblings still serve.
   */
  readonly servedTls?: TlsFiles
}

/**
 * A reload's config handed over instead of read from `configFile`: a worker reloads with the text
 * its primary checked, under the primary's generation number (src/workers.ts), so that every
 * process counts the same generations however SIGHUPs come.
 */
export interface ReloadSource {
  /** null: read `configFile` (the primary holds no text of it). */
  readonly text: string | null
  /** The files the text names, as the primary read them (LoadedConfig.files). */
  readonly files?: NamedFiles
  readonly generation: number
}

/** `leaving`: not applied because the gateway is shutting down (nothing wrong with the file). */
export type ReloadResult = { ok: true, generation: number, restartNeeded: readonly string[] } | { ok: false, error: string, leaving?: true }

/** The outcome of the latest SIGHUP, shown on /config so `gateway reload` can report it. */
export interface ReloadOutcome {
  /** Counts completed reloads: a waiting CLI sees its own reload as this number moving. */
  readonly attempt: number
  readonly ok: boolean
  readonly generation: number
  readonly problems: readonly string[]
  readonly at: string
  /** Settings of an accepted file that keep their values from the start until a restart. */
  readonly restartNeeded?: readonly string[]
  /** With `workers: N`: the workers that could not apply an accepted file (they serve the one before). */
  readonly workersFailed?: ReadonlyArray<{ readonly pid: number | undefined, readonly problems: readonly string[] }>
}

/**
 * What `after` changes that a reload cannot apply: the sockets bound at start (the listener, its
 * TLS or plain protocol, the admin listener) and the number of workers. Compared with the config
 * the process started with, so a change that is reverted needs nothing.
 */
export function settingsNeedingRestart (started: ResolvedConfig, after: ResolvedConfig): string[] {
  const needed: string[] = []
  if (after.listen !== started.listen) needed.push('listen')
  if ((after.tls === undefined) !== (started.tls === undefined)) needed.push('tls (on or off)')
  if (adminListen(after) !== adminListen(started)) needed.push('admin')
  if (after.workers !== started.workers) needed.push('workers')
  if (after.tls?.redirectHttp?.listen !== started.tls?.redirectHttp?.listen) needed.push('tls.redirectHttp.listen')
  return needed
}

/** The one wording of settingsNeedingRestart's list: the reload's warning, in each process and on `gateway reload`'s stderr. */
export function restartNeededMessage (settings: readonly string[]): string {
  return `${settings.join(', ')}: these changes need a restart; the running gateway keeps its start's values`
}

export function splitHostPort (hp: string): { host: string, port: number } {
  const i = hp.lastIndexOf(':')
  return { host: hp.slice(0, i).replace(/^\[|\]$/g, '') || '0.0.0.0', port: Number(hp.slice(i + 1)) }
}

export { isLoopback }

function listen (server: Server | HttpsServer, address: string): Promise<AddressInfo> {
  const { host, port } = splitHostPort(address)
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, host, () => {
      server.off('error', reject)
      resolve(server.address() as AddressInfo)
    })
  })
}

export const RELOAD_HISTORY = 20

/** One connection's responses that have not closed, oldest first (pipelined requests queue here). */
interface OpenResponses {
  readonly responses: ServerResponse[]
  /** An error answer waiting for those responses (clientError on a later pipelined request). */
  then: (() => void) | null
  /** The request being served: one at a time per connection (see servePipelined). */
  serving: ServerResponse | null
  /** Requests pipelined behind it, not yet started, oldest first. */
  readonly waiting: Array<{ readonly req: IncomingMessage, readonly res: ServerResponse }>
}

/**
 * Requests a connection may have waiting behind the one being served; one more closes it. node:http
 * parses every request a read brings and stops reading only for answers held for their turn,
 * which requests not yet started do not write: without a bound, a client writing requests ahead
 * without end would be held in memory without end. No client pipelines this deep (wrk's example
 * script sends 3 at a time; browsers none).
 */
const MAX_PIPELINED_WAITING = 128

/**
 * Serves a connection's requests one at a time, as nginx and Envoy serve an HTTP/1.1 connection:
 * a request pipelined behind another starts when the one before it has closed. Started as they
 * came, one connection of 2,000 pipelined GETs took every upstream connection and the whole queue
 * (other clients got 503 GW_ERR_UPSTREAM_BUSY), and once their answers waiting for their turn
 * passed 16 KiB, node:http stopped reading the connection: a client that left was no longer seen,
 * and every one of its upstream requests ran on until it answered.
 */
function servePipelined (open: OpenResponses, req: IncomingMessage, res: ServerResponse, handle: (req: IncomingMessage, res: ServerResponse) => void): boolean {
  if (open.serving === null) {
    open.serving = res
    handle(req, res)
    return true
  }
  if (open.waiting.length >= MAX_PIPELINED_WAITING) return false
  open.waiting.push({ req, res })
  return true
}

/** The request served on the connection closed: the next one waiting starts. */
function serveNext (open: OpenResponses, closed: ServerResponse, handle: (req: IncomingMessage, res: ServerResponse) => void): void {
  if (open.serving !== closed) return
  open.serving = null
  const next = open.waiting.shift()
  if (next === undefined) return
  open.serving = next.res
  handle(next.req, next.res)
}

/**
 * node emits 'close' on a response once it has had the connection. A response pipelined behind
 * one still going out never closed when the connection ended (the client reset it, a send timeout
 * cut it): its request stayed counted in flight for good, and a drain waited for it until
 * server.shutdownTimeout. Closed here, like the one that had the connection.
 */
function closeUnassigned (open: OpenResponses | undefined): void {
  if (open === undefined) return
  // never started: nobody is left to answer (not logged, as nginx logs no request it never read)
  for (const { res } of open.waiting.splice(0)) {
    const i = open.responses.indexOf(res)
    if (i !== -1) open.responses.splice(i, 1)
    res.destroy()
  }
  for (const res of open.responses.slice()) {
    if (res.socket !== null || res.writableFinished) continue
    res.destroy()
    res.emit('close')
  }
}

function responseClosed (open: OpenResponses, res: ServerResponse): void {
  const i = open.responses.indexOf(res)
  if (i !== -1) open.responses.splice(i, 1)
  if (open.responses.length === 0 && open.then !== null) {
    const then = open.then
    open.then = null
    then()
  }
}

/** What a file that loads still gets wrong (src/runtime.ts warnings), logged at start and on each reload. */
function warnConfig (logger: Logger, runtime: Runtime): void {
  if (runtime.warnings.length > 0) logger.warn({ warnings: runtime.warnings.slice(0, REPORTED_PROBLEMS).map(formatProblem) }, 'configuration loaded with routes that can never match')
  warnUntrustedIdentityHeader(logger, runtime)
}

/**
 * `identity.header` names a header an auth layer sets. With `trustedProxies` set it is believed from
 * those peers only; without, from every client, which can then claim whichever user and plan it likes.
 */
function warnUntrustedIdentityHeader (logger: Logger, runtime: Runtime): void {
  const identity = runtime.config.identity
  if (identity === undefined || !('header' in identity) || runtime.config.trustedProxies.length > 0) return
  logger.warn({ header: identity.header }, 'identity.header is believed from every client because trustedProxies is empty: a client can claim whichever user it likes; list the auth layer\'s addresses in trustedProxies')
}

/** Responses the drain told to close their connection (and may tell to stay open again). */
const closedByDrain = new WeakSet<ServerResponse>()

/**
 * While draining, a connection closes after its last response, not its first: node:http ends the
 * connection once a response says Connection: close, and the answers to requests pipelined behind
 * it (already forwarded upstream) were lost. A newer pipelined request takes the close over.
 */
function closeAfterLast (open: OpenResponses, last: ServerResponse): void {
  for (const res of open.responses) {
    if (res !== last && closedByDrain.has(res) && !res.headersSent) {
      closedByDrain.delete(res)
      res.shouldKeepAlive = true
    }
  }
  if (!last.headersSent && last.shouldKeepAlive) {
    closedByDrain.add(last)
    last.shouldKeepAlive = false
  }
}

/**
 * The shield's settings node:http reads from the server object as it goes: a reload that tightens
 * them during an attack takes effect at once. The header limits apply to connections opened from
 * now on, the timeouts to every connection's next check (headers, request) or idle wait (keep-alive).
 */
function applyServerSettings (server: Server | HttpsServer, runtime: Runtime): void {
  const s = runtime.server
  // One more than the limit, so the pipeline sees a request over it (431) rather than node:http
  // dropping the fields beyond its own limit without a word.
  server.maxHeadersCount = s.maxHeadersCount + 1
  server.headersTimeout = s.headersTimeoutMs
  server.requestTimeout = s.requestTimeoutMs
  server.keepAliveTimeout = s.keepAliveTimeoutMs
  ;(server as { maxHeaderSize?: number }).maxHeaderSize = s.maxHeaderSize
}

const NOT_A_FORWARD_PROXY = Object.freeze({ reason: 'CONNECT is not served: the gateway is a reverse proxy, not a forward proxy' })

/**
 * Nothing after an answer that closed the connection is served, logged or counted. Node's parser
 * can still read a request there: a lingering close reads the rest of a body, and what follows it
 * in the same read is parsed too (src/proxy/lingering-close.ts).
 */
function closedByAnswer (socket: Socket): boolean {
  if (!socket.writableEnded) return false
  socket.destroy()
  return true
}

/** Connections whose parser error was handled (node's clientError comes again at each read). */
const answeredClientError = new WeakSet<Socket>()

/** Destroys `socket` once each of `earlier` (responses pipelined before a request that failed) has closed. */
function closeAfterEarlierAnswers (socket: Socket, earlier: readonly ServerResponse[]): void {
  let left = earlier.length
  if (left === 0) {
    socket.destroy()
    return
  }
  for (const res of earlier) res.once('close', () => { if (--left === 0) socket.destroy() })
}

/** Longest the exit waits for the log buffer to reach stdout once the gateway has stopped. */
const LOG_DRAIN_MS = 2000
/** Longest the shutdown waits for the client sockets it destroyed to report their close. */
const SOCKETS_CLOSE_MS = 1000
// How long a shutdown waits for a reload still compiling before it closes the shared resources (a
// 20,000-route file compiles in a few seconds), so what that compile opens is closed with the rest.
const RELOAD_SETTLE_MS = 15_000

export class Gateway {
  readonly logger: Logger
  readonly metrics: GatewayMetrics
  private readonly resources: ResourceCache
  private state: PipelineState | null = null
  private server: Server | HttpsServer | null = null
  private admin: Server | null = null
  private generation = 0
  private reloading: Promise<ReloadResult> | null = null
  /** The newest ReloadSource not yet applied: reloads queued behind a running one take it. */
  private nextSource: ReloadSource | null = null
  lastReload: ReloadOutcome | null = null
  /** The last RELOAD_HISTORY reloads, newest last: the admin page's reload history. */
  readonly reloadHistory: ReloadOutcome[] = []
  /** Forwards to the metrics and counts each second for the admin page. */
  readonly live: LiveTelemetry
  private feed: LiveFeed | null = null
  private stopLiveFrames: (() => void) | null = null
  private pendingReload: Promise<ReloadResult> | null = null
  private readonly draining = new Set<Runtime>()
  /** Replaced runtimes that still have requests in flight (kept past the drain deadline, for the count). */
  private readonly retired = new Set<Runtime>()
  private shuttingDown = false
  private readonly sockets = new Set<Socket>()
  /** Reads the PROXY protocol headers of the listener's connections (its own sockets until then). */
  private proxyProtocol: ProxyProtocolListener | null = null
  private connectionCap: ConnectionCap | null = null
  /** tls.redirectHttp's listener; null without one. */
  private redirect: Server | null = null
  /**
   * Per connection that has sent a request: its responses not closed yet (told to close their
   * connection when draining starts) and what to write once they all have. Kept per connection,
   * not in one Set of every response: a Set whose table churns with each request made V8 promote
   * whole request graphs out of the young generation (2.2 MB per scavenge and 6-7 ms pauses
   * against the bare proxy's 0.1 MB and 0.7 ms; bench/README.md, issue 13 profiles).
   */
  private readonly openResponses = new WeakMap<Socket, OpenResponses>()
  private readonly connections = new Set<OpenResponses>()
  private listenAddress = ''
  /** The config the sockets were bound with: what settingsNeedingRestart compares a reload to. */
  private startedConfig: ResolvedConfig | null = null
  port = 0
  adminPort = 0
  /** The port of tls.redirectHttp's listener; 0 without one. */
  redirectPort = 0

  private constructor (private readonly options: GatewayOptions, logger: Logger) {
    this.generation = (options.initialGeneration ?? 1) - 1
    this.logger = logger
    this.resources = new ResourceCache(logger)
    this.metrics = new GatewayMetrics({ localKeys: () => this.resources.localKeys(), targets: () => this.targetHealth(), pending: () => this.upstreamsPending(), inflight: () => this.inflightRequests(), logDropped: () => droppedLogLines(this.logger), strayRejections: strayRejectionCount, connections: () => this.connectionCap?.open() ?? 0, encoders: openEncoderCount })
    this.live = new LiveTelemetry(this.metrics)
  }

  /** Loads the file, starts both listeners; throws ConfigError with located problems. */
  static async start (options: GatewayOptions): Promise<Gateway> {
    const loaded = options.initial ?? await loadConfigFile(options.configFile, options.env)
    const logger = options.logger ?? createLogger(options.logLevel ?? loaded.config.log.level)
    const gw = new Gateway(options, logger)
    try {
      await gw.boot(loaded)
    } catch (err) {
      await gw.close()
      throw err
    }
    return gw
  }

  get runtime (): Runtime | null {
    return this.state?.runtime ?? null
  }

  get url (): string {
    return `${this.state?.proto ?? 'http'}://127.0.0.1:${this.port}`
  }

  /** The file this gateway reads on start and on each reload. */
  get configFile (): string {
    return this.options.configFile
  }

  get adminUrl (): string {
    return `http://127.0.0.1:${this.adminPort}`
  }

  /** Health of every target of the live runtime's upstreams (for the target health gauge). */
  * targetHealth (): Generator<{ upstream: string, target: string, healthy: boolean }> {
    const rt = this.runtime
    if (rt === null) return
    for (const [upstream, pool] of rt.pools) for (const t of pool.health()) yield { upstream, target: t.url, healthy: t.healthy }
  }

  /** Requests waiting for a connection, per upstream of the live runtime (the pending gauge). */
  * upstreamsPending (): Generator<{ upstream: string, pending: number }> {
    const rt = this.runtime
    if (rt === null) return
    for (const [upstream, pool] of rt.pools) yield { upstream, pending: pool.pending }
  }

  /** Client connections open on the public listener (WebSocket tunnels included). */
  openConnections (): number {
    return this.sockets.size
  }

  redisStatus (): RedisStatus {
    const rt = this.runtime
    return rt === null ? { configured: false, connected: false, breaker: null, instances: 1 } : this.resources.redisStatus(rt.config)
  }

  /**
   * Answers what reached no route (a malformed head, a CONNECT), with a request id made for it.
   * Pipelined requests before it on the connection are answered first, in order (RFC 9112
   * §9.3.2): the answer waits for their responses instead of being written in the middle of them.
   * Counted and logged like every answered request: oversized headers and slowloris are worth seeing.
   */
  private answerUnrouted (socket: Socket, status: number, error: string, write: (requestId: string) => void): void {
    const requestId = randomUUID()
    const open = this.openResponses.get(socket)
    if (open === undefined || open.responses.length === 0) write(requestId)
    else open.then = () => { write(requestId) }
    this.live.request('-', '-', status, 0)
    this.logger.info({ requestId, ip: socket.remoteAddress, route: '-', status, error }, 'request')
  }

  /** The connection's open responses, tracked from its first request until it closes. */
  private openResponsesOf (socket: Socket): OpenResponses {
    let open = this.openResponses.get(socket)
    if (open === undefined) {
      const opened: OpenResponses = { responses: [], then: null, serving: null, waiting: [] }
      this.openResponses.set(socket, opened)
      this.connections.add(opened)
      socket.once('close', () => this.connections.delete(opened))
      open = opened
    }
    return open
  }

  private async boot (loaded: LoadedConfig): Promise<void> {
    const prepared = await compileRuntime(loaded, ++this.generation, this.resources, this.live)
    prepared.commit()
    const runtime = prepared.runtime
    this.metrics.generation.set(runtime.generation)
    // settings a reload cannot change keep their start values, in a replacement worker too
    const started = this.options.startedWith ?? runtime.config
    const tls = started.tls === undefined ? null : runtime.tls ?? this.options.servedTls ?? null
    const proto = tls === null ? 'http' : 'https'
    this.state = {
      runtime,
      telemetry: this.live,
      logger: this.logger,
      accessLog: createAccessLog(this.logger),
      proto,
      ws: createWebSocketProxy(),
      warnedProxyMisconfig: false,
      proxyCheckedPeer: undefined
    }
    warnConfig(this.logger, runtime)
    const s = runtime.server
    const serverOptions = {
      headersTimeout: s.headersTimeoutMs,
      requestTimeout: s.requestTimeoutMs,
      keepAliveTimeout: s.keepAliveTimeoutMs,
      // node:http only checks headersTimeout/requestTimeout every connectionsCheckingInterval
      // (30 s by default), so a slowloris client would hold a socket up to 30 s past the timeout.
      connectionsCheckingInterval: Math.max(100, Math.min(1000, Math.floor(s.headersTimeoutMs / 2))),
      maxHeaderSize: s.maxHeaderSize
    }
    // A TLS handshake not finished within headersTimeout (as the process starts: node reads it
    // once) is closed, as nginx's client_header_timeout bounds its handshake. node's default held
    // it 120 s, where the HTTP layer answers a connection that sends no request within
    // headersTimeout with a 408: a client that connected and never sent a ClientHello held its
    // place in server.maxConnections 12 times the default 10 s. (0 is node's 120 s again.)
    const server = tls === null
      ? createHttpServer(serverOptions)
      : createHttpsServer({ ...serverOptions, cert: tls.cert, key: tls.key, handshakeTimeout: s.headersTimeoutMs })
    // req.socket stays set after the response detaches from it, so the close finds its connection
    const handleRequest = createRequestHandler(this.state, (req, res) => {
      const open = this.openResponses.get(req.socket)
      if (open === undefined) return
      responseClosed(open, res)
      serveNext(open, res, handleRequest)
    })
    applyServerSettings(server, runtime)
    const onRequest = (req: IncomingMessage, res: ServerResponse): void => {
      if (closedByAnswer(req.socket)) return
      // While draining, each connection's last response says Connection: close, so keep-alive
      // clients reconnect elsewhere instead of sending their next request to a gateway about to go.
      const open = this.openResponsesOf(req.socket)
      if (this.shuttingDown) closeAfterLast(open, res)
      open.responses.push(res)
      // a body's rest is read before a closing answer closes the connection (lingering close)
      if (hasRequestBody(req.headers)) lingerAfterAnswer(req, res)
      if (servePipelined(open, req, res, handleRequest)) return
      warnPipelineOverflow({ ip: req.socket.remoteAddress })
      req.socket.destroy()
    }
    const warnPipelineOverflow = warnSparingly(this.logger, `connection closed: a client wrote more than ${MAX_PIPELINED_WAITING} requests ahead of the one being served (this line comes at most every 10 s)`)
    server.on('request', onRequest)
    // Expect: 100-continue: the 100 goes out when the body is read (src/proxy/expect-continue.ts)
    server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => {
      holdContinue(req, res)
      onRequest(req, res)
    })
    // An expectation other than 100-continue is ignored and the request served, as nginx does
    // (RFC 9110 §10.1.1: a server MAY answer 417); node's own 417 had no JSON and no log line.
    // Expect is never forwarded.
    server.on('checkExpectation', onRequest)
    const handleUpgrade = createUpgradeHandler(this.state)
    server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
      if (closedByAnswer(socket)) return
      // node took its own 'error' listener off this socket: a reset while the request waits for
      // the answers before it must not end the process
      const onError = (): void => { socket.destroy() }
      socket.on('error', onError)
      // h2c and every other offer but WebSocket: served over HTTP/1.1 (src/proxy/upgrade-offer.ts)
      const proceed = offersWebSocket(req)
        ? () => { handleUpgrade(req, socket, head) }
        : () => {
            // node's own listener comes back with the connection (one per decline, not one more each)
            socket.off('error', onError)
            if (declineUpgrade(server, req, socket, head)) return
            socket.on('error', onError)
            this.answerUnrouted(socket, 431, 'GW_ERR_HEADERS_TOO_LARGE', (requestId) => { writeError(socket, 'GW_ERR_HEADERS_TOO_LARGE', requestId) })
          }
      // Node emits 'upgrade' while requests pipelined before it on the connection still await their
      // answers. Admitted at once, its 101 went out first and those answers were written into the
      // tunnel (RFC 9112 §9.3.2: answers go in order); a declined offer's answer would overtake
      // them. It waits for them, as a malformed request's error does; if the last of them closes
      // the connection, the upgrade finds it closed.
      const open = this.openResponses.get(socket)
      if (open === undefined || open.responses.length === 0) {
        proceed()
        return
      }
      // (node arms its keep-alive timer as that last answer finishes; http-proxy clears a socket's
      // timeout as it starts the upgrade, and the tunnel sets websocketIdleTimeout once open)
      open.then = proceed
    })
    server.on('connection', (socket: Socket) => {
      // a declined upgrade hands its connection to the server again (declineUpgrade)
      if (this.sockets.has(socket)) return
      this.sockets.add(socket)
      socket.once('close', () => {
        this.sockets.delete(socket)
        closeUnassigned(this.openResponses.get(socket))
      })
    })
    server.on('clientError', (err: NodeJS.ErrnoException, socket: Socket) => {
      // node's https server hands its TLS errors on here. A handshake not finished in time is no
      // request: answered as one, it got a 400 (written raw, or over TLS when the handshake ended
      // in the 2 s closeSoon gives), an access line and a 4xx in gateway_requests_total each, so
      // a flood of them flooded the log. Closed at once and counted apart.
      if (err.code === 'ERR_TLS_HANDSHAKE_TIMEOUT') {
        this.metrics.tlsHandshakeTimedOut()
        return socket.destroy()
      }
      // node's parser reports its error again at each read that follows: answered, logged and
      // counted once (a bad request behind a slow answer, and its client sending on, was logged
      // once per read). A connection whose answer has gone out (ended) lingers: destroyed at the
      // next read, while its client still sent, the kernel's reset discarded the 400 at the client
      // (lingerAfterAnswer's timer ends it).
      if (answeredClientError.has(socket)) {
        // server.requestTimeout still bounds a connection kept for the answers before a bad request
        if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') socket.destroy()
        return
      }
      if (!socket.writable) return socket.destroy()
      answeredClientError.add(socket)
      // Destroying the socket of a client that left closes the request in flight, which is then
      // logged as a client abort and gives back what it held (concurrency leases, buffer budget).
      if (clientLeft(err)) return socket.destroy()
      const code = err.code ?? ''
      const [status, error] = parserErrorAnswer(err, socket)
      // A request timeout while a request's body is still arriving: that body is what is late (a
      // byte now and then keeps clientBodyTimeout from firing), and its answer would wait for it
      // for ever. Ending the connection closes it (logged as a client abort, giving back what it
      // held); answers still owed to requests pipelined before it are lost, the price of a
      // connection that outlived server.requestTimeout. Each of those requests is logged and
      // counted once, as the client_timeout it is, not as a client abort beside a 408 never sent.
      const open = this.openResponses.get(socket)
      const broken = open?.responses.find(r => !r.req.complete)
      if (open !== undefined && broken !== undefined) {
        if (code === 'ERR_HTTP_REQUEST_TIMEOUT') {
          // An upload waiting for its turn behind a long answer is not read (one request at a
          // time), so it is no late client of its own: the answer in progress goes on, and the
          // upload's body is bounded by clientBodyTimeout once it starts. node reports the
          // connection once for that request (it leaves its list of connections to check).
          if (open.waiting.some(w => w.res === broken)) return
          for (const res of open.responses) cutByGateway.set(res, 'client_timeout')
          socket.destroy()
          return
        }
        // A body that cannot be parsed (a bad chunk size): its request is in flight and waited
        // for the rest of a body that never comes, for clientBodyTimeout (60 s by default, an
        // upstream connection held when streamed). Its answer, unless begun, is a 400 that closes
        // the connection, after the answers owed to the requests before it (nginx answers 400);
        // the forward gives up its upstream call for it. An answer begun (the upstream's) cannot
        // become a 400: the connection is closed once the answers before it went out. Either way
        // the request is logged once, as the bad request it is.
        cutByGateway.set(broken, 'bad_request')
        if (refuseUnparsableBody(broken)) {
          broken.shouldKeepAlive = false
          return
        }
        closeAfterEarlierAnswers(socket, open.responses.filter(r => r !== broken && !r.writableFinished))
        return
      }
      // The rest of a body whose request was answered whole (an upstream that answered early)
      // cannot be parsed: that request is answered and logged. A 400 now would read as the
      // answer to the client's next request.
      if (isDroppingBody(socket)) return socket.destroy()
      this.answerUnrouted(socket, status, code === '' ? 'bad_request' : code, (requestId) => {
        writeParserError(socket, status, error, code, requestId)
      })
    })
    // CONNECT asks for a tunnel to another host (forward proxying), which the gateway does not
    // offer; node closes such a connection without a word when nothing listens for it.
    server.on('connect', (_req: IncomingMessage, socket: Socket) => {
      if (closedByAnswer(socket)) return
      // node took its own 'error' listener off: a reset while answering must not end the process
      socket.on('error', () => { socket.destroy() })
      this.answerUnrouted(socket, 400, 'connect', (requestId) => { writeError(socket, 'GW_ERR_BAD_REQUEST', requestId, NOT_A_FORWARD_PROXY) })
    })
    // after every 'connection' listener above and before the PROXY header's reader wraps them:
    // a connection is counted under the client the header names
    const warnClientDropped = warnSparingly(this.logger, 'connection closed as it arrived: its client holds server.maxConnectionsPerClient connections (gateway_client_connections_dropped_total counts each; this line comes at most every 10 s)')
    capConnectionsPerClient(server, {
      policy: () => this.runtime?.clientConnections ?? null,
      dropped: (peer, client, max) => {
        this.metrics.clientConnectionDropped()
        warnClientDropped({ peer, client, maxConnectionsPerClient: max })
      }
    })
    // after every 'connection' listener above: a PROXY header is read before any of them runs
    // a balancer that sends no header gets every connection closed: said at warn, sparingly
    const warnRefused = warnSparingly(this.logger, 'connection closed: a proxyProtocol peer sent no valid PROXY protocol header (gateway_proxy_protocol_refused_total counts each; this line comes at most every 10 s)')
    this.proxyProtocol = acceptProxyProtocol(server, {
      policy: () => this.runtime?.proxyProtocol ?? null,
      refused: (reason, peer) => {
        this.metrics.proxyProtocolRefused(reason)
        warnRefused({ peer, reason })
      }
    })
    // in front of every listener above, the PROXY header's reader included
    const warnDropped = warnSparingly(this.logger, 'connection closed as it arrived: server.maxConnections client connections are open (gateway_connections_dropped_total counts each; this line comes at most every 10 s)')
    this.connectionCap = capConnections(server, {
      max: () => this.runtime?.server.maxConnections ?? Infinity,
      dropped: (peer) => {
        this.metrics.connectionDropped()
        warnDropped({ peer, maxConnections: this.runtime?.server.maxConnections })
      }
    })
    this.server = server
    this.listenAddress = started.listen
    this.startedConfig = started
    this.port = (await listen(server, this.listenAddress)).port
    // An accept that fails (libuv absorbs EMFILE by its spare descriptor; ENFILE without it, ENOMEM,
    // ENOBUFS come through) is emitted as the listener's 'error': with no listener, it ended the
    // process, and every connection with it. The listener keeps accepting.
    const warnAccept = warnSparingly(this.logger, 'a listener failed to accept a connection and keeps listening (this line comes at most every 10 s)')
    const onAcceptError = (err: NodeJS.ErrnoException): void => { warnAccept({ error: err.message, code: err.code }) }
    server.on('error', onAcceptError)
    const redirectHttp = started.tls?.redirectHttp
    if (redirectHttp !== undefined) {
      const port = this.port
      // the port clients are sent to follows the config in force (a reload may change it)
      const httpsPort = (): number => this.runtime?.config.tls?.redirectHttp?.port ?? port
      const redirect = createHttpServer(serverOptions, createRedirectHandler(httpsPort, () => { this.metrics.httpsRedirected() }))
      // its connections hold descriptors as the listener's do: capped alike, counted apart
      capConnections(redirect, { max: () => this.runtime?.server.maxConnections ?? Infinity, dropped: () => { this.metrics.connectionDropped() } })
      this.redirect = redirect
      this.redirectPort = (await listen(redirect, redirectHttp.listen)).port
      redirect.on('error', onAcceptError)
    }

    const self = this // eslint-disable-line @typescript-eslint/no-this-alias
    const limitsDeps: LimitsApiDeps = {
      runtime: () => this.runtime,
      peek: async (rt, checks) => await this.resources.peekLimits(rt.config, checks),
      reset: async (rt, message) => await this.resources.resetLimits(rt.config, message),
      logger: this.logger
    }
    const source: AdminSource = {
      get runtime () { return self.runtime },
      get shuttingDown () { return self.shuttingDown },
      get lastReload () { return self.lastReload },
      get reloadPending () { return self.reloading !== null || self.pendingReload !== null },
      reloadHistory: this.reloadHistory,
      metrics: this.metrics,
      redisStatus: () => this.redisStatus(),
      limits: createLimitsApi(limitsDeps, json)
    }
    if (this.options.adminListener === false) {
      // a worker: the primary's admin page sums every worker's frames and asks each for /limits
      const stopFrames = sendLiveFrames(() => this.live.takeFrame(), () => healthOf(source), () => this.runtime === null ? null : describeRoutes(this.runtime))
      const stopAdmin = answerAdminRequests(createLimitsOps(limitsDeps))
      this.stopLiveFrames = () => { stopFrames(); stopAdmin() }
      this.logger.info({ listen: `${proto}://${this.listenAddress}`, port: this.port, ...this.redirectField(), generation: runtime.generation, hash: runtime.hash, routes: runtime.routeList.length }, 'gateway started')
      return
    }
    this.feed = new LiveFeed(() => this.live.takeFrame(), () => healthOf(source))
    this.feed.start()
    const adminAddress = adminListen(runtime.config)
    const adminOnLoopback = isLoopback(splitHostPort(adminAddress).host)
    const admin = createAdminServer(source, this.feed, adminOnLoopback, this.logger)
    this.admin = admin
    this.adminPort = (await listen(admin, adminAddress)).port
    admin.on('error', onAcceptError)
    if (!adminOnLoopback) warnOpenAdmin(this.logger, adminAddress, runtime.config)
    this.logger.info({ listen: `${proto}://${this.listenAddress}`, port: this.port, adminPort: this.adminPort, ...this.redirectField(), generation: runtime.generation, hash: runtime.hash, routes: runtime.routeList.length }, 'gateway started')
  }

  /**
   * Re-reads the file. A valid config is compiled aside and swapped in with one assignment:
   * requests in flight finish on the runtime they started with. An invalid one is logged with
   * its located problems and the old config keeps serving, unchanged: nothing shared with it
   * (Redis timeout, body budget, TLS context) is touched before the swap.
   */
  reload (source?: ReloadSource): Promise<ReloadResult> {
    if (source !== undefined) this.nextSource = source
    // A SIGHUP during a reload may follow an edit the running reload did not read: it queues
    // exactly one more reload (further ones coalesce into that one, which takes the newest source).
    if (this.reloading !== null) {
      this.pendingReload ??= this.reloading.then(() => {
        this.pendingReload = null
        return this.reload()
      })
      return this.pendingReload
    }
    this.reloading = this.doReload().then(result => {
      this.lastReload = {
        attempt: (this.lastReload?.attempt ?? 0) + 1,
        ok: result.ok,
        generation: this.generation,
        problems: result.ok ? [] : result.error.split('\n'),
        at: new Date().toISOString(),
        restartNeeded: result.ok ? result.restartNeeded : []
      }
      this.reloadHistory.push(this.lastReload)
      if (this.reloadHistory.length > RELOAD_HISTORY) this.reloadHistory.shift()
      return result
    }).finally(() => { this.reloading = null })
    return this.reloading
  }

  private async doReload (): Promise<ReloadResult> {
    const state = this.state
    if (state === null || this.shuttingDown) return { ok: false, error: 'gateway not running', leaving: true }
    const source = this.nextSource
    this.nextSource = null
    let prepared: Awaited<ReturnType<typeof compileRuntime>>
    try {
      const file = this.options.configFile
      const loaded = source === null || source.text === null ? await loadConfigFile(file, this.options.env) : { ...await loadConfigText(source.text, file, this.options.env), ...(source.files !== undefined ? { files: source.files } : {}) }
      prepared = await compileRuntime(loaded, source?.generation ?? this.generation + 1, this.resources, this.live)
    } catch (err) {
      if (this.shuttingDown) return await this.abandonReload()
      this.metrics.reload('failure')
      const problems = reloadProblems(err)
      this.logger.error({ problems, generation: state.runtime.generation }, 'reload rejected; the running configuration keeps serving')
      // anything the failed compile created but the live runtime does not use is released
      await this.sweep()
      return { ok: false, error: problems.join('\n') }
    }
    if (this.shuttingDown) return await this.abandonReload()
    // The commit: from here on nothing can fail, and the new runtime's settings reach what it
    // shares with the previous one in the same turn of the event loop as the swap.
    const runtime = prepared.runtime
    this.generation = runtime.generation
    if (this.server !== null) applyServerSettings(this.server, runtime)
    const previous = state.runtime
    state.runtime = runtime
    prepared.commit()
    if (adminReadToken(previous.config) !== adminReadToken(runtime.config)) this.feed?.endStreams()
    this.refreshTls(runtime)
    this.metrics.generation.set(runtime.generation)
    this.metrics.reload('success')
    // An operator who lowers log.level to silence a flood expects it at once (the CLI's
    // --log-level and an embedder's own logger win over the file, as at start).
    if (this.options.logLevel === undefined && this.options.logger === undefined) this.logger.level = runtime.config.log.level
    const restartNeeded = this.startedConfig === null ? [] : settingsNeedingRestart(this.startedConfig, runtime.config)
    if (restartNeeded.length > 0) this.logger.warn({ settings: restartNeeded, listen: this.listenAddress }, restartNeededMessage(restartNeeded))
    this.logger.info({ generation: runtime.generation, previous: previous.generation, hash: runtime.hash }, 'configuration reloaded')
    warnConfig(this.logger, runtime)
    // The old runtime's requests may be admitted but not yet dispatched (waiting on Redis, a JWKS,
    // a delay slot): its pools close only once it has no request left.
    this.draining.add(previous)
    this.retired.add(previous)
    void this.whenIdle(previous).then(() => {
      this.draining.delete(previous)
      if (previous.activity.inflight === 0) this.retired.delete(previous)
      return this.sweep()
    })
    return { ok: true, generation: runtime.generation, restartNeeded }
  }

  /**
   * A shutdown began while the file compiled: nothing is swapped in. The drain closes the shared
   * resources once this compile settles; what it opened (a Redis connection, after a drain that
   * had closed them already) is closed here too. Committed, it opened a Redis client nothing
   * closed: the process never exited, and logged "configuration reloaded" after "gateway stopped".
   */
  private async abandonReload (): Promise<ReloadResult> {
    await this.resources.closeAll()
    this.logger.info('reload abandoned: the gateway is shutting down')
    return { ok: false, error: 'the gateway is shutting down', leaving: true }
  }

  // A renewed certificate is picked up by SIGHUP without a restart. The files were read and
  // checked to form a pair when the runtime compiled, so this cannot fail after the swap.
  private refreshTls (runtime: Runtime): void {
    const tls = runtime.tls
    if (tls === null || this.server === null || !('setSecureContext' in this.server)) return
    this.server.setSecureContext({ cert: tls.cert, key: tls.key })
  }

  /** Closes what neither the live runtime nor a draining one uses. */
  private async sweep (): Promise<void> {
    const live = this.state?.runtime
    if (live === undefined || this.shuttingDown) return
    const pools = [...live.pools.values()]
    for (const rt of this.draining) pools.push(...rt.pools.values())
    await this.resources.sweep(live.config, pools, [...this.draining].map(rt => rt.config))
  }

  /**
   * Requests in flight, from the one counter each runtime keeps (src/request-record.ts): HTTP
   * requests until their response closes, upgrades until their handshake is decided. The
   * shutdown drain waits on it, and a replaced runtime's pools close once its own count is 0.
   */
  private inflightRequests (): number {
    let n = this.state?.runtime.activity.inflight ?? 0
    for (const rt of this.retired) {
      if (rt.activity.inflight === 0) this.retired.delete(rt)
      else n += rt.activity.inflight
    }
    return n
  }

  private async whenIdle (rt: Runtime): Promise<void> {
    // bounded by the longest a request may take (server.requestTimeout) plus a margin
    const deadline = Date.now() + rt.server.requestTimeoutMs + 1000
    while (rt.activity.inflight > 0 && Date.now() < deadline && !this.shuttingDown) {
      await new Promise(resolve => setTimeout(resolve, 50).unref())
    }
  }

  /** Stops accepting, lets in-flight requests finish (up to server.shutdownTimeout), then closes everything. */
  /**
   * Drains and stops. A second call (SIGINT then SIGTERM, or a signal sent to the whole process
   * group as well as relayed by the workers primary) waits for the same drain instead of
   * returning at once, so a caller never exits in the middle of it.
   */
  close (): Promise<void> {
    this.closing ??= this.drainAndStop()
    return this.closing
  }

  private closing: Promise<void> | null = null

  private async drainAndStop (): Promise<void> {
    this.shuttingDown = true
    // An upgrade on a connection opened before the drain is refused, as the README promises.
    this.state?.ws.drain()
    const timeoutMs = this.runtime?.server.shutdownTimeoutMs ?? 10_000
    const server = this.server
    // The redirect listener stops accepting with the TLS one: a client it sent to HTTPS now would
    // find that listener closed (it kept redirecting for the whole drain).
    const redirect = this.redirect
    const redirectClosed = redirect === null ? null : new Promise<void>(resolve => { redirect.close(() => resolve()) })
    if (server !== null) {
      for (const c of this.connections) {
        const last = c.responses[c.responses.length - 1]
        if (last !== undefined) closeAfterLast(c, last)
      }
      const closed = new Promise<void>(resolve => server.close(() => resolve()))
      server.closeIdleConnections()
      // a connection still owing its PROXY header has sent no request: closed as an idle one is
      this.proxyProtocol?.closeWaiting()
      // The drain waits for HTTP requests only. server.close() alone would also wait for every open
      // WebSocket (an upgraded socket still counts as a connection), i.e. always the whole budget.
      let drained: () => void = () => {}
      const requestsDone = new Promise<void>(resolve => { drained = resolve })
      // keep-alive connections that finish their request become idle: close them as they do
      const idle = setInterval(() => {
        server.closeIdleConnections()
        redirect?.closeIdleConnections()
        if (this.inflightRequests() === 0) drained()
      }, 50)
      const deadline = new Promise<void>(resolve => setTimeout(resolve, timeoutMs).unref())
      await Promise.race([closed, requestsDone, deadline])
      clearInterval(idle)
      // Requests still waiting for an upstream connection reached no upstream: they are answered
      // 503 shutting_down (what the README promises) before their connections are cut, not reset.
      let refused = 0
      for (const rt of new Set([this.runtime, ...this.draining, ...this.retired])) {
        if (rt !== null) for (const pool of rt.pools.values()) refused += pool.refuseWaiting()
      }
      if (refused > 0) await new Promise(resolve => setTimeout(resolve, 50))
      // What is still running now is cut by the gateway: logged as shutting_down, not as 499.
      for (const c of this.connections) for (const res of c.responses) cutByGateway.set(res, 'shutting_down')
      // Tunnels first: a handshake still waiting for its upstream is answered 503, which a socket
      // already destroyed below could not carry.
      this.state?.ws.close()
      server.closeAllConnections()
      // A destroyed socket emits 'close' a loop turn later, and that close writes a WebSocket's
      // "websocket closed" line and takes it off gateway_websockets_open. A worker exits as soon
      // as it leaves its primary (node's cluster ends it at the disconnect): every tunnel open at
      // the shutdown lost its line. Waited for, briefly: the listeners run before ours.
      const closing = [...this.sockets].map(s => new Promise<void>(resolve => s.once('close', () => resolve())))
      for (const s of this.sockets) s.destroy()
      await waitAtMost(Promise.all(closing), SOCKETS_CLOSE_MS)
    } else {
      this.state?.ws.close()
    }
    this.feed?.stop()
    this.stopLiveFrames?.()
    if (this.reloading !== null) await waitAtMost(this.reloading.then(() => {}, () => {}), RELOAD_SETTLE_MS)
    await this.resources.closeAll()
    if (this.admin !== null) {
      const admin = this.admin
      await new Promise<void>(resolve => { admin.close(() => resolve()); admin.closeAllConnections() })
    }
    if (redirect !== null) {
      redirect.closeAllConnections()
      await redirectClosed
    }
    this.logger.info('gateway stopped')
    // wait for the log to reach stdout, but a blocked stdout must not hold the exit forever
    await new Promise<void>(resolve => {
      const giveUp = setTimeout(resolve, LOG_DRAIN_MS)
      this.logger.flush(() => { clearTimeout(giveUp); resolve() })
    })
  }

  /** The redirect listener's address for the 'gateway started' line; none without one. */
  private redirectField (): { redirectHttp?: string } {
    const listen = this.startedConfig?.tls?.redirectHttp?.listen
    return listen === undefined ? {} : { redirectHttp: `http://${listen.slice(0, listen.lastIndexOf(':'))}:${this.redirectPort}` }
  }

  /** The effective config, secrets redacted (also served on /config). */
  redactedConfig (): unknown {
    return this.runtime === null ? null : redactConfig(this.runtime.config)
  }
}
