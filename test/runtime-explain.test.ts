// Issue 7 item 6 (and issue 9's "explain doesn't know plans"): `gateway explain` asks the runtime
// compiled by the live gateway's own factory, so it cannot disagree with it. Each case sends the
// same request to `bin/gateway explain` and to a running gateway started from the same file.
// Regressions: explain called a bad API key "anonymous" (live: 401), ignored `routing:` defaults
// such as caseInsensitive (explain: 404, live: routed), and did not know consumers' plans.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { explainOutput } from './helpers/cli.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import { rawRequest } from './helpers/raw-http.js'

const explain = explainOutput

t.test('explain and the live gateway agree: bad API key, routing defaults, plans', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
routing: { caseInsensitive: true }
identity:
  apiKeys: { header: x-api-key, keys: { k-alice: alice, k-bob: bob } }
consumers:
  alice: { plan: pro }
defaultPlan: free
plans:
  free: { limits: { user: { algorithm: fixed-window, limit: 2, window: 1m } } }
  pro: { limits: { user: { algorithm: fixed-window, limit: 100, window: 1m } } }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: internal, host: admin.internal, pathPrefix: /api/, upstream: backend, headers: { request: { set: { x-route: internal } } } }
  - { name: admin, pathPrefix: /Admin/, upstream: backend }
  - { name: api, pathPrefix: /api/, upstream: backend }
`)
  const file = gw.runtime?.file as string

  t.test('a bad API key: 401 in both', async t => {
    const text = explain(file, 'GET', '/api/x', '--header', 'x-api-key:not-a-key')
    t.match(text, /^result: +401 GW_ERR_UNAUTHORIZED/m, text)
    t.notMatch(text, /anonymous/, 'not "anonymous"')
    const live = await send(`${gw.url}/api/x`, { headers: { 'x-api-key': 'not-a-key' } })
    t.equal(live.status, 401)
    t.equal(live.json?.error, 'GW_ERR_UNAUTHORIZED')
  })

  t.test('a method node does not know, or one in lower case, is a 400 in both (explain routed "get" as GET)', async t => {
    for (const [method, why] of [['get', 'methods are case-sensitive: GET'], ['FOO', 'not a method node\'s HTTP parser knows']] as const) {
      t.equal(explain(file, method, '/api/x'), `400 GW_ERR_BAD_REQUEST: HPE_INVALID_METHOD (${why})\n`)
      const live = await rawRequest(gw.port, `${method} /api/x HTTP/1.1\r\nHost: a\r\n`)
      t.equal(live.status, 400)
      t.same([live.json?.error, live.json?.message], ['GW_ERR_BAD_REQUEST', 'HPE_INVALID_METHOD'])
    }
  })

  t.test('routing.caseInsensitive applies to every route: routed in both', async t => {
    const text = explain(file, 'GET', '/admin/users')
    t.match(text, /^route: +admin -> upstream backend$/m, text)
    const live = await send(`${gw.url}/admin/users`)
    t.equal(live.status, 200, 'the live gateway routes it')
    t.equal(live.json?.url, '/admin/users', 'and the upstream got it')
  })

  t.test("a consumer's plan decides its limits: the same limit in both", async t => {
    for (const [key, user, plan, limit] of [['k-alice', 'alice', 'pro', 100], ['k-bob', 'bob', 'free', 2]] as const) {
      const text = explain(file, 'GET', '/api/x', '--header', `x-api-key:${key}`)
      t.match(text, new RegExp(`^client: .*user ${user}, plan ${plan}$`, 'm'), text)
      t.match(text, new RegExp(`^limit: +${plan}:user \\[user\\] fixed-window: limit ${limit} per 60000ms;`, 'm'), `${user}: the plan's user limit`)
      t.equal(text.split('\n').filter(l => l.startsWith('limit:')).length, 1, `${user}: and no other`)
      const live = await send(`${gw.url}/api/x`, { headers: { 'x-api-key': key } })
      t.equal(live.status, 200)
      t.match(String(live.headers['ratelimit-policy']), `"${plan}:user";q=${limit};w=60`, `${user}: the live gateway applies the same limit`)
    }
    // --user names a consumer without a credential: its plan is the one its requests get
    t.match(explain(file, 'GET', '/api/x', '--user', 'alice'), /^limit: +pro:user /m, '--user alice: plan pro')
    t.match(explain(file, 'GET', '/api/x', '--user', 'carol'), /^limit: +free:user /m, '--user carol: the defaultPlan')
  })

  t.test('an absolute-form target is routed by its authority, not by Host, in both', async t => {
    const text = explain(file, 'GET', 'http://admin.internal/api/x', '--header', 'host:a')
    t.match(text, /^route: +internal -> upstream backend$/m, text)
    const live = await rawRequest(gw.port, 'GET http://admin.internal/api/x HTTP/1.1\r\nHost: a\r\n')
    t.equal(live.status, 200)
    t.equal((live.json?.headers as Record<string, string> | undefined)?.['x-route'], 'internal', 'the live gateway routes it there too')
    t.match(explain(file, 'GET', 'http://u@admin.internal/api/x'), /^400 GW_ERR_BAD_REQUEST/, 'a userinfo: 400 in explain')
    t.equal((await rawRequest(gw.port, 'GET http://u@admin.internal/api/x HTTP/1.1\r\nHost: a\r\n')).status, 400, 'and live')
  })

  t.test('paths the gateway refuses are refused by explain too (URL parsing resolved them to a route)', async t => {
    for (const target of ['/api/..\\Admin/x', '/api/../../Admin/x', '/api/x#frag']) {
      const text = explain(file, 'GET', target)
      t.match(text, /^400 GW_ERR_BAD_PATH/, `explain ${target}: ${text}`)
      const live = await rawRequest(gw.port, `GET ${target} HTTP/1.1\r\nHost: a\r\n`)
      t.equal(live.status, 400, `live ${target}: 400`)
    }
    t.match(explain(file, 'GET', 'http://[::1'), /^400 /, 'an absolute-form target that is not a URL: 400, not a crash')
    t.match(explain(file, 'GET', '/api/x?q=..%2F'), /^request: GET \/api\/x\?q=\.\.%2F /m, 'the query is shown as sent')
  })

  t.test('targets node\'s parser refuses are refused by explain too (it routed them to api)', async t => {
    t.equal(explain(file, 'GET', '/api/café'), '400 GW_ERR_BAD_REQUEST: HPE_INVALID_URL (a request target is ASCII: percent-encode the rest, é as %C3%A9)\n')
    const raw = await rawRequest(gw.port, 'GET /api/café HTTP/1.1\r\nHost: a\r\n')
    t.same([raw.status, raw.json?.error, raw.json?.message], [400, 'GW_ERR_BAD_REQUEST', 'HPE_INVALID_URL'], 'live: 400')
    t.match(explain(file, 'GET', '/api/caf%C3%A9'), /^route: +api /m, 'percent-encoded: routed')
    // server.maxHeaderSize is 16384 by default
    const long = `/api/${'a'.repeat(17_000)}`
    t.equal(explain(file, 'GET', long), '414 GW_ERR_URI_TOO_LONG: the request line is longer than server.maxHeaderSize (16384 bytes)\n')
    const tooLong = await rawRequest(gw.port, `GET ${long} HTTP/1.1\r\nHost: a\r\n`)
    t.same([tooLong.status, tooLong.json?.error], [414, 'GW_ERR_URI_TOO_LONG'], 'live: 414')
  })
})
