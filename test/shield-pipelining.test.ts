// Issue 15 item 9: a pipelined good request followed by a malformed one lost the good one's
// response (the 400 was written at once, in its place). Responses go out in request order.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { rawExchange, parseResponses } from './helpers/raw-http.js'

t.test('pipelined: a slow good request, then a malformed one: 200 first, then 400', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const text = await rawExchange(gw.port,
    'GET /slow?ms=300 HTTP/1.1\r\nHost: a\r\n\r\n' +
    'GET /fast HTTP/1.1\r\nHost: a\r\n\r\n' +
    'GET /bad HTTP/1.1\r\nHost: a\r\nbad header line\r\n\r\n')
  const replies = parseResponses(text)
  t.same(replies.map(r => r.status), [200, 200, 400], 'every request answered, in order')
  t.equal(replies[0]?.json?.url, '/slow?ms=300')
  t.equal(replies[1]?.json?.url, '/fast')
  t.equal(replies[2]?.json?.error, 'GW_ERR_BAD_REQUEST')
})

t.test('a malformed request alone is still answered 400 at once', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const started = Date.now()
  const replies = parseResponses(await rawExchange(gw.port, 'GET /bad HTTP/1.1\r\nHost: a\r\nbad header line\r\n\r\n'))
  t.same(replies.map(r => r.status), [400])
  t.ok(Date.now() - started < 2000)
})

t.test('a large response pipelined behind a slow one is not cut as a slow reader', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { sendTimeout: 500ms }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // the client reads everything at once; the second answer (1 MB) waits 1.5 s for its turn
  const text = await rawExchange(gw.port,
    'GET /slow?ms=1500 HTTP/1.1\r\nHost: a\r\n\r\n' +
    'GET /download?bytes=1048576 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n')
  const replies = parseResponses(text)
  t.same(replies.map(r => r.status), [200, 200], 'both answered')
  t.equal(replies[1]?.body.length, 1048576, 'the second whole')
  t.notOk(gw.lines.some(l => l.msg === 'request' && l.error === 'send_timeout'), 'no send_timeout logged')
})
