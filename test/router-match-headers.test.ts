// A route's matchHeaders: requests are routed by their header fields too (a canary by a header, an
// API version by Accept-Version), through the live gateway and `gateway explain` alike. Routes are
// still tried in file order, the first match wins; a preflight is routed without the conditions
// (it carries none of the script's fields); mistakes are located errors or warnings.
import t from 'tap'
import { request } from 'undici'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { startGateway, writeConfig } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { gateway, explainOutput } from './helpers/cli.js'
import { tempDir } from './helpers/teardown.js'

const routes = (stable: string, canary: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  stable: { targets: [${stable}] }
  canary: { targets: [${canary}] }
routes:
  - name: canary
    pathPrefix: /api/
    matchHeaders: { x-canary: "1", x-legacy: false }
    upstream: canary
    cors: { origins: ["https://app.example.com"] }
  - name: v2
    pathPrefix: /api/
    matchHeaders: { accept-version: [v2, v3] }
    upstream: canary
  - name: debug
    pathPrefix: /api/
    methods: [DELETE]
    matchHeaders: { x-debug: true }
    upstream: canary
  - name: stable
    pathPrefix: /api/
    methods: [GET, POST]
    upstream: stable
    cors: { origins: ["https://other.example.com"] }
`

t.test('requests are routed by their headers, first match in file order', async t => {
  const stable = await startUpstream(t, 'stable')
  const canary = await startUpstream(t, 'canary')
  const gw = await startGateway(t, routes(stable.url, canary.url))
  const ask = async (headers: Record<string, string>, method = 'GET'): Promise<[number, string]> => {
    const res = await request(gw.url + '/api/x', { method: method as 'GET', headers })
    const text = await res.body.text()
    return [res.statusCode, text.startsWith('{"error"') ? (JSON.parse(text) as { error: string }).error : (JSON.parse(text) as { name: string }).name]
  }
  t.same(await ask({ 'x-canary': '1' }), [200, 'canary'])
  t.same(await ask({ 'x-canary': '0' }), [200, 'stable'])
  t.same(await ask({ 'x-canary': '1', 'x-legacy': 'yes' }), [200, 'stable'], 'a field the route needs absent')
  t.same(await ask({ 'accept-version': 'v3' }), [200, 'canary'])
  t.same(await ask({ 'accept-version': 'v1' }), [200, 'stable'])
  t.same(await ask({ 'x-debug': '' }, 'DELETE'), [200, 'canary'], 'present, whatever the value')
  t.same(await ask({}, 'DELETE'), [405, 'GW_ERR_METHOD_NOT_ALLOWED'], 'no route takes a DELETE without x-debug')
  const res = await request(gw.url + '/api/x', { method: 'DELETE' })
  t.equal(res.headers.allow, 'GET, HEAD, POST', 'its Allow lists the methods of the routes that match the headers')
  await res.body.dump()
  t.same(gw.lines.filter(l => l.msg === 'request').map(l => l.route), ['canary', 'stable', 'stable', 'v2', 'stable', 'debug', '-', '-'])
})

t.test('a preflight is routed without the conditions: the first route on the path answers it', async t => {
  const stable = await startUpstream(t, 'stable')
  const canary = await startUpstream(t, 'canary')
  const gw = await startGateway(t, routes(stable.url, canary.url))
  const res = await request(gw.url + '/api/x', { method: 'OPTIONS', headers: { origin: 'https://app.example.com', 'access-control-request-method': 'GET', 'access-control-request-headers': 'x-canary' } })
  t.equal(res.statusCode, 204, 'the canary route\'s policy, though the preflight carries no x-canary')
  t.equal(res.headers['access-control-allow-origin'], 'https://app.example.com')
  await res.body.dump()
  t.same([stable.requests, canary.requests], [0, 0])
})

t.test('a route with conditions and no cors does not keep the preflight from the cors route behind it', async t => {
  // an internal canary without cors before the browser-facing route: the script's requests carry
  // no x-canary and reach the route with cors, and so must its preflight
  const stable = await startUpstream(t, 'stable')
  const canary = await startUpstream(t, 'canary')
  const config = `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  stable: { targets: [${stable.url}] }
  canary: { targets: [${canary.url}] }
routes:
  - { name: canary, pathPrefix: /api/, matchHeaders: { x-canary: "1" }, upstream: canary }
  - { name: stable, pathPrefix: /api/, methods: [GET, POST], upstream: stable, cors: { origins: ["https://app.example.com"] } }
`
  const gw = await startGateway(t, config)
  const origin = 'https://app.example.com'
  const preflight = await request(gw.url + '/api/x', { method: 'OPTIONS', headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type' } })
  await preflight.body.dump()
  t.equal(preflight.statusCode, 204, 'answered by the gateway with the cors route\'s policy')
  t.equal(preflight.headers['access-control-allow-origin'], origin)
  t.same([stable.requests, canary.requests], [0, 0], 'not forwarded')
  const call = await request(gw.url + '/api/x', { method: 'POST', headers: { origin, 'content-type': 'application/json' }, body: '{}' })
  await call.body.dump()
  t.same([call.statusCode, call.headers['access-control-allow-origin']], [200, origin], 'the call it announced reaches the cors route')
  // a 405 on the path carries the policy a preflight gets
  const put = await request(gw.url + '/api/x', { method: 'PUT', headers: { origin } })
  await put.body.dump()
  t.same([put.statusCode, put.headers['access-control-allow-origin']], [405, origin])
  const file = writeConfig(t, config)
  t.match(explainOutput(file, 'OPTIONS', '/api/x', '--header', `origin: ${origin}`, '--header', 'access-control-request-method: POST'), /route: {3}stable -> CORS preflight for POST: 204/)
})

t.test('gateway explain routes by the headers given', async t => {
  const file = writeConfig(t, routes('http://127.0.0.1:9', 'http://127.0.0.1:9'))
  t.match(explainOutput(file, 'GET', '/api/x', '--header', 'x-canary: 1'), /route: {3}canary -> upstream canary/)
  t.match(explainOutput(file, 'GET', '/api/x'), /route: {3}stable -> upstream stable/)
  t.match(explainOutput(file, 'DELETE', '/api/x'), /405 GW_ERR_METHOD_NOT_ALLOWED \(Allow: GET, HEAD, POST\)/)
})

t.test('a field given twice is one value to explain as to the live gateway', async t => {
  const stable = await startUpstream(t, 'stable')
  const canary = await startUpstream(t, 'canary')
  const config = routes(stable.url, canary.url)
  const gw = await startGateway(t, config)
  // two lines: node joins them ("v2, v3"), which no list holds
  const res = await request(gw.url + '/api/x', { headers: { 'accept-version': ['v2', 'v3'] } })
  t.equal((JSON.parse(await res.body.text()) as { name: string }).name, 'stable', 'live: "v2, v3" is neither v2 nor v3')
  const file = writeConfig(t, config)
  t.match(explainOutput(file, 'GET', '/api/x', '--header', 'accept-version: v2', '--header', 'accept-version: v3'), /route: {3}stable -> upstream stable/, 'explain: the same route')
  // node keeps the first User-Agent (and Authorization, Content-Type...) a request repeats
  writeFileSync(file, config.replace('matchHeaders: { accept-version: [v2, v3] }', 'matchHeaders: { user-agent: probe }'))
  t.match(explainOutput(file, 'GET', '/api/x', '--header', 'user-agent: probe', '--header', 'user-agent: other'), /route: {3}v2 -> upstream canary/)
})

t.test('names are case-insensitive: a name written capitalized in the file matches the field however the client spells it', async t => {
  const up = await startUpstream(t, 'canary')
  const stable = await startUpstream(t, 'stable')
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  canary: { targets: [${up.url}] }
  stable: { targets: [${stable.url}] }
routes:
  - { name: canary, pathPrefix: /api/, matchHeaders: { X-Canary: "1", Accept-Version: [V2], X-Legacy: false }, upstream: canary }
  - { name: stable, pathPrefix: /api/, upstream: stable }
`)
  const routeOf = async (headers: Record<string, string>): Promise<string> => {
    const res = await request(gw.url + '/api/x', { headers })
    return (JSON.parse(await res.body.text()) as { name: string }).name
  }
  t.equal(await routeOf({ 'x-canary': '1', 'accept-version': 'V2' }), 'canary', 'lowercase fields')
  t.equal(await routeOf({ 'X-CANARY': '1', 'Accept-Version': 'V2' }), 'canary', 'uppercase fields')
  t.equal(await routeOf({ 'x-canary': '1', 'accept-version': 'v2' }), 'stable', 'values stay case-sensitive')
  t.equal(await routeOf({ 'x-canary': '1', 'accept-version': 'V2', 'x-LEGACY': '1' }), 'stable', 'an absent condition is met by no spelling of the field')
  const file = writeConfig(t, `upstreams:
  canary: { targets: [${up.url}] }
routes:
  - { name: canary, pathPrefix: /api/, matchHeaders: { X-Canary: "1" }, upstream: canary }
`)
  t.match(explainOutput(file, 'GET', '/api/x', '--header', 'x-canary: 1'), /route: {3}canary -> upstream canary/, 'explain: the same')
})

t.test('mistakes are located: a value of another type, the Host field, a route the conditions cannot reach', async t => {
  const file = join(tempDir(t, 'gw-match-headers'), 'gateway.yaml')
  writeFileSync(file, `upstreams:
  backend: { targets: [http://127.0.0.1:9] }
routes:
  - { name: a, pathPrefix: /a/, upstream: backend, matchHeaders: { x-n: 1 } }
  - { name: b, pathPrefix: /b/, upstream: backend, matchHeaders: { Host: api.example.com } }
  - { name: c, pathPrefix: /c/, upstream: backend, matchHeaders: { "x y": "1" } }
`)
  const run = await gateway(['validate', '-c', file])
  t.equal(run.code, 1)
  t.match(run.stderr, /gateway\.yaml:4:\d+ routes\[0\]\.matchHeaders\.x-n: expected a value \(text: quote one that YAML reads as a number\), a list of values, true \(present\) or false \(absent\)/)
  t.match(run.stderr, /gateway\.yaml:6:\d+ routes\[2\]\.matchHeaders\.x y: not a header name/)
  writeFileSync(file, `upstreams:
  backend: { targets: [http://127.0.0.1:9] }
routes:
  - { name: b, pathPrefix: /b/, upstream: backend, matchHeaders: { Host: api.example.com } }
  - { name: all, pathPrefix: /, upstream: backend }
  - { name: late, pathPrefix: /api/, upstream: backend, matchHeaders: { x-canary: "1" } }
`)
  const host = await gateway(['validate', '-c', file])
  t.equal(host.code, 1)
  t.match(host.stderr, /gateway\.yaml:4:\d+ routes\[0\]\.matchHeaders\.Host: the host is matched by the route's "host"/)
  // conditions no request can meet, which no unreachable-route warning tells
  writeFileSync(file, `upstreams:
  backend: { targets: [http://127.0.0.1:9] }
routes:
  - { name: twice, pathPrefix: /t/, upstream: backend, matchHeaders: { X-Canary: "1", x-canary: "2" } }
  - { name: blank, pathPrefix: /b/, upstream: backend, matchHeaders: { accept-version: [v1, " v2"] } }
  - { name: fine, pathPrefix: /f/, upstream: backend, matchHeaders: { x-a: "a b", x-b: "" } }
`)
  const never = await gateway(['validate', '-c', file])
  t.equal(never.code, 1)
  t.match(never.stderr, /gateway\.yaml:4:\d+ routes\[0\]\.matchHeaders\.x-canary: "X-Canary" names the same field \(names are case-insensitive\)/)
  t.match(never.stderr, /gateway\.yaml:5:\d+ routes\[1\]\.matchHeaders\.accept-version: a value starting or ending with a space or tab matches no request/)
  t.notMatch(never.stderr, /routes\[2\]/, 'an inner space and an empty value are values a request can carry')
  writeFileSync(file, `upstreams:
  backend: { targets: [http://127.0.0.1:9] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
  - { name: late, pathPrefix: /api/, upstream: backend, matchHeaders: { x-canary: "1" } }
`)
  const late = await gateway(['validate', '-c', file])
  t.equal(late.code, 0)
  t.match(late.stderr, /gateway\.yaml:5:\d+ routes\[1\]\.pathPrefix: never matches: routes\[0\] \(all\) comes first/, 'a header route behind a catch-all is a located warning')
})
