// `gateway explain`: what the gateway would do with one request, without starting it: the route
// that matches, who the client is, and each limit that applies, with its algorithm, parameters and
// store key. It asks the runtime compiled by src/runtime.ts (the live gateway's own factory, run
// offline), so it cannot disagree with the gateway on routing, identity or plans.
import { METHODS } from 'node:http'
import { normalizePath, requestTargetAuthority, requestTargetPath, requestTargetQuery } from './router/normalize-path.js'
import { normalizeHost } from './router/route-table.js'
import { checkTargetAuthority } from './router/request-head.js'
import { preflightMethod } from './router/cors.js'
import { dimensionValue, keyFor, limitsFor } from './limit/plan.js'
import type { IdentityResult } from './identify/identity.js'
import type { CompiledRoute, Runtime } from './runtime.js'
import type { AddressCheck } from './identify/ip-restriction.js'

export interface ExplainRequest {
  readonly method: string
  readonly url: string
  readonly ip: string
  /** `--user`: taken as identified (its plan from `consumers`/`defaultPlan`), no credential checked. */
  readonly user: string | null
  readonly headers: readonly string[]
}

/** `--user U` stands for a verified credential of U: the plan is the one U's requests get. */
function asUser (rt: Runtime, user: string): IdentityResult {
  const plan = rt.consumers.plans.get(user) ?? rt.consumers.defaultPlan
  return plan === null ? { ok: true, user } : { ok: true, user, plan }
}

/**
 * The fields of which node:http keeps the first line when a request repeats them (IncomingMessage's
 * matchKnownFields); it joins Cookie's lines with "; " and every other field's with ", ".
 */
const FIRST_OF_REPEATED: ReadonlySet<string> = new Set(['age', 'authorization', 'content-length', 'content-type', 'etag', 'expires', 'from', 'host', 'if-modified-since', 'if-unmodified-since', 'last-modified', 'location', 'max-forwards', 'proxy-authorization', 'referer', 'retry-after', 'server', 'user-agent'])

export async function explain (rt: Runtime, req: ExplainRequest): Promise<string> {
  // an absolute-form target's authority is the host, whatever Host says (RFC 9112 §3.2.2), as in
  // src/pipeline.ts
  const authority = requestTargetAuthority(req.url) ?? undefined
  const badAuthority = authority === undefined ? null : checkTargetAuthority(authority)
  if (badAuthority !== null) return `400 ${badAuthority.code}: ${badAuthority.reason}\n`
  const headers: Record<string, string> = {}
  for (const h of req.headers) {
    const i = h.indexOf(':')
    // node reads a header's bytes as Latin-1: "x-user-id: josé" typed here (UTF-8) reaches the
    // live gateway as "josÃ©", which the identity header reads back as UTF-8 ("josé")
    if (i <= 0) continue
    const name = h.slice(0, i).trim().toLowerCase()
    const value = Buffer.from(h.slice(i + 1).trim(), 'utf8').toString('latin1')
    // a field given twice is what node makes of two lines: the later one replaced the first, and
    // explain routed "accept-version: v2, v3" (which no matchHeaders list holds) as "v3"
    const before = headers[name]
    if (before === undefined) headers[name] = value
    else if (!FIRST_OF_REPEATED.has(name)) headers[name] = before + (name === 'cookie' ? '; ' : ', ') + value
  }
  // node's parser takes the methods it knows, as written (RFC 9110 §9.1: case-sensitive): the live
  // gateway answers "get" or "FOO" 400, where explain routed them as GET
  if (!METHODS.includes(req.method)) {
    const upper = req.method.toUpperCase()
    return `400 GW_ERR_BAD_REQUEST: HPE_INVALID_METHOD (${METHODS.includes(upper) ? `methods are case-sensitive: ${upper}` : 'not a method node\'s HTTP parser knows'})\n`
  }
  const method = req.method
  // Refused by node's parser before a route is looked at, where explain routed them: a target
  // byte outside ASCII ("/café" as typed; a client sends /caf%C3%A9), and a request line longer
  // than server.maxHeaderSize (src/server.ts answers 414; just under it the parser's count
  // includes the header fields, so the exact edge is not known here)
  if (/[\u007f-\uffff]/.test(req.url)) return '400 GW_ERR_BAD_REQUEST: HPE_INVALID_URL (a request target is ASCII: percent-encode the rest, é as %C3%A9)\n'
  if (Buffer.byteLength(`${method} ${req.url} HTTP/1.1\r\n`) > rt.config.server.maxHeaderSize) {
    return `414 GW_ERR_URI_TOO_LONG: the request line is longer than server.maxHeaderSize (${rt.config.server.maxHeaderSize} bytes)\n`
  }
  const lines: string[] = []
  // the raw target, split and normalized as the live gateway does (src/pipeline.ts): URL's
  // parsing resolves "..", turns "\\" into "/" and drops "#...", and routed what the gateway refuses
  const rawPath = requestTargetPath(req.url)
  if (rawPath === null) return '400 GW_ERR_BAD_PATH: not an origin-form or absolute-form request target\n'
  const normalized = normalizePath(rawPath)
  if (!normalized.ok) return `400 GW_ERR_BAD_PATH: ${normalized.reason}\n`
  const hostHeader = authority ?? headers.host
  const host = normalizeHost(hostHeader)
  lines.push(`request: ${method} ${normalized.path}${requestTargetQuery(req.url)} (${hostHeader === undefined ? 'no Host header' : `host "${hostHeader}"`})`)
  // a CORS preflight is routed by the method it asks for and answered by the gateway when that
  // route has cors, as src/pipeline.ts does
  const client = rt.resolveClientIp(req.ip, headers['x-forwarded-for'])
  // as src/pipeline.ts: a client address the route's ipRestriction refuses gets 403 before anything
  // else about the route (a preflight's grant, identity, limits) is told
  const allowed = (check: AddressCheck | null): boolean => check === null || check(client.ip)
  const forbidden = (route: CompiledRoute): string | null => allowed(rt.ipAllowed) && allowed(route.ipAllowed)
    ? null
    : lines.concat(`route:   ${route.name} -> 403 GW_ERR_IP_FORBIDDEN (client ip ${client.ip} is not let through by ipRestriction)`, '').join('\n')
  const asked = preflightMethod(method, headers.origin, headers['access-control-request-method'])
  const preflightRoute = asked === null ? null : rt.preflightRoutes.match(host, asked, normalized.path, null)
  if (asked !== null && preflightRoute !== null && preflightRoute.cors !== null) {
    const refused = forbidden(preflightRoute)
    if (refused !== null) return refused
    const answer = preflightRoute.cors.preflight(headers.origin as string, asked, headers['access-control-request-headers'])
    const result = answer.ok
      ? `204, answered by the gateway (${answer.headers.flatMap((v, i) => i % 2 === 0 && v !== 'vary' ? [`${v}: ${answer.headers[i + 1] as string}`] : []).join(', ')})`
      : `403 GW_ERR_CORS_REJECTED (${answer.reason})`
    return lines.concat(`route:   ${preflightRoute.name} -> CORS preflight for ${asked}: ${result}; not forwarded, no credentials checked, no limit charged`, '').join('\n')
  }
  const route = rt.routes.match(host, method, normalized.path, headers)
  // as src/pipeline.ts: a client the gateway-wide ipRestriction refuses is told no route's absence
  if (!allowed(rt.ipAllowed) && (route === null || (!route.allowPathParams && normalized.path.includes(';')))) {
    return lines.concat(`route:   ${route?.name ?? 'none'} -> 403 GW_ERR_IP_FORBIDDEN (client ip ${client.ip} is not let through by the gateway's ipRestriction)`, '').join('\n')
  }
  if (route === null) {
    const allow = rt.routes.allowedMethods(host, normalized.path, headers)
    if (allow !== null) return lines.concat(`route:   none for ${method} -> 405 GW_ERR_METHOD_NOT_ALLOWED (Allow: ${allow.join(', ')})`, '').join('\n')
    return lines.concat('route:   none -> 404 GW_ERR_NOT_FOUND', '').join('\n')
  }
  if (!route.allowPathParams && normalized.path.includes(';')) {
    return lines.concat(`route:   ${route.name} -> 400 GW_ERR_BAD_PATH (path parameters ";" are not allowed on this route)`, '').join('\n')
  }
  const refused = forbidden(route)
  if (refused !== null) return refused
  lines.push(route.respond !== null
    ? `route:   ${route.name} -> respond ${route.respond.status} (answered by the gateway once admitted, nothing forwarded)`
    : `route:   ${route.name} -> upstream ${route.upstream ?? ''}${route.websocket ? ' (websocket)' : ''}`)
  // The same identity resolver and route `auth` as the pipeline (src/pipeline.ts)
  let identity: IdentityResult
  // an `auth: none` route identifies nobody, --user included: explain charged that user's limits
  // there, where the live gateway (and GET /limits) charge none
  if (route.auth === 'none') identity = { ok: true, user: null }
  else if (req.user !== null) identity = asUser(rt, req.user)
  else identity = await rt.identity.resolve(headers, route.auth === null ? undefined : route.auth === 'required', rt.isTrustedPeer(req.ip))
  if (!identity.ok) {
    lines.push(`client:  ip ${client.ip} (limit key ${client.key}), identity refused: ${identity.reason}`)
    lines.push(`result:  401 GW_ERR_UNAUTHORIZED (charged to the client IP: ${rt.failurePlan.all.map(l => l.name).join(', ')})`)
    return lines.join('\n') + '\n'
  }
  const user = identity.user
  const plan = identity.plan ?? null
  const ignored = route.auth === 'none' && req.user !== null ? ` (--user ${req.user} ignored: auth: none identifies nobody)` : ''
  lines.push(`client:  ip ${client.ip} (limit key ${client.key}), user ${user ?? '(anonymous)'}${plan === null ? '' : `, plan ${plan}`}${ignored}`)
  const local = rt.config.local
  if (local !== undefined) {
    // each worker holds its own bucket: read as one, a client let through N times the rate looked refused
    const where = rt.config.workers > 1 ? `in process: each of the ${rt.config.workers} workers holds its own bucket` : 'in process'
    lines.push(`local:   token bucket ${local.limit}/${local.window} burst ${local.burst} per client "${client.key}" (${where})`)
  }
  const limits = limitsFor(route, plan)
  const store = rt.config.redis === undefined ? 'in process' : 'redis'
  if (limits.all.length === 0) lines.push('limits:  none')
  for (const l of limits.all) {
    const value = dimensionValue(l.dimension, client.key, user)
    const s = l.spec
    const key = value === null ? '(skipped: anonymous request)' : keyFor(l.keyBase, value)
    if (l.concurrency) {
      lines.push(`limit:   ${l.name} [${l.dimension}] concurrency: at most ${s.limit} in flight (lease TTL ${s.windowMs}ms); ${store} key ${key}; onError ${l.onError}; rejects with 429 GW_ERR_CONCURRENCY_LIMITED`)
      continue
    }
    const params = s.algorithm === 'calendar-quota'
      ? `limit ${s.limit} per calendar ${l.name.slice(l.name.indexOf(':') + 1)} period` + (l.cost !== 1 ? `, cost ${l.cost}` : '')
      : `limit ${s.limit} per ${s.windowMs}ms` + (s.burst !== s.limit ? `, burst ${s.burst}` : '') + (l.cost !== 1 ? `, cost ${l.cost}` : '') + (s.maxDelayMs > 0 ? `, delay up to ${s.maxDelayMs}ms` : '')
    lines.push(`limit:   ${l.name} [${l.dimension}] ${s.algorithm}: ${params}${l.shadow ? ' (shadow)' : ''}; ${store} key ${key}; onError ${l.onError}; rejects with ${l.status}`)
  }
  return lines.join('\n') + '\n'
}
