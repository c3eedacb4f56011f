import t from 'tap'
import { ANY_METHOD, compileRouteTable, normalizeHost, type RoutePattern } from '../src/router/route-table.js'

interface Route extends RoutePattern { readonly upstream?: string, readonly websocket?: boolean }

// The reference: a linear scan, obviously correct, that the indexed table must agree with.
function naiveMatch (routes: readonly Route[], host: string, method: string, path: string): Route | null {
  for (const r of routes) {
    if (r.host !== undefined) {
      if (r.host.startsWith('*.')) {
        const suffix = r.host.slice(1)
        if (!(host.endsWith(suffix) && host.length > suffix.length)) continue
      } else if (r.host !== host) continue
    }
    if (r.path !== undefined && r.path !== path) continue
    if (r.pathPrefix !== undefined && !path.startsWith(r.pathPrefix)) continue
    // HEAD is GET without the body: a GET route takes it
    if (r.methods !== undefined && !r.methods.includes(method) && !(method === 'HEAD' && r.methods.includes('GET'))) continue
    return r
  }
  return null
}

t.test('normalizeHost', async (t) => {
  const cases: Array<[string | undefined, string]> = [
    [undefined, ''],
    ['', ''],
    ['API.Example.COM', 'api.example.com'],
    ['api.example.com:8080', 'api.example.com'],
    ['api.example.com.', 'api.example.com'],
    ['Api.Example.Com.:443', 'api.example.com'],
    ['[::1]:8080', '[::1]'],
    ['[2001:DB8::1]', '[2001:db8::1]'],
    ['127.0.0.1:3000', '127.0.0.1'],
    ['localhost', 'localhost'],
    // the ends of A-Z, and a name with no character outside them
    ['A.example.com', 'a.example.com'],
    ['Zeta.com', 'zeta.com'],
    ['LOCALHOST', 'localhost'],
    // an unclosed bracket is not an IPv6 literal: kept whole, for the route lookup to miss
    ['[::1', '[::1']
  ]
  for (const [input, expected] of cases) t.equal(normalizeHost(input), expected, String(input))
  const already = 'api.example.com'
  t.equal(normalizeHost(already), already, 'already-normal host returned as is')
})

t.test('pathPrefix is a plain string prefix (like Envoy prefix)', async (t) => {
  const api: Route = { name: 'api', pathPrefix: '/api' }
  const table = compileRouteTable([api])
  t.equal(table.match('', 'GET', '/api', {}), api)
  t.equal(table.match('', 'GET', '/api/x', {}), api)
  t.equal(table.match('', 'GET', '/apix', {}), api)
  t.equal(table.match('', 'GET', '/ap', {}), null)
  t.equal(table.match('', 'GET', '/', {}), null)
  const slash: Route = { name: 'slash', pathPrefix: '/api/' }
  const t2 = compileRouteTable([slash])
  t.equal(t2.match('', 'GET', '/api/x', {}), slash)
  t.equal(t2.match('', 'GET', '/api/', {}), slash)
  t.equal(t2.match('', 'GET', '/api', {}), null)
  t.equal(t2.match('', 'GET', '/apix', {}), null)
})

t.test('precedence: first route in file order wins', async (t) => {
  const routes: Route[] = [
    { name: 'admin-exact', host: 'api.example.com', path: '/admin' },
    { name: 'wild-users', host: '*.example.com', pathPrefix: '/users' },
    { name: 'api-get-only', host: 'api.example.com', pathPrefix: '/', methods: ['GET'] },
    { name: 'any-host-users', pathPrefix: '/users/' },
    { name: 'api-post', host: 'api.example.com', pathPrefix: '/', methods: ['POST', 'PUT'] },
    { name: 'catch-all' }
  ]
  const table = compileRouteTable(routes)
  const name = (host: string, method: string, path: string): string | undefined =>
    table.match(host, method, path, {})?.name
  t.equal(name('api.example.com', 'DELETE', '/admin'), 'admin-exact')
  t.equal(name('api.example.com', 'GET', '/users/1'), 'wild-users', 'wildcard route earlier than exact-host route')
  t.equal(name('api.example.com', 'GET', '/orders'), 'api-get-only')
  t.equal(name('api.example.com', 'HEAD', '/orders'), 'api-get-only', 'HEAD is GET without the body: a GET route takes it (it fell through to the catch-all, past the GET route\'s limits)')
  t.equal(name('api.example.com', 'POST', '/orders'), 'api-post')
  t.equal(name('other.org', 'GET', '/users/1'), 'any-host-users')
  t.equal(name('other.org', 'GET', '/users'), 'catch-all')
  t.equal(name('a.b.example.com', 'GET', '/users'), 'wild-users', 'wildcard matches deeper subdomains')
  t.equal(name('example.com', 'GET', '/users'), 'catch-all', 'wildcard does not match the apex')
  t.equal(name('', 'GET', '/admin'), 'catch-all', 'no Host header: only host-less routes')
  t.equal(name('xexample.com', 'GET', '/users'), 'catch-all', 'suffix must start at a label boundary')
})

t.test('exact path beats a later prefix, a prefix beats a later exact path', async (t) => {
  const a: Route = { name: 'exact', path: '/v1/items' }
  const b: Route = { name: 'prefix', pathPrefix: '/v1/' }
  t.equal(compileRouteTable([a, b]).match('', 'GET', '/v1/items', {}), a)
  t.equal(compileRouteTable([b, a]).match('', 'GET', '/v1/items', {}), b)
  t.equal(compileRouteTable([a, b]).match('', 'GET', '/v1/items/2', {}), b)
  t.equal(compileRouteTable([a]).match('', 'GET', '/v1/items/', {}), null, 'exact means exact')
})

t.test('patterns are normalized or refused at compile time', async (t) => {
  const upper: Route = { name: 'u', host: 'API.Example.com.' }
  t.equal(compileRouteTable([upper]).match('api.example.com', 'GET', '/', {}), upper)
  const refused: Array<[Route, RegExp]> = [
    [{ name: 'a', path: '/x', pathPrefix: '/y' }, /not both/],
    [{ name: 'b', path: '/a/../b' }, /normal form, write "\/b"/],
    [{ name: 'c', pathPrefix: 'api' }, /start with/],
    [{ name: 'd', methods: ['get'] }, /uppercase/],
    [{ name: 'e', methods: [] }, /never match/],
    [{ name: 'f', host: 'api.example.com:8080' }, /without port/],
    [{ name: 'g', host: 'a.*.example.com' }, /host/],
    [{ name: 'h', path: '/caf%c3%a9' }, /write "\/caf%C3%A9"/],
    [{ name: 'i', methods: ['gET'] }, /uppercase/],
    [{ name: 'j', methods: ['GEt'] }, /uppercase/],
    [{ name: 'k', host: 'x[::1]' }, /host/],
    [{ name: 'l', host: '[::1]x' }, /host/]
  ]
  for (const [route, message] of refused) {
    t.throws(() => compileRouteTable([route]), { code: 'GW_ERR_CONFIG_INVALID', message }, route.name)
  }
  t.throws(() => compileRouteTable([{ name: 'ok' }, { name: 'bad', methods: ['get'] }]), { message: /routes\[1\] \(bad\)/ })
})

t.test('radix tree splits shared prefixes correctly', async (t) => {
  const routes: Route[] = [
    { name: 'abcd', pathPrefix: '/abcd' },
    { name: 'abce', pathPrefix: '/abce' },
    { name: 'ab', pathPrefix: '/ab' },
    { name: 'a', pathPrefix: '/a' },
    { name: 'root', pathPrefix: '/' }
  ]
  const table = compileRouteTable(routes)
  const name = (p: string): string | undefined => table.match('', 'GET', p, {})?.name
  t.equal(name('/abcdef'), 'abcd')
  t.equal(name('/abce'), 'abce')
  t.equal(name('/abcf'), 'ab')
  t.equal(name('/ab'), 'ab')
  t.equal(name('/a'), 'a')
  t.equal(name('/b'), 'root')
})

t.test('1000 random routes agree with a linear reference matcher', async (t) => {
  let seed = 7
  const rand = (n: number): number => {
    seed = (seed * 1103515245 + 12345) % 2147483648
    return Math.floor((seed / 2147483648) * n)
  }
  const pick = <T>(xs: readonly T[]): T => xs[rand(xs.length)] as T
  const hosts = ['api.example.com', 'www.example.com', 'a.b.example.com', 'example.com', 'shop.test', 'x.shop.test', 'other.org', '']
  const hostPatterns = ['api.example.com', 'www.example.com', '*.example.com', '*.b.example.com', 'example.com', 'shop.test', '*.shop.test', 'other.org']
  const segments = ['api', 'v1', 'v2', 'users', 'u', 'orders', 'o', 'x', 'static', 'a.css']
  const methods = ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']
  const randomPath = (): string => {
    let p = ''
    const depth = rand(4)
    for (let i = 0; i <= depth; i++) p += '/' + pick(segments)
    return p
  }
  const routes: Route[] = []
  for (let i = 0; i < 1000; i++) {
    const r: { -readonly [K in keyof Route]: Route[K] } = { name: `r${i}` }
    if (rand(4) !== 0) r.host = pick(hostPatterns)
    const kind = rand(200)
    if (kind < 100) r.path = randomPath()
    else if (kind < 199) {
      // Prefixes that end inside a segment, at a "/" and at a segment end.
      const p = randomPath()
      const cut = rand(3)
      r.pathPrefix = cut === 0 ? p : cut === 1 ? p + '/' : p.slice(0, Math.max(2, p.length - 1 - rand(3)))
    }
    if (rand(3) === 0) r.methods = methods.filter(() => rand(3) === 0).concat(pick(methods))
    // A route without path, host or methods would answer every request left: keep those rare.
    if (r.path === undefined && r.pathPrefix === undefined) r.host ??= pick(hostPatterns)
    routes.push(r)
  }
  const table = compileRouteTable(routes)
  let matched = 0
  let mismatches = 0
  for (let n = 0; n < 20000; n++) {
    const host = pick(hosts)
    const method = pick(methods)
    // "/miss..." only matches routes without a path pattern.
    let path = rand(3) === 0 ? '/miss' + randomPath() : randomPath()
    if (rand(5) === 0) path += pick(['/', 'x', '.json'])
    const expected = naiveMatch(routes, host, method, path)
    const actual = table.match(host, method, path, {})
    if (actual !== expected) {
      if (mismatches++ < 5) t.fail(`${method} ${host}${path}: expected ${expected?.name}, got ${actual?.name}`)
    }
    if (expected !== null) matched++
  }
  t.equal(mismatches, 0, 'no mismatch against the reference')
  t.ok(matched > 5000 && matched < 20000, `a healthy mix of hits and misses (${matched} hits)`)
})

t.test('an IPv6 literal is a host', async (t) => {
  const v6: Route = { name: 'v6', host: '[::1]' }
  t.equal(compileRouteTable([v6]).match('[::1]', 'GET', '/', {}), v6)
})

t.test('allowedMethods: what the routes matching host and path accept, for 405 and Allow', async (t) => {
  const routes: Route[] = [
    { name: 'get', path: '/items', methods: ['GET'] },
    { name: 'write', pathPrefix: '/items', methods: ['POST', 'PUT'] },
    { name: 'open', host: '*.example.com', pathPrefix: '/open' },
    { name: 'trace', host: '*.example.com', path: '/open/t', methods: ['TRACE'] },
    { name: 'delete', host: 'api.example.com', path: '/x', methods: ['DELETE'] },
    { name: 'folded', pathPrefix: '/Admin/', caseInsensitive: true, methods: ['PATCH'] }
  ]
  const table = compileRouteTable(routes)
  const allowed = (host: string, path: string): string[] | null => {
    const list = table.allowedMethods(host, path, {})
    return list === null ? null : [...list].sort()
  }
  t.same(allowed('', '/items'), ['GET', 'HEAD', 'POST', 'PUT'], 'an exact path and a prefix together (HEAD where GET is)')
  t.same(allowed('a.example.com', '/open/x'), [...ANY_METHOD].sort(), 'a route without methods: any but TRACE')
  t.same(ANY_METHOD, ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'])
  t.same(allowed('a.example.com', '/open/t'), [...ANY_METHOD, 'TRACE'].sort(), 'TRACE only where a route lists it')
  t.same(allowed('api.example.com', '/x'), ['DELETE'], 'an exact host')
  t.same(allowed('', '/ADMIN/users'), ['PATCH'], 'a case-insensitive route')
  t.equal(allowed('example.com', '/open/x'), null, 'a wildcard host needs a label before its suffix')
  t.equal(allowed('', '/nothing'), null, 'no route for the path: 404, not 405')
  t.equal(allowed('other.org', '/x'), null, 'the path of another host')
})

t.test('TRACE only reaches a route that lists it', async (t) => {
  const any: Route = { name: 'any', pathPrefix: '/' }
  const trace: Route = { name: 'trace', pathPrefix: '/', methods: ['TRACE'] }
  t.equal(compileRouteTable([any]).match('', 'TRACE', '/x', {}), null)
  t.equal(compileRouteTable([any, trace]).match('', 'TRACE', '/x', {}), trace)
  t.equal(compileRouteTable([any, trace]).match('', 'GET', '/x', {}), any)
})

t.test('caseInsensitive routes match whatever the case; the others do not; file order still wins', async (t) => {
  const admin: Route = { name: 'admin', pathPrefix: '/admin/', caseInsensitive: true }
  const login: Route = { name: 'login', path: '/Login', caseInsensitive: true }
  const plain: Route = { name: 'plain', pathPrefix: '/Plain' }
  const apiHost: Route = { name: 'api-host', host: 'api.example.com', pathPrefix: '/' }
  const upper: Route = { name: 'upper', pathPrefix: '/ADMIN/' }
  const table = compileRouteTable([admin, login, plain, apiHost, upper])
  const name = (path: string, host = ''): string | undefined => table.match(host, 'GET', path, {})?.name
  t.equal(name('/ADMIN/x'), 'admin', 'before the case-sensitive /ADMIN/ route')
  t.equal(name('/Admin/'), 'admin')
  t.equal(name('/login'), 'login')
  t.equal(name('/LOGIN'), 'login')
  t.equal(name('/plain'), undefined, 'a case-sensitive route')
  t.equal(name('/Plain/x'), 'plain')
  t.equal(name('/other', 'api.example.com'), 'api-host', 'a host whose routes all keep case')
  t.equal(name('/aDmIn/x', 'api.example.com'), 'admin', 'an earlier any-host route folds case on every host')
})

t.test('matchTrailingSlash: one resource with and without its trailing slash', async (t) => {
  const routes: Route[] = [
    { name: 'login', path: '/login', matchTrailingSlash: true },
    { name: 'logout', path: '/logout/', matchTrailingSlash: true },
    { name: 'admin', pathPrefix: '/admin/', matchTrailingSlash: true },
    { name: 'root', path: '/', matchTrailingSlash: true },
    { name: 'strict', path: '/strict' },
    { name: 'folded', path: '/Help', matchTrailingSlash: true, caseInsensitive: true }
  ]
  const table = compileRouteTable(routes)
  const name = (path: string): string | undefined => table.match('', 'GET', path, {})?.name
  t.equal(name('/login/'), 'login')
  t.equal(name('/logout'), 'logout')
  t.equal(name('/admin'), 'admin')
  t.equal(name('/admin/x'), 'admin')
  t.equal(name('/'), 'root')
  t.equal(name('/strict/'), undefined, 'only where asked')
  t.equal(name('/HELP/'), 'folded')
})

t.test('wildcard hosts of several lengths: at least one label before the suffix', async (t) => {
  const wide: Route = { name: 'wide', host: '*.example.com', pathPrefix: '/' }
  const narrow: Route = { name: 'narrow', host: '*.b.example.com', pathPrefix: '/' }
  const table = compileRouteTable([wide, narrow])
  const name = (host: string): string | undefined => table.match(host, 'GET', '/x', {})?.name
  t.equal(name('x.b.example.com'), 'wide', 'both match: the first in file order')
  t.equal(compileRouteTable([narrow, wide]).match('x.b.example.com', 'GET', '/x', {})?.name, 'narrow')
  t.equal(name('b.example.com'), 'wide')
  t.equal(name('example.com'), undefined)
  t.equal(name('.example.com'), undefined, 'an empty label is not a label')
  t.equal(name('a.b.other.com'), undefined, 'a dot where a suffix would start, but another suffix')
  t.equal(name('xexample.com'), undefined)
})

// allowedMethods walks every candidate bucket again (it is reached on a miss alone), so its own
// copies of the host checks and of the radix walk are tested here at their edges, not via match().
t.test('405 Allow: methods of every route on the path, across exact, wildcard and any-host routes', async (t) => {
  const routes: Route[] = [
    { name: 'exact-host', host: 'api.example.com', path: '/p', methods: ['GET'] },
    { name: 'wild', host: '*.example.com', pathPrefix: '/p', methods: ['POST'] },
    { name: 'deep-wild', host: '*.b.example.com', pathPrefix: '/', methods: ['PATCH'] },
    { name: 'any-host', path: '/p', methods: ['PUT'] },
    { name: 'any-host-again', pathPrefix: '/', methods: ['PUT', 'DELETE'] }
  ]
  const table = compileRouteTable(routes)
  // in the order a client reads them: exact host, wildcard hosts, any host; each method once
  t.same(table.allowedMethods('api.example.com', '/p', {}), ['GET', 'HEAD', 'POST', 'PUT', 'DELETE'])
  t.same(table.allowedMethods('www.example.com', '/p', {}), ['POST', 'PUT', 'DELETE'])
  t.same(table.allowedMethods('x.b.example.com', '/p', {}), ['POST', 'PATCH', 'PUT', 'DELETE'], 'two wildcard suffixes')
  t.same(table.allowedMethods('b.example.com', '/p', {}), ['POST', 'PUT', 'DELETE'], 'the apex of the deeper wildcard')
  t.same(table.allowedMethods('.example.com', '/p', {}), ['PUT', 'DELETE'], 'a host as long as the suffix has no label before it')
  t.same(table.allowedMethods('a.b.other.com', '/p', {}), ['PUT', 'DELETE'], 'a dot where a suffix would start, but another suffix')
  t.same(table.allowedMethods('other.org', '/q', {}), ['PUT', 'DELETE'])
})

t.test('405 Allow on a table without any-host routes', async (t) => {
  const table = compileRouteTable<Route>([
    { name: 'api', host: 'api.example.com', pathPrefix: '/v1/', methods: ['GET'] },
    { name: 'wild', host: '*.example.com', path: '/v1/x', methods: ['POST'] }
  ])
  t.same(table.allowedMethods('api.example.com', '/v1/x', {}), ['GET', 'HEAD', 'POST'])
  t.same(table.allowedMethods('a.example.com', '/v1/x', {}), ['POST'])
  t.equal(table.allowedMethods('other.org', '/v1/x', {}), null)
  t.equal(table.allowedMethods('a.b.other.com', '/v1/x', {}), null, 'a dot at a suffix length, no bucket there')
  t.equal(table.allowedMethods('', '/v1/x', {}), null)
})

t.test('405 Allow: prefix and exact routes along a deeper tree', async (t) => {
  const routes: Route[] = [
    { name: 'v1', pathPrefix: '/api/v1/', methods: ['GET'] },
    { name: 'v2', pathPrefix: '/api/v2/', methods: ['POST'] },
    { name: 'api', pathPrefix: '/api/', methods: ['PUT'] },
    { name: 'v1-exact', path: '/api/v1/items', methods: ['DELETE'] },
    { name: 'apiary', pathPrefix: '/apiary', methods: ['PATCH'] },
    { name: 'events', path: '/api/v1/events', methods: ['GET'], websocket: true },
    { name: 'events-post', path: '/api/v1/events', methods: ['POST'] }
  ]
  const table = compileRouteTable(routes)
  t.same(table.allowedMethods('', '/api/v1/items', {}), ['DELETE', 'PUT', 'GET', 'HEAD'], 'the exact route, then prefixes from the root down')
  t.same(table.allowedMethods('', '/api/v1/x', {}), ['PUT', 'GET', 'HEAD'])
  t.same(table.allowedMethods('', '/api/v2/x', {}), ['PUT', 'POST'])
  t.same(table.allowedMethods('', '/api/v3/x', {}), ['PUT'], 'the path leaves the tree below /api/')
  t.same(table.allowedMethods('', '/api/v1', {}), ['PUT'], 'the path ends inside the edge "1/"')
  t.same(table.allowedMethods('', '/api/v', {}), ['PUT'], 'the path ends at the node where v1 and v2 part')
  t.same(table.allowedMethods('', '/api/', {}), ['PUT'], 'the path ends at the node of a route')
  t.same(table.allowedMethods('', '/apiary/x', {}), ['PATCH'])
  t.same(table.allowedMethods('', '/api/v1/events', {}), ['GET', 'HEAD', 'POST', 'PUT'], 'a websocket route and a plain route on one path')
  t.equal(table.allowedMethods('', '/apix', {}), null)
  t.equal(table.allowedMethods('', '/b', {}), null, 'the first character leaves the tree')
  t.equal(table.allowedMethods('', '/', {}), null)
})

t.test('405 Allow: a route without methods adds the default list after the listed ones', async (t) => {
  const table = compileRouteTable<Route>([
    { name: 'trace', path: '/t', methods: ['TRACE'] },
    { name: 'open', pathPrefix: '/' }
  ])
  t.same(table.allowedMethods('', '/t', {}), ['TRACE', ...ANY_METHOD])
  t.same(table.allowedMethods('', '/x', {}), [...ANY_METHOD])
  t.equal(compileRouteTable<Route>([{ name: 'p', path: '/p', methods: ['GET'] }]).allowedMethods('', '/q', {}), null)
})

t.test('matchHeaders: a route matches only when every condition holds; the first such route in file order wins', async (t) => {
  const canary: Route = { name: 'canary', pathPrefix: '/api/', matchHeaders: [{ name: 'x-canary', present: true, values: ['1'] }] }
  const versioned: Route = { name: 'v2', pathPrefix: '/api/', matchHeaders: [{ name: 'x-version', present: true, values: ['v2', 'v3'] }, { name: 'x-legacy', present: false, values: null }] }
  const debug: Route = { name: 'debug', pathPrefix: '/api/', methods: ['POST'], matchHeaders: [{ name: 'x-debug', present: true, values: null }] }
  const stable: Route = { name: 'stable', pathPrefix: '/api/', methods: ['GET'] }
  const table = compileRouteTable<Route>([canary, versioned, debug, stable])
  t.equal(table.match('', 'GET', '/api/x', { 'x-canary': '1' }), canary)
  t.equal(table.match('', 'GET', '/api/x', { 'x-canary': '2' }), stable, 'another value: the next route')
  t.equal(table.match('', 'GET', '/api/x', { 'x-canary': 'a, 1' }), stable, 'repeated fields, as node joins them, are one value')
  t.equal(table.match('', 'GET', '/api/x', { 'x-version': 'v3' }), versioned, 'one of the listed values')
  t.equal(table.match('', 'GET', '/api/x', { 'x-version': 'v3', 'x-legacy': '' }), stable, 'a field that must be absent, present (empty)')
  t.equal(table.match('', 'GET', '/api/x', { 'x-version': 'V3' }), stable, 'values are compared exactly')
  t.equal(table.match('', 'POST', '/api/x', { 'x-debug': 'anything' }), debug, 'present, any value')
  t.equal(table.match('', 'POST', '/api/x', {}), null, 'no route takes a POST without x-debug')
  t.same(table.allowedMethods('', '/api/x', {}), ['GET', 'HEAD'], '405 lists the methods of the routes whose headers hold')
  t.same([...(table.allowedMethods('', '/api/x', { 'x-debug': '1' }) ?? [])].sort(), ['GET', 'HEAD', 'POST'])
  t.equal(table.match('', 'GET', '/api/x', null), canary, 'null headers: the conditions are not asked (a preflight)')
  t.equal(compileRouteTable<Route>([debug, stable]).match('', 'POST', '/api/x', null), debug)
})
