// pino JSON logs. Secrets never reach a log line: credentials are redacted by path, and the
// config is logged only in its redacted form (see admin/redact.ts).
import cluster from 'node:cluster'
import { fstatSync } from 'node:fs'
import { pino, type Logger as PinoLogger, type DestinationStream } from 'pino'
import { LogSink, type LogSinkOptions } from './log-sink.js'

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

const liveSinks = new Set<WeakRef<LogSink>>()
let exitHookInstalled = false

/**
 * stdout (or `fd`), buffered and bounded (src/log-sink.ts): one write per batch instead of one
 * per line through the thread pool, flushed every LOG_FLUSH_MS, at drain (Gateway.stop) and
 * synchronously at exit, so no line of a finished request is lost on SIGTERM.
 */
export function createLogDestination (fd = 1, options: Omit<LogSinkOptions, 'fd'> = {}): LogSink {
  if (fd === 1) nonBlockingStdout()
  // a worker shares stdout with the primary and the other workers
  const sink = new LogSink({ sharedFd: cluster.isWorker, ...options, fd })
  for (const ref of liveSinks) if (ref.deref() === undefined) liveSinks.delete(ref)
  liveSinks.add(new WeakRef(sink))
  if (!exitHookInstalled) {
    exitHookInstalled = true
    process.once('exit', () => { for (const ref of liveSinks) ref.deref()?.flushAtExit() })
  }
  return sink
}

/**
 * A stdout that is a pipe or a socket is inherited blocking (libuv makes a child's stdio so): a
 * write to a stalled reader then held a thread-pool thread for good, the bounded waits of the sink
 * (EAGAIN) never applied, and SIGTERM never ended the process (process.exit neither: libuv joins
 * its threads at exit). Node opens process.stdout on a pipe or socket through libuv, which makes
 * it non-blocking; the flag is on the open file, shared with the other workers. An ESM import of
 * node:process happens to open it as well (its module facade reads every property of process);
 * this does not depend on one. Each fork makes the shared file blocking again until the new worker
 * gets here.
 */
function nonBlockingStdout (): void {
  try {
    const stat = fstatSync(1)
    if (stat.isFIFO() || stat.isSocket()) void process.stdout
  } catch {
    // no fd 1: the sink's writes fail and are counted
  }
}

/** The sink under each logger made by createLogger: access lines are written to it directly. */
const sinkOf = new WeakMap<Logger, LogSink>()

export function createLogger (level: LogLevel = 'info', destination?: DestinationStream): Logger {
  const dest = destination ?? createLogDestination()
  const logger = pino({
    level,
    base: { pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' }
  }, dest)
  if (dest instanceof LogSink) sinkOf.set(logger, dest)
  return logger
}

/** Lines the logger's sink dropped (stdout blocked past its bound); 0 for a logger of the embedder's. */
export function droppedLogLines (logger: Logger): number {
  return sinkOf.get(logger)?.dropped ?? 0
}

/** One access-log line: the fields are a contract (README, access log section). */
export interface AccessRecord {
  readonly requestId: string
  readonly traceId: string | undefined
  readonly ip: string | undefined
  readonly user: string | undefined
  readonly method: string | undefined
  readonly host: string | undefined
  readonly path: string
  readonly route: string
  readonly target: string | undefined
  readonly status: number
  readonly sentStatus: number | undefined
  readonly durationMs: number
  readonly bytesIn: number
  readonly bytesOut: number
  /** The coding a compressed answer went out with. */
  readonly encoding: string | undefined
  readonly error: string | undefined
  /** The first attempt's failure, when the request was sent again and this is a later attempt's answer. */
  readonly retriedAfter: string | undefined
  readonly outcome: string | undefined
  readonly limit: string | undefined
  readonly userAgent: string | undefined
}

export interface AccessLog {
  (record: AccessRecord): void
  /** False while the level is above info: the caller need not build the record at all. */
  readonly enabled: () => boolean
}

const INFO = 30

/**
 * The access line of every request. On a logger made by createLogger it is serialized here and
 * handed to the sink: the same JSON pino writes (level, time, pid, the fields in this order,
 * msg; undefined fields left out), at a fraction of pino's cost per line (issue 13: pino's
 * generic serializer and redaction were most of the 8-12 µs a line cost). Access records carry
 * no credential (no headers; the path went through the query redactor), so redaction has
 * nothing to do on them. An embedder's own logger gets the record through `info` as before.
 */
export function createAccessLog (logger: Logger): AccessLog {
  const sink = sinkOf.get(logger)
  if (sink === undefined) {
    const enabled = (): boolean => logger.isLevelEnabled('info')
    return Object.assign((record: AccessRecord) => { if (enabled()) logger.info(record, 'request') }, { enabled })
  }
  const pidPart = `","pid":${process.pid}`
  const isoTime = createIsoClock()
  const write = (record: AccessRecord): void => {
    if (logger.levelVal > INFO) return
    let line = '{"level":30,"time":"' + isoTime(Date.now()) + pidPart + ',"requestId":' + jsonString(record.requestId)
    if (record.traceId !== undefined) line += ',"traceId":' + jsonString(record.traceId)
    if (record.ip !== undefined) line += ',"ip":' + jsonString(record.ip)
    if (record.user !== undefined) line += ',"user":' + jsonString(record.user)
    if (record.method !== undefined) line += ',"method":' + jsonString(record.method)
    if (record.host !== undefined) line += ',"host":' + jsonString(record.host)
    line += ',"path":' + jsonString(record.path) + ',"route":' + jsonString(record.route)
    if (record.target !== undefined) line += ',"target":' + jsonString(record.target)
    line += ',"status":' + numberJson(record.status)
    if (record.sentStatus !== undefined) line += ',"sentStatus":' + numberJson(record.sentStatus)
    line += ',"durationMs":' + millisJson(record.durationMs) + ',"bytesIn":' + numberJson(record.bytesIn) + ',"bytesOut":' + numberJson(record.bytesOut)
    if (record.encoding !== undefined) line += ',"encoding":' + jsonString(record.encoding)
    if (record.error !== undefined) line += ',"error":' + jsonString(record.error)
    if (record.retriedAfter !== undefined) line += ',"retriedAfter":' + jsonString(record.retriedAfter)
    if (record.outcome !== undefined) line += ',"outcome":' + jsonString(record.outcome)
    if (record.limit !== undefined) line += ',"limit":' + jsonString(record.limit)
    if (record.userAgent !== undefined) line += ',"userAgent":' + jsonString(record.userAgent)
    sink.write(line + ',"msg":"request"}\n')
  }
  return Object.assign(write, { enabled: () => logger.levelVal <= INFO })
}

/**
 * `new Date(ms).toISOString()` for the access line's time, formatted by V8 with snprintf (about 5k
 * instructions a call): kept per second, with the milliseconds appended per line. Times from
 * 1970 to 9999 (toISOString's format changes outside them).
 */
export function createIsoClock (): (ms: number) => string {
  let lastMs = -1
  let lastIso = ''
  let second = -1
  let secondPrefix = ''
  return (ms) => {
    if (ms === lastMs) return lastIso
    lastMs = ms
    const s = Math.floor(ms / 1000)
    if (s !== second) {
      second = s
      // "2026-11-27T04:20:31." of "2026-11-27T04:20:31.000Z"
      secondPrefix = new Date(s * 1000).toISOString().slice(0, 20)
    }
    const milli = ms - s * 1000
    lastIso = secondPrefix + (milli < 10 ? '00' : milli < 100 ? '0' : '') + String(milli) + 'Z'
    return lastIso
  }
}

/**
 * What JSON.stringify must escape in a string (quote, backslash, control characters) and what it
 * rewrites (surrogates, lone ones become escapes). A string free of them is quoted as it is:
 * JSON.stringify is a call into V8's runtime, about twice the cost of this test, and most of an
 * access line's strings (ids, addresses, methods, routes, targets) never need it.
 */
// eslint-disable-next-line no-control-regex -- control characters are what it looks for
const JSON_ESCAPED = /["\\\u0000-\u001f\ud800-\udfff]/

function jsonString (s: string): string {
  return JSON_ESCAPED.test(s) ? JSON.stringify(s) : '"' + s + '"'
}

// JSON has no NaN or Infinity: pino writes null for them, so does this
function numberJson (n: number): string {
  return Number.isFinite(n) ? String(n) : 'null'
}

/**
 * `numberJson(ms)` for a duration of whole microseconds (the record's durationMs), printed from
 * integers: String() of a double searches for its shortest decimal, a frame of its own in the
 * access line's profile. Other numbers go to numberJson.
 */
export function millisJson (ms: number): string {
  const us = Math.round(ms * 1000)
  // the double must be exactly us / 1000 for both to print the same digits
  if (!Number.isSafeInteger(us) || us < 0 || us / 1000 !== ms) return numberJson(ms)
  const frac = us % 1000
  const whole = String((us - frac) / 1000)
  if (frac === 0) return whole
  if (frac % 100 === 0) return whole + '.' + String(frac / 100)
  if (frac % 10 === 0) return whole + (frac < 100 ? '.0' : '.') + String(frac / 10)
  return whole + (frac < 10 ? '.00' : frac < 100 ? '.0' : '.') + String(frac)
}

/**
 * An absolute-form target's userinfo (`GET http://user:password@host/ HTTP/1.1`): such a request is
 * refused before routing, and the access line and the span's url.path showed the target as sent,
 * the password in clear. It is shown as `[redacted]`, as /config shows a URL's.
 */
const TARGET_USERINFO = /^([a-z][a-z0-9+.-]*:\/\/)[^/?#]*@/i

export function hideTargetUserinfo (target: string): string {
  // an origin-form target (`/...`), nearly every request, has no authority to look at
  return target.charCodeAt(0) === 47 ? target : target.replace(TARGET_USERINFO, '$1[redacted]@')
}

/** Query parameters whose values never reach a log line unless `log.redactQuery` says otherwise. */
// Credentials clients put in a query: OAuth 2.0's access_token (RFC 6750 §2.3 lets a client send it
// so) and client_secret, API keys however spelt, the signatures of presigned URLs (Azure SAS `sig`,
// AWS SigV4 and Google Cloud Storage `X-*-Signature`, `X-*-Credential`).
export const DEFAULT_REDACT_QUERY: readonly string[] = Object.freeze([
  'token', 'key', 'api_key', 'password', 'secret', 'signature', 'access_token', 'client_secret', 'apikey', 'sig',
  'x-amz-signature', 'x-amz-credential', 'x-amz-security-token', 'x-goog-signature', 'x-goog-credential'
])

/**
 * Compiled at config load: the function the access log passes every path through. A parameter is
 * redacted under the name its upstream reads: compared case-insensitively after percent-decoding
 * (`?API%5Fkey=` is `api_key`), without a `[...]` suffix (`token[]`, `api_key[0]`: qs, PHP, Rails)
 * and trimmed (`token%20`), with `;` separating parameters as `&` does (frameworks that accept it).
 * The value becomes `[redacted]`, everything else stays byte for byte. A path without `?` is
 * returned as is. The query is walked with indexOf, not split: it runs per logged request (issue
 * 13), and a query without a listed name costs its parameter names as strings, no array, no copy.
 */
export function compileQueryRedactor (names: readonly string[] = DEFAULT_REDACT_QUERY): (path: string) => string {
  if (names.length === 0) return path => path
  const redacted = new Set(names.map(n => n.toLowerCase()))
  const listed = (rawName: string): boolean => {
    let name = rawName
    // decoding is the slow part: names with an escape need it
    if (rawName.includes('%') || rawName.includes('+')) {
      try { name = decodeURIComponent(rawName.replace(/\+/g, ' ')) } catch { /* malformed escape: compare as written */ }
    }
    const bracket = name.indexOf('[')
    if (bracket !== -1) name = name.slice(0, bracket)
    return redacted.has(name.trim().toLowerCase())
  }
  return path => {
    const q = path.indexOf('?')
    if (q === -1) return path
    // `out` is the redacted path up to `copied`, built from the first listed name on
    let out = ''
    let copied = 0
    let amp = path.indexOf('&', q)
    let semi = path.indexOf(';', q)
    let eq = path.indexOf('=', q)
    for (let start = q + 1; start <= path.length;) {
      if (amp !== -1 && amp < start) amp = path.indexOf('&', start)
      if (semi !== -1 && semi < start) semi = path.indexOf(';', start)
      if (eq !== -1 && eq < start) eq = path.indexOf('=', start)
      const end = amp === -1 ? (semi === -1 ? path.length : semi) : (semi === -1 || amp < semi ? amp : semi)
      const nameEnd = eq !== -1 && eq < end ? eq : end
      if (nameEnd > start && listed(path.slice(start, nameEnd))) {
        out += path.slice(copied, nameEnd) + '=[redacted]'
        copied = end
      }
      start = end + 1
    }
    return copied === 0 ? path : out + path.slice(copied)
  }
}
