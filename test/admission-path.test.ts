// One admission path (issue 7 item 4): HTTP requests and WebSocket upgrades go through the same
// admit() and differ only in how a refusal is written; a request is logged and counted once
// however many ways it ends; one in-flight counter serves the drain, the gauge and a reload.
import t, { type Test } from 'tap'
import http from 'node:http'
import { once } from 'node:events'
import { Writable } from 'node:stream'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { rawRequest, type RawReply } from './helpers/raw-http.js'
import { eventually, metric } from './helpers/ratelimit.js'
import { RequestRecord } from '../src/request-record.js'
import { GatewayMetrics } from '../src/admin/metrics.js'
import { compileQueryRedactor, createAccessLog, createLogger } from '../src/log.js'
import { PROPAGATING_TRACER } from '../src/tracing.js'

const UPGRADE = 'Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n'

/** What a client sees of a refusal, without what differs per request (its id, the exact wait). */
function refusal (r: RawReply): Record<string, unknown> {
  const { requestId: _id, retryAfterMs: _wait, ...body } = r.json ?? {}
  const headers: Record<string, string> = {}
  for (const name of ['content-type', 'allow', 'www-authenticate', 'retry-after', 'ratelimit-policy']) {
    if (r.headers[name] !== undefined) headers[name] = r.headers[name]
  }
  return { status: r.status, body, headers, hasRequestId: typeof r.json?.requestId === 'string' && r.headers['x-request-id'] === r.json.requestId }
}

t.test('an upgrade is refused exactly like the HTTP request: same status, body and headers', async (t) => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity:
  apiKeys: { header: x-api-key, keys: { good-key: alice } }
  failureLimit: { limit: 100, window: 1m }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: ws, pathPrefix: /ws, upstream: backend, websocket: true, auth: required, limits: { user: { limit: 1, window: 1m } } }
  - { name: api, pathPrefix: /api, upstream: backend, methods: [GET], auth: none }
`)
  const both = async (head: string): Promise<[RawReply, RawReply]> => {
    const http = await rawRequest(gw.port, head)
    const upgrade = await rawRequest(gw.port, head + UPGRADE)
    return [http, upgrade]
  }
  const cases: Array<[string, string, number]> = [
    ['no route', 'GET /nope HTTP/1.1\r\nHost: x\r\n', 404],
    ['method not allowed', 'POST /api/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n', 405],
    ['bad path', 'GET /a/%2e%2e%2f../x HTTP/1.1\r\nHost: x\r\n', 400],
    ['unknown API key', 'GET /ws/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: wrong\r\n', 401],
    ['no credentials', 'GET /ws/x HTTP/1.1\r\nHost: x\r\n', 401]
  ]
  for (const [what, head, status] of cases) {
    const [plain, upgrade] = await both(head)
    t.equal(plain.status, status, `${what}: HTTP ${status}`)
    t.same(refusal(upgrade), refusal(plain), `${what}: the upgrade gets the same answer`)
  }
  // alice's user budget is 1 a minute: the HTTP request spends it, then both are refused alike
  t.equal((await rawRequest(gw.port, 'GET /ws/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: good-key\r\n')).status, 200)
  const [plain, upgrade] = await both('GET /ws/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: good-key\r\n')
  t.equal(plain.status, 429)
  t.match(plain.json, { error: 'rate_limited', dimension: 'user', limit: 'ws.user' }, 'the 429 body clients know')
  t.same(refusal(upgrade), refusal(plain), 'rate limited: the upgrade gets the same 429')
  t.match(upgrade.json, { retryAfterMs: Number }, 'with the wait')
})

t.test('a request that both times out and errors is logged and counted once', async (t) => {
  // A real request on a real socket, recorded as the pipeline does, then ended twice.
  const server = http.createServer()
  t.teardown(() => server.close())
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const port = (server.address() as { port: number }).port
  const arrived = once(server, 'request') as Promise<[http.IncomingMessage, http.ServerResponse]>
  const client = http.get(`http://127.0.0.1:${port}/slow?token=secret`)
  client.on('error', () => {})
  const [req, res] = await arrived
  t.teardown(() => { res.destroy(); client.destroy() })

  const lines: Array<Record<string, unknown>> = []
  const logger = createLogger('info', new Writable({
    write (chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString().split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>)
      cb()
    }
  }))
  const metrics = new GatewayMetrics({ localKeys: () => 0 })
  const rt = { activity: { inflight: 0 }, tracer: PROPAGATING_TRACER, redactQuery: compileQueryRedactor(undefined), isTrustedPeer: () => false }
  const record = new RequestRecord({ telemetry: metrics, accessLog: createAccessLog(logger) }, rt, req, true)
  t.equal(rt.activity.inflight, 1, 'in flight once recorded')
  const timedOut = record.finish({ status: 504, result: { status: 504, target: 'http://upstream', bytesIn: 0, bytesOut: 0, errorCode: 'GW_ERR_UPSTREAM_TIMEOUT', errorKind: 'response_timeout', retriedAfter: null, error: null } })
  const failed = record.finish({ status: 503, outcome: 'pipeline_error' })
  t.equal(timedOut, true, 'the first ending is the one recorded')
  t.equal(failed, false, 'the second is refused')
  t.equal(rt.activity.inflight, 0, 'left the in-flight count once, not twice')
  record.leave()
  t.equal(rt.activity.inflight, 0, 'leaving again changes nothing')
  logger.flush()
  await eventually('the log line', async () => lines.length > 0, 2000)
  const logged = lines.filter(l => l.msg === 'request')
  t.equal(logged.length, 1, 'one access-log line')
  t.match(logged[0], { status: 504, error: 'response_timeout', requestId: record.requestId })
  const counted = await metrics.registry.getSingleMetric('gateway_requests_total')?.get()
  t.same(counted?.values.map(v => [v.labels.status_class, v.value]), [['5xx', 1]], 'counted once, as the 504')
})

/** An in-process gateway with one route (given as its YAML flow mapping) to an upstream of its own. */
async function gatewayWithRoute (t: Test, route: string): Promise<Awaited<ReturnType<typeof startGateway>>> {
  const up = await startUpstream(t)
  return await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - ${route}
`)
}

t.test('a response timeout through the gateway: one 504, one log line, one count, nothing left in flight', async (t) => {
  const gw = await gatewayWithRoute(t, '{ name: slow, pathPrefix: /, upstream: backend, timeouts: { response: 200ms } }')
  const reply = await rawRequest(gw.port, 'GET /hang HTTP/1.1\r\nHost: x\r\n')
  t.equal(reply.status, 504)
  t.equal(reply.json?.error, 'GW_ERR_UPSTREAM_TIMEOUT')
  await eventually('the log line', async () => gw.lines.some(l => l.requestId === reply.json?.requestId), 3000)
  t.equal(gw.lines.filter(l => l.msg === 'request' && l.requestId === reply.json?.requestId).length, 1, 'one access-log line')
  t.equal(await metric(gw.adminUrl, 'gateway_requests_total', { route: 'slow', status_class: '5xx' }), 1, 'counted once')
  t.equal(await metric(gw.adminUrl, 'gateway_requests_in_flight'), 0, 'nothing in flight')
  t.equal(gw.runtime?.activity.inflight, 0, 'the runtime\'s count, which the pool sweep waits on, is 0 too')
})

t.test('one in-flight counter: a request on a replaced runtime still counts, for the gauge and the drain', async (t) => {
  const gw = await gatewayWithRoute(t, '{ name: hang, pathPrefix: /, upstream: backend }')
  const client = http.get(`${gw.url}/hang`)
  client.on('error', () => {})
  await eventually('in flight', async () => await metric(gw.adminUrl, 'gateway_requests_in_flight') === 1, 3000)
  const before = gw.runtime
  t.equal(before?.activity.inflight, 1, 'counted on the runtime it started on')
  t.same(await gw.reload(), { ok: true, generation: 2, restartNeeded: [] })
  t.not(gw.runtime, before, 'a new runtime serves')
  t.equal(gw.runtime?.activity.inflight, 0, 'the new runtime has nothing in flight')
  t.equal(await metric(gw.adminUrl, 'gateway_requests_in_flight'), 1, 'the request on the old runtime still counts')
  client.destroy()
  await eventually('nothing in flight', async () => await metric(gw.adminUrl, 'gateway_requests_in_flight') === 0, 3000)
  t.equal(before?.activity.inflight, 0, 'the old runtime is idle: its pools may close')
})

t.test('a stage that throws after a decision from Redis answers 503 and the gateway serves on', async (t) => {
  const gw = await gatewayWithRoute(t, '{ name: api, pathPrefix: /, upstream: backend }')
  const limiter = gw.runtime?.limiter
  if (limiter === undefined) throw new Error('no runtime')
  const check = limiter.check.bind(limiter)
  // the shape a decision through Redis has (a promise), settled with a verdict the next stage
  // cannot read, then a promise that fails: each must be a 503 with its JSON body, never a crash
  const broken = Object.defineProperty({}, 'kind', { get () { throw new Error('verdict unreadable') } })
  limiter.check = () => Promise.resolve(broken) as ReturnType<typeof check>
  const unreadable = await rawRequest(gw.port, 'GET /a HTTP/1.1\r\nHost: x\r\n')
  limiter.check = () => Promise.reject(new Error('decision failed')) as ReturnType<typeof check>
  const rejected = await rawRequest(gw.port, 'GET /b HTTP/1.1\r\nHost: x\r\n')
  limiter.check = check
  for (const [name, reply] of [['an unreadable verdict', unreadable], ['a failed decision', rejected]] as const) {
    t.equal(reply.status, 503, name)
    t.equal(reply.json?.error, 'GW_ERR_LIMITER_UNAVAILABLE', name)
  }
  t.equal(gw.lines.filter(l => l.msg === 'request pipeline failed').length, 2, 'each failure logged once with its request')
  t.equal((await rawRequest(gw.port, 'GET /c HTTP/1.1\r\nHost: x\r\n')).status, 200, 'the gateway serves on')
})
