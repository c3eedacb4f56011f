// A route's cors: the gateway answers its preflights (never forwarded, never charged to a limit,
// a 403 naming what is not allowed) and puts Access-Control-* on every answer to an allowed
// origin, its own 429 included (without them a browser script saw a network error instead of the
// 429 and its Retry-After). The upstream's own Access-Control-* fields are dropped on such a route;
// its Vary is kept beside Vary: Origin.
import t from 'tap'
import { request } from 'undici'
import { startGateway } from './helpers/gateway.js'
import { refusingUrl, startHttpServer } from './helpers/upstream.js'
import { tempDir, type Teardown } from './helpers/teardown.js'
import { gateway } from './helpers/cli.js'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'

interface Seen { method: string, path: string }

async function setup (t: Teardown): Promise<{ url: string, seen: Seen[], lines: Array<Record<string, unknown>> }> {
  const seen: Seen[] = []
  const up = await startHttpServer(t, (req, res) => {
    seen.push({ method: req.method ?? '', path: req.url ?? '' })
    // an upstream with CORS of its own, which the gateway's policy replaces
    res.writeHead(200, { 'content-type': 'text/plain', vary: req.url?.endsWith('/vary-origin') === true ? 'Accept-Encoding, origin' : 'Accept-Encoding', 'access-control-allow-origin': '*', 'x-total': '42', 'set-cookie': ['a=1', 'b=2'] })
    res.end('up')
  })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${up.url}] }
  dead: { targets: [${await refusingUrl()}] }
routes:
  - name: down
    pathPrefix: /down/
    upstream: dead
    cors: { origins: ["https://app.example.com"] }
  - name: api
    pathPrefix: /api/
    methods: [GET, POST, DELETE]
    upstream: backend
    limits: { ip: { algorithm: fixed-window, limit: 3, window: 1h } }
    cors:
      origins: ["https://app.example.com", "https://*.example.org"]
      headers: [content-type, authorization]
      exposeHeaders: [x-total]
      credentials: true
      maxAge: 1h
  - name: open
    pathPrefix: /open/
    upstream: backend
    cors: { origins: ["*"] }
  - name: star
    pathPrefix: /star/
    upstream: backend
    cors: { origins: ["https://app.example.com"], headers: ["*"], credentials: true }
  - name: v6
    pathPrefix: /v6/
    upstream: backend
    cors: { origins: ["http://[::1]:3000"] }
  - name: plain
    pathPrefix: /
    upstream: backend
`)
  return { url: gw.url, seen, lines: gw.lines }
}

const preflight = (origin: string, method: string, headers?: string): Record<string, string> => ({
  origin, 'access-control-request-method': method, ...(headers !== undefined ? { 'access-control-request-headers': headers } : {})
})

t.test('a preflight from an allowed origin is answered by the gateway: 204, never forwarded, never charged', async t => {
  const { url, seen, lines } = await setup(t)
  for (let i = 0; i < 5; i++) {
    const res = await request(`${url}/api/items`, { method: 'OPTIONS', headers: preflight('https://app.example.com', 'POST', 'Content-Type, Authorization') })
    await res.body.text()
    t.equal(res.statusCode, 204, `preflight ${i + 1}: 204 (the ip limit of 3 does not count it)`)
    if (i > 0) continue
    t.same([res.headers['access-control-allow-origin'], res.headers['access-control-allow-methods'], res.headers['access-control-allow-headers'], res.headers['access-control-allow-credentials'], res.headers['access-control-max-age']],
      ['https://app.example.com', 'POST', 'content-type, authorization', 'true', '3600'])
    t.match(res.headers.vary, /Origin/)
    t.type(res.headers['x-request-id'], 'string')
  }
  t.same(seen, [], 'no preflight reached the upstream')
  t.match(lines.filter(l => l.msg === 'request'), [{ status: 204, route: 'api', outcome: 'preflight', method: 'OPTIONS' }])
  const sub = await request(`${url}/api/items`, { method: 'OPTIONS', headers: preflight('https://eu.shop.example.org', 'DELETE') })
  await sub.body.text()
  t.same([sub.statusCode, sub.headers['access-control-allow-origin']], [204, 'https://eu.shop.example.org'], 'a subdomain of a "*." pattern')
})

t.test('a preflight asking for what the route does not allow: 403 GW_ERR_CORS_REJECTED naming it', async t => {
  const { url, seen, lines } = await setup(t)
  const cases: Array<[Record<string, string>, RegExp]> = [
    [preflight('https://evil.example.com', 'GET'), /origin "https:\/\/evil\.example\.com" is not allowed/],
    [preflight('http://app.example.com', 'GET'), /origin "http:\/\/app\.example\.com" is not allowed/],
    [preflight('https://example.org', 'GET'), /origin "https:\/\/example\.org" is not allowed/],
    [preflight('https://app.example.com.evil.net', 'GET'), /is not allowed/],
    [preflight('https://app.example.com', 'GET', 'x-secret'), /header "x-secret" is not in the route's cors\.headers/]
  ]
  for (const [headers, reason] of cases) {
    const res = await request(`${url}/api/items`, { method: 'OPTIONS', headers })
    const body = await res.body.json() as { error: string, reason: string }
    t.equal(res.statusCode, 403, JSON.stringify(headers))
    t.equal(body.error, 'GW_ERR_CORS_REJECTED')
    t.match(body.reason, reason)
    t.equal(res.headers['access-control-allow-origin'], undefined, 'no Access-Control-Allow-Origin')
  }
  t.same(seen, [], 'none reached the upstream')
  t.same(lines.filter(l => l.msg === 'request').map(l => [l.status, l.outcome]), cases.map(() => [403, 'cors_rejected']), 'each logged as refused by cors')
  // a method the route does not take: not this route's preflight, so an OPTIONS routed as before
  // (here the catch-all route without cors forwards it)
  const put = await request(`${url}/api/items`, { method: 'OPTIONS', headers: preflight('https://app.example.com', 'PUT') })
  t.equal(await put.body.text(), 'up', 'PUT is not a method of the route')
  t.same(seen, [{ method: 'OPTIONS', path: '/api/items' }])
})

t.test('answers to an allowed origin carry the policy: the upstream\'s and the gateway\'s own 429', async t => {
  const { url } = await setup(t)
  const origin = 'https://app.example.com'
  const ok = await request(`${url}/api/items`, { headers: { origin } })
  t.equal(await ok.body.text(), 'up')
  t.same([ok.headers['access-control-allow-origin'], ok.headers['access-control-allow-credentials']], [origin, 'true'], 'the upstream\'s "*" replaced by the allowed origin')
  t.equal(ok.headers['access-control-expose-headers'], 'ratelimit, ratelimit-policy, retry-after, x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-reset, x-request-id, x-total', 'the fields the README lists as always readable, then the route\'s exposeHeaders')
  t.equal([ok.headers.vary].flat().join(', '), 'Accept-Encoding, Origin', 'the upstream\'s Vary kept, Origin beside it')
  t.same(ok.headers['set-cookie'], ['a=1', 'b=2'], 'both of the upstream\'s Set-Cookie fields')
  const listed = await request(`${url}/api/vary-origin`, { headers: { origin } })
  await listed.body.text()
  t.equal(listed.headers.vary, 'Accept-Encoding, origin', 'an upstream Vary listing Origin already: not listed twice')
  await (await request(`${url}/api/items`, { headers: { origin } })).body.text()
  const limited = await request(`${url}/api/items`, { headers: { origin } })
  const body = await limited.body.json() as { error: string }
  t.equal(limited.statusCode, 429)
  t.equal(body.error, 'rate_limited')
  t.equal(limited.headers['access-control-allow-origin'], origin, 'the 429 is readable by the script')
  t.match(limited.headers['access-control-expose-headers'], /retry-after/)
  t.type(limited.headers['retry-after'], 'string')
  t.match(limited.headers.vary, /Origin/)
})

t.test('the gateway\'s own failure answers carry the policy too (502 of a refusing upstream)', async t => {
  const { url } = await setup(t)
  const res = await request(`${url}/down/x`, { headers: { origin: 'https://app.example.com' } })
  const body = await res.body.json() as { error: string }
  t.same([res.statusCode, body.error, res.headers['access-control-allow-origin'], res.headers.vary], [502, 'GW_ERR_UPSTREAM_UNAVAILABLE', 'https://app.example.com', 'Origin'])
  const other = await request(`${url}/down/x`, { headers: { origin: 'https://evil.example.com' } })
  await other.body.text()
  // 503 now: the refusing target was ejected by the first request
  t.same([other.statusCode, other.headers['access-control-allow-origin'], other.headers.vary], [503, undefined, 'Origin'], 'another origin: no policy, Vary: Origin still')
})

t.test('a method the path does not take: the 405 carries the policy of the first route with cors a preflight would reach', async t => {
  const up = await startHttpServer(t, (_req, res) => { res.end('up') })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /api/, methods: [GET, POST], upstream: backend, cors: { origins: ["https://app.example.com"] } }
`)
  const res = await request(`${gw.url}/api/items`, { method: 'PUT', body: 'x', headers: { origin: 'https://app.example.com' } })
  const body = await res.body.json() as { error: string }
  t.same([res.statusCode, body.error, res.headers.allow, res.headers['access-control-allow-origin'], res.headers.vary], [405, 'GW_ERR_METHOD_NOT_ALLOWED', 'GET, HEAD, POST', 'https://app.example.com', 'Origin'])
  const other = await request(`${gw.url}/api/items`, { method: 'PUT', body: 'x', headers: { origin: 'https://evil.example.com' } })
  await other.body.text()
  t.same([other.statusCode, other.headers['access-control-allow-origin']], [405, undefined], 'another origin: no policy')
  // a path whose first route has no cors: the policy of the one that has
  const mixed = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: read, path: /x, methods: [GET], upstream: backend }
  - { name: write, path: /x, methods: [POST], upstream: backend, cors: { origins: ["https://app.example.com"] } }
`)
  const deleted = await request(`${mixed.url}/x`, { method: 'DELETE', headers: { origin: 'https://app.example.com' } })
  await deleted.body.text()
  t.same([deleted.statusCode, deleted.headers.allow, deleted.headers['access-control-allow-origin']], [405, 'GET, HEAD, POST', 'https://app.example.com'])
})

t.test('other origins and no origin: served, without the policy and without the upstream\'s', async t => {
  const { url } = await setup(t)
  const other = await request(`${url}/api/items`, { headers: { origin: 'https://evil.example.com' } })
  t.equal(await other.body.text(), 'up')
  t.equal(other.headers['access-control-allow-origin'], undefined, 'the upstream\'s "*" dropped: the file\'s policy holds')
  t.match(other.headers.vary, /Origin/, 'the answer still varies by origin')
  const none = await request(`${url}/api/items`)
  t.equal(await none.body.text(), 'up')
  t.equal(none.headers['access-control-allow-origin'], undefined)
  // a route without cors relays the upstream's fields and forwards OPTIONS
  const plain = await request(`${url}/x`, { method: 'OPTIONS', headers: preflight('https://app.example.com', 'GET') })
  t.equal(await plain.body.text(), 'up')
  t.equal(plain.headers['access-control-allow-origin'], '*', 'a route without cors is left alone')
})

t.test('origins "*": "*" for every origin and for requests without Origin, no Vary: Origin', async t => {
  const { url } = await setup(t)
  const res = await request(`${url}/open/a`, { headers: { origin: 'https://anyone.test' } })
  t.equal(await res.body.text(), 'up')
  t.equal(res.headers['access-control-allow-origin'], '*')
  t.equal(res.headers.vary, 'Accept-Encoding', 'the upstream\'s Vary alone')
  // Fetch, CORS protocol and HTTP caches: a static "*" goes on answers to requests without Origin
  // too (a navigation's answer, cached without it, would be reused for a script's fetch)
  const bare = await request(`${url}/open/a`)
  t.equal(await bare.body.text(), 'up')
  t.same([bare.headers['access-control-allow-origin'], bare.headers.vary], ['*', 'Accept-Encoding'], 'without Origin: "*" as well, still no Vary: Origin')
  const pre = await request(`${url}/open/a`, { method: 'PATCH', headers: {} })
  await pre.body.text()
  const p = await request(`${url}/open/a`, { method: 'OPTIONS', headers: preflight('https://anyone.test', 'PATCH', 'x-anything') })
  await p.body.text()
  t.same([p.statusCode, p.headers['access-control-allow-origin'], p.headers['access-control-allow-methods'], p.headers['access-control-allow-headers'], p.headers['access-control-max-age']], [204, '*', 'PATCH', 'x-anything', '600'], 'defaults: the method and headers asked for, 10 minutes')
  // duplicate Access-Control-Request-Method fields reach node joined: never granted as a list
  const listed = await request(`${url}/open/a`, { method: 'OPTIONS', headers: preflight('https://anyone.test', 'GET, DELETE') })
  const refused = await listed.body.json() as { error: string, reason: string }
  t.same([listed.statusCode, refused.error, listed.headers['access-control-allow-methods']], [403, 'GW_ERR_CORS_REJECTED', undefined])
  t.match(refused.reason, /Access-Control-Request-Method is not a method name/)
})

t.test('headers: ["*"] lets a preflight ask for every header, credentials or not', async t => {
  const { url, seen } = await setup(t)
  const res = await request(`${url}/star/a`, { method: 'OPTIONS', headers: preflight('https://app.example.com', 'PUT', 'X-Custom, content-type') })
  await res.body.text()
  t.same([res.statusCode, res.headers['access-control-allow-headers'], res.headers['access-control-allow-credentials']], [204, 'x-custom, content-type', 'true'],
    'the names asked for, echoed (a literal "*" is no wildcard to a browser when credentials are sent)')
  t.same(seen, [])
})

t.test('an IPv6 origin (a local dev server at http://[::1]:3000) is allowed as the browser sends it', async t => {
  const { url } = await setup(t)
  const allowed = await request(`${url}/v6/a`, { headers: { origin: 'http://[::1]:3000' } })
  t.equal(await allowed.body.text(), 'up')
  t.equal(allowed.headers['access-control-allow-origin'], 'http://[::1]:3000')
  const pre = await request(`${url}/v6/a`, { method: 'OPTIONS', headers: preflight('http://[::1]:3000', 'PUT') })
  await pre.body.text()
  t.same([pre.statusCode, pre.headers['access-control-allow-origin']], [204, 'http://[::1]:3000'], 'its preflight answered')
  for (const other of ['http://[::2]:3000', 'http://[::1]:3001', 'https://[::1]:3000']) {
    const res = await request(`${url}/v6/a`, { headers: { origin: other } })
    await res.body.text()
    t.equal(res.headers['access-control-allow-origin'], undefined, `${other}: another origin`)
  }
})

t.test('located config errors', async t => {
  const dir = tempDir(t, 'cors-config')
  const cases: Array<[string, RegExp]> = [
    ['cors: { origins: ["https://app.example.com/path"] }', /gateway\.yaml:\d+:\d+ routes\[0\]\.cors\.origins\[0\]: expected "\*" or an origin/],
    // never what a browser sends: it leaves out the scheme's default port and leading zeros
    ['cors: { origins: ["https://ok.example.com", "https://app.example.com:443", "http://*.example.com:80", "https://app.example.com:08443", "https://app.example.com:70000"] }',
      /origins\[1\]: expected "\*" or an origin[^]*origins\[2\]: expected[^]*origins\[3\]: expected[^]*origins\[4\]: expected/],
    // an IPv6 address only as a browser serializes it, and without subdomains
    ['cors: { origins: ["http://[::1]:3000", "http://[0:0::1]:3000", "http://[::1]:80", "http://*.[::1]", "http://[::1"] }',
      /origins\[1\]: a browser sends this origin as "http:\/\/\[::1\]:3000"[^]*origins\[2\]: expected "\*" or an origin[^]*origins\[3\]: expected[^]*origins\[4\]: expected/],
    // an IPv4 address only in full, as a browser serializes it; a host ending in a number is one
    ['cors: { origins: ["http://127.0.0.1:3000", "http://127.1", "http://0x7f.0.0.1:8080", "http://127.000.000.001", "http://2130706433", "https://app.1", "https://*.app.1"] }',
      new RegExp([
        'origins\\[1\\]: a browser sends this origin as "http://127\\.0\\.0\\.1"',
        'origins\\[2\\]: a browser sends this origin as "http://127\\.0\\.0\\.1:8080"',
        'origins\\[3\\]: a browser sends this origin as "http://127\\.0\\.0\\.1"',
        'origins\\[4\\]: a browser sends this origin as "http://127\\.0\\.0\\.1"',
        'origins\\[5\\]: expected "\\*" or an origin',
        'origins\\[6\\]: expected "\\*" or an origin'
      ].join('[^]*'))],
    // a name in another script only in its ASCII form, as a browser sends it
    ['cors: { origins: ["https://bücher.example", "https://*.bücher.example:8443", "https://bücher.example/path"] }',
      /origins\[0\]: a browser sends this origin as "https:\/\/xn--bcher-kva\.example"[^]*origins\[1\]: a browser sends this origin as "https:\/\/\*\.xn--bcher-kva\.example:8443"[^]*origins\[2\]: expected "\*" or an origin/],
    ['cors: { origins: ["*"], credentials: true }', /routes\[0\]\.cors\.credentials: credentials: true with origins "\*"/],
    ['cors: { origins: ["https://a.example.com"] }\n    headers: { response: { set: { access-control-allow-origin: "*" } } }', /routes\[0\]\.headers\.response\.set\.access-control-allow-origin: access-control-allow-origin is written by the route's cors/]
  ]
  for (const [route, want] of cases) {
    const file = join(dir, 'gateway.yaml')
    writeFileSync(file, `upstreams:\n  b: { targets: ["http://127.0.0.1:9"] }\nroutes:\n  - name: r\n    pathPrefix: /\n    upstream: b\n    ${route}\n`)
    const run = await gateway(['validate', '-c', file])
    t.equal(run.code, 1, route)
    t.match(run.stderr, want)
  }
})

t.test('preflights still pass the local level: a flooding address is shed (429)', async t => {
  const up = await startHttpServer(t, (_req, res) => res.end('up'))
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
local: { limit: 2, window: 1h }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend, cors: { origins: ["https://app.example.com"] } }
`)
  const got: number[] = []
  let shedVary: unknown
  for (let i = 0; i < 3; i++) {
    const res = await request(`${gw.url}/a`, { method: 'OPTIONS', headers: preflight('https://app.example.com', 'GET') })
    await res.body.text()
    got.push(res.statusCode)
    shedVary = res.headers.vary
  }
  t.same(got, [204, 204, 429], 'the third preflight of the address is shed by the local level')
  t.equal(shedVary, 'Origin', 'its 429 varies by Origin, as the preflight\'s grant does')
})

t.test('cors.methods bounds what a preflight may ask; the gateway\'s own 401, 413 and 504 carry the policy; a preflight refused varies by Origin', async t => {
  const upstream = await startHttpServer(t, (req, res) => {
    if (req.url?.startsWith('/slow/') === true) {
      setTimeout(() => res.end('late'), 2000).unref()
      return
    }
    // every CORS field an upstream may send of its own, and a Vary of "*"
    res.writeHead(200, { 'access-control-allow-origin': '*', 'access-control-allow-credentials': 'true', 'access-control-expose-headers': 'x-secret', 'access-control-allow-methods': 'PUT', vary: '*' })
    res.end('up')
  })
  const origin = 'https://app.example.com'
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { apiKeys: { header: x-api-key, keys: { k-0123456789abcdef: alice } } }
upstreams:
  backend: { targets: [${upstream.url}], retries: 0, timeouts: { response: 300ms } }
routes:
  - { name: reads, pathPrefix: /reads/, upstream: backend, cors: { origins: ["${origin}"], methods: [GET, POST] } }
  - { name: keyed, pathPrefix: /keyed/, upstream: backend, auth: required, cors: { origins: ["${origin}"] } }
  - { name: small, pathPrefix: /small/, upstream: backend, maxBodySize: 10, cors: { origins: ["${origin}"] } }
  - { name: slow, pathPrefix: /slow/, upstream: backend, cors: { origins: ["${origin}"] } }
`)
  // cors.methods: a route that takes every method grants a preflight only these
  const del = await request(`${gw.url}/reads/a`, { method: 'OPTIONS', headers: preflight(origin, 'DELETE') })
  const refused = await del.body.json() as { error: string, reason: string }
  t.same([del.statusCode, refused.error, del.headers['access-control-allow-methods'], del.headers['access-control-allow-origin']], [403, 'GW_ERR_CORS_REJECTED', undefined, undefined])
  t.match(refused.reason, /the method "DELETE" is not in the route's cors\.methods/)
  t.equal(del.headers.vary, 'Origin', 'the refusal varies by Origin, as a grant does')
  const post = await request(`${gw.url}/reads/a`, { method: 'OPTIONS', headers: preflight(origin, 'POST') })
  await post.body.text()
  t.same([post.statusCode, post.headers['access-control-allow-methods']], [204, 'POST'])
  t.match(post.headers.vary, /^Origin/)

  // the upstream's own CORS fields are replaced by the policy's, its Vary kept
  const ok = await request(`${gw.url}/reads/a`, { headers: { origin } })
  t.equal(await ok.body.text(), 'up')
  t.same([ok.headers['access-control-allow-origin'], ok.headers['access-control-allow-credentials'], ok.headers['access-control-allow-methods']], [origin, undefined, undefined], 'no credentials or methods of the upstream\'s')
  t.notMatch(String(ok.headers['access-control-expose-headers']), /x-secret/, 'nor its expose list')
  t.equal(ok.headers.vary, '*', 'a Vary of "*" says all: Origin is not added')

  // the gateway's own answers
  const unauthorized = await request(`${gw.url}/keyed/a`, { headers: { origin } })
  const tooLarge = await request(`${gw.url}/small/a`, { method: 'POST', body: 'x'.repeat(20), headers: { origin } })
  const late = await request(`${gw.url}/slow/a`, { headers: { origin } })
  for (const [name, res, status] of [['401', unauthorized, 401], ['413', tooLarge, 413], ['504', late, 504]] as const) {
    await res.body.text()
    t.same([res.statusCode, res.headers['access-control-allow-origin'], res.headers.vary], [status, origin, 'Origin'], `the ${name} is readable by the script`)
  }
})
