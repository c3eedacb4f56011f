// The admin listener's shield: a connection cap of its own and the public listener's timeouts.
// Built with node's defaults, it took any number of connections (each a file descriptor, taken
// from the half of the open-file limit server.maxConnections leaves for upstream and Redis
// connections) and kept one that sent nothing for 60 to 90 s (node's headersTimeout, checked
// every 30 s) whatever server.headersTimeout said. Used by a single process's admin listener
// (createAdminServer) and by the workers primary's.
import { createServer, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http'
import { randomUUID } from 'node:crypto'
import type { Socket } from 'node:net'
import { capConnections } from '../proxy/connection-cap.js'
import { clientLeft, parserErrorAnswer, writeParserError } from '../parser-errors.js'
import { serverSettings, type ServerSettings } from '../runtime.js'
import type { ResolvedConfig } from '../config/defaults.js'

/**
 * The most connections an admin listener holds at once. An admin API needs few: a Prometheus
 * scrape or two, a load balancer's or orchestrator's probes, `gateway reload` and `gateway limits`,
 * a few tabs of the admin page (the live feed serves at most 16 streams).
 */
export const ADMIN_MAX_CONNECTIONS = 64
/** The fewest it holds whatever server.maxConnections: the feed's 16 streams and room beside them. */
export const ADMIN_MIN_CONNECTIONS = 32

/**
 * The admin listener's cap for a public cap of `maxConnections`: 64, or a quarter of the public cap
 * where that is less (never under 32). Under the default public cap, half the open-file limit, the
 * admin listener so holds at most an eighth of the files: a quarter of the half kept for upstream
 * and Redis connections (32 of 256 files), where a fixed 64 took half of it.
 */
export function adminMaxConnections (maxConnections: number): number {
  return Math.min(ADMIN_MAX_CONNECTIONS, Math.max(ADMIN_MIN_CONNECTIONS, Math.floor(maxConnections / 4)))
}

/** What the shield reads of the config in force. */
export type AdminServerSettings = Pick<ServerSettings, 'headersTimeoutMs' | 'requestTimeoutMs' | 'keepAliveTimeoutMs' | 'maxConnections'>

export interface AdminShieldHooks {
  /** The settings in force, read per connection (a reload applies from the next one); null: none loaded yet. */
  readonly settings: () => AdminServerSettings | null
  /** Where a connection closed as it arrived is warned of (at most every 10 s); absent: not warned of. */
  readonly logger?: { warn: (fields: object, msg: string) => void } | undefined
}

/** A warning about connections closed as they came comes at most this often (as the public listener's). */
const WARN_EVERY_MS = 10_000

/**
 * node:http only checks headersTimeout and requestTimeout every connectionsCheckingInterval (30 s
 * by default): the public listener's interval (src/server.ts), read once as the listener is made.
 */
function checkingInterval (headersTimeoutMs: number): number {
  return Math.max(100, Math.min(1000, Math.floor(headersTimeoutMs / 2)))
}

/**
 * The settings node:http reads from the server as it goes: headersTimeout and requestTimeout at
 * each check of every connection, keepAliveTimeout as a response ends. requestTimeout bounds the
 * receiving of a request, not its answer: the page's `/events` stream, a GET received whole,
 * runs past it.
 */
function applyTimeouts (server: Server, s: AdminServerSettings): void {
  server.headersTimeout = s.headersTimeoutMs
  server.requestTimeout = s.requestTimeoutMs
  server.keepAliveTimeout = s.keepAliveTimeoutMs
}

/**
 * An admin listener answering with `handle`: its connections capped (adminMaxConnections; one
 * beyond it is closed as it arrives, unanswered, as the public listener's are) and timed as the
 * public listener's are (server.headersTimeout, requestTimeout, keepAliveTimeout).
 */
export function createShieldedAdminServer (handle: RequestListener<typeof IncomingMessage, typeof ServerResponse>, hooks: AdminShieldHooks): Server {
  const initial = hooks.settings()
  const server = initial === null
    ? createServer({ connectionsCheckingInterval: 1000 }, handle)
    : createServer({ headersTimeout: initial.headersTimeoutMs, requestTimeout: initial.requestTimeoutMs, keepAliveTimeout: initial.keepAliveTimeoutMs, connectionsCheckingInterval: checkingInterval(initial.headersTimeoutMs) }, handle)
  // before node's own listener: a connection it is handed finds the timeouts of the config in force
  server.prependListener('connection', () => {
    const s = hooks.settings()
    if (s !== null) applyTimeouts(server, s)
  })
  server.on('clientError', answerClientError)
  let warnedAt = -Infinity
  capConnections(server, {
    max: () => {
      const s = hooks.settings()
      return s === null ? ADMIN_MAX_CONNECTIONS : adminMaxConnections(s.maxConnections)
    },
    dropped: (peer) => {
      const now = Date.now()
      if (hooks.logger === undefined || now - warnedAt < WARN_EVERY_MS) return
      warnedAt = now
      const s = hooks.settings()
      hooks.logger.warn({ peer, adminMaxConnections: s === null ? ADMIN_MAX_CONNECTIONS : adminMaxConnections(s.maxConnections) }, 'admin connection closed as it arrived: the admin listener holds its most connections (this line comes at most every 10 s)')
    }
  })
  return server
}

/**
 * A request node:http could not parse (a query longer than the 16 KiB a head may take, a bad
 * head, one not received in time) answered as the public listener answers it: JSON with its code,
 * where node wrote a bare 431 or 400. Written once: node reports the error again at each read
 * that follows, when the connection is already closing.
 */
function answerClientError (err: NodeJS.ErrnoException, socket: Socket): void {
  if (!socket.writable || clientLeft(err)) {
    socket.destroy()
    return
  }
  const [status, error] = parserErrorAnswer(err, socket)
  writeParserError(socket, status, error, err.code ?? '', randomUUID())
}

/** The server settings of `config`, computed once per config (the workers primary has no runtime). */
const settingsOfConfig = new WeakMap<ResolvedConfig, ServerSettings>()
export function configServerSettings (config: ResolvedConfig): ServerSettings {
  let s = settingsOfConfig.get(config)
  if (s === undefined) {
    s = serverSettings(config)
    settingsOfConfig.set(config, s)
  }
  return s
}
