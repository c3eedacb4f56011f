import { GatewayError } from '../errors.js'
import { normalizePath } from './normalize-path.js'

// Routes are compiled once into indexes (host -> exact-path Map + prefix radix tree) so a lookup
// costs a few Map hits and one walk down the path, whatever the number of routes. Precedence is
// still "first route in file order wins": every index keeps routes sorted by their file index and
// the lookup keeps the lowest index found across all candidate indexes.

/** What the router needs from a route in the config; the table returns the caller's own object. */
export interface RoutePattern {
  readonly name: string
  /** Exact host (`api.example.com`) or wildcard (`*.example.com`: every subdomain, not the apex). */
  readonly host?: string
  /** Exact path match, in normalized form (see `normalizePath`). */
  readonly path?: string
  /**
   * Plain string prefix, like Envoy's `prefix`: `/api` matches `/api`, `/api/x` and `/apix`.
   * Write `/api/` to match only below `/api/`.
   */
  readonly pathPrefix?: string
  /** Uppercase method names; absent = any method but TRACE. HEAD does not match a route listing only GET. */
  readonly methods?: readonly string[]
  /** `/Admin` matches `/admin` (for upstreams that fold case: IIS, Windows file systems). */
  readonly caseInsensitive?: boolean
  /** `path: /admin` also matches `/admin/`, and `pathPrefix: /admin/` also matches `/admin`. */
  readonly matchTrailingSlash?: boolean
  /** Request headers that must hold for the route to match (`matchHeaders`); absent or empty: none. */
  readonly matchHeaders?: readonly HeaderCondition[]
}

/** One `matchHeaders` entry. */
export interface HeaderCondition {
  /** Lowercase field name. */
  readonly name: string
  /** false: the request must not carry the field. */
  readonly present: boolean
  /** The values of which the field's must be one (as node joins repeated fields: "a, b"); null: whatever the value. */
  readonly values: readonly string[] | null
}

/** The request's header fields as node gives them; null asks a lookup to ignore `matchHeaders`. */
export type RequestHeaders = Readonly<Record<string, string | string[] | undefined>> | null

export interface RouteTable<R extends RoutePattern> {
  /** `host` as returned by `normalizeHost`, `path` as returned by `normalizePath`. */
  match(host: string, method: string, path: string, headers: RequestHeaders): R | null
  /**
   * For a request `match` found no route for: the methods the routes matching its host, path and
   * headers accept (for `405` and its `Allow`), or null when no route matches the path at all
   * (404). A route without `methods` contributes ANY_METHOD.
   */
  allowedMethods(host: string, path: string, headers: RequestHeaders): readonly string[] | null
}

/** What a route without `methods` accepts, as listed in `Allow` (TRACE only when a route lists it). */
export const ANY_METHOD: readonly string[] = Object.freeze(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'])

interface Entry<R> {
  readonly index: number
  readonly methods: readonly string[] | null
  /** null: the route matches whatever the headers. */
  readonly headers: readonly HeaderCondition[] | null
  readonly route: R
}

// A radix tree keyed on char codes: each edge carries a label, so a walk costs one Map hit per
// branching point rather than one per character.
interface PrefixNode<R> {
  label: string
  children: Map<number, PrefixNode<R>> | null
  entries: Entry<R>[] | null
}

interface HostBucket<R> {
  readonly minIndex: number
  readonly exact: Map<string, Entry<R>[]>
  readonly prefixes: PrefixNode<R>
  /** caseInsensitive routes, keyed and walked by the lowercased path. */
  readonly exactFolded: Map<string, Entry<R>[]>
  readonly prefixesFolded: PrefixNode<R>
}

const DOT = 0x2e
// RFC 9110 §9.1: method is a case-sensitive token; config methods are conventionally uppercase.
const METHOD = /^[!#$%&'*+.^_`|~0-9A-Z-]+$/
const HOST_PATTERN = /^(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*$|^\[[0-9a-f:.]+\]$/

/** Lowercases, strips the port (`[::1]:8080` aware) and a trailing dot; '' when absent. */
export function normalizeHost (hostHeader: string | undefined): string {
  if (hostHeader === undefined) return ''
  let end = hostHeader.length
  if (hostHeader.charCodeAt(0) === 0x5b) {
    // RFC 3986 §3.2.2: an IPv6 literal is bracketed; its colons are not a port separator.
    const close = hostHeader.indexOf(']')
    if (close !== -1) end = close + 1
  } else {
    const colon = hostHeader.indexOf(':')
    if (colon !== -1) end = colon
  }
  // "example.com." is the same fully qualified name as "example.com" (RFC 1034 §3.1).
  if (end > 0 && hostHeader.charCodeAt(end - 1) === DOT) end--
  const host = end === hostHeader.length ? hostHeader : hostHeader.slice(0, end)
  for (let i = 0; i < host.length; i++) {
    const c = host.charCodeAt(i)
    if (c >= 0x41 && c <= 0x5a) return host.toLowerCase()
  }
  return host
}

export function compileRouteTable<R extends RoutePattern> (routes: readonly R[]): RouteTable<R> {
  const exactHosts = new Map<string, HostBucket<R>>()
  // Keyed by the suffix including its dot: "*.example.com" -> ".example.com".
  const wildcardHosts = new Map<string, HostBucket<R>>()
  let anyHost: HostBucket<R> | null = null
  // Whether any route folds case: only then does a lookup lowercase the path.
  let anyFolded = false

  routes.forEach((route, index) => {
    const where = `routes[${index}] (${route.name})`
    const invalid = (message: string): GatewayError =>
      new GatewayError('GW_ERR_CONFIG_INVALID', `${where}: ${message}`)

    let methods: readonly string[] | null = null
    if (route.methods !== undefined) {
      if (route.methods.length === 0) throw invalid('methods is empty, the route would never match')
      for (const m of route.methods) {
        if (!METHOD.test(m)) throw invalid(`method "${m}" must be an uppercase token like "GET"`)
      }
      methods = Object.freeze(withImpliedHead(route.methods))
    }
    if (route.path !== undefined && route.pathPrefix !== undefined) {
      throw invalid('set path or pathPrefix, not both')
    }
    const pathText = route.path ?? route.pathPrefix
    if (pathText !== undefined) {
      // Requests are normalized before lookup, so a pattern that is not normal could never match.
      const n = normalizePath(pathText)
      if (!n.ok) throw invalid(`path "${pathText}": ${n.reason}`)
      if (n.path !== pathText) throw invalid(`path "${pathText}" is not in normal form, write "${n.path}"`)
    }

    let bucket: HostBucket<R>
    const host = route.host === undefined ? '*' : stripTrailingDot(route.host.toLowerCase())
    if (host === '*') {
      bucket = anyHost ??= newBucket(index)
    } else {
      if (!HOST_PATTERN.test(host)) throw invalid(`host "${route.host}" must be a host name, "*.domain" or "[ipv6]", without port`)
      const wildcard = host.startsWith('*.')
      const map = wildcard ? wildcardHosts : exactHosts
      const key = wildcard ? host.slice(1) : host
      let b = map.get(key)
      if (b === undefined) map.set(key, b = newBucket(index))
      bucket = b
    }

    for (const c of route.matchHeaders ?? []) {
      if (c.name !== c.name.toLowerCase()) throw invalid(`matchHeaders "${c.name}" must be lowercase`)
    }
    const headers = route.matchHeaders === undefined || route.matchHeaders.length === 0 ? null : Object.freeze([...route.matchHeaders])
    const entry: Entry<R> = { index, methods, headers, route }
    const folded = route.caseInsensitive === true
    if (folded) anyFolded = true
    const exactMap = folded ? bucket.exactFolded : bucket.exact
    const addExact = (key: string): void => {
      const k = folded ? key.toLowerCase() : key
      const list = exactMap.get(k)
      if (list === undefined) exactMap.set(k, [entry])
      else if (list[list.length - 1] !== entry) list.push(entry)
    }
    const slash = route.matchTrailingSlash === true
    if (route.path !== undefined) {
      addExact(route.path)
      // the same resource with or without its trailing slash, as most frameworks serve it
      if (slash && route.path !== '/') addExact(route.path.endsWith('/') ? route.path.slice(0, -1) : route.path + '/')
    } else {
      const prefix = route.pathPrefix ?? ''
      insertPrefix(folded ? bucket.prefixesFolded : bucket.prefixes, folded ? prefix.toLowerCase() : prefix, entry)
      // "/admin/" also takes "/admin"; a prefix without the slash already takes "/admin/"
      if (slash && prefix.length > 1 && prefix.endsWith('/')) addExact(prefix.slice(0, -1))
    }
  })

  // Distinct wildcard suffix lengths: a lookup slices the host only where a suffix could start.
  const wildcardLengths = [...new Set([...wildcardHosts.keys()].map(k => k.length))].sort((a, b) => a - b)

  return {
    match (host: string, method: string, path: string, headers: RequestHeaders): R | null {
      let best: Entry<R> | null = null
      const folded = anyFolded ? path.toLowerCase() : null
      const exact = exactHosts.get(host)
      if (exact !== undefined) best = searchBucket(exact, method, path, folded, headers, best)
      for (let i = 0; i < wildcardLengths.length; i++) {
        const len = wildcardLengths[i] as number
        // ">" not ">=": "*.example.com" needs at least one label before ".example.com".
        if (host.length > len && host.charCodeAt(host.length - len) === DOT) {
          const b = wildcardHosts.get(host.slice(host.length - len))
          if (b !== undefined) best = searchBucket(b, method, path, folded, headers, best)
        }
      }
      if (anyHost !== null) best = searchBucket(anyHost, method, path, folded, headers, best)
      return best === null ? null : best.route
    },
    allowedMethods (host: string, path: string, headers: RequestHeaders): readonly string[] | null {
      // Only reached on a miss, so it walks every candidate bucket without the index shortcuts.
      const found = new Set<string>()
      let any = false
      const folded = anyFolded ? path.toLowerCase() : null
      const collect = (bucket: HostBucket<R>): void => {
        for (const e of entriesFor(bucket, path, folded)) {
          if (!headersHold(e.headers, headers)) continue
          if (e.methods === null) any = true
          else for (const m of e.methods) found.add(m)
        }
      }
      const exact = exactHosts.get(host)
      if (exact !== undefined) collect(exact)
      for (const len of wildcardLengths) {
        if (host.length > len && host.charCodeAt(host.length - len) === DOT) {
          const b = wildcardHosts.get(host.slice(host.length - len))
          if (b !== undefined) collect(b)
        }
      }
      if (anyHost !== null) collect(anyHost)
      if (!any && found.size === 0) return null
      if (any) for (const m of ANY_METHOD) found.add(m)
      return [...found]
    }
  }
}

function stripTrailingDot (host: string): string {
  return host.length > 1 && host.charCodeAt(host.length - 1) === DOT ? host.slice(0, -1) : host
}

function newBucket<R> (minIndex: number): HostBucket<R> {
  return {
    minIndex,
    exact: new Map(),
    prefixes: { label: '', children: null, entries: null },
    exactFolded: new Map(),
    prefixesFolded: { label: '', children: null, entries: null }
  }
}

function insertPrefix<R> (root: PrefixNode<R>, key: string, entry: Entry<R>): void {
  let node = root
  let pos = 0
  while (pos < key.length) {
    const first = key.charCodeAt(pos)
    const child = node.children?.get(first)
    if (child === undefined) {
      const leaf: PrefixNode<R> = { label: key.slice(pos), children: null, entries: [entry] }
      ;(node.children ??= new Map()).set(first, leaf)
      return
    }
    let common = 0
    const max = Math.min(child.label.length, key.length - pos)
    while (common < max && child.label.charCodeAt(common) === key.charCodeAt(pos + common)) common++
    if (common < child.label.length) {
      // Split the edge: the new middle node ends where the keys diverge.
      const mid: PrefixNode<R> = { label: child.label.slice(0, common), children: new Map(), entries: null }
      child.label = child.label.slice(common)
      mid.children?.set(child.label.charCodeAt(0), child)
      node.children?.set(first, mid)
      node = mid
    } else {
      node = child
    }
    pos += common
  }
  // Routes are inserted in file order, so each list stays sorted by index.
  ;(node.entries ??= []).push(entry)
}

/**
 * A route's methods with HEAD where GET is: HEAD is GET without the body (RFC 9110 §9.3.2), and
 * an upstream answers it with its GET handler (Express, Koa, node's own frameworks; nginx's
 * `limit_except GET` lets HEAD through too). Without it, a HEAD to a GET-only route fell through
 * to a catch-all route and reached the same handler past the GET route's limits, auth and
 * ipRestriction.
 */
export function withImpliedHead (methods: readonly string[]): string[] {
  const get = methods.indexOf('GET')
  // right after GET, as an Allow header lists them
  return get === -1 || methods.includes('HEAD') ? [...methods] : [...methods.slice(0, get + 1), 'HEAD', ...methods.slice(get + 1)]
}

// The lowest-index entry of a sorted list that allows `method` and whose headers hold, if it beats `best`.
function firstAllowed<R> (list: Entry<R>[], method: string, headers: RequestHeaders, best: Entry<R> | null): Entry<R> | null {
  for (let i = 0; i < list.length; i++) {
    const e = list[i] as Entry<R>
    if (best !== null && e.index >= best.index) return best
    // TRACE echoes the request, credentials included (cross-site tracing): a route without
    // `methods` does not take it, only one that lists it.
    if ((e.methods === null ? method !== 'TRACE' : e.methods.includes(method)) && headersHold(e.headers, headers)) return e
  }
  return best
}

/** Whether every condition holds for `headers` (null conditions, or null headers: yes). */
export function headersHold (conditions: readonly HeaderCondition[] | null, headers: RequestHeaders): boolean {
  if (conditions === null || headers === null) return true
  for (let i = 0; i < conditions.length; i++) {
    const c = conditions[i] as HeaderCondition
    const value = headers[c.name]
    if (value === undefined) {
      if (c.present) return false
      continue
    }
    if (!c.present) return false
    if (c.values !== null && !c.values.includes(typeof value === 'string' ? value : value.join(', '))) return false
  }
  return true
}

// Every entry whose path matches, whatever its methods.
function * entriesFor<R> (bucket: HostBucket<R>, path: string, folded: string | null): Generator<Entry<R>> {
  yield * entriesIn(bucket.exact, bucket.prefixes, path)
  if (folded !== null) yield * entriesIn(bucket.exactFolded, bucket.prefixesFolded, folded)
}

function * entriesIn<R> (exact: Map<string, Entry<R>[]>, prefixes: PrefixNode<R>, path: string): Generator<Entry<R>> {
  const list = exact.get(path)
  if (list !== undefined) yield * list
  let node = prefixes
  let pos = 0
  for (;;) {
    if (node.entries !== null) yield * node.entries
    if (node.children === null || pos >= path.length) return
    const child = node.children.get(path.charCodeAt(pos))
    if (child === undefined || !path.startsWith(child.label, pos)) return
    pos += child.label.length
    node = child
  }
}

function searchBucket<R> (bucket: HostBucket<R>, method: string, path: string, folded: string | null, headers: RequestHeaders, best: Entry<R> | null): Entry<R> | null {
  if (best !== null && bucket.minIndex >= best.index) return best
  best = searchIn(bucket.exact, bucket.prefixes, method, path, headers, best)
  if (folded !== null) best = searchIn(bucket.exactFolded, bucket.prefixesFolded, method, folded, headers, best)
  return best
}

function searchIn<R> (exact: Map<string, Entry<R>[]>, prefixes: PrefixNode<R>, method: string, path: string, headers: RequestHeaders, best: Entry<R> | null): Entry<R> | null {
  const list = exact.get(path)
  if (list !== undefined) best = firstAllowed(list, method, headers, best)
  let node = prefixes
  let pos = 0
  for (;;) {
    if (node.entries !== null) best = firstAllowed(node.entries, method, headers, best)
    if (node.children === null || pos >= path.length) return best
    const child = node.children.get(path.charCodeAt(pos))
    if (child === undefined || !path.startsWith(child.label, pos)) return best
    pos += child.label.length
    node = child
  }
}

/** A route no request can reach, and why: the warning `gateway validate`, a start and a reload give. */
export interface UnreachableRoute {
  readonly index: number
  /** The field the reason points at. */
  readonly field: 'path' | 'pathPrefix' | 'name'
  readonly reason: string
}

/**
 * Routes no request can reach (routes are tried in file order and the first match wins): a path
 * holding `?` (a request's path never does: its query is split off first), or every request a
 * route takes already taken by an earlier one (`pathPrefix: /` before `pathPrefix: /api/`, the
 * same prefix twice). Conservative: a route reported is certainly unreachable, not every
 * unreachable route is found (wildcard hosts are not compared).
 */
export function unreachableRoutes (routes: readonly RoutePattern[]): UnreachableRoute[] {
  const out: UnreachableRoute[] = []
  routes.forEach((route, index) => {
    const written = route.path ?? route.pathPrefix
    const field = route.path !== undefined ? 'path' : 'pathPrefix'
    if (written?.includes('?') === true) {
      out.push({ index, field, reason: `"${written}" holds a "?": a request's path never does (its query is split off before routing), so this route never matches` })
      return
    }
    const earlier = routes.findIndex((r, i) => i < index && takesEveryRequestOf(r, route))
    if (earlier !== -1) {
      const by = routes[earlier] as RoutePattern
      out.push({ index, field: written === undefined ? 'name' : field, reason: `never matches: routes[${earlier}] (${by.name}) comes first and takes every request it would (the first route that matches wins: put the narrower route first)` })
    }
  })
  return out
}

function takesEveryRequestOf (a: RoutePattern, b: RoutePattern): boolean {
  const hostA = a.host === undefined ? '*' : stripTrailingDot(a.host.toLowerCase())
  if (hostA !== '*' && (b.host === undefined || hostA !== stripTrailingDot(b.host.toLowerCase()))) return false
  const methodsA = a.methods === undefined ? undefined : withImpliedHead(a.methods)
  if (methodsA !== undefined && (b.methods === undefined || !withImpliedHead(b.methods).every(m => methodsA.includes(m)))) return false
  if (!(a.matchHeaders ?? []).every(c => impliedBy(c, b.matchHeaders ?? []))) return false
  const fold = a.caseInsensitive === true
  if (!fold && b.caseInsensitive === true) return false
  const f = (s: string): string => fold ? s.toLowerCase() : s
  const prefixA = a.path === undefined ? f(a.pathPrefix ?? '') : null
  const exactA = new Set(matchedExactly(a).map(f))
  const takes = (path: string): boolean => (prefixA !== null && f(path).startsWith(prefixA)) || exactA.has(f(path))
  // every path b takes as a whole prefix must sit under a's prefix, and each exact one be taken
  if (b.path === undefined && (prefixA === null || !f(b.pathPrefix ?? '').startsWith(prefixA))) return false
  return matchedExactly(b).every(takes)
}

/** Whether every request meeting `conditions` meets `c` too. */
function impliedBy (c: HeaderCondition, conditions: readonly HeaderCondition[]): boolean {
  return conditions.some(d => d.name === c.name && d.present === c.present &&
    (c.values === null || (d.values !== null && d.values.every(v => c.values?.includes(v) === true))))
}

/** The paths a route matches exactly: its `path`, and the trailing-slash variant it also takes. */
function matchedExactly (r: RoutePattern): string[] {
  const slash = r.matchTrailingSlash === true
  if (r.path !== undefined) return slash && r.path !== '/' ? [r.path, r.path.endsWith('/') ? r.path.slice(0, -1) : r.path + '/'] : [r.path]
  const prefix = r.pathPrefix ?? ''
  return slash && prefix.length > 1 && prefix.endsWith('/') ? [prefix.slice(0, -1)] : []
}
