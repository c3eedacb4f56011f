// W3C Trace Context through a real gateway: the upstream gets a traceparent naming the gateway's
// span (the caller's trace kept, or a new one), and the access log line carries the trace id.
import t from 'tap'
import { once } from 'node:events'
import { writeFileSync } from 'node:fs'
import type { IncomingMessage } from 'node:http'
import { WebSocket } from 'ws'
import { spawnGateway, startGateway } from './helpers/gateway.js'
import { refusingUrl, startHttpServer, startUpstream, type EchoBody } from './helpers/upstream.js'
import { startRedis } from './helpers/redis.js'
import { rawRequest } from './helpers/raw-http.js'
import { attr, spansIn, startReceiver, type OtlpExport, type OtlpSpan } from './helpers/otlp.js'

type Line = Record<string, unknown>
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/
const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

async function lineOf (lines: Line[], requestId: string, msg = 'request'): Promise<Line> {
  for (let i = 0; i < 500; i++) {
    const found = lines.find(l => l.msg === msg && l.requestId === requestId)
    if (found !== undefined) return found
    await sleep(10)
  }
  throw new Error(`no ${msg} line for ${requestId}`)
}

const config = (upstream: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["${upstream}"] }
routes:
  - { name: api, pathPrefix: /, upstream: backend, websocket: true }
`

t.test('a caller\'s traceparent: same trace upstream, the gateway\'s span as parent, trace id logged', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  const incoming = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
  const res = await fetch(`${gw.url}/x`, { headers: { traceparent: incoming, tracestate: 'vendor=1' } })
  const echo = await res.json() as EchoBody
  const sent = TRACEPARENT.exec(echo.headers.traceparent as string)
  t.ok(sent !== null, `upstream got a valid traceparent: ${String(echo.headers.traceparent)}`)
  const [, traceId, parentId, flags] = sent as RegExpExecArray
  t.equal(traceId, '4bf92f3577b34da6a3ce929d0e0e4736', 'the caller\'s trace')
  t.not(parentId, '00f067aa0ba902b7', 'the parent is the gateway\'s span, not the caller\'s')
  t.equal(flags, '01', 'the sampled flag is kept')
  t.equal(echo.headers.tracestate, 'vendor=1', 'tracestate passes through')
  t.equal((await lineOf(gw.lines, res.headers.get('x-request-id') ?? '')).traceId, '4bf92f3577b34da6a3ce929d0e0e4736')
})

// W3C Trace Context §3.2.2.5: flags other than sampled are reserved, "Vendors MUST set those to
// zero"; the caller's ff went on to the upstream as it came
t.test('a caller\'s traceparent with reserved flags set: the upstream gets the sampled flag alone', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  for (const [flags, sent] of [['ff', '01'], ['fe', '00'], ['03', '01'], ['00', '00']]) {
    const echo = await (await fetch(`${gw.url}/x`, { headers: { traceparent: `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-${flags as string}` } })).json() as EchoBody
    t.match(echo.headers.traceparent, new RegExp(`^00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-${sent as string}$`), `flags ${flags as string}: ${String(echo.headers.traceparent)}`)
  }
  // a later version's flags are read as version 00's (§3.2.4)
  const future = await (await fetch(`${gw.url}/x`, { headers: { traceparent: 'cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff-more' } })).json() as EchoBody
  t.match(future.headers.traceparent, /^00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-01$/)
})

t.test('no traceparent, or an invalid one: a new trace, propagated and logged', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  const invalid = [
    undefined,
    '00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01', // uppercase
    '00-00000000000000000000000000000000-00f067aa0ba902b7-01', // zero trace id
    '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01', // zero parent id
    'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', // version ff
    '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra', // version 00 with more fields
    // repeated, as node joins two fields: the first alone would be a valid later version
    'cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x, 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
  ]
  const seen = new Set<string>()
  for (const header of invalid) {
    const headers: Record<string, string> = { tracestate: 'vendor=1' }
    if (header !== undefined) headers.traceparent = header
    const res = await fetch(`${gw.url}/x`, { headers })
    const echo = await res.json() as EchoBody
    t.equal(echo.headers.tracestate, undefined, `${String(header)}: the caller's tracestate is not sent with a new trace`)
    const sent = TRACEPARENT.exec(echo.headers.traceparent as string)
    t.ok(sent !== null, `${String(header)}: upstream got a valid traceparent`)
    const traceId = (sent as RegExpExecArray)[1] as string
    t.not(traceId, '4bf92f3577b34da6a3ce929d0e0e4736', `${String(header)}: a new trace`)
    t.equal((sent as RegExpExecArray)[3], '01', `${String(header)}: the new trace is sampled`)
    t.equal((await lineOf(gw.lines, res.headers.get('x-request-id') ?? '')).traceId, traceId, 'the logged trace id is the propagated one')
    seen.add(traceId)
  }
  t.equal(seen.size, invalid.length, 'every new trace has its own id')
  // a later version is read by its first four fields (W3C Trace Context §3.2.4)
  const future = await (await fetch(`${gw.url}/x`, { headers: { traceparent: 'cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds' } })).json() as EchoBody
  t.match(future.headers.traceparent, /^00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-01$/)
})

t.test('a WebSocket upgrade carries the trace too, and its lines the trace id', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  const ws = new WebSocket(`ws://127.0.0.1:${gw.port}/ws`, { headers: { traceparent: '00-11111111111111111111111111111111-2222222222222222-00' } })
  // 'open' follows 'upgrade' in the same tick: both are awaited from the start
  const opened = once(ws, 'open')
  const [upgrade] = await once(ws, 'upgrade') as [IncomingMessage]
  const id = String(upgrade.headers['x-request-id'])
  await opened
  t.match(up.upgrades.at(-1)?.headers.traceparent, /^00-11111111111111111111111111111111-[0-9a-f]{16}-00$/)
  ws.close()
  t.equal((await lineOf(gw.lines, id)).traceId, '11111111111111111111111111111111')
  t.equal((await lineOf(gw.lines, id, 'websocket closed')).traceId, '11111111111111111111111111111111')
})

t.test('tracing.otlp: one span per request, exported over OTLP/HTTP to a local receiver', async t => {
  const exports: OtlpExport[] = []
  const paths: string[] = []
  const receiver = await startReceiver(t, (body, req) => {
    paths.push(`${req.method ?? ''} ${req.url ?? ''} ${req.headers['content-type'] ?? ''}`)
    exports.push(JSON.parse(body) as OtlpExport)
  })
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  // exact counts: 2 s, not the default 50 ms (startRedis in test/helpers/redis.ts says why)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
tracing: { otlp: "${receiver.url}", serviceName: gw-under-test }
redis: { url: "${redis.url}", timeout: 2s }
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    limits:
      ip: { algorithm: token-bucket, limit: 1, window: 1m }
`)
  // a token bucket (one token a minute), not a fixed window: an epoch-aligned minute would start
  // afresh if the clock crossed hh:mm:00 between the two requests
  const parent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
  const ok = await fetch(`${gw.url}/items?id=1`, { headers: { traceparent: parent } })
  const echo = await ok.json() as EchoBody
  const limited = await fetch(`${gw.url}/items`)
  t.equal(limited.status, 429)
  // a caller that marked its trace unsampled: the upstream is told so, and no span is exported
  const unsampled = await fetch(`${gw.url}/items`, { headers: { traceparent: '00-5af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-00' } })
  t.equal(unsampled.status, 429)
  await gw.close() // flushes the batch
  const spans = spansIn(exports)
  t.equal(spans.length, 2, 'one span per sampled request')
  t.notOk(spans.some(s => s.traceId === '5af7651916cd43dd8448eb211c80319c'), 'none for the unsampled trace')
  t.match(paths[0], /^POST \/v1\/traces application\/json/, 'OTLP/HTTP on the traces path')
  const service = exports[0]?.resourceSpans[0]?.resource.attributes.find(a => a.key === 'service.name')?.value.stringValue
  t.equal(service, 'gw-under-test')

  const first = spans.find(s => attr(s, 'http.response.status_code') === 200) as OtlpSpan
  t.ok(first !== undefined)
  t.equal(first.traceId, '0af7651916cd43dd8448eb211c80319c', 'the caller\'s trace')
  t.equal(first.parentSpanId, 'b7ad6b7169203331', 'the caller\'s span is the parent')
  t.equal(echo.headers.traceparent, `00-${first.traceId}-${first.spanId}-01`, 'the upstream\'s parent is this span')
  t.equal(first.name, 'GET api')
  t.equal(first.kind, 2, 'SERVER')
  t.equal(attr(first, 'http.route'), 'api')
  t.equal(attr(first, 'gateway.upstream'), 'backend')
  t.equal(attr(first, 'gateway.upstream.target'), up.url)
  t.ok((attr(first, 'gateway.redis.duration_ms') as number) > 0, `Redis time recorded: ${String(attr(first, 'gateway.redis.duration_ms'))} ms`)
  t.equal(attr(first, 'gateway.outcome'), undefined)

  const second = spans.find(s => attr(s, 'http.response.status_code') === 429) as OtlpSpan
  t.ok(second !== undefined)
  t.not(second.traceId, first.traceId, 'a request without traceparent starts its own trace')
  t.equal(second.parentSpanId ?? '', '', 'a root span')
  t.equal(attr(second, 'gateway.outcome'), 'rejected')
  t.equal(attr(second, 'gateway.limit'), 'api.ip')
  const logged = gw.lines.filter(l => l.msg === 'request').map(l => l.traceId)
  t.same(logged.sort(), [first.traceId, second.traceId, '5af7651916cd43dd8448eb211c80319c'].sort(), 'the access log names the exported traces, and the unsampled one')
})

t.test('tracing.otlp: gateway.redis.duration_ms is the time a request waited on Redis, a failed identity\'s charge included; 0 without Redis', async t => {
  const spansOf = async (withRedis: boolean): Promise<OtlpSpan[]> => {
    const exports: OtlpExport[] = []
    const receiver = await startReceiver(t, body => { exports.push(JSON.parse(body) as OtlpExport) })
    const up = await startUpstream(t)
    const redis = withRedis ? `redis: { url: "${(await startRedis(t)).url}", timeout: 2s }\n` : ''
    const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
tracing: { otlp: "${receiver.url}" }
${redis}identity: { required: true, apiKeys: { header: x-api-key, keys: { good-key-0123456789: alice } } }
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    limits: { user: { algorithm: token-bucket, limit: 100, window: 1m } }
`)
    t.equal((await fetch(`${gw.url}/x`, { headers: { 'x-api-key': 'good-key-0123456789' } })).status, 200)
    t.equal((await fetch(`${gw.url}/x`, { headers: { 'x-api-key': 'a-guessed-key' } })).status, 401)
    await gw.close() // flushes the batch
    return spansIn(exports)
  }
  const waited = (spans: OtlpSpan[], status: number): number => attr(spans.find(s => attr(s, 'http.response.status_code') === status) as OtlpSpan, 'gateway.redis.duration_ms') as number
  const onRedis = await spansOf(true)
  t.ok(waited(onRedis, 200) > 0, `the admitted request: ${waited(onRedis, 200)} ms`)
  t.ok(waited(onRedis, 401) > 0, `the failed identity, charged to its IP's failure budget on Redis: ${waited(onRedis, 401)} ms`)
  const inProcess = await spansOf(false)
  t.same([waited(inProcess, 200), waited(inProcess, 401)], [0, 0], 'decided in process: 0')
})

// url.path is the target as sent: an absolute-form target's user and password went to the collector
t.test('tracing.otlp: the span of an absolute-form target with a user and password does not hold them', async t => {
  const bodies: string[] = []
  const receiver = await startReceiver(t, body => { bodies.push(body) })
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url).replace('routes:', `tracing: { otlp: "${receiver.url}" }\nroutes:`))
  const r = await rawRequest(gw.port, 'GET http://alice:S3cretPw@x/abs?a=1 HTTP/1.1\r\nHost: x\r\n')
  t.equal(r.status, 400)
  await gw.close() // flushes the batch
  const spans = spansIn(bodies.map(b => JSON.parse(b) as OtlpExport))
  t.equal(spans.length, 1)
  t.equal(attr(spans[0] as OtlpSpan, 'url.path'), 'http://[redacted]@x/abs')
  t.notOk(bodies.some(b => b.includes('S3cretPw')), 'no export holds the password')
})

t.test('tracing.otlp: a request in flight across reloads (one that changes the tracer, then a rejected one) still exports its span', async t => {
  const spans: Array<{ service: string | undefined, span: OtlpSpan }> = []
  const receiver = await startReceiver(t, body => {
    for (const r of (JSON.parse(body) as OtlpExport).resourceSpans) {
      const service = r.resource.attributes.find(a => a.key === 'service.name')?.value.stringValue
      for (const s of r.scopeSpans) for (const span of s.spans) spans.push({ service, span })
    }
  })
  let answer: (() => void) | null = null
  const up = await startHttpServer(t, (_req, res) => { answer = () => res.end('late') })
  const yaml = (service: string): string => config(up.url).replace('routes:', `tracing: { otlp: "${receiver.url}", serviceName: ${service} }\nroutes:`)
  const gw = await startGateway(t, yaml('before'))
  const slow = fetch(`${gw.url}/slow`).then(async r => await r.text())
  for (let i = 0; i < 200 && answer === null; i++) await sleep(10)
  writeFileSync(gw.configFile, yaml('after'))
  t.match(await gw.reload(), { ok: true })
  writeFileSync(gw.configFile, 'listen: [')
  t.match(await gw.reload(), { ok: false }, 'a rejected reload sweeps what the live config does not use')
  ;(answer as unknown as () => void)()
  t.equal(await slow, 'late')
  await gw.close() // flushes every tracer
  t.same(spans.map(s => [s.service, attr(s.span, 'url.path')]), [['before', '/slow']], 'the span of the request started before the reloads, from its tracer')
})

t.test('tracing.otlp: a collector that refuses connections costs dropped spans, never a request, and no stray rejection', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, config(up.url).replace('routes:', `tracing: { otlp: "${await refusingUrl()}" }\nroutes:`))
  const first = await Promise.all(Array.from({ length: 20 }, async (_, i) => (await fetch(`${gw.url}/x${i}`)).status))
  t.same(first, new Array(20).fill(200))
  await sleep(700) // the batch (500 ms) is sent and refused
  const later = await Promise.all(Array.from({ length: 5 }, async (_, i) => (await fetch(`${gw.url}/y${i}`)).status))
  t.same(later, new Array(5).fill(200), 'served on after a refused export')
  gw.child.kill('SIGTERM')
  t.equal(await gw.exited, 0)
  t.notOk(gw.logs.some(l => String(l.msg).includes('GW_ERR_STRAY_REJECTION') || l.code === 'GW_ERR_STRAY_REJECTION'), 'no stray rejection logged')
  t.notMatch(gw.stderr(), /Unhandled|GW_ERR_STRAY_REJECTION/)
})

t.test('tracing.otlp: a collector that never answers delays the shutdown by at most about a second', async t => {
  const up = await startUpstream(t)
  // accepts the export and never answers it
  const { url: collector } = await startHttpServer(t, () => {})
  const gw = await spawnGateway(t, config(up.url).replace('routes:', `tracing: { otlp: "${collector}" }\nserver: { shutdownTimeout: 1s }\nroutes:`))
  for (let i = 0; i < 3; i++) t.equal((await fetch(`${gw.url}/x${i}`)).status, 200)
  await sleep(700) // the batch (500 ms) is sent and hangs
  const stopping = Date.now()
  gw.child.kill('SIGTERM')
  t.equal(await gw.exited, 0)
  const tookMs = Date.now() - stopping
  // the exporter alone waited about 10 s before the bound (8.7-10.2 s measured)
  t.ok(tookMs < 6000, `stopped in ${tookMs} ms`)
  t.ok(gw.logs.some(l => l.msg === 'gateway stopped'), 'its last line was written')
})

// The exporter's own timeout is the socket's idle timeout: a collector that sends its answer a
// byte at a time never let an export end, the stuck exports piled up, and after SIGTERM and
// "gateway stopped" the process never exited (seen still running minutes later).
t.test('tracing.otlp: a collector that answers a byte at a time: each export ends within its bound, and SIGTERM still ends the gateway', async t => {
  const up = await startUpstream(t)
  const exports: Array<{ opened: number, closed: number | null }> = []
  const { url: collector } = await startHttpServer(t, (req, res) => {
    const e = { opened: Date.now(), closed: null as number | null }
    exports.push(e)
    req.resume()
    res.writeHead(200, { 'content-type': 'application/json' })
    const drip = setInterval(() => res.write(' '), 200)
    res.on('close', () => { clearInterval(drip); e.closed = Date.now() })
  })
  const gw = await spawnGateway(t, config(up.url).replace('routes:', `tracing: { otlp: "${collector}" }\nserver: { shutdownTimeout: 1s }\nroutes:`))
  for (let i = 0; i < 3; i++) t.equal((await fetch(`${gw.url}/x${i}`)).status, 200)
  for (let i = 0; i < 300 && exports.length === 0; i++) await sleep(10)
  t.equal(exports.length, 1, 'the batch was sent')
  await sleep(3500)
  const first = exports[0] as { opened: number, closed: number | null }
  t.ok(first.closed !== null && first.closed - first.opened < 3000, `the export's connection was closed within its bound (${first.closed === null ? 'still open' : `${first.closed - first.opened} ms`})`)
  t.equal((await fetch(`${gw.url}/after`)).status, 200, 'requests are served as usual')
  await sleep(700) // the next batch is sent and drips
  const stopping = Date.now()
  gw.child.kill('SIGTERM')
  const code = await Promise.race([gw.exited, sleep(10_000).then(() => 'still running')])
  t.equal(code, 0, 'the gateway exited')
  const tookMs = Date.now() - stopping
  t.ok(tookMs < 6000, `stopped in ${tookMs} ms`)
  t.ok(gw.logs.some(l => l.msg === 'gateway stopped'), 'its last line was written')
})
