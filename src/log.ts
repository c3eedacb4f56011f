// pino JSON logs. Secrets never reach a log line: credentials are redacted by path, and the
// config is logged only in its redacted form (see admin/redact.ts).
import { pino, type Logger as PinoLogger, type DestinationStream } from 'pino'

export type Logger = PinoLogger
export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent'

/**
 * Exact paths only: pino's redaction with a leading wildcard (`*.authorization`) walks every
 * key of every line and cost about 18 µs per access line, more than the rest of a logged request
 * (issue 13). The shapes that can carry a credential are the ones listed.
 */
const REDACT_PATHS = [
  'headers.authorization', 'headers.cookie', 'headers["x-api-key"]', 'headers["proxy-authorization"]',
  'req.headers.authorization', 'req.headers.cookie', 'req.headers["x-api-key"]',
  'redis.password', 'config.redis.password', 'password', 'secret', 'token'
]

/** Lines are written in batches of at least this many bytes, or on the flush timer. */
export const LOG_BATCH_BYTES = 8 * 1024
/** Longest a finished request's line waits in the buffer. */
export const LOG_FLUSH_MS = 100

/**
 * stdout (or `fd`), buffered: one write per batch instead of one per line through the thread
 * pool, flushed every LOG_FLUSH_MS and, through pino, synchronously at exit (pino registers its
 * own destinations for that), so no line of a finished request is lost on SIGTERM.
 */
export function createLogDestination (fd = 1): DestinationStream {
  const stream = pino.destination({ dest: fd, sync: false, minLength: LOG_BATCH_BYTES, maxWrite: 4 * LOG_BATCH_BYTES, periodicFlush: LOG_FLUSH_MS })
  // Not bounded yet (as before): with sonic-boom's maxLength, or a bound kept in front of it, a
  // destination that had dropped lines while stdout was blocked never wrote again once stdout
  // drained (seen with sonic-boom 4.2.1). Open in issue 13.
  return stream
}

export function createLogger (level: LogLevel = 'info', destination?: DestinationStream): Logger {
  return pino({
    level,
    base: { pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' }
  }, destination ?? createLogDestination())
}

/** Query parameters whose values never reach a log line unless `log.redactQuery` says otherwise. */
export const DEFAULT_REDACT_QUERY: readonly string[] = Object.freeze(['token', 'key', 'api_key', 'password', 'secret', 'signature'])

/**
 * Compiled at config load: the function the access log passes every path through. Names match
 * case-insensitively and after percent-decoding (`?API%5Fkey=` is `api_key`); the value becomes
 * `[redacted]`, everything else stays byte for byte. A path without `?` is returned as is.
 */
export function compileQueryRedactor (names: readonly string[] = DEFAULT_REDACT_QUERY): (path: string) => string {
  if (names.length === 0) return path => path
  const redacted = new Set(names.map(n => n.toLowerCase()))
  return path => {
    const q = path.indexOf('?')
    if (q === -1) return path
    let changed = false
    const parts = path.slice(q + 1).split('&')
    for (let i = 0; i < parts.length; i++) {
      const part = parts[i] as string
      const eq = part.indexOf('=')
      const rawName = eq === -1 ? part : part.slice(0, eq)
      let name = rawName
      // decoding is the slow part: only names with an escape need it
      if (rawName.includes('%') || rawName.includes('+')) {
        try { name = decodeURIComponent(rawName.replace(/\+/g, ' ')) } catch { /* malformed escape: compare as written */ }
      }
      if (redacted.has(name.toLowerCase())) {
        parts[i] = `${rawName}=[redacted]`
        changed = true
      }
    }
    return changed ? `${path.slice(0, q)}?${parts.join('&')}` : path
  }
}
