// Request paths are normalized once, before routing, so that the route we match is the resource
// the upstream will serve: RFC 3986 §6.2.2 (case and percent-encoding normalization, dot-segment
// removal) plus a few rejections that close well-known routing bypasses.

export type NormalizedPath = { ok: true; path: string } | { ok: false; reason: string }

const SLASH = 0x2f
const DOT = 0x2e
const PERCENT = 0x25
const BACKSLASH = 0x5c
const HASH = 0x23

const HEX = '0123456789ABCDEF'

// -1 for a non-hex char code, else its value. Indexed by char code (< 128).
const HEX_VALUE = new Int8Array(128).fill(-1)
for (let i = 0; i < 10; i++) HEX_VALUE[0x30 + i] = i
for (let i = 0; i < 6; i++) {
  HEX_VALUE[0x41 + i] = 10 + i
  HEX_VALUE[0x61 + i] = 10 + i
}

// RFC 3986 §2.3: unreserved = ALPHA / DIGIT / "-" / "." / "_" / "~"; only these are decoded (§6.2.2.2).
const UNRESERVED = new Uint8Array(128)
for (let c = 0x30; c <= 0x39; c++) UNRESERVED[c] = 1
for (let c = 0x41; c <= 0x5a; c++) UNRESERVED[c] = 1
for (let c = 0x61; c <= 0x7a; c++) UNRESERVED[c] = 1
UNRESERVED[0x2d] = UNRESERVED[DOT] = UNRESERVED[0x5f] = UNRESERVED[0x7e] = 1

const fail = (reason: string): NormalizedPath => ({ ok: false, reason })

// Raw controls (C0, SP, DEL) never belong in a path (RFC 3986 §2, §7.3); a raw "\" is a "/" to
// some servers (IIS, Windows file APIs), so it would let "/public\..\admin" skip our routing. A
// raw "#" never belongs in a request target (RFC 9112 §3.2: no fragment), and servers that cut
// the fragment off (Express, nginx) serve "/login#x" as "/login", past the route for "/login".
function isForbiddenRaw (c: number): boolean {
  return c <= 0x20 || c === 0x7f || c === BACKSLASH || c === HASH
}

function forbiddenReason (c: number): string {
  if (c === BACKSLASH) return 'backslash in path'
  if (c === HASH) return 'fragment ("#") in request target'
  // a route's path in gateway.yaml is checked here too: "/api/ x" was "a control character"
  if (c === 0x20) return 'space in path (write it as %20)'
  return 'control character in path'
}

/**
 * Normalizes the path of a request target (no query). Returns the input string itself (no copy)
 * when it is already normal: no `%`, no segment starting with `.`, no `//`, no `\`.
 */
export function normalizePath (rawPath: string): NormalizedPath {
  if (rawPath.charCodeAt(0) !== SLASH) return fail('path must start with "/"')
  const len = rawPath.length
  let prev = SLASH
  for (let i = 1; i < len; i++) {
    const c = rawPath.charCodeAt(i)
    if (c === PERCENT || isForbiddenRaw(c) || (prev === SLASH && (c === SLASH || c === DOT))) {
      return normalizeSlow(rawPath)
    }
    prev = c
  }
  return { ok: true, path: rawPath }
}

function normalizeSlow (raw: string): NormalizedPath {
  const segments: string[] = []
  const len = raw.length
  let segment = ''
  // Start of the raw run not yet copied into `segment`: runs are copied with one slice.
  let runStart = 1
  for (let i = 1; i <= len; i++) {
    const c = i === len ? SLASH : raw.charCodeAt(i)
    if (c === SLASH) {
      segment += raw.slice(runStart, i)
      runStart = i + 1
      const last = i === len
      if (segment === '..') {
        // RFC 3986 §5.2.4 silently drops a ".." above the root; we refuse it instead, since only a
        // scanner or an attack sends one and the upstream may resolve it differently.
        if (segments.length === 0) return fail('path climbs above the root')
        segments.pop()
        if (last) segments.push('')
      } else if (segment === '.') {
        if (last) segments.push('')
      } else if (segment === '') {
        // "//" runs merge, but a trailing "/" is kept: "/a/" and "/a" can be different resources.
        if (last) segments.push('')
      } else if (segment.charCodeAt(0) === DOT && (segment.startsWith('.;') || segment.startsWith('..;'))) {
        // Servlet containers strip ";params" before resolving dot segments, so "/api/..;/admin"
        // reaches "/admin" on Tomcat ("Breaking Parser Logic", Orange Tsai, Black Hat 2018).
        return fail('dot segment with path parameters')
      } else {
        segments.push(segment)
      }
      segment = ''
    } else if (c === PERCENT) {
      const hi = i + 1 < len ? hexValue(raw.charCodeAt(i + 1)) : -1
      const lo = i + 2 < len ? hexValue(raw.charCodeAt(i + 2)) : -1
      if (hi < 0 || lo < 0) return fail('malformed percent-encoding')
      const byte = hi * 16 + lo
      // An encoded "/" or "\" makes one segment here and two upstream (many servers decode before
      // splitting); NUL truncates paths in C-based backends.
      if (byte === SLASH || byte === BACKSLASH || byte === 0) return fail('encoded "/", "\\" or NUL in path')
      segment += raw.slice(runStart, i)
      segment += byte < 128 && UNRESERVED[byte] === 1
        ? String.fromCharCode(byte)
        : '%' + HEX[hi] + HEX[lo] // §6.2.2.1: uppercase hex digits
      i += 2
      runStart = i + 1
    } else if (isForbiddenRaw(c)) {
      return fail(forbiddenReason(c))
    }
  }
  // A final '' entry (pushed only on the last segment) is the trailing slash; [''] is the root.
  if (segments.length === 0) return { ok: true, path: '/' }
  return { ok: true, path: '/' + segments.join('/') }
}

function hexValue (c: number): number {
  return c < 128 ? (HEX_VALUE[c] as number) : -1
}

/**
 * The path of a request target, as the gateway routes it: origin-form, or absolute-form (RFC 9112
 * §3.2.2) from its first "/" after the authority. Null for every other form (e.g. "*"). The path still
 * needs normalizePath; nothing is decoded or resolved here (WHATWG URL parsing would turn "\\" into
 * "/" and resolve "..", and route what the gateway refuses). Two functions, not one returning both:
 * the request path allocates no pair.
 */
export function requestTargetPath (target: string): string | null {
  const q = target.indexOf('?')
  const rawPath = q === -1 ? target : target.slice(0, q)
  if (rawPath.charCodeAt(0) === 47 /* / */) return rawPath
  if (!/^https?:\/\//i.test(rawPath)) return null
  const slash = rawPath.indexOf('/', rawPath.indexOf('//') + 2)
  return slash === -1 ? '/' : rawPath.slice(slash)
}

/**
 * The authority of an absolute-form target ("api.example.com:8080" of "http://api.example.com:8080/x"),
 * as it stands; null for every other form. Its validity is the caller's to check, as a Host's.
 */
export function requestTargetAuthority (target: string): string | null {
  if (!/^https?:\/\//i.test(target)) return null
  const start = target.indexOf('//') + 2
  let end = start
  while (end < target.length) {
    const c = target.charCodeAt(end)
    if (c === 47 /* / */ || c === 63 /* ? */ || c === 35 /* # */) break
    end++
  }
  return target.slice(start, end)
}

/** The raw query of a request target, with its "?" ('' without one): passed upstream untouched. */
export function requestTargetQuery (target: string): string {
  const q = target.indexOf('?')
  return q === -1 ? '' : target.slice(q)
}
