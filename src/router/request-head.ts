// Checks on the request head that node:http does not make, run before routing so that a request
// the upstream would read differently from us is refused here (issue 15 items 7, 8 and 10).
import type { IncomingMessage } from 'node:http'
import type { ErrorCode } from '../errors.js'
import { CONNECTION_CLOSE, isChunkedOnly } from '../proxy/hop-by-hop.js'

export interface HeadProblem {
  readonly code: ErrorCode
  readonly reason: string
  /** Added to the answer: `Connection: close` where what follows on the connection cannot be trusted. */
  readonly headers?: ReadonlyArray<readonly [string, string]>
}

// RFC 9110 §7.2 / RFC 3986 §3.2.2: reg-name or IP-literal, then an optional port, or nothing at
// all (RFC 9112 §3.2: an empty Host when the target has no authority). Stricter than reg-name (no
// sub-delims, no "%"): "a@b", "x/y" or "host:abc" would be read as another authority by an
// upstream that rebuilds a URL from Host; ":80" has no host, and a port is at most 65535.
// The language of /^(?:(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~-]+)(?::([0-9]{0,5}))?)?$/, scanned by
// hand: a regex match allocated its result on every request (test/router-host-header.test.ts
// compares the two).
export function isValidHost (host: string): boolean {
  const n = host.length
  let i = 0
  if (n > 0 && host.charCodeAt(0) === 0x5b) { // [IP-literal]
    i = 1
    while (i < n && isIpLiteralChar(host.charCodeAt(i))) i++
    if (i === 1 || i === n || host.charCodeAt(i) !== 0x5d) return false
    i++
  } else {
    while (i < n && isRegNameChar(host.charCodeAt(i))) i++
    if (i === 0) return n === 0
  }
  if (i === n) return true
  if (host.charCodeAt(i) !== 0x3a || n - i - 1 > 5) return false
  let port = 0
  for (let j = i + 1; j < n; j++) {
    const c = host.charCodeAt(j)
    if (c < 0x30 || c > 0x39) return false
    port = port * 10 + c - 0x30
  }
  return port <= 65535
}

// 0-9 A-F a-f : .
function isIpLiteralChar (c: number): boolean {
  return (c >= 0x30 && c <= 0x3a) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66) || c === 0x2e
}

// A-Z a-z 0-9 . _ ~ -
function isRegNameChar (c: number): boolean {
  return (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || (c >= 0x30 && c <= 0x39) || c === 0x2e || c === 0x2d || c === 0x5f || c === 0x7e
}

const TOO_MANY: HeadProblem = Object.freeze({ code: 'GW_ERR_HEADERS_TOO_LARGE', reason: 'too many header fields (server.maxHeadersCount)' })
const TWO_HOSTS: HeadProblem = Object.freeze({ code: 'GW_ERR_BAD_REQUEST', reason: 'more than one Host header' })
const UNKNOWN_CODING: HeadProblem = Object.freeze({ code: 'GW_ERR_NOT_IMPLEMENTED', reason: 'only the chunked transfer coding is supported' })
const BAD_HOST: HeadProblem = Object.freeze({ code: 'GW_ERR_BAD_REQUEST', reason: 'invalid Host header' })
const HTTP10_CODING: HeadProblem = Object.freeze({ code: 'GW_ERR_BAD_REQUEST', reason: 'Transfer-Encoding in an HTTP/1.0 request', headers: CONNECTION_CLOSE })
const BAD_AUTHORITY: HeadProblem = Object.freeze({ code: 'GW_ERR_BAD_REQUEST', reason: 'invalid authority in the request target' })

/**
 * The problem with an absolute-form target's authority (from requestTargetAuthority), null when it
 * is a host: a userinfo ("user@host") or an empty host is refused, as an invalid Host is (RFC 9110
 * §4.2.1, §4.2.4).
 */
export function checkTargetAuthority (authority: string): HeadProblem | null {
  return authority !== '' && isValidHost(authority) ? null : BAD_AUTHORITY
}

/**
 * null when the head is acceptable. `maxHeadersCount` is the configured limit; node:http keeps at
 * least one field more than that (the server is created with maxHeadersCount + 1), so a request
 * over the limit is seen here instead of losing its last fields silently.
 */
export function checkRequestHead (req: IncomingMessage, maxHeadersCount: number): HeadProblem | null {
  const raw = req.rawHeaders
  if (raw.length > maxHeadersCount * 2) return TOO_MANY
  // node:http keeps the first Host and drops the others; an upstream or cache may keep the last.
  let hosts = 0
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i] as string
    if (name.length === 4 && name.toLowerCase() === 'host' && ++hosts > 1) return TWO_HOSTS
  }
  // RFC 9112 §6.1: a transfer coding the server does not understand is a 501. node:http decodes
  // only "chunked" and would silently drop the others ("gzip, chunked" would reach the upstream
  // as an unlabelled gzip body).
  const te = req.headers['transfer-encoding']
  if (te !== undefined && !isChunkedOnly(te)) return UNKNOWN_CODING
  // RFC 9112 §6.1: its framing is to be treated as faulty (an HTTP/1.0 hop in front may read the
  // body by Content-Length, or to the connection's end); refused, as nginx does
  if (te !== undefined && req.httpVersionMinor === 0 && req.httpVersionMajor === 1) return HTTP10_CODING
  const host = req.headers.host
  if (host !== undefined && !isValidHost(host)) return BAD_HOST
  return null
}
