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
