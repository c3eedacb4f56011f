// What is not an HTTP/1.1 request for a route gets a JSON 400 that says why, in order behind the
// requests pipelined before it, and is logged: a CONNECT (a client that takes the gateway for a
// forward proxy, as HTTPS_PROXY pointed at it does) was closed by node without a word, and
// HTTP/2 with prior knowledge was answered with the parser's code alone.
import t from 'tap'
import net from 'node:net'
import { once } from 'node:events'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { rawExchange, parseResponses } from './helpers/raw-http.js'
import type { Teardown } from './helpers/teardown.js'

const CONNECT = 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n'

async function gateway (t: Teardown, routes = '  - { name: all, pathPrefix: /, upstream: backend }\n'): Promise<Awaited<ReturnType<typeof startGateway>>> {
  const upstream = await startUpstream(t)
  return await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
${routes}`)
}

t.test('CONNECT gets 400 JSON naming the reason, and the connection is closed', async t => {
  const gw = await gateway(t)
  const text = await rawExchange(gw.port, CONNECT)
  const replies = parseResponses(text)
  t.equal(replies.length, 1, 'one answer, then the gateway closed the connection')
  const [reply] = replies
  t.equal(reply?.status, 400)
  t.equal(reply?.headers.connection, 'close')
  t.same(reply?.json, {
    error: 'GW_ERR_BAD_REQUEST',
    message: 'the request is malformed',
    requestId: reply?.headers['x-request-id'],
    reason: 'CONNECT is not served: the gateway is a reverse proxy, not a forward proxy'
  })
  const line = gw.lines.find((l) => l.msg === 'request' && l.error === 'connect')
  t.match(line, { status: 400, route: '-', requestId: reply?.headers['x-request-id'] }, 'logged as an answered request')
})

t.test('a CONNECT pipelined behind a slow request is answered after it', async t => {
  const gw = await gateway(t)
  const replies = parseResponses(await rawExchange(gw.port, 'GET /slow?ms=300 HTTP/1.1\r\nHost: a\r\n\r\n' + CONNECT))
  t.same(replies.map((r) => r.status), [200, 400], 'in order')
  t.equal(replies[0]?.json?.url, '/slow?ms=300')
})

t.test('HTTP/2 with prior knowledge gets 400 JSON that says this listener speaks HTTP/1.1', async t => {
  const gw = await gateway(t)
  const [reply] = parseResponses(await rawExchange(gw.port, 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'))
  t.equal(reply?.status, 400)
  t.equal(reply?.json?.error, 'GW_ERR_BAD_REQUEST')
  t.equal(reply?.json?.message, 'HTTP/2 with prior knowledge is not served: this listener speaks HTTP/1.1')
})

t.test('a CONNECT or an oversized h2c offer behind an answer that closed the connection: nothing written, the gateway serves on', async t => {
  const gw = await gateway(t, `  - { name: small, pathPrefix: /small/, upstream: backend, maxBodySize: 100 }
  - { name: ok, pathPrefix: /ok/, upstream: backend }
`)
  const filler = Array.from({ length: 105 }, (_, i) => `X-${i}: v\r\n`).join('')
  const closing = [
    // refused without its 100 Continue (no route): node closes the connection after the 404...
    'POST /nowhere HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\nx',
    // ...and after a 413 by Content-Length
    `POST /small/x HTTP/1.1\r\nHost: a\r\nContent-Length: 200\r\n\r\n${'y'.repeat(200)}`
  ]
  const behind = [CONNECT, `GET /h2c HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n${filler}\r\n`]
  for (const first of closing) {
    for (const second of behind) {
      const replies = parseResponses(await rawExchange(gw.port, first + second))
      t.equal(replies.length, 1, 'one answer, the first: the connection had ended')
      t.equal(replies[0]?.headers.connection, 'close')
    }
  }
  const [after] = parseResponses(await rawExchange(gw.port, 'GET /ok/after HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n'))
  t.equal(after?.status, 200, 'the gateway still serves')
})

t.test('a client that resets while its CONNECT or upgrade offer waits behind a slow answer does not end the gateway', async t => {
  const gw = await gateway(t)
  for (const offer of [CONNECT, 'GET /h2c HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n', 'GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n']) {
    const socket = net.connect(gw.port, '127.0.0.1')
    socket.on('error', () => {})
    await once(socket, 'connect')
    socket.write('GET /slow?ms=300 HTTP/1.1\r\nHost: a\r\n\r\n' + offer)
    await new Promise((resolve) => setTimeout(resolve, 100))
    socket.resetAndDestroy()
    await new Promise((resolve) => setTimeout(resolve, 400))
  }
  const [after] = parseResponses(await rawExchange(gw.port, 'GET /after HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n'))
  t.equal(after?.status, 200, 'the gateway still serves')
})
