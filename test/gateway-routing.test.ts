// Routing through a real gateway: exact vs prefix, file order, methods, hosts, the 404 body, and
// path normalization attacks sent as raw request targets (node:http does not normalize `path`).
import t from 'tap'
import http, { type IncomingHttpHeaders } from 'node:http'
import { backendConfig, startGateway } from './helpers/gateway.js'
import { startUpstream, type EchoBody, type Upstream } from './helpers/upstream.js'
import type { Teardown } from './helpers/teardown.js'

interface Reply { status: number, headers: IncomingHttpHeaders, body: string }

/** One request with `path` written on the request line byte for byte. */
function send (base: string, path: string, options: { method?: string, headers?: Record<string, string> } = {}): Promise<Reply> {
  const { port } = new URL(base)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method: options.method ?? 'GET', headers: options.headers ?? {}, agent: false }, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end()
  })
}

// Each route tags the request it forwards, so the echo upstream tells which route matched.
const tag = (name: string): string => `headers: { request: { set: { x-route: ${name} } } }`

function config (upstream: Upstream): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: health, path: /api/health, methods: [GET], upstream: backend, ${tag('health')} }
  - { name: v1, pathPrefix: /api/v1/, upstream: backend, ${tag('v1')} }
  - { name: v1-users, pathPrefix: /api/v1/users, upstream: backend, ${tag('v1-users')} }
  - { name: submit, path: /api/submit, methods: [POST, PUT], upstream: backend, ${tag('submit')} }
  - { name: docs-prefix, pathPrefix: /docs/, upstream: backend, ${tag('docs-prefix')} }
  - { name: docs-exact, path: /docs/index, upstream: backend, ${tag('docs-exact')} }
  - { name: host-exact, host: api.example.com, pathPrefix: /h/, upstream: backend, ${tag('host-exact')} }
  - { name: host-wild, host: "*.example.com", pathPrefix: /h/, upstream: backend, ${tag('host-wild')} }
  - { name: admin, pathPrefix: /admin, upstream: backend, ${tag('admin')} }
  - { name: api, pathPrefix: /api/, upstream: backend, ${tag('api')} }
  - { name: plain, pathPrefix: /apx, upstream: backend, ${tag('plain')} }
  - { name: strip, pathPrefix: /strip/, stripPrefix: /strip, upstream: backend, ${tag('strip')} }
`
}

async function setup (t: Teardown): Promise<{ base: string, upstream: Upstream }> {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream))
  return { base: gw.url, upstream }
}

/** The route that served `path` and the URL the upstream received. */
async function routed (base: string, path: string, options: { method?: string, headers?: Record<string, string> } = {}): Promise<{ status: number, route: unknown, url: unknown }> {
  const reply = await send(base, path, options)
  if (reply.status !== 200) return { status: reply.status, route: null, url: null }
  const seen = JSON.parse(reply.body) as EchoBody
  return { status: reply.status, route: seen.headers['x-route'], url: seen.url }
}

t.test('exact path, prefixes, first match in file order, methods', async (t) => {
  const { base } = await setup(t)
  t.same(await routed(base, '/api/health'), { status: 200, route: 'health', url: '/api/health' })
  t.same(await routed(base, '/api/health/deep'), { status: 200, route: 'api', url: '/api/health/deep' }, 'an exact path does not match below itself')
  t.same(await routed(base, '/api/health', { method: 'POST' }), { status: 200, route: 'api', url: '/api/health' }, 'a method the exact route does not list falls through to the next match')
  t.same(await routed(base, '/api/v1/users/7'), { status: 200, route: 'v1', url: '/api/v1/users/7' }, 'the earlier, shorter prefix wins over a later, longer one')
  t.same(await routed(base, '/docs/index'), { status: 200, route: 'docs-prefix', url: '/docs/index' }, 'an earlier prefix wins over a later exact path')
  t.same(await routed(base, '/api/submit', { method: 'POST' }), { status: 200, route: 'submit', url: '/api/submit' })
  t.same(await routed(base, '/api/submit', { method: 'PUT' }), { status: 200, route: 'submit', url: '/api/submit' })
  t.same(await routed(base, '/api/submit'), { status: 200, route: 'api', url: '/api/submit' }, 'GET is not listed by the submit route')
  t.same(await routed(base, '/apxyz'), { status: 200, route: 'plain', url: '/apxyz' }, 'pathPrefix is a plain string prefix')
  t.same(await routed(base, '/admin'), { status: 200, route: 'admin', url: '/admin' })
  t.equal((await send(base, '/api')).status, 404, '/api/ does not match /api')
})

t.test('hosts: exact, wildcard subdomain, case and port insensitive; the apex is not a subdomain', async (t) => {
  const { base } = await setup(t)
  t.same(await routed(base, '/h/x', { headers: { host: 'api.example.com' } }), { status: 200, route: 'host-exact', url: '/h/x' })
  t.same(await routed(base, '/h/x', { headers: { host: 'API.Example.COM:8080' } }), { status: 200, route: 'host-exact', url: '/h/x' })
  t.same(await routed(base, '/h/x', { headers: { host: 'www.example.com' } }), { status: 200, route: 'host-wild', url: '/h/x' })
  const apex = await send(base, '/h/x', { headers: { host: 'example.com' } })
  t.equal(apex.status, 404, 'example.com is not *.example.com')
  const other = await send(base, '/h/x', { headers: { host: 'api.example.org' } })
  t.equal(other.status, 404)
})

t.test('an absolute-form target routes by its own authority, not by Host, and the upstream gets it as Host (RFC 9112 §3.2.2)', async (t) => {
  const { base } = await setup(t)
  const seenHost = async (target: string, host: string): Promise<{ status: number, route: unknown, host: unknown }> => {
    const reply = await send(base, target, { headers: { host } })
    if (reply.status !== 200) return { status: reply.status, route: null, host: null }
    const seen = JSON.parse(reply.body) as EchoBody
    // X-Forwarded-Host names the host the request was for: the target's authority too
    t.equal(seen.headers['x-forwarded-host'], seen.headers.host, `${target}: X-Forwarded-Host`)
    return { status: reply.status, route: seen.headers['x-route'], host: seen.headers.host }
  }
  t.same(await seenHost('http://api.example.com/h/x', 'api.example.org'), { status: 200, route: 'host-exact', host: 'api.example.com' })
  t.same(await seenHost('HTTPS://API.example.com:8443/h/x?q=1', 'www.example.com'), { status: 200, route: 'host-exact', host: 'API.example.com:8443' })
  t.same(await seenHost('http://www.example.com/h/x', 'api.example.com'), { status: 200, route: 'host-wild', host: 'www.example.com' })
  t.same(await seenHost('http://api.example.org/h/x', 'api.example.com'), { status: 404, route: null, host: null }, 'a Host naming a routed host does not route a target for another')
  for (const target of ['http://user@api.example.com/h/x', 'http:///h/x', 'http://api.example.com:99999/h/x', 'http://a b/h/x'.replace(' ', '%20')]) {
    const reply = await send(base, target, { headers: { host: 'api.example.com' } })
    t.equal(reply.status, 400, target)
    t.match(JSON.parse(reply.body), { error: 'GW_ERR_BAD_REQUEST', reason: 'invalid authority in the request target' }, target)
  }
})

t.test('no route: 404 JSON with error, message and the request id', async (t) => {
  const { base, upstream } = await setup(t)
  const given = await send(base, '/nowhere', { headers: { 'x-request-id': 'req-404-given' } })
  t.equal(given.status, 404)
  t.match(given.headers['content-type'], /^application\/json/)
  // the client is not a trusted proxy: its id is replaced by a generated one (issue 15 item 11)
  t.same(JSON.parse(given.body), { error: 'GW_ERR_NOT_FOUND', message: 'no route matches this request', requestId: given.headers['x-request-id'] })
  t.not(given.headers['x-request-id'], 'req-404-given')
  const generated = await send(base, '/nowhere')
  const body = JSON.parse(generated.body) as { error: string, requestId: string }
  t.equal(body.error, 'GW_ERR_NOT_FOUND')
  t.match(body.requestId, /^[0-9a-f-]{36}$/, 'a request id is generated')
  t.equal(generated.headers['x-request-id'], body.requestId)
  t.equal(upstream.requests, 0, 'nothing reached the upstream')
})

t.test('dot segments are resolved before routing: /api/../admin reaches /admin, never /api/', async (t) => {
  const { base } = await setup(t)
  t.same(await routed(base, '/api/../admin/users'), { status: 200, route: 'admin', url: '/admin/users' })
  t.same(await routed(base, '/api/%2e%2e/admin'), { status: 200, route: 'admin', url: '/admin' }, 'encoded dots are dots')
  t.same(await routed(base, '/api/%2E%2e/admin'), { status: 200, route: 'admin', url: '/admin' })
  t.same(await routed(base, '/api/./v1/./x'), { status: 200, route: 'v1', url: '/api/v1/x' })
  t.same(await routed(base, '/api/v1/users/../../health'), { status: 200, route: 'health', url: '/api/health' })
  t.same(await routed(base, '/docs/a/..'), { status: 200, route: 'docs-prefix', url: '/docs/' }, 'a trailing ".." keeps the trailing slash')
  // absolute-form (RFC 9112 §3.2.2) is normalized the same way
  t.same(await routed(base, 'http://gateway.test/api/../admin?x=1'), { status: 200, route: 'admin', url: '/admin?x=1' })
})

t.test('"//" is merged and unreserved percent-encodings are decoded; the upstream receives the normalized path', async (t) => {
  const { base } = await setup(t)
  t.same(await routed(base, '//api//v1///x'), { status: 200, route: 'v1', url: '/api/v1/x' })
  t.same(await routed(base, '/%61pi/v1/%7Euser'), { status: 200, route: 'v1', url: '/api/v1/~user' })
  t.same(await routed(base, '/api/v1/a%3ab%c3%a9'), { status: 200, route: 'v1', url: '/api/v1/a%3Ab%C3%A9' }, 'reserved and non-ASCII bytes stay encoded, in uppercase hex')
  t.same(await routed(base, '/api/v1/trailing/'), { status: 200, route: 'v1', url: '/api/v1/trailing/' }, 'a trailing slash is kept')
})

t.test('the query string passes untouched, whatever it contains', async (t) => {
  const { base } = await setup(t)
  const query = '?q=%2e%2e/../x&y=%zz&z=a+b&path=%2F%5C&&e='
  t.same(await routed(base, '/api//v1/../v1/x' + query), { status: 200, route: 'v1', url: '/api/v1/x' + query })
  t.same(await routed(base, '/strip/users' + query), { status: 200, route: 'strip', url: '/users' + query }, 'stripPrefix leaves the query alone')
})

t.test('stripPrefix removes the prefix from what the upstream receives', async (t) => {
  const { base } = await setup(t)
  t.same(await routed(base, '/strip/users/7'), { status: 200, route: 'strip', url: '/users/7' })
  t.same(await routed(base, '/strip/'), { status: 200, route: 'strip', url: '/' })
  t.same(await routed(base, '/strip//a/../b'), { status: 200, route: 'strip', url: '/b' }, 'stripped after normalization')
})

t.test('stripPrefix also strips a path its route matched by folding case or by the trailing slash', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, backendConfig(upstream.url, `  - { name: folded, pathPrefix: /api/, stripPrefix: /api, caseInsensitive: true, upstream: backend, ${tag('folded')} }
  - { name: slash, pathPrefix: /svc/, stripPrefix: /svc/, matchTrailingSlash: true, upstream: backend, ${tag('slash')} }
`))
  t.same(await routed(gw.url, '/API/users'), { status: 200, route: 'folded', url: '/users' }, 'the upstream got /API/users before')
  t.same(await routed(gw.url, '/Api/users?x=1'), { status: 200, route: 'folded', url: '/users?x=1' })
  t.same(await routed(gw.url, '/api/users'), { status: 200, route: 'folded', url: '/users' })
  t.same(await routed(gw.url, '/svc'), { status: 200, route: 'slash', url: '/' }, 'the upstream got /svc before')
  t.same(await routed(gw.url, '/svc?x=1'), { status: 200, route: 'slash', url: '/?x=1' })
  t.same(await routed(gw.url, '/svc/a'), { status: 200, route: 'slash', url: '/a' })
})

t.test('a path whose folded prefix is not a whole segment goes upstream as the client wrote it, never case-folded', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, backendConfig(upstream.url, `  - { name: admin, path: /apiadmin, upstream: backend, ${tag('admin')} }
  - { name: folded, pathPrefix: /api, stripPrefix: /api, caseInsensitive: true, upstream: backend, ${tag('folded')} }
`))
  // '/APIadmin' went upstream as '/apiadmin': the admin route's path, past whatever limits it has
  t.same(await routed(gw.url, '/APIadmin'), { status: 200, route: 'folded', url: '/APIadmin' })
  t.same(await routed(gw.url, '/APIary/Report?x=1'), { status: 200, route: 'folded', url: '/APIary/Report?x=1' })
  t.same(await routed(gw.url, '/APi/Report'), { status: 200, route: 'folded', url: '/Report' }, 'a whole segment is still stripped')
  t.same(await routed(gw.url, '/apiadmin'), { status: 200, route: 'admin', url: '/apiadmin' })
})

t.test('bad paths get 400 GW_ERR_BAD_PATH as JSON and never reach the upstream', async (t) => {
  const { base, upstream } = await setup(t)
  const bad = [
    '/%2e%2e/admin',
    '/..',
    '/api/../../admin',
    '/api/v1/%2e%2e/%2e%2e/%2e%2e/etc/passwd',
    '/api/a%2Fb',
    '/api/a%2fb',
    '/api/a%5Cb',
    '/api/a%5cb',
    '/api\\..\\admin',
    '/api/a\\b',
    '/api/%zz',
    '/api/%4',
    '/api/abc%',
    '/api/a%00b',
    '/api/..;/admin',
    '/api/a#',
    '/api/a#b',
    '*'
  ]
  for (const path of bad) {
    const reply = await send(base, path, { headers: { 'x-request-id': 'bad-path-1' } })
    t.equal(reply.status, 400, `${path} -> 400`)
    t.match(reply.headers['content-type'], /^application\/json/, `${path}: JSON`)
    const body = JSON.parse(reply.body) as Record<string, unknown>
    t.match(body, { error: 'GW_ERR_BAD_PATH', message: String, requestId: reply.headers['x-request-id'] }, `${path}: body`)
  }
  t.equal(upstream.requests, 0, 'no bad path reached the upstream')
})

t.test('HEAD takes the route GET takes: a GET-only route\'s ipRestriction, auth and limits hold for HEAD, not a catch-all\'s', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, backendConfig(upstream.url, `  - name: report
    path: /api/report
    methods: [GET]
    upstream: backend
    ipRestriction: { allow: [10.0.0.0/8] }
  - name: counted
    path: /api/counted
    methods: [GET]
    upstream: backend
    limits: { ip: { algorithm: fixed-window, limit: 1, window: 1h } }
  - { name: api, pathPrefix: /api/, upstream: backend }
`))
  const head = async (path: string): Promise<number> => {
    const res = await fetch(`${gw.url}${path}`, { method: 'HEAD' })
    await res.arrayBuffer()
    return res.status
  }
  // it fell through to the catch-all "api": 200 five times, the upstream running the GET handler
  t.same([await head('/api/report'), await head('/api/report')], [403, 403], 'the GET route\'s ipRestriction refuses HEAD as it refuses GET')
  t.same([await head('/api/counted'), await head('/api/counted')], [200, 429], 'the GET route\'s limit counts HEAD')
  t.equal(upstream.log.length, 1, 'one request reached the upstream')
  t.same(gw.lines.filter(l => l.msg === 'request').map(l => l.route), ['report', 'report', 'counted', 'counted'])
  const post = await fetch(`${gw.url}/api/report`, { method: 'POST', body: 'x' })
  await post.arrayBuffer()
  t.equal(post.status, 200, 'a POST still goes to the catch-all, which takes it')
})
