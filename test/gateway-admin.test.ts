// The admin listener of a real gateway: /healthz, /readyz, /metrics after real traffic, /config
// with every kind of secret redacted, and a Redis that cannot be reached (the gateway still
// starts, serves and reports itself degraded).
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { backendConfig, spawnGateway, startGateway } from './helpers/gateway.js'
import { rawRequest } from './helpers/raw-http.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

t.test('/healthz and /readyz', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const health = await fetch(`${gw.adminUrl}/healthz`)
  t.equal(health.status, 200)
  t.same(await health.json(), { status: 'ok' })
  const ready = await fetch(`${gw.adminUrl}/readyz`)
  t.equal(ready.status, 200)
  t.same(await ready.json(), {
    status: 'ready',
    generation: 1,
    redis: { state: 'not_configured' },
    upstreams: { backend: [{ url: upstream.url, healthy: true, ejectedForMs: 0, consecutiveFailures: 0 }] }
  })

  const unknown = await fetch(`${gw.adminUrl}/nope`)
  t.equal(unknown.status, 404)
  t.match(await unknown.json(), { error: 'GW_ERR_NOT_FOUND' })
  const post = await fetch(`${gw.adminUrl}/healthz`, { method: 'POST' })
  t.equal(post.status, 405, 'admin endpoints are read-only')
  t.equal(post.headers.get('allow'), 'GET, HEAD', 'the 405 names the methods the path answers (RFC 9110 §15.5.6)')
  t.match(await post.json(), { error: 'GW_ERR_METHOD_NOT_ALLOWED' })
  const postUnknown = await fetch(`${gw.adminUrl}/no-such-path`, { method: 'POST' })
  t.equal(postUnknown.status, 404, 'a path the listener does not serve is a 404 whatever the method')
  t.match(await postUnknown.json(), { error: 'GW_ERR_NOT_FOUND' })
  const putLimits = await fetch(`${gw.adminUrl}/limits`, { method: 'PUT' })
  t.same([putLimits.status, putLimits.headers.get('allow')], [405, 'GET, HEAD, DELETE'], '/limits answers GET, HEAD and DELETE')
  t.match(await putLimits.json(), { error: 'GW_ERR_METHOD_NOT_ALLOWED' })
  // HEAD where GET is (RFC 9110 §9.3.2): the head a GET gets, no body
  for (const path of ['/limits?route=all&ip=127.0.0.1', '/limits?route=nope', '/consumers/nobody']) {
    const got = await fetch(`${gw.adminUrl}${path}`)
    const head = await fetch(`${gw.adminUrl}${path}`, { method: 'HEAD' })
    await got.arrayBuffer()
    t.same([head.status, head.headers.get('content-type'), await head.text()], [got.status, got.headers.get('content-type'), ''], `HEAD ${path}: ${got.status} as the GET, no body`)
  }
  const postConsumer = await fetch(`${gw.adminUrl}/consumers/nobody`, { method: 'POST' })
  t.same([postConsumer.status, postConsumer.headers.get('allow')], [405, 'GET, HEAD'], '/consumers/NAME answers GET and HEAD')
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200, 'the public listener forwards /healthz to the upstream')
  t.equal(upstream.log.length, 1)
})

t.test('a request target the admin listener cannot parse is a 400, and the gateway goes on serving', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await spawnGateway(t, backendConfig(upstream.url, '  - { name: all, pathPrefix: /, upstream: backend }\n'))
  // each of these ended the process: a throw in the admin request listener went uncaught
  const badEscape = await rawRequest(gw.adminPort, 'GET /consumers/%zz HTTP/1.1\r\nHost: localhost\r\n')
  t.same([badEscape.status, badEscape.json?.error], [400, 'GW_ERR_BAD_REQUEST'], '/consumers/%zz')
  const badUrl = await rawRequest(gw.adminPort, 'GET //[ HTTP/1.1\r\nHost: localhost\r\n')
  t.same([badUrl.status, badUrl.json?.error], [400, 'GW_ERR_BAD_REQUEST'], 'GET //[')
  // what node:http cannot parse, answered in JSON as the public listener answers it (node wrote a bare 431 or 400)
  const longQuery = await rawRequest(gw.adminPort, `GET /limits?route=${'a'.repeat(20_000)} HTTP/1.1\r\nHost: localhost\r\n`)
  t.same([longQuery.status, longQuery.json?.error], [414, 'GW_ERR_URI_TOO_LONG'], 'a query over 16 KiB')
  const longField = await rawRequest(gw.adminPort, `GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: ${'b'.repeat(20_000)}\r\n`)
  t.same([longField.status, longField.json?.error], [431, 'GW_ERR_HEADERS_TOO_LARGE'], 'a field over 16 KiB')
  const badHead = await rawRequest(gw.adminPort, 'GET /healthz HTTP/1.1\r\nHost localhost\r\n')
  t.same([badHead.status, badHead.json?.error], [400, 'GW_ERR_BAD_REQUEST'], 'a field without a colon')
  t.equal((await fetch(`${gw.adminUrl}/healthz`)).status, 200, 'the admin listener still answers')
  t.equal((await fetch(`${gw.url}/x`)).status, 200, 'and the public one')
})

t.test('an admin listener on loopback answers loopback Host names only (DNS rebinding)', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, backendConfig(upstream.url, '  - { name: all, pathPrefix: /, upstream: backend }\n'))
  const port = gw.adminPort
  for (const path of ['/config', '/metrics', '/limits?ip=127.0.0.1', '/events']) {
    const rebound = await rawRequest(port, `GET ${path} HTTP/1.1\r\nHost: attacker.example:${port}\r\n`)
    t.same([rebound.status, rebound.json?.error], [421, 'GW_ERR_BAD_REQUEST'], `${path} with the page's own Host: 421`)
  }
  for (const host of [`localhost:${port}`, `127.0.0.1:${port}`, 'LOCALHOST', `[::1]:${port}`]) {
    t.equal((await rawRequest(port, `GET /config HTTP/1.1\r\nHost: ${host}\r\n`)).status, 200, `Host ${host}: answered`)
  }
  t.equal((await fetch(`${gw.adminUrl}/healthz`)).status, 200)
  // bound to every address: reached by name on purpose (the machine's own name is 127.0.1.1 on Debian)
  const open = await startGateway(t, backendConfig(upstream.url, '  - { name: all, pathPrefix: /, upstream: backend }\n').replace(/^admin: .*$/m, 'admin: { listen: "0.0.0.0:0", token: "a-token-of-sixteen-chars" }'))
  t.equal((await rawRequest(open.adminPort, 'GET /config HTTP/1.1\r\nHost: gateway-host.example\r\n')).status, 200, 'a listener on 0.0.0.0 answers any Host')
})

t.test('/readyz answers 503 while the gateway drains', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { shutdownTimeout: 5s }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const inflight = fetch(`${gw.url}/slow?ms=1000`).then((res) => res.status)
  while (upstream.log.length === 0) await sleep(10)
  const closing = gw.close()
  const draining = await fetch(`${gw.adminUrl}/readyz`)
  t.equal(draining.status, 503, 'a load balancer stops sending new requests')
  t.match(await draining.json(), { status: 'shutting_down' })
  t.equal(await inflight, 200, 'the in-flight request still finishes')
  await closing
})

t.test('/metrics after traffic: requests, durations, upstream errors, process metrics', async (t) => {
  const upstream = await startUpstream(t)
  const refusing = await refusingUrl()
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
  dead: { targets: [${refusing}] }
routes:
  - { name: dead, pathPrefix: /dead/, upstream: dead }
  - { name: small, pathPrefix: /small/, upstream: backend, maxBodySize: 10 }
  - { name: api, pathPrefix: /api/, stripPrefix: /api, upstream: backend }
`)
  for (let i = 0; i < 3; i++) t.equal((await fetch(`${gw.url}/api/x${i}`)).status, 200)
  t.equal((await fetch(`${gw.url}/api/post`, { method: 'POST', body: 'b' })).status, 200)
  t.equal((await fetch(`${gw.url}/api/status?code=503`)).status, 503)
  t.equal((await fetch(`${gw.url}/nowhere`)).status, 404)
  t.equal((await fetch(`${gw.url}/dead/x`)).status, 502)
  t.equal((await fetch(`${gw.url}/small/x`, { method: 'POST', body: 'more than ten bytes' })).status, 413)

  const res = await fetch(`${gw.adminUrl}/metrics`)
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /^text\/plain/)
  const text = await res.text()
  const value = (series: string): number | null => {
    const line = text.split('\n').find((l) => l.startsWith(series + ' '))
    return line === undefined ? null : Number(line.slice(series.length + 1))
  }
  t.equal(value('gateway_requests_total{route="api",method="GET",status_class="2xx"}'), 3)
  t.equal(value('gateway_requests_total{route="api",method="POST",status_class="2xx"}'), 1)
  t.equal(value('gateway_requests_total{route="api",method="GET",status_class="5xx"}'), 1, 'an upstream 503 is counted as 5xx')
  t.equal(value('gateway_requests_total{route="dead",method="GET",status_class="5xx"}'), 1)
  t.equal(value('gateway_requests_total{route="-",method="GET",status_class="4xx"}'), 1, 'unrouted requests are counted too')
  t.equal(value('gateway_request_duration_seconds_count{route="api"}'), 5)
  t.equal(value('gateway_request_duration_seconds_bucket{le="+Inf",route="api"}'), 5)
  t.ok((value('gateway_request_duration_seconds_sum{route="api"}') ?? -1) > 0)
  t.equal(value('gateway_upstream_errors_total{upstream="dead",kind="refused"}'), 1)
  t.notMatch(text, /gateway_upstream_errors_total\{upstream="backend"/, 'a client error (413) is not an upstream error')
  t.equal(value('gateway_requests_total{route="small",method="POST",status_class="4xx"}'), 1)
  t.equal(value('gateway_config_generation'), 1)
  t.equal(value('gateway_config_reloads_total{result="success"}'), 0)
  for (const name of ['process_cpu_user_seconds_total', 'process_resident_memory_bytes', 'nodejs_heap_size_used_bytes', 'nodejs_eventloop_lag_seconds']) {
    t.ok((value(name) ?? -1) >= 0, `process metric ${name}`)
  }
})

t.test('/config redacts secrets; an unreachable Redis neither stops the start nor fails requests', async (t) => {
  const upstream = await startUpstream(t)
  const deadRedis = new URL(await refusingUrl())
  const target = new URL(upstream.url)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis:
  url: redis://:UrlRedisPw-1@127.0.0.1:${deadRedis.port}
  password: \${REDIS_PASSWORD}
  timeout: 50ms
identity:
  apiKeys: { header: x-api-key, keys: { k-TopSecret-alice: alice, k-TopSecret-bob: bob } }
limits:
  ip: { limit: 1000, window: 1m }
upstreams:
  backend: { targets: ["http://127.0.0.1:${target.port}"] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    headers: { request: { set: { authorization: "Bearer UpstreamToken-4", x-api-key: UpstreamKey-5, x-env: prod } } }
`, { REDIS_PASSWORD: 'EnvRedisPw-2' })

  // Redis is unreachable: every request is still answered by the upstream, never with a 5xx
  const statuses: number[] = []
  for (let i = 0; i < 10; i++) statuses.push((await fetch(`${gw.url}/x${i}`, { headers: { 'x-api-key': 'k-TopSecret-alice' } })).status)
  t.same(statuses, Array(10).fill(200), 'the limiter falls back instead of failing')
  t.equal((await fetch(`${gw.url}/x`, { headers: { 'x-api-key': 'k-wrong' } })).status, 401, 'identity still works')
  const ready = await fetch(`${gw.adminUrl}/readyz`)
  t.equal(ready.status, 200, 'degraded is still ready')
  t.match(await ready.json(), { status: 'degraded', generation: 1, redis: { state: 'fallback' } })
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(metrics, /gateway_ratelimit_decisions_total\{route="api",dimension="ip",limit="[^"]+",level="fallback",result="allowed"\} \d+/)
  t.match(metrics, /gateway_redis_breaker_state [12]/)

  const res = await fetch(`${gw.adminUrl}/config`)
  t.equal(res.status, 200)
  const text = await res.text()
  // (a target URL with credentials is refused at load: test/config-checks.test.ts)
  for (const secret of ['UrlRedisPw-1', 'EnvRedisPw-2', 'k-TopSecret', 'UpstreamToken-4', 'UpstreamKey-5']) {
    t.notMatch(text, secret, `${secret} is not shown`)
  }
  const body = JSON.parse(text) as { generation: number, hash: string, config: { routes: Array<{ name: string, headers: { request: { set: Record<string, string> } } }>, redis: { url: string }, upstreams: Record<string, unknown> } }
  t.equal(body.generation, 1)
  t.match(body.hash, /^[0-9a-f]{64}$/)
  t.equal(body.config.routes[0]?.name, 'api', 'the rest of the config is shown')
  t.equal(body.config.routes[0]?.headers.request.set['x-env'], '[redacted]', 'every header-rule value is redacted, whatever its name (issue 15 item 6)')
  t.match(body.config.redis.url, /^redis:\/\/.*@127\.0\.0\.1:\d+$/, 'the URL is shown without its credentials')
  t.equal(upstream.log.length, 10)
})

t.test('/config redacts a JWT secret; a JWKS URL with credentials is refused at load, without printing them', async (t) => {
  const upstream = await startUpstream(t)
  const hs = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity:
  jwt: { secret: JwtSecret-6-long-enough-for-hs256-0123456789, claim: sub }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const hsText = await (await fetch(`${hs.adminUrl}/config`)).text()
  t.notMatch(hsText, 'JwtSecret-6')
  t.match(hsText, /"claim": "sub"/)

  // Refused since 2026-11-27 (test/config-checks.test.ts); /config's redaction of such a URL is
  // still tested apart (test/shield-config-redaction.test.ts).
  const refused = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity:
  jwt: { jwksUrl: "http://idp:JwksPw-7@127.0.0.1:9/.well-known/jwks.json" }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`).then(() => 'started', (err: unknown) => err instanceof Error ? err.message : String(err))
  t.match(refused, /gateway\.yaml:4:\d+ identity\.jwt\.jwksUrl: a JWKS URL may not hold credentials/)
  t.notMatch(refused, 'JwksPw-7')
})

t.test('a reload rejected with thousands of problems keeps the first 100 and a count for /config and the admin page', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, backendConfig(upstream.url, '  - { name: all, pathPrefix: /, upstream: backend }\n'))
  const routes = Array.from({ length: 2000 }, (_, i) => `  - { name: r${i}, pathPrefix: /r${i}/, upstream: nowhere }\n`).join('')
  writeFileSync(gw.runtime!.file, backendConfig(upstream.url, routes))
  const result = await gw.reload()
  t.equal(result.ok, false)
  const view = await (await fetch(`${gw.adminUrl}/config`)).json() as { lastReload: { ok: boolean, problems: string[] } }
  t.equal(view.lastReload.ok, false)
  t.equal(view.lastReload.problems.length, 101, 'the first 100 problems and one line counting the rest')
  t.match(view.lastReload.problems[0], /gateway\.yaml:\d+:\d+ routes\[0\]\.upstream/)
  t.equal(view.lastReload.problems[100], '... and 1900 more problems (gateway validate lists them all)')
  const logged = gw.lines.find(l => l.msg === 'reload rejected; the running configuration keeps serving') as { problems?: string[] } | undefined
  t.equal(logged?.problems?.length, 101, 'the log line holds the same')
  t.equal((await fetch(`${gw.url}/x`)).status, 200, 'the running configuration keeps serving')
})
