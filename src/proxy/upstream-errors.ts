import type { ErrorCode } from '../errors.js'
import { isTlsRefusalCode } from '../tls-errors.js'

/** Why a forward failed, as logged and counted. */
export type ForwardErrorKind =
  | 'refused'
  | 'dns'
  | 'tls'
  | 'bad_response'
  | 'reset'
  | 'connect_timeout'
  | 'response_timeout'
  | 'no_healthy'
  | 'queue_full'
  | 'queue_timeout'
  | 'client_abort'
  | 'body_too_large'
  | 'bad_request'
  | 'shutting_down'
  | 'client_timeout'
  | 'send_timeout'
  | 'too_many_tunnels'
  | 'out_of_files'

/** The stable code answered for each kind; null when nobody is left to answer. */
export const KIND_CODES: Readonly<Record<ForwardErrorKind, ErrorCode | null>> = Object.freeze({
  refused: 'GW_ERR_UPSTREAM_UNAVAILABLE',
  dns: 'GW_ERR_UPSTREAM_DNS',
  // the code clients already knew a refused certificate by; its message says what happened (KIND_MESSAGES)
  tls: 'GW_ERR_UPSTREAM_UNAVAILABLE',
  bad_response: 'GW_ERR_UPSTREAM_BAD_RESPONSE',
  reset: 'GW_ERR_UPSTREAM_UNAVAILABLE',
  connect_timeout: 'GW_ERR_UPSTREAM_TIMEOUT',
  response_timeout: 'GW_ERR_UPSTREAM_TIMEOUT',
  no_healthy: 'GW_ERR_NO_HEALTHY_UPSTREAM',
  // every connection busy and upstreams.X.maxPending requests already waiting, or one waited timeouts.queue
  queue_full: 'GW_ERR_UPSTREAM_BUSY',
  queue_timeout: 'GW_ERR_UPSTREAM_BUSY',
  client_abort: null,
  body_too_large: 'GW_ERR_BODY_TOO_LARGE',
  bad_request: 'GW_ERR_BAD_REQUEST',
  shutting_down: 'GW_ERR_SHUTTING_DOWN',
  client_timeout: 'GW_ERR_CLIENT_TIMEOUT',
  // the client stopped reading: nobody is left to answer
  send_timeout: null,
  too_many_tunnels: 'GW_ERR_TOO_MANY_TUNNELS',
  out_of_files: 'GW_ERR_OUT_OF_FILES'
})

/**
 * The answer's message where the kind says more than its code's (ERRORS) does: a certificate the
 * gateway refused was answered "the upstream refused or reset the connection", which sends an
 * operator to look at the target's listener rather than at its certificate.
 */
export const KIND_MESSAGES: Readonly<Partial<Record<ForwardErrorKind, string>>> = Object.freeze({
  tls: 'the gateway refused the upstream\'s TLS certificate, or the TLS handshake failed'
})

/**
 * The kinds of a connection never made: no byte of the request reached the target. The target is
 * ejected (passive health) and the request may go to another (retryOn: connect-failure).
 */
export function isConnectFailure (kind: ForwardErrorKind): boolean {
  return kind === 'refused' || kind === 'dns' || kind === 'connect_timeout' || kind === 'tls'
}

/**
 * Maps an undici or socket error to a kind by its stable `code` (undici's `UND_ERR_*`, node's `E*`),
 * never by class. The kinds of isConnectFailure mean no byte reached the upstream.
 */
export function classifyUpstreamError (err: unknown): ForwardErrorKind {
  switch (errorCode(err)) {
    case 'ECONNREFUSED':
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
      return 'refused'
    // A name that does not resolve is a configuration or DNS problem, not a refusing target:
    // its own kind, so a dashboard tells them apart. Like 'refused', nothing was sent.
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
    case 'EAI_FAIL':
      return 'dns'
    case 'UND_ERR_CONNECT_TIMEOUT':
      return 'connect_timeout'
    // The gateway's own descriptors ran out (the process's or the system's limit): the connection
    // was never attempted. Not the target's failure, so it neither ejects it nor counts toward
    // consecutiveFailures, and no other target would fare better: not retried.
    case 'EMFILE':
    case 'ENFILE':
      return 'out_of_files'
    case 'UND_ERR_HEADERS_TIMEOUT':
    case 'UND_ERR_BODY_TIMEOUT':
      return 'response_timeout'
    // a head larger than undici takes: what the upstream sent is not relayable HTTP, its connection did not break
    case 'UND_ERR_HEADERS_OVERFLOW':
      return 'bad_response'
    // undici's one SocketError for an upgrade nobody asked for (a 101 to a plain request): the
    // message is all that tells it from a connection that broke
    case 'UND_ERR_SOCKET':
      return (err as { message?: unknown }).message === 'bad upgrade' ? 'bad_response' : 'reset'
    // A header or path undici (or node:http, for WebSockets) will not put on the wire.
    case 'UND_ERR_INVALID_ARG':
    case 'UND_ERR_NOT_SUPPORTED':
    case 'ERR_INVALID_CHAR':
    case 'ERR_INVALID_HTTP_TOKEN':
      return 'bad_request'
    default: {
      const code = errorCode(err)
      // A certificate refused, or a TLS handshake that failed (ERR_SSL_*: a target that speaks
      // plain HTTP, no common protocol version or cipher): the connection was never made, so
      // nothing was sent (a retry still checks that nothing was: mayRetry). Taken for a reset, it
      // was answered as one, counted toward consecutiveFailures and never tried on another target.
      if (code !== undefined && isTlsRefusalCode(code)) return 'tls'
      // undici's HTTPParserError (its name; its code, llhttp's HPE_*, is often unset): the upstream
      // answered something that is not HTTP/1.1, not a connection that broke
      const parser = (code !== undefined && code.startsWith('HPE_')) || (err as { name?: unknown } | null)?.name === 'HTTPParserError'
      return parser ? 'bad_response' : 'reset'
    }
  }
}

function errorCode (err: unknown): string | undefined {
  if (typeof err !== 'object' || err === null) return undefined
  const code = (err as { code?: unknown }).code
  if (typeof code === 'string') return code
  // Happy eyeballs (autoSelectFamily) reports one failure per address in an AggregateError.
  if (err instanceof AggregateError) return errorCode(err.errors[0])
  return undefined
}
