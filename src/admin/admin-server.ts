// The admin listener, on its own address: /healthz /readyz /metrics /config, and the admin page
// (/, /events, /routes: src/admin/dashboard.ts).
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { GatewayMetrics } from './metrics.js'
import { redactConfig } from './redact.js'
import { DASHBOARD_PATHS, PAGE_FILE_PATHS, handleDashboard } from './dashboard.js'
import { adminError, bearerToken, methodNotAllowed, tokenMatches } from './limits-api.js'
import type { LiveFeed } from './live-feed.js'
import type { Runtime } from '../runtime.js'
import type { RedisStatus } from '../runtime-resources.js'
import { ERRORS, errorBody } from '../errors.js'
import { normalizeHost } from '../router/route-table.js'
import { adminReadToken, adminToken, type ResolvedConfig } from '../config/defaults.js'
import { createShieldedAdminServer } from './admin-shield.js'

export interface AdminSource {
  readonly runtime: Runtime | null
  readonly shuttingDown: boolean
  /** Absent on listeners that do not reload themselves (the workers primary). */
  readonly lastReload?: unknown
  /**
   * A reload running or queued: `lastReload` may then be an earlier reload's verdict, not the
   * one of a SIGHUP just sent (`gateway reload` waits until this is false).
   */
  readonly reloadPending?: boolean
  /** The last reloads, newest last (bounded), for the admin page. */
  readonly reloadHistory?: readonly unknown[]
  readonly metrics: GatewayMetrics
  redisStatus (): RedisStatus
  /** /limits and /consumers/NAME (src/admin/limits-api.ts); absent on the workers primary. */
  readonly limits?: (req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) => boolean
}

/** What /readyz answers: readiness, the Redis state and passive health per upstream target. */
export function readiness (source: AdminSource): { ready: boolean, body: Record<string, unknown> } {
  const rt = source.runtime
  const redis = source.redisStatus()
  const ready = rt !== null && !source.shuttingDown
  const redisUp = redis.connected && redis.breaker === 'closed'
  const degraded = redis.configured && !redisUp
  return {
    ready,
    body: {
      status: !ready ? (source.shuttingDown ? 'shutting_down' : 'not_ready') : degraded ? 'degraded' : 'ready',
      generation: rt?.generation ?? null,
      redis: redis.configured
        ? { state: redisUp ? 'up' : 'fallback', connected: redis.connected, breaker: redis.breaker, instances: redis.instances, ...(redis.nodes !== undefined && redis.nodes.some(n => n.node !== '*') ? { nodes: redis.nodes } : {}) }
        : { state: 'not_configured' },
      // Passive health per target: an ejected target is visible here before anyone reads a log.
      upstreams: rt === null ? {} : Object.fromEntries([...rt.pools].map(([name, pool]) => [name, pool.health()]))
    }
  }
}

/** The admin page's health panel: readiness plus the running config and its reload history. */
export function healthOf (source: AdminSource): Record<string, unknown> {
  const rt = source.runtime
  return { ...readiness(source).body, hash: rt?.hash ?? null, loadedAt: rt?.loadedAt ?? null, reloads: source.reloadHistory ?? [] }
}

/** Admin answers: pretty JSON, never cached. Also used by the workers primary's admin listener. */
export function json (res: import('node:http').ServerResponse, status: number, body: unknown, headers?: Readonly<Record<string, string>>): void {
  const text = JSON.stringify(body, null, 2)
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(text), ...headers })
  res.end(text)
}

/** The read-only paths of every admin listener, the page's among them. */
const READ_ONLY_PATHS: ReadonlySet<string> = new Set(['/healthz', '/readyz', '/metrics', '/config', ...DASHBOARD_PATHS])

/**
 * A method other than GET and HEAD: on a read-only path a 405 with the `Allow` header RFC 9110
 * §15.5.6 asks for; on a path the listener does not serve a 404, as for GET. True when answered.
 */
export function refusedAdminMethod (req: IncomingMessage, res: ServerResponse, path: string): boolean {
  if (req.method === 'GET' || req.method === 'HEAD') return false
  const answer = READ_ONLY_PATHS.has(path) ? methodNotAllowed(path, 'GET, HEAD') : adminError('GW_ERR_NOT_FOUND', ADMIN_PATHS)
  json(res, answer.status, answer.body, answer.headers)
  return true
}

/**
 * Answered without the read token: health checks (a load balancer's, Docker's or Kubernetes's
 * probe carries no token) and the page's own files, which hold no data and ask for the token.
 */
const OPEN_READ_PATHS: ReadonlySet<string> = new Set(['/healthz', '/readyz', ...PAGE_FILE_PATHS])

/**
 * `admin.reads: token` (`readToken` set): a request for another path without that Bearer token
 * gets 401 with `WWW-Authenticate: Bearer` (RFC 6750 §3), whatever its method. True when answered.
 */
export function refusedRead (req: IncomingMessage, res: ServerResponse, path: string, readToken: string | null, logger?: { warn: (fields: object, msg: string) => void }): boolean {
  if (readToken === null || OPEN_READ_PATHS.has(path)) return false
  const given = bearerToken(req)
  if (given !== null && tokenMatches(given, readToken)) return false
  // A write (DELETE /limits) refused here is logged as the limits API logs the ones it refuses:
  // answered before it, token guessing went unlogged where reads are guarded, and was logged
  // where they are open. A read refused (a scraper without its token) is not: every scrape would be.
  if (req.method !== 'GET' && req.method !== 'HEAD') logger?.warn({ remote: req.socket.remoteAddress, path: req.url }, 'admin request refused: missing or wrong token')
  json(res, ERRORS.GW_ERR_ADMIN_UNAUTHORIZED.status, errorBody('GW_ERR_ADMIN_UNAUTHORIZED', 'admin.reads is token: this endpoint needs Authorization: Bearer <admin.token> (/healthz, /readyz and the page are open)'), { 'www-authenticate': 'Bearer realm="gateway admin"' })
  return true
}

export const ADMIN_PATHS = 'admin endpoints: / (page) /events /routes /healthz /readyz /metrics /config /limits /consumers/NAME'

/**
 * An admin listener's request handler that never throws: a request target that does not parse
 * (`GET //[`, `/consumers/%zz`) is a 400, anything else a 500, and the process (every worker's
 * traffic with it) goes on. Uncaught, a throw in a request listener ends the process.
 */
export function answeringSafely (handle: (req: IncomingMessage, res: ServerResponse) => void): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    try {
      handle(req, res)
    } catch (err) {
      if (res.headersSent) {
        res.destroy()
        return
      }
      const message = err instanceof Error ? err.message : String(err)
      if (err instanceof URIError || (err as { code?: unknown }).code === 'ERR_INVALID_URL') json(res, 400, errorBody('GW_ERR_BAD_REQUEST', `the request target does not parse: ${message}`))
      else json(res, ERRORS.GW_ERR_ADMIN_FAILED.status, errorBody('GW_ERR_ADMIN_FAILED', message))
    }
  }
}

export function isLoopback (host: string): boolean {
  return host === 'localhost' || host === '::1' || /^(::ffff:)?127\.\d+\.\d+\.\d+$/.test(host)
}

/**
 * The warning for an admin listener others can reach with its reads open: /events carries client
 * addresses and users. It named the token alone, so an operator who set one read it as protecting
 * the rest. None with `admin.reads: token`.
 */
export function warnOpenAdmin (logger: { warn: (fields: object, msg: string) => void }, adminAddress: string, config: ResolvedConfig): void {
  if (adminReadToken(config) !== null) return
  logger.warn({ admin: adminAddress, tokenSet: adminToken(config) !== null }, 'the admin listener binds a non-loopback address: anyone who can reach it reads /config, /metrics, /events (client addresses and users), /limits and /consumers (admin.token guards DELETE /limits alone): set admin.reads: token, or bind it to loopback or a network only operators reach')
}
/**
 * An admin listener bound to loopback answers loopback Host names only. A web page the operator
 * opens could otherwise point its own name at 127.0.0.1 (DNS rebinding) and read /config, /metrics
 * and the live feed's client IPs and users from the operator's browser: the Host it sends is its
 * own name. A listener on another address is reached by name on purpose, and has a token.
 */
export function misdirectedAdminRequest (req: IncomingMessage, res: ServerResponse, boundToLoopback: boolean): boolean {
  // the configured bind address, not the connection's: a listener on 0.0.0.0 reached over
  // loopback by the machine's own name (127.0.1.1 on Debian) is reached by name on purpose
  if (!boundToLoopback) return false
  const host = req.headers.host
  if (host === undefined) return false
  // the router's own Host parsing (port cut, lower case, trailing dot); IPv6 keeps its brackets
  const name = normalizeHost(host)
  if (isLoopback(name.startsWith('[') ? name.slice(1, -1) : name)) return false
  json(res, 421, errorBody('GW_ERR_BAD_REQUEST', 'this admin listener is bound to loopback and answers Host localhost, 127.0.0.1 or [::1] only'))
  return true
}

/**
 * The admin listener of a single process: capped and timed as src/admin/admin-shield.ts says, with
 * the config in force. `logger`: where a connection closed as it arrived over the cap is warned of.
 */
export function createAdminServer (source: AdminSource, live: LiveFeed | null = null, boundToLoopback = true, logger?: { warn: (fields: object, msg: string) => void }): Server {
  return createShieldedAdminServer(answeringSafely((req, res) => {
    if (misdirectedAdminRequest(req, res, boundToLoopback)) return
    const path = (req.url ?? '/').split('?')[0] ?? '/'
    const rt = source.runtime
    if (refusedRead(req, res, path, rt === null ? null : adminReadToken(rt.config), logger)) return
    if (source.limits?.(req, res) === true) return
    if (refusedAdminMethod(req, res, path)) return
    switch (path) {
      case '/healthz':
        return json(res, 200, { status: 'ok' })
      case '/readyz': {
        const { ready, body } = readiness(source)
        return json(res, ready ? 200 : 503, body)
      }
      case '/metrics':
        source.metrics.registry.metrics().then(text => {
          res.writeHead(200, { 'content-type': source.metrics.registry.contentType })
          res.end(text)
        }, (err: unknown) => json(res, ERRORS.GW_ERR_METRICS_FAILED.status, errorBody('GW_ERR_METRICS_FAILED', String(err))))
        return
      case '/config': {
        const rt = source.runtime
        if (rt === null) return json(res, ERRORS.GW_ERR_NOT_READY.status, errorBody('GW_ERR_NOT_READY', 'no configuration loaded yet'))
        // the config in force: the file with every default written in, secrets redacted
        const shown = redactConfig(rt.config) as { server: { maxConnections: number | null } }
        // its one default read from the process (half the open-file limit), as the runtime took it
        shown.server.maxConnections = rt.server.maxConnections
        return json(res, 200, { pid: process.pid, generation: rt.generation, hash: rt.hash, file: rt.file, loadedAt: rt.loadedAt, lastReload: source.lastReload ?? null, reloadPending: source.reloadPending ?? false, config: shown })
      }
      default:
        if (handleDashboard(req, res, path, live, () => source.runtime, json)) return
        return json(res, ERRORS.GW_ERR_NOT_FOUND.status, errorBody('GW_ERR_NOT_FOUND', ADMIN_PATHS))
    }
  }), { settings: () => source.runtime?.server ?? null, logger })
}
