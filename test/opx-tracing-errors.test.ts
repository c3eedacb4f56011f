// README (Tracing): "A 5xx sets the span status to error", `error.type` is set "for upstream
// failures", `serviceName` defaults to `edge-gateway`, and an `otlp` URL "with a path is used as
// is" (a bare address gets /v1/traces). A trace backend's error rate and error search read the
// span status and error.type; a collector behind a path prefix gets the spans at that path.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'
import { attr, spansIn, startReceiver, type OtlpExport, type OtlpSpan } from './helpers/otlp.js'

t.test('tracing.otlp: a 5xx span has status error, an upstream failure its error.type; the default service name; a URL with a path is used as is', async t => {
  const exports: OtlpExport[] = []
  const paths: string[] = []
  const receiver = await startReceiver(t, (body, req) => {
    paths.push(`${req.method ?? ''} ${req.url ?? ''}`)
    try { exports.push(JSON.parse(body) as OtlpExport) } catch { /* not an export */ }
  })
  const up = await startUpstream(t)
  const dead = await refusingUrl()
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
tracing: { otlp: "${receiver.url}/otel/traces" }
upstreams:
  backend: { targets: ["${up.url}"] }
  dead: { targets: ["${dead}"] }
routes:
  - { name: down, pathPrefix: /down, upstream: dead }
  - { name: api, pathPrefix: /, upstream: backend }
`)
  t.equal((await fetch(`${gw.url}/fine`)).status, 200)
  t.equal((await fetch(`${gw.url}/status?code=500`)).status, 500, 'the upstream\'s own 500, passed on')
  const refused = await fetch(`${gw.url}/down`)
  t.equal(refused.status, 502)
  t.match(await refused.json(), { error: 'GW_ERR_UPSTREAM_UNAVAILABLE' })
  await gw.close() // flushes the batch

  t.ok(paths.length > 0, 'the collector got exports')
  t.same([...new Set(paths)], ['POST /otel/traces'], 'every export went to the path the URL names, not /v1/traces')
  const services = new Set(exports.flatMap(e => e.resourceSpans.map(r => r.resource.attributes.find(a => a.key === 'service.name')?.value.stringValue)))
  t.same([...services], ['edge-gateway'], 'service.name defaults to edge-gateway')

  const spans = spansIn(exports)
  const byStatus = (code: number): OtlpSpan | undefined => spans.find(s => attr(s, 'http.response.status_code') === code)
  const ok = byStatus(200)
  const failed = byStatus(500)
  const unavailable = byStatus(502)
  t.ok(ok !== undefined && failed !== undefined && unavailable !== undefined, `a span for each request (${spans.length})`)
  // OTLP JSON: status.code 2 is STATUS_CODE_ERROR; 0 (UNSET) may be left out
  t.not(ok?.status?.code ?? 0, 2, 'a 200 is no error')
  t.equal(failed?.status?.code, 2, 'a 500 sets the span status to error')
  t.equal(unavailable?.status?.code, 2, 'a 502 sets the span status to error')
  t.equal(unavailable?.name, 'GET down')
  t.equal(attr(unavailable as OtlpSpan, 'error.type'), 'refused', 'the upstream failure is the span\'s error.type, as the access line\'s error')
  t.equal(attr(ok as OtlpSpan, 'error.type'), undefined, 'no error.type on a success')
  const line = gw.lines.find(l => l.msg === 'request' && l.path === '/down')
  t.equal(line?.error, 'refused', 'the access line says the same')
})
