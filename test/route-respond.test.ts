// A route's `respond`: the gateway answers the requests the route admits itself and forwards
// nothing (a maintenance page, a retired path's 410), as Kong's request-termination and nginx's
// `return` do. The request is admitted first, as one that is forwarded: its address, credentials
// and limits apply, and its answer carries the RateLimit, CORS and X-Request-Id fields.
import t from 'tap'
import { request } from 'undici'
import { writeFileSync } from 'node:fs'
import { startGateway, writeConfig } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { gateway, explainOutput } from './helpers/cli.js'
import { tempDir } from './helpers/teardown.js'
import { parseResponses, rawConnection } from './helpers/raw-http.js'

const yaml = (up: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up}] }
routes:
  - name: maintenance
    pathPrefix: /shop/
    respond:
      status: 503
      body: '{"error":"maintenance","message":"back at 14:00 UTC"}'
      contentType: application/json
      headers: { retry-after: "3600", cache-control: no-store }
    limits:
      ip: { algorithm: fixed-window, limit: 3, window: 1h }
    cors: { origins: ["https://app.example.com"] }
  - { name: gone, path: /v1/old, respond: { status: 410 } }
  - { name: private, pathPrefix: /internal/, respond: { status: 204 }, ipRestriction: { allow: [10.0.0.0/8] } }
  - { name: members, pathPrefix: /members/, respond: { status: 200, body: "hello member" }, auth: required }
  - { name: api, pathPrefix: /, upstream: backend }
`

t.test('the route\'s answer, with what the request adds; nothing forwarded', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url))
  const res = await request(gw.url + '/shop/cart', { headers: { origin: 'https://app.example.com' } })
  t.equal(res.statusCode, 503)
  t.same(await res.body.json(), { error: 'maintenance', message: 'back at 14:00 UTC' })
  t.equal(res.headers['content-type'], 'application/json')
  t.equal(res.headers['retry-after'], '3600')
  t.equal(res.headers['cache-control'], 'no-store')
  t.match(res.headers['x-request-id'], /\S+/)
  t.match(res.headers.ratelimit, /^"maintenance\.ip";r=2;t=\d+$/, 'the RateLimit fields of the limit it was admitted under (3, one spent)')
  t.equal(res.headers['access-control-allow-origin'], 'https://app.example.com', 'the route\'s CORS fields')
  const preflight = await request(gw.url + '/shop/cart', { method: 'OPTIONS', headers: { origin: 'https://app.example.com', 'access-control-request-method': 'GET' } })
  t.same([preflight.statusCode, preflight.headers['access-control-allow-origin']], [204, 'https://app.example.com'], 'a CORS preflight is answered as on every cors route')
  await preflight.body.dump()
  const head = await request(gw.url + '/shop/cart', { method: 'HEAD' })
  t.equal(head.statusCode, 503)
  t.equal(head.headers['content-length'], String(Buffer.byteLength('{"error":"maintenance","message":"back at 14:00 UTC"}')), 'HEAD: the length of the body a GET gets')
  t.equal(await head.body.text(), '')
  const posted = await request(gw.url + '/shop/order', { method: 'POST', body: 'x'.repeat(100_000) })
  t.equal(posted.statusCode, 503, 'a request with a body gets the answer too')
  await posted.body.dump()
  t.equal((await request(gw.url + '/shop/cart')).statusCode, 429, 'the ip limit of 3 holds: the fourth is refused')
  const gone = await request(gw.url + '/v1/old')
  t.same([gone.statusCode, gone.headers['content-type'], gone.headers['content-length'], await gone.body.text()], [410, undefined, '0', ''], 'no body: no Content-Type')
  const empty = await request(gw.url + '/internal/x', { headers: { 'x-forwarded-for': '10.1.2.3' } })
  t.equal(empty.statusCode, 403, 'ipRestriction applies (the peer is no trusted proxy)')
  await empty.body.dump()
  const anonymous = await request(gw.url + '/members/x')
  t.equal(anonymous.statusCode, 401, 'auth: required applies')
  await anonymous.body.dump()
  const member = await request(gw.url + '/members/x', { headers: { 'x-user-id': 'alice' } })
  t.same([member.statusCode, member.headers['content-type'], await member.body.text()], [200, 'text/plain; charset=utf-8', 'hello member'])
  t.same(up.log, [], 'nothing reached the upstream')
  t.equal((await request(gw.url + '/other')).statusCode, 200, 'the forwarding route behind them forwards')
  const lines = gw.lines.filter(l => l.msg === 'request')
  t.match(lines[0], { route: 'maintenance', status: 503, outcome: 'responded', bytesOut: 53 })
  t.match(lines.find(l => l.method === 'HEAD'), { status: 503, outcome: 'responded', bytesOut: 0 }, 'a HEAD sent no body')
  t.notOk('target' in (lines[0] as object), 'no target')
  t.match(lines.find(l => l.route === 'members' && l.status === 200), { outcome: 'responded', user: 'alice' })
})

t.test('a request body is read and dropped: the connection serves the next request', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url))
  const c = rawConnection(gw.port)
  // 1 MiB of body by length, then 1 MiB chunked, then a GET: each after the body on one connection
  const mib = 'x'.repeat(1 << 20)
  c.send(`POST /v1/old HTTP/1.1\r\nHost: a\r\nContent-Length: ${mib.length}\r\n\r\n${mib}`)
  c.send(`POST /v1/old HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n${(mib.length).toString(16)}\r\n${mib}\r\n0\r\n\r\n`)
  c.send('GET /v1/old HTTP/1.1\r\nHost: a\r\n\r\n')
  const replies = parseResponses(await c.untilText(/(HTTP\/1\.1 410[^]*){3}/))
  t.same(replies.map(r => r.status), [410, 410, 410], 'three answers on one connection')
  t.same(replies.map(r => r.headers.connection), ['keep-alive', 'keep-alive', 'keep-alive'], 'none closes it')
  const lines = gw.lines.filter(l => l.msg === 'request')
  t.same(lines.map(l => `${String(l.method)} ${String(l.status)}`), ['POST 410', 'POST 410', 'GET 410'], 'each logged once, the body no request of its own')
  t.same(up.log, [], 'nothing reached the upstream')
})

t.test('a 204 carries neither body nor Content-Length; /routes and explain tell a respond route', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url).replace('allow: [10.0.0.0/8]', 'allow: [loopback]'))
  const res = await request(gw.url + '/internal/x')
  t.same([res.statusCode, res.headers['content-length'], res.headers['content-type']], [204, undefined, undefined])
  await res.body.dump()
  const routes = await (await request(gw.adminUrl + '/routes')).body.json() as { routes: Array<{ name: string, upstream: unknown, respond: unknown }> }
  t.same(routes.routes.map(r => [r.name, r.respond, r.upstream === null ? null : (r.upstream as { name: string }).name]), [['maintenance', 503, null], ['gone', 410, null], ['private', 204, null], ['members', 200, null], ['api', null, 'backend']])
  const file = writeConfig(t, yaml(up.url))
  t.match(explainOutput(file, 'GET', '/shop/x'), /route: {3}maintenance -> respond 503 \(answered by the gateway once admitted, nothing forwarded\)/)
  t.match(explainOutput(file, 'GET', '/x'), /route: {3}api -> upstream backend/)
})

t.test('a reload turns a route into a respond route and back', async t => {
  const up = await startUpstream(t)
  const forwarding = `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
  const gw = await startGateway(t, forwarding)
  t.equal((await request(gw.url + '/x')).statusCode, 200)
  writeFileSync(gw.configFile, forwarding.replace('upstream: backend }', 'respond: { status: 503, body: down for maintenance } }'))
  t.equal((await gw.reload()).ok, true)
  const down = await request(gw.url + '/x')
  t.same([down.statusCode, await down.body.text()], [503, 'down for maintenance'])
  writeFileSync(gw.configFile, forwarding)
  t.equal((await gw.reload()).ok, true)
  t.equal((await request(gw.url + '/x')).statusCode, 200)
  t.equal(up.log.length, 2)
})

t.test('mistakes are located errors', async t => {
  const file = `${tempDir(t, 'route-respond')}/gateway.yaml`
  writeFileSync(file, `upstreams:
  backend: { targets: [http://127.0.0.1:9] }
routes:
  - { name: both, pathPrefix: /a/, upstream: backend, respond: { status: 503 } }
  - { name: neither, pathPrefix: /b/ }
  - { name: ws, pathPrefix: /c/, websocket: true, stripPrefix: /c, respond: { status: 503 } }
  - { name: fields, pathPrefix: /d/, respond: { status: 200, headers: { content-length: "3", Content-Type: text/html, connection: close } } }
  - { name: nobody, pathPrefix: /e/, respond: { status: 204, body: x } }
  - { name: rules, pathPrefix: /g/, respond: { status: 200 }, headers: { response: { set: { x-a: "1" } } } }
  - { name: retried, pathPrefix: /i/, respond: { status: 200 }, retries: 2, retryOn: [503], retryBackoff: { base: 25ms } }
`)
  const run = await gateway(['validate', '-c', file])
  t.equal(run.code, 1)
  const expected = [
    /gateway\.yaml:4:\d+ routes\[0\]: a route needs exactly one of "upstream" \(forward\) or "respond" \(the gateway answers\)/,
    /gateway\.yaml:5:\d+ routes\[1\]: a route needs exactly one of "upstream"/,
    /gateway\.yaml:6:\d+ routes\[2\]\.websocket: a route with "respond" forwards nothing/,
    /gateway\.yaml:6:\d+ routes\[2\]\.stripPrefix: a route with "respond" forwards nothing/,
    /gateway\.yaml:7:\d+ routes\[3\]\.respond\.headers\.content-length: "content-length" is written by the gateway/,
    /gateway\.yaml:7:\d+ routes\[3\]\.respond\.headers\.Content-Type: set it with respond\.contentType/,
    /gateway\.yaml:7:\d+ routes\[3\]\.respond\.headers\.connection: "connection" is written by the gateway/,
    /gateway\.yaml:8:\d+ routes\[4\]\.respond\.body: a 204 carries no body/,
    /gateway\.yaml:9:\d+ routes\[5\]\.headers: a route with "respond" forwards nothing/,
    /gateway\.yaml:10:\d+ routes\[6\]\.retries: a route with "respond" forwards nothing/,
    /gateway\.yaml:10:\d+ routes\[6\]\.retryOn: a route with "respond" forwards nothing/,
    /gateway\.yaml:10:\d+ routes\[6\]\.retryBackoff: a route with "respond" forwards nothing/
  ]
  for (const re of expected) t.match(run.stderr, re)
  writeFileSync(file, `upstreams:
  backend: { targets: [http://127.0.0.1:9] }
routes:
  - { name: interim, pathPrefix: /f/, respond: { status: 101 } }
  - { name: huge, pathPrefix: /h/, respond: { status: 200, body: "${'x'.repeat(64 * 1024 + 1)}" } }
  - { name: wide, pathPrefix: /w/, respond: { status: 200, body: "${'é'.repeat(32 * 1024 + 1)}" } }
  - { name: full, pathPrefix: /u/, respond: { status: 200, body: "${'é'.repeat(32 * 1024)}" } }
`)
  const schema = await gateway(['validate', '-c', file])
  t.equal(schema.code, 1)
  t.match(schema.stderr, /gateway\.yaml:4:\d+ routes\[0\]\.respond\.status: expected a final status, 200 to 599/)
  t.match(schema.stderr, /gateway\.yaml:5:\d+ routes\[1\]\.respond\.body: at most 65536 bytes/)
  // 32769 characters of two bytes each: under the bound in characters, over it in bytes
  t.match(schema.stderr, /gateway\.yaml:6:\d+ routes\[2\]\.respond\.body: at most 65536 bytes \(UTF-8\)/)
  t.notMatch(schema.stderr, /routes\[3\]/, 'exactly 65536 bytes is taken')
})
