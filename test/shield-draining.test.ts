// Issue 15 item 16: what clients and the access log see while the gateway drains, and when a
// response is cut half-way.
import t from 'tap'
import http from 'node:http'
import net from 'node:net'
import { once } from 'node:events'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { metric } from './helpers/ratelimit.js'
import { parseResponses } from './helpers/raw-http.js'
import type { Teardown } from './helpers/teardown.js'

const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

function config (upstream: string, shutdownTimeout = '5s'): string {
  return `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { shutdownTimeout: ${shutdownTimeout} }
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`
}

/** A GET on a keep-alive agent; answers status, headers and body, or the error that ended it. */
function get (url: string, agent: http.Agent): Promise<{ status: number, headers: http.IncomingHttpHeaders, body: string, error: string | null }> {
  return new Promise(resolve => {
    const req = http.get(url, { agent }, res => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c: string) => { body += c })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body, error: null }))
      res.on('error', err => resolve({ status: res.statusCode ?? 0, headers: res.headers, body, error: err.message }))
      res.on('aborted', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body, error: 'aborted' }))
    })
    req.on('error', err => resolve({ status: 0, headers: {}, body: '', error: err.message }))
  })
}

t.test('while draining, responses carry Connection: close', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  const agent = new http.Agent({ keepAlive: true })
  t.teardown(() => agent.destroy())
  const before = await get(`${gw.url}/warm`, agent)
  t.equal(before.headers.connection, 'keep-alive', 'before: keep-alive')
  const inflight = get(`${gw.url}/slow?ms=600`, agent)
  await sleep(150)
  const closing = gw.close()
  const reply = await inflight
  t.equal(reply.status, 200, 'the request in flight finishes')
  t.equal(reply.headers.connection, 'close', 'and tells the client to close')
  await closing
})

t.test('a request cut at shutdownTimeout is logged as shutting_down (503), not as a client abort (499)', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url, '300ms'))
  const agent = new http.Agent({ keepAlive: true })
  t.teardown(() => agent.destroy())
  const hanging = get(`${gw.url}/hang`, agent)
  const dripping = get(`${gw.url}/drip?chunks=50&intervalMs=100`, new http.Agent())
  await sleep(200)
  await gw.close()
  await hanging
  const drip = await dripping
  t.equal(drip.status, 200, 'the dripping response had started')
  t.ok(drip.error !== null, 'and was cut')
  const line = (path: string): Record<string, unknown> | undefined => gw.lines.find(l => l.msg === 'request' && l.path === path)
  t.match(line('/hang'), { status: 503, error: 'shutting_down' })
  t.match(line('/drip?chunks=50&intervalMs=100'), { status: 503, sentStatus: 200, error: 'shutting_down' }, 'cut mid-body: an error, with the status its head had carried')
  t.equal(gw.lines.filter(l => l.status === 499).length, 0, 'nothing logged as a client abort')
})

t.test('a request held by a leaky-bucket delay when shutdownTimeout ends is logged as shutting_down (503), not as a client abort (499)', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { shutdownTimeout: 300ms }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - name: all
    pathPrefix: /
    upstream: backend
    limits: { ip: { algorithm: leaky-bucket, limit: 1, window: 30s, burst: 3, onLimit: delay, maxDelay: 60s } }
`)
  t.equal((await get(`${gw.url}/first`, new http.Agent())).status, 200, 'the first request passes at once')
  // the next waits about 30 s for its slot
  const held = get(`${gw.url}/held`, new http.Agent())
  await sleep(200)
  await gw.close()
  t.ok((await held).error !== null, 'the held request was cut')
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/held'), { status: 503, error: 'shutting_down' })
  t.equal(gw.lines.filter(l => l.status === 499).length, 0, 'nothing logged as a client abort')
})

async function resettingUpstream (t: Teardown): Promise<string> {
  // Headers and half the announced body, then a reset.
  const server = net.createServer(socket => {
    socket.on('error', () => {})
    socket.once('data', () => {
      socket.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf of it', () => setTimeout(() => socket.resetAndDestroy(), 50))
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => server.close())
  return `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`
}

t.test('a response cut mid-body by the upstream is logged and counted as an error, not as a 2xx', async t => {
  const gw = await startGateway(t, config(await resettingUpstream(t)))
  const reply = await get(`${gw.url}/cut`, new http.Agent())
  t.equal(reply.status, 200, 'the client got the head')
  t.ok(reply.error !== null, 'and a cut body')
  await sleep(50)
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/cut'), { status: 502, sentStatus: 200, error: 'reset' })
  t.equal(await metric(gw.adminUrl, 'gateway_requests_total', { route: 'all', status_class: '5xx' }), 1, 'counted as 5xx')
  t.equal(await metric(gw.adminUrl, 'gateway_requests_total', { route: 'all', status_class: '2xx' }), 0, 'not as 2xx')
})

// README (error table): GW_ERR_SHUTTING_DOWN is "a WebSocket upgrade arriving while the gateway drains".
t.test('a WebSocket upgrade arriving while the gateway drains gets 503 GW_ERR_SHUTTING_DOWN and never reaches the upstream', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url, '10s').replace('routes:\n', 'routes:\n  - { name: ws, pathPrefix: /ws/, websocket: true, upstream: backend }\n'))
  // A request in flight keeps the drain going; the listener is closed by then, so the upgrade
  // comes on a connection opened before the drain whose head was only half sent.
  const slow = get(`${gw.url}/slow?ms=3000`, new http.Agent())
  const socket = net.connect(Number(new URL(gw.url).port), '127.0.0.1')
  t.teardown(() => socket.destroy())
  await once(socket, 'connect')
  await new Promise<void>(resolve => socket.write('GET /ws/chat HTTP/1.1\r\nHost: gw\r\n', () => resolve()))
  // The server has read the first bytes (gateway and client share this event loop): the
  // connection is busy with a request, so the drain does not close it as idle.
  await sleep(100)
  const closing = gw.close()
  await sleep(100)
  t.equal(gw.lines.find(l => l.msg === 'request' && l.path === '/slow?ms=3000'), undefined, 'the drain is still running')
  let text = ''
  socket.setEncoding('latin1')
  socket.on('data', (chunk: string) => { text += chunk })
  socket.write('Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n')
  await once(socket, 'close', { signal: AbortSignal.timeout(10_000) })
  const [reply] = parseResponses(text)
  t.equal(reply?.status, 503, 'the documented status')
  t.match(reply?.json, { error: 'GW_ERR_SHUTTING_DOWN', requestId: reply?.headers['x-request-id'] }, 'the documented JSON error code, with the request id')
  t.equal(upstream.upgrades.length, 0, 'the upgrade never reached the upstream')
  t.equal((await slow).status, 200, 'the request in flight still finished')
  await closing
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/ws/chat'), { route: 'ws', status: 503 }, 'logged with the status the client got')
})

t.test('draining with pipelined requests in flight: every one is answered, and the connection closes after the last', async t => {
  const seen: string[] = []
  const upstream = http.createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`)
    req.resume()
    if (req.url === '/slow') setTimeout(() => res.end('slow done'), 800)
    else res.end('second done')
  })
  upstream.listen(0, '127.0.0.1')
  await once(upstream, 'listening')
  t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
  const gw = await startGateway(t, config(`http://127.0.0.1:${(upstream.address() as net.AddressInfo).port}`))
  const socket = net.connect(gw.port, '127.0.0.1')
  let got = ''
  socket.on('data', (d: Buffer) => { got += d.toString('latin1') })
  const closed = once(socket, 'close')
  socket.write('GET /slow HTTP/1.1\r\nHost: a\r\n\r\nPOST /order HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello')
  for (let i = 0; i < 100 && seen.length < 2; i++) await sleep(20)
  t.same(seen, ['GET /slow', 'POST /order'], 'both reached the upstream')
  const closing = gw.close() // what SIGTERM does
  await closed
  await closing
  const replies = parseResponses(got)
  t.same(replies.map(r => `${r.status} ${r.body}`), ['200 slow done', '200 second done'], 'the order the upstream took is answered (it was dropped)')
  t.not(replies[0]?.headers.connection, 'close', 'the first response does not close the connection under the second')
})

t.test('at the drain deadline, a request still waiting for an upstream connection gets 503 shutting down, not a reset', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { shutdownTimeout: 1s }
upstreams:
  backend: { targets: [${upstream.url}], maxConnections: 1 }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const agent = new http.Agent({ keepAlive: true })
  t.teardown(() => agent.destroy())
  const holding = get(`${gw.url}/slow?ms=3000`, agent) // takes the one connection past the deadline
  await sleep(200)
  const waiting = get(`${gw.url}/queued`, agent)
  await sleep(200)
  const closing = gw.close()
  const answer = await waiting
  t.equal(answer.error, null, 'an answer, not a reset')
  t.equal(answer.status, 503)
  t.match(JSON.parse(answer.body), { error: 'GW_ERR_SHUTTING_DOWN' })
  t.notOk(upstream.log.includes('/queued'), 'it never reached the upstream')
  await closing
  await holding
})
