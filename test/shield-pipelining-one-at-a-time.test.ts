// A connection's requests are served one at a time, as nginx and Envoy serve an HTTP/1.1
// connection. Started as they came, one connection of pipelined GETs took every upstream
// connection and the queue; and once its answers waiting for their turn (404s the gateway gives
// at once) passed node:http's 16 KiB, node:http stopped reading the connection: a client that
// left was not seen, and its upstream request ran on until it answered (README "Client
// disconnects": when the client goes away, the upstream request is aborted).
import t from 'tap'
import net from 'node:net'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { startGateway } from './helpers/gateway.js'
import { startHttpServer, startUpstream } from './helpers/upstream.js'
import { eventually, metric, send } from './helpers/ratelimit.js'

/** `n` GETs of /api/<name><i> written at once on a connection of their own; what comes back is read as it comes. */
function pipeline (port: number, name: string, n: number): { socket: net.Socket, text: () => string, answered: () => number } {
  const socket = net.connect(port, '127.0.0.1')
  socket.on('error', () => {})
  let text = ''
  socket.setEncoding('latin1')
  socket.on('data', (chunk: string) => { text += chunk })
  let raw = ''
  for (let i = 0; i < n; i++) raw += `GET /api/${name}${i} HTTP/1.1\r\nHost: a\r\n\r\n`
  socket.write(raw)
  return { socket, text: () => text, answered: () => (text.match(/HTTP\/1\.1 200/g) ?? []).length }
}

t.test('a pipelining client that leaves has its upstream request aborted, also behind 60 answers waiting their turn', async (t) => {
  let closedEarly = 0
  let started = 0
  const { url } = await startHttpServer(t, (_req: IncomingMessage, res: ServerResponse) => {
    started++
    const timer = setTimeout(() => res.end('late'), 8000)
    res.on('close', () => { if (!res.writableFinished) { clearTimeout(timer); closedEarly++ } })
  })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}], timeouts: { response: 30s } }
routes:
  - { name: api, pathPrefix: /api/, upstream: backend }
`)
  for (const answeredAtOnce of [0, 60]) {
    const before = closedEarly
    const c = net.connect(gw.port, '127.0.0.1')
    c.on('error', () => {})
    c.pause()
    let raw = 'GET /api/slow HTTP/1.1\r\nHost: a\r\n\r\n'
    for (let i = 0; i < answeredAtOnce; i++) raw += `GET /nowhere/${i} HTTP/1.1\r\nHost: a\r\n\r\n`
    const startedBefore = started
    c.write(raw)
    await eventually('the slow request reached the upstream', async () => started > startedBefore, 5000)
    await new Promise(resolve => setTimeout(resolve, 300))
    c.destroy()
    await eventually(`the upstream request aborted within 2 s of its client leaving (${answeredAtOnce} answers held behind it)`, async () => closedEarly > before, 2000)
    t.equal(closedEarly, before + 1, `aborted with ${answeredAtOnce} answers held`)
    await eventually('nothing in flight', async () => await metric(gw.adminUrl, 'gateway_requests_in_flight') === 0, 2000)
    t.equal(gw.lines.filter(l => l.msg === 'request' && String(l.path).startsWith('/nowhere/')).length, 0, 'the requests never started are not logged')
  }
})

t.test('one connection of 100 pipelined GETs holds one upstream request at a time: another client is served meanwhile, every GET answered in order', async (t) => {
  let busy = 0
  let most = 0
  const { url } = await startHttpServer(t, (req: IncomingMessage, res: ServerResponse) => {
    busy++
    most = Math.max(most, busy)
    setTimeout(() => { busy--; res.end(req.url) }, req.url === '/api/other' ? 0 : 2)
  })
  // 4 connections and no queue: 100 requests started at once got 96 refusals of 503
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}], maxConnections: 4, maxPending: 0 }
routes:
  - { name: api, pathPrefix: /api/, upstream: backend }
`)
  const c = pipeline(gw.port, 'p', 100)
  await eventually('the pipelined GETs under way', async () => busy > 0, 5000)
  const other = await send(`${gw.url}/api/other`)
  t.equal(other.status, 200, 'another client is served while the pipeline runs')
  await eventually('every pipelined GET answered', async () => c.answered() === 100, 20_000)
  c.socket.write('GET /api/after HTTP/1.1\r\nHost: a\r\n\r\n')
  await eventually('the next request on the connection answered', async () => c.text().includes('/api/after'), 5000)
  c.socket.destroy()
  const bodies = [...c.text().matchAll(/\r\n\r\n(\/api\/[a-z0-9]+)/g)].map(m => m[1])
  t.same(bodies, [...Array.from({ length: 100 }, (_, i) => `/api/p${i}`), '/api/after'], 'in order')
  t.ok(most <= 2, `at most one upstream request of the pipeline at a time (with the other client's: ${most})`)
})

t.test('a client writing more than 128 requests ahead of the one served is closed, warned of; nothing stays in flight', async (t) => {
  const { url } = await startHttpServer(t, (req: IncomingMessage, res: ServerResponse) => { setTimeout(() => res.end(req.url), 5) })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}] }
routes:
  - { name: api, pathPrefix: /api/, upstream: backend }
`)
  const c = net.connect(gw.port, '127.0.0.1')
  c.on('error', () => {})
  const closed = new Promise(resolve => c.once('close', resolve))
  let raw = ''
  // the one served, 128 waiting, and one more
  for (let i = 0; i < 130; i++) raw += `GET /api/p${i} HTTP/1.1\r\nHost: a\r\n\r\n`
  c.write(raw)
  c.resume()
  t.ok(await Promise.race([closed.then(() => true), new Promise(resolve => setTimeout(resolve, 10_000, false))]), 'the connection is closed')
  t.ok(gw.lines.some(l => l.level === 40 && String(l.msg).startsWith('connection closed: a client wrote more than 128 requests ahead')), 'warned of')
  await eventually('nothing in flight', async () => await metric(gw.adminUrl, 'gateway_requests_in_flight') === 0, 5000)
  t.equal((await send(`${gw.url}/api/after`)).status, 200, 'the gateway serves on')

  // 129 (the one served and 128 waiting) are all answered
  const d = pipeline(gw.port, 'q', 129)
  await eventually('all 129 answered', async () => d.answered() === 129, 20_000)
  d.socket.destroy()
})

t.test('an upload pipelined behind an answer longer than server.requestTimeout waits for its turn: both are served', async (t) => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { requestTimeout: 2s, headersTimeout: 1s }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const c = net.connect(gw.port, '127.0.0.1')
  c.on('error', () => {})
  let text = ''
  c.setEncoding('latin1')
  c.on('data', (chunk: string) => { text += chunk })
  const closed = new Promise(resolve => c.once('close', resolve))
  // 4 MiB: more than the socket's buffers take while the upload is not read
  const size = 4 * 1024 * 1024
  c.write(`GET /slow?ms=3000 HTTP/1.1\r\nHost: a\r\n\r\nPOST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: ${size}\r\n\r\n`)
  c.write(Buffer.alloc(size, 97))
  await eventually('both answered', async () => (text.match(/HTTP\/1\.1 200/g) ?? []).length === 2, 20_000)
  t.match(text, /"bytes":4194304/, 'the whole upload reached the upstream')
  c.end()
  await closed
  t.notOk(gw.lines.some(l => l.msg === 'request' && l.status === 408), 'no request cut as a client timeout')
})
