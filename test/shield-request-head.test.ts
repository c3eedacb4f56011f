// Issue 15 items 7 and 8: request heads node:http accepts but the gateway must refuse, because the
// upstream (or the gateway's own client-IP and routing decisions) would read them differently.
import t from 'tap'
import net from 'node:net'
import { startGateway, type LogCapture } from './helpers/gateway.js'
import type { Gateway } from '../src/server.js'
import type { Teardown } from './helpers/teardown.js'
import { startHttpServer, startUpstream } from './helpers/upstream.js'
import { startRedis } from './helpers/redis.js'
import { parseResponses, rawConnection, rawExchange, rawRequest } from './helpers/raw-http.js'

function junk (n: number): string {
  let out = ''
  for (let i = 0; i < n; i++) out += `x-junk-${i}: y\r\n`
  return out
}

/** A gateway in this process with one route, every path to `upstream`; `settings` adds top-level keys. */
async function oneRoute (t: Teardown, upstream: string, settings = ''): Promise<Gateway & LogCapture> {
  return await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
${settings}
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
}

t.test('server.maxHeadersCount: more header fields get 431 (an X-Forwarded-For after 1000 junk lines is not lost silently)', async t => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url, 'trustedProxies: [127.0.0.1]')
  // Host + Connection (added by rawRequest) + 98 = 100 fields: the default limit, accepted
  const ok = await rawRequest(gw.port, `GET /ok HTTP/1.1\r\nHost: a\r\n${junk(97)}X-Forwarded-For: 203.0.113.9\r\n`)
  t.equal(ok.status, 200, '100 fields pass')
  t.equal((ok.json?.headers as Record<string, string>)['x-forwarded-for'], '203.0.113.9, 127.0.0.1', 'the last field reached the upstream')
  const over = await rawRequest(gw.port, `GET /over HTTP/1.1\r\nHost: a\r\n${junk(98)}X-Forwarded-For: 203.0.113.9\r\n`)
  t.equal(over.status, 431, '101 fields: 431')
  t.match(over.json, { error: 'GW_ERR_HEADERS_TOO_LARGE', reason: /maxHeadersCount/, requestId: String })
  const attack = await rawRequest(gw.port, `GET /attack HTTP/1.1\r\nHost: a\r\n${junk(1000)}X-Forwarded-For: 203.0.113.9\r\n`)
  t.equal(attack.status, 431, '1000 junk lines then X-Forwarded-For: 431')
  t.same(upstream.log, ['/ok'], 'neither request over the limit reached the upstream')
  const lines = gw.lines.filter(l => l.msg === 'request' && l.status === 431)
  t.equal(lines.length, 2, 'both refusals are logged')
})

t.test('server.maxHeadersCount is configurable', async t => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url, 'server: { maxHeadersCount: 20 }')
  t.equal((await rawRequest(gw.port, `GET / HTTP/1.1\r\nHost: a\r\n${junk(18)}`)).status, 200, '20 fields')
  t.equal((await rawRequest(gw.port, `GET / HTTP/1.1\r\nHost: a\r\n${junk(19)}`)).status, 431, '21 fields')
})

t.test('two Host headers, or an invalid Host, get 400 and never reach the upstream', async t => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  const two = await rawRequest(gw.port, 'GET /two HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n')
  t.equal(two.status, 400, 'two Host lines')
  t.match(two.json, { error: 'GW_ERR_BAD_REQUEST', reason: 'more than one Host header', requestId: String })
  for (const host of ['a@b', 'x/y', 'host:abc', 'a b', 'a\\b', 'evil.com#x', ':80', ':', 'a:99999', 'a:65536']) {
    const reply = await rawRequest(gw.port, `GET /bad HTTP/1.1\r\nHost: ${host}\r\n`)
    t.equal(reply.status, 400, `Host: ${host}`)
    t.equal(reply.json?.reason, 'invalid Host header')
  }
  for (const host of ['api.example.com', 'api.example.com:8080', '127.0.0.1:80', '[::1]:8080', 'a_b.local.', 'a:65535', 'a:']) {
    t.equal((await rawRequest(gw.port, `GET /good HTTP/1.1\r\nHost: ${host}\r\n`)).status, 200, `Host: ${host} passes`)
  }
  // RFC 9112 §3.2: an empty Host is what a client sends for a target without an authority
  t.equal((await rawRequest(gw.port, 'GET /good HTTP/1.1\r\nHost: \r\n')).status, 200, 'an empty Host passes')
  t.equal(upstream.log.filter(u => u !== '/good').length, 0, 'no refused request reached the upstream')
})

t.test('an HTTP/1.0 request with Transfer-Encoding gets 400 and never reaches the upstream (RFC 9112 §6.1)', async t => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  // served before, and the request pipelined behind it on the kept-alive connection too
  const text = await rawExchange(gw.port, 'POST /first HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /second HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n')
  const replies = parseResponses(text)
  t.same(replies.map(r => r.status), [400], 'a 400, and the connection closed')
  t.equal(replies[0]?.json?.reason, 'Transfer-Encoding in an HTTP/1.0 request')
  t.same(upstream.log, [], 'nothing reached the upstream')
  const chunked11 = await rawRequest(gw.port, 'POST /ok HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n', '3\r\nabc\r\n0\r\n\r\n')
  t.equal(chunked11.status, 200, 'the same body in HTTP/1.1 is served')
})

t.test('a chunked body that cannot be parsed gets a 400 at once, logged once, and the connection closes; the answers before it go out first', async t => {
  const upstream = await startUpstream(t)
  // three bytes of chunk, then no CRLF: node's parser fails there. The request waited for the
  // rest of its body for clientBodyTimeout (with an upstream connection, streamed), then got a
  // 408, logged beside a 400 logged at once and never sent; then it was cut without an answer
  for (const [bufferBodies, target] of [['1mb', '/x'], ['0', '/x'], ['0', '/status?code=200']]) {
    // /status answers at the head: its 200 was sent and logged behind the slow GET
    const bad = `POST ${String(target)} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX0\r\n\r\n`
    for (const before of ['', 'GET /slow?ms=300 HTTP/1.1\r\nHost: a\r\n\r\n']) {
      const gw = await oneRoute(t, upstream.url, `server: { clientBodyTimeout: 30s, bufferBodies: ${String(bufferBodies)} }`)
      const what = `bufferBodies ${String(bufferBodies)} ${String(target)}${before === '' ? '' : ', behind a slow GET'}`
      const replies = parseResponses(await rawExchange(gw.port, before + bad))
      t.same(replies.map(r => r.status), before === '' ? [400] : [200, 400], `${what}: the GET's answer, the 400, then the connection closed; no 408`)
      const refusal = replies[replies.length - 1]
      t.match(refusal?.json, { error: 'GW_ERR_BAD_REQUEST', reason: 'the chunked request body cannot be parsed', requestId: String }, `${what}: the 400 says why`)
      t.equal(refusal?.headers.connection, 'close', `${what}: the 400 closes the connection`)
      const expected = before === '' ? ['400 bad_request'] : ['200 undefined', '400 bad_request']
      for (let i = 0; i < 500 && gw.lines.filter(l => l.msg === 'request').length < expected.length; i++) await new Promise(resolve => setTimeout(resolve, 10))
      t.same(gw.lines.filter(l => l.msg === 'request').map(l => `${String(l.status)} ${String(l.error)}`).sort(), expected, `${what}: one line each, the bad one a 400`)
      t.equal((await rawRequest(gw.port, 'GET /ok HTTP/1.1\r\nHost: a\r\n')).status, 200, 'the gateway serves on')
    }
  }
})

t.test('a chunked body that cannot be parsed while its limits are decided in Redis: a 400, or the limit\'s 429, and the connection closes', async t => {
  const upstream = await startUpstream(t)
  const redis = await startRedis(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - name: open
    pathPrefix: /open
    upstream: backend
    limits: { ip: { algorithm: fixed-window, limit: 100, window: 1m } }
  - name: tight
    pathPrefix: /tight
    upstream: backend
    limits: { ip: { algorithm: fixed-window, limit: 1, window: 1m } }
`)
  // head and body come in one read: the parser fails in the body while the decision is in Redis
  const bad = (path: string): string => `POST ${path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX0\r\n\r\n`
  const open = parseResponses(await rawExchange(gw.port, bad('/open') + 'GET /open/behind HTTP/1.1\r\nHost: a\r\n\r\n'))
  t.same(open.map(r => r.status), [400], 'admitted: the forward answers 400 as it starts, and the connection closes')
  t.equal(open[0]?.json?.reason, 'the chunked request body cannot be parsed')
  t.equal((await rawRequest(gw.port, 'GET /tight HTTP/1.1\r\nHost: a\r\n')).status, 200, 'the tight limit\'s one request')
  const tight = parseResponses(await rawExchange(gw.port, bad('/tight')))
  t.same(tight.map(r => r.status), [429], 'refused by its limit: that answer, then the connection closed')
  t.equal(tight[0]?.headers.connection, 'close')
  t.same(upstream.log, ['/tight'], 'no unparsable body reached the upstream')
})

t.test('an upload pipelined behind a slow answer waits for its turn; a body found unparsable meanwhile gets its 400 after that answer', async t => {
  let reached = false
  let releaseSlow = (): void => {}
  const { url } = await startHttpServer(t, (req, res) => {
    if (req.url === '/slow') {
      releaseSlow = () => { res.end('slow') }
      return
    }
    // would answer at the head and read on (a full-duplex upload)
    reached = true
    res.writeHead(200, { 'content-type': 'text/plain' })
    res.flushHeaders()
    req.resume()
    req.on('error', () => {})
  })
  const gw = await oneRoute(t, url, 'server: { bufferBodies: 0, clientBodyTimeout: 30s }')
  const c = rawConnection(gw.port)
  c.send('GET /slow HTTP/1.1\r\nHost: a\r\n\r\nPOST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n')
  await new Promise(resolve => setTimeout(resolve, 300))
  // one request at a time per connection (as nginx and Envoy serve one): the upload starts when
  // the answer before it is done
  t.notOk(reached, 'the upload is not forwarded while the answer before it is owed')
  c.send('zz\r\n')
  await new Promise(resolve => setTimeout(resolve, 100))
  releaseSlow()
  await c.closed
  const replies = parseResponses(c.received())
  t.same(replies.map(r => r.status), [200, 400], 'the slow answer, then the 400')
  t.equal(replies[1]?.json?.reason, 'the chunked request body cannot be parsed')
  t.notOk(reached, 'the unparsable upload never reached the upstream')
})

t.test('a client that sends on after its unparsable body, reading later, still gets the 400', async t => {
  const upstream = await startUpstream(t)
  for (const bufferBodies of ['1mb', '0']) {
    const gw = await oneRoute(t, upstream.url, `server: { bufferBodies: ${bufferBodies}, clientBodyTimeout: 30s }`)
    const c = net.connect(gw.port, '127.0.0.1')
    c.on('error', () => {})
    const closed = new Promise(resolve => c.once('close', resolve))
    // reads nothing until it has sent its whole upload, as a simple client does
    c.pause()
    c.write('POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n')
    for (let i = 0; i < 30 && !c.destroyed; i++) {
      c.write('x'.repeat(1024))
      await new Promise(resolve => setTimeout(resolve, 10))
    }
    let text = ''
    c.setEncoding('latin1')
    c.on('data', (chunk: string) => { text += chunk })
    c.resume()
    await closed
    // the socket was destroyed at the next read after the 400 went out: the reset discarded it
    t.same(parseResponses(text).map(r => r.status), [400], `bufferBodies ${bufferBodies}: the 400 reached the client`)
  }
})

t.test('the unparsable rest of a body whose request was answered whole ends the connection, without a second answer or line', async t => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url, 'server: { bufferBodies: 0, clientBodyTimeout: 30s }')
  const c = rawConnection(gw.port)
  // /status answers at once, reading the body on: the answer ends while the body still arrives
  c.send('POST /status?code=200 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n')
  await c.untilText(/\r\n\r\n\{[^}]*\}/)
  c.send('zz\r\n')
  await c.closed
  // a 400 after it read as the answer to the client's next request, and was logged as a second request
  t.same(parseResponses(c.received()).map(r => r.status), [200], 'the answer, then the connection closed')
  await new Promise(resolve => setTimeout(resolve, 200))
  t.same(gw.lines.filter(l => l.msg === 'request').map(l => l.status), [200], 'one line')
})

t.test('a body found unparsable while its upstream connection is being made is answered at once', async t => {
  // a TLS target whose handshake never ends: the request waits in its connection attempt
  const hanging = net.createServer((socket) => { socket.on('error', () => {}) })
  await new Promise<void>((resolve) => hanging.listen(0, '127.0.0.1', resolve))
  t.teardown(() => hanging.close())
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { bufferBodies: 0, clientBodyTimeout: 30s }
upstreams:
  slow: { targets: ["https://127.0.0.1:${(hanging.address() as net.AddressInfo).port}"], timeouts: { connect: 6s } }
routes:
  - { name: all, pathPrefix: /, upstream: slow }
`)
  const started = Date.now()
  const replies = parseResponses(await rawExchange(gw.port, 'POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX0\r\n\r\n'))
  t.same(replies.map(r => r.status), [400])
  // it waited for the attempt's end (timeouts.connect, 6 s) before
  t.ok(Date.now() - started < 3000, `answered while the attempt still ran (${Date.now() - started} ms)`)
})

/** Writes `raw`, then ten bytes more every `everyMs` until the gateway closes the connection; what came back. */
async function sendingOn (port: number, raw: string, everyMs: number): Promise<string> {
  const c = rawConnection(port)
  c.send(raw)
  const sending = setInterval(() => { c.send('0123456789') }, everyMs)
  await c.closed
  clearInterval(sending)
  return c.received()
}

t.test('a parse error behind a slow answer, its client sending on, is handled once: one line, no listener piled up per read', async t => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  const warnings: string[] = []
  const onWarning = (w: Error): void => { warnings.push(w.name) }
  process.on('warning', onWarning)
  t.teardown(() => { process.off('warning', onWarning) })
  // node's parser reports its error again at each read after it: the gateway logged a bad head
  // once per read, and added a close listener per read for a bad body
  for (const bad of ['GET /bad HTTP/1.1\r\nHost: a\r\nbad header: x\r\n\r\n', 'POST /bad HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX']) {
    const text = await sendingOn(gw.port, 'GET /slow?ms=600 HTTP/1.1\r\nHost: a\r\n\r\n' + bad, 20)
    t.equal(parseResponses(text)[0]?.status, 200, `${bad.slice(0, 4)}: the slow answer came first`)
  }
  for (let i = 0; i < 500 && gw.lines.filter(l => l.msg === 'request').length < 4; i++) await new Promise(resolve => setTimeout(resolve, 10))
  await new Promise(resolve => setTimeout(resolve, 200))
  t.same(gw.lines.filter(l => l.msg === 'request').map(l => String(l.status)).sort(), ['200', '200', '400', '400'], 'one line for each request')
  t.same(warnings, [], 'no warning (MaxListenersExceededWarning)')
})

t.test('server.requestTimeout still cuts a connection kept for the answers before a bad body', async t => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url, 'server: { headersTimeout: 1s, requestTimeout: 1s }')
  // the GET's answer takes 4 s; its connection, with a bad body behind it and a client sending
  // on, outlived requestTimeout once the parse error was handled (node's timeout came as a
  // second clientError)
  const text = await sendingOn(gw.port, 'GET /slow?ms=4000 HTTP/1.1\r\nHost: a\r\n\r\nPOST /bad HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX', 50)
  t.same(parseResponses(text).map(r => r.status), [], 'cut before the slow answer came')
})
