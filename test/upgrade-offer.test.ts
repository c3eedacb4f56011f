// An Upgrade offer the gateway does not take (h2c, as `curl --http2` and Java's HttpClient send
// on every plain-HTTP request) is ignored, as RFC 9110 §7.8 allows: the request is served over
// HTTP/1.1 with its body, on a connection that stays open, in order with the requests around it
// (src/proxy/upgrade-offer.ts). A WebSocket handshake on a route without `websocket: true` is
// still refused.
import t from 'tap'
import { connect as tlsConnect } from 'node:tls'
import { startGateway } from './helpers/gateway.js'
import { startUpstream, type EchoBody } from './helpers/upstream.js'
import { parseResponses, rawExchange, type RawReply } from './helpers/raw-http.js'
import { selfSignedCertificate } from './helpers/tls.js'

const H2C = 'Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n'

function config (upstreamUrl: string, extra = ''): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${extra}upstreams:
  backend: { targets: [${upstreamUrl}] }
routes:
  - { name: plain, pathPrefix: /, upstream: backend }
`
}

const echoOf = (reply: RawReply): EchoBody => reply.json as unknown as EchoBody

t.test('an h2c offer is served over HTTP/1.1: no 101, the offer not forwarded, the connection kept for the next request', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  const port = Number(new URL(gw.url).port)
  // the offer and a second request in one write, as a pipelining client sends them
  const text = await rawExchange(port, `GET /first HTTP/1.1\r\nHost: a.test\r\n${H2C}\r\nGET /second HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n`)
  const replies = parseResponses(text)
  t.same(replies.map((r) => r.status), [200, 200], 'both answered, the offer with its response and not 101')
  t.same(replies.map((r) => echoOf(r).url), ['/first', '/second'], 'in order')
  const forwarded = echoOf(replies[0] as RawReply).headers
  t.same([forwarded.upgrade, forwarded['http2-settings']], [undefined, undefined], 'neither Upgrade nor HTTP2-Settings reaches the upstream')
  t.notMatch(String(forwarded.connection), /upgrade/i)
  t.equal(up.requests, 2)
  t.equal(up.upgrades.length, 0)
})

t.test('an h2c offer with a body: Content-Length and chunked bodies reach the upstream whole', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  const port = Number(new URL(gw.url).port)
  const sized = 'hello=world&x=1'
  const chunked = '5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n'
  const text = await rawExchange(port,
    `POST /sized HTTP/1.1\r\nHost: a.test\r\n${H2C}Content-Type: text/plain\r\nContent-Length: ${sized.length}\r\n\r\n${sized}` +
    `PUT /chunked HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade, HTTP2-Settings, close\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}`)
  const replies = parseResponses(text)
  t.same(replies.map((r) => r.status), [200, 200])
  t.same(replies.map((r) => [echoOf(r).method, echoOf(r).body]), [['POST', sized], ['PUT', 'hello world']], 'each body as sent')
})

t.test('an h2c offer pipelined behind a streaming answer waits for it', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  const port = Number(new URL(gw.url).port)
  const text = await rawExchange(port, `GET /drip?chunks=4&intervalMs=50 HTTP/1.1\r\nHost: a.test\r\n\r\nGET /after HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade, HTTP2-Settings, close\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n`)
  // the drip's answer is chunked: its end is the zero chunk, then the next response starts
  const end = text.indexOf('\r\n0\r\n\r\n')
  t.ok(end > 0, 'the streamed answer ends')
  t.ok(text.indexOf('HTTP/1.1', 1) > end, 'the offer\'s answer starts after it, not inside it')
  const [after] = parseResponses(text.slice(end + 7))
  t.equal(after?.status, 200)
  t.equal(after === undefined ? '' : echoOf(after).url, '/after')
})

t.test('a WebSocket handshake on a route without websocket: true is still refused', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  const port = Number(new URL(gw.url).port)
  const [reply] = parseResponses(await rawExchange(port, 'GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n'))
  t.equal(reply?.status, 400)
  t.equal(reply?.json?.reason, 'this route does not accept WebSocket upgrades')
  t.equal(up.requests + up.upgrades.length, 0)
})

t.test('over TLS too', async t => {
  const up = await startUpstream(t)
  const { cert, key } = selfSignedCertificate(t, 'gw-upgrade-offer', 'a.test')
  const gw = await startGateway(t, config(up.url, `tls: { cert: ${cert}, key: ${key} }\n`))
  const port = Number(new URL(gw.url).port)
  const socket = tlsConnect({ host: '127.0.0.1', port, rejectUnauthorized: false })
  socket.setTimeout(10_000, () => socket.destroy())
  socket.write(`POST /tls HTTP/1.1\r\nHost: a.test\r\n${H2C}Content-Length: 2\r\n\r\nok` +
    'GET /tls-next HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n')
  let text = ''
  socket.setEncoding('latin1')
  for await (const chunk of socket) text += chunk as string
  const replies = parseResponses(text)
  t.same(replies.map((r) => r.status), [200, 200])
  t.same(replies.map((r) => [echoOf(r).url, echoOf(r).body]), [['/tls', 'ok'], ['/tls-next', '']])
  t.equal(echoOf(replies[0] as RawReply).headers['x-forwarded-proto'], 'https')
})

t.test('an h2c offer with more header fields than the gateway keeps is refused 431, its body never read as a request', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  const port = Number(new URL(gw.url).port)
  // node keeps maxHeadersCount fields of a head but frames the body by all of them: a
  // Content-Length past the kept ones must not be lost when the head is written again
  const smuggled = 'GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n'
  const filler = Array.from({ length: 120 }, (_, i) => `X-${i}: v\r\n`).join('')
  const text = await rawExchange(port, `POST /outer HTTP/1.1\r\nHost: a.test\r\n${H2C}${filler}Content-Length: ${smuggled.length}\r\n\r\n${smuggled}`)
  const replies = parseResponses(text)
  t.same(replies.map((r) => r.status), [431], 'one answer, and the connection closed')
  t.equal(replies[0]?.json?.error, 'GW_ERR_HEADERS_TOO_LARGE')
  t.equal(up.requests, 0, 'nothing forwarded, the body least of all')
})

t.test('an h2c offer pipelined behind an answer is not cut by the keep-alive timeout that answer armed', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'server: { keepAliveTimeout: 1s }\n'))
  const port = Number(new URL(gw.url).port)
  const text = await rawExchange(port, `GET /a HTTP/1.1\r\nHost: a.test\r\n\r\nGET /slow?ms=3000 HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade, HTTP2-Settings, close\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n`)
  const replies = parseResponses(text)
  t.same(replies.map((r) => r.status), [200, 200], 'the slow one answered too')
  t.same(replies.map((r) => echoOf(r).url), ['/a', '/slow?ms=3000'])
})

t.test('draining: an h2c offer pipelined behind the connection\'s last answer is not served', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url))
  const port = Number(new URL(gw.url).port)
  const exchange = rawExchange(port, `GET /slow?ms=600 HTTP/1.1\r\nHost: a.test\r\n\r\nPOST /second HTTP/1.1\r\nHost: a.test\r\n${H2C}Content-Length: 2\r\n\r\nok`)
  await new Promise((resolve) => setTimeout(resolve, 200))
  const closing = gw.close()
  const replies = parseResponses(await exchange)
  await closing
  t.same(replies.map((r) => r.status), [200], 'the answer in flight, and the connection closed after it')
  t.equal(replies[0]?.headers.connection, 'close')
  t.notOk(up.log.includes('/second'), 'the request behind it never reached the upstream')
  t.notOk(gw.lines.some((l) => l.msg === 'request' && l.path === '/second'), 'nor was it handled: the client resends it elsewhere')
})
