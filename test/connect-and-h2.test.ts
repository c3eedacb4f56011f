// What is not an HTTP/1.1 request for a route gets a JSON 400 that says why, in order behind the
// requests pipelined before it, and is logged: a CONNECT (a client that takes the gateway for a
// forward proxy, as HTTPS_PROXY pointed at it does) was closed by node without a word, and
// HTTP/2 with prior knowledge was answered with the parser's code alone.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { rawExchange, parseResponses } from './helpers/raw-http.js'
import type { Teardown } from './helpers/teardown.js'

const CONNECT = 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n'

async function gateway (t: Teardown): Promise<Awaited<ReturnType<typeof startGateway>>> {
  const upstream = await startUpstream(t)
  return await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
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
