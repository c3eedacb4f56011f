// WebSocket through a real gateway: echo on a `websocket: true` route, close propagation both
// ways, and upgrades the gateway must refuse (non-websocket route, no route, bad path, dead upstream).
import t from 'tap'
import { once } from 'node:events'
import http, { type IncomingMessage } from 'node:http'
import { randomBytes } from 'node:crypto'
import type { Duplex } from 'node:stream'
import { WebSocket } from 'ws'
import { backendConfig, spawnGateway, startGateway } from './helpers/gateway.js'
import net from 'node:net'
import { readdirSync } from 'node:fs'
import { refusingUrl, startHttpServer, startUpstream, type Upstream } from './helpers/upstream.js'
import { parseResponses, rawConnection, rawExchange } from './helpers/raw-http.js'
import { eventually, metric, send } from './helpers/ratelimit.js'
import type { Teardown } from './helpers/teardown.js'

function config (upstream: Upstream, refusing: string): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
# the test client stands for a trusted proxy: the request ids it sends are kept (issue 15 item 11)
trustedProxies: [127.0.0.1]
upstreams:
  backend: { targets: [${upstream.url}] }
  down: { targets: [${refusing}] }
routes:
  - name: events
    pathPrefix: /ws/
    websocket: true
    upstream: backend
    stripPrefix: /ws
    headers: { request: { set: { x-route: events } }, response: { set: { x-gw: yes } } }
  - { name: dead, pathPrefix: /dead/, websocket: true, upstream: down }
  - { name: plain, pathPrefix: /, upstream: backend }
`
}

async function setup (t: Teardown): Promise<{ ws: string, upstream: Upstream }> {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream, await refusingUrl()))
  return { ws: gw.url.replace(/^http/, 'ws'), upstream }
}

/** An open client, closed at teardown. */
async function connect (t: Teardown, url: string, headers: Record<string, string> = {}): Promise<{ ws: WebSocket, response: IncomingMessage }> {
  const ws = new WebSocket(url, { headers })
  t.teardown(() => ws.terminate())
  // 'open' follows 'upgrade' in the same tick: listen for both before waiting
  let response: IncomingMessage | null = null
  ws.once('upgrade', (res: IncomingMessage) => { response = res })
  await Promise.race([
    once(ws, 'open', { signal: AbortSignal.timeout(5000) }),
    once(ws, 'unexpected-response').then(([, res]) => { throw new Error(`upgrade refused with ${(res as IncomingMessage).statusCode}`) })
  ])
  if (response === null) throw new Error('open without upgrade')
  return { ws, response: response as IncomingMessage }
}

async function nextMessage (ws: WebSocket): Promise<{ data: Buffer, isBinary: boolean }> {
  const [data, isBinary] = await once(ws, 'message', { signal: AbortSignal.timeout(5000) }) as [Buffer, boolean]
  return { data, isBinary }
}

/**
 * An upgrade request with `path` on the request line as is (the ws client would resolve dot
 * segments itself); answers the refusal's status and JSON body.
 */
async function refused (base: string, path: string, headers: Record<string, string> = {}, method = 'GET'): Promise<{ status: number, body: Record<string, unknown>, requestId: unknown }> {
  const { port } = new URL(base)
  const req = http.request({
    host: '127.0.0.1',
    port,
    path,
    method,
    agent: false,
    headers: { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': randomBytes(16).toString('base64'), ...headers }
  })
  req.end()
  const upgraded = once(req, 'upgrade').then(([res, socket]) => {
    (socket as Duplex).destroy()
    throw new Error(`upgraded with ${(res as IncomingMessage).statusCode}`)
  })
  const [res] = await Promise.race([once(req, 'response', { signal: AbortSignal.timeout(5000) }) as Promise<[IncomingMessage]>, upgraded])
  let text = ''
  res.setEncoding('utf8')
  for await (const chunk of res) text += chunk as string
  return { status: res.statusCode ?? 0, body: JSON.parse(text) as Record<string, unknown>, requestId: res.headers['x-request-id'] }
}

t.test('messages echo through a websocket route; the upstream gets the forwarded headers', async (t) => {
  const { ws: base, upstream } = await setup(t)
  const { ws, response } = await connect(t, `${base}/ws/chat?room=1&x=%2F`, { 'x-request-id': 'ws-req-1', 'x-forwarded-for': '203.0.113.5' })
  t.equal(response.statusCode, 101)
  t.equal(response.headers['x-request-id'], 'ws-req-1', 'the request id is echoed on the 101')
  t.equal(response.headers['x-gw'], 'yes', 'response header rules apply to the 101')

  ws.send('hello')
  const text = await nextMessage(ws)
  t.equal(text.data.toString(), 'hello')
  t.equal(text.isBinary, false)
  const binary = Buffer.from([0, 1, 2, 255, 254])
  ws.send(binary)
  const back = await nextMessage(ws)
  t.equal(back.isBinary, true)
  t.same([...back.data], [...binary])
  const large = Buffer.alloc(2 * 1024 * 1024, 7)
  ws.send(large)
  const largeBack = await nextMessage(ws)
  t.equal(largeBack.data.length, large.length, 'a 2 MB frame makes the round trip')

  t.equal(upstream.upgrades.length, 1)
  const seen = upstream.upgrades[0] as { url: string, headers: Record<string, unknown> }
  t.equal(seen.url, '/chat?room=1&x=%2F', 'prefix stripped, query untouched')
  t.equal(seen.headers['x-forwarded-for'], '203.0.113.5, 127.0.0.1')
  t.equal(seen.headers['x-forwarded-proto'], 'http')
  t.equal(seen.headers['x-request-id'], 'ws-req-1')
  t.equal(seen.headers['x-route'], 'events', 'request header rules apply')
  t.equal(upstream.requests, 0, 'no plain HTTP request was made')
})

t.test('a client close reaches the upstream', async (t) => {
  const { ws: base, upstream } = await setup(t)
  const { ws } = await connect(t, `${base}/ws/a`)
  ws.send('ping')
  await nextMessage(ws)
  const upstreamClosed = upstream.nextWebSocketClose(5000)
  ws.close(4001, 'client leaves')
  const code = await upstreamClosed
  t.equal(code, 4001, 'the upstream sees the client close code')
  const [clientCode] = await once(ws, 'close') as [number]
  t.equal(clientCode, 4001, 'the close handshake completes')
  t.equal(upstream.openWebSockets, 0)
})

t.test('an upstream close reaches the client', async (t) => {
  const { ws: base, upstream } = await setup(t)
  const { ws } = await connect(t, `${base}/ws/b`)
  const closed = once(ws, 'close', { signal: AbortSignal.timeout(5000) }) as Promise<[number, Buffer]>
  ws.send('close-me')
  const [code, reason] = await closed
  t.equal(code, 4000, 'the client sees the upstream close code')
  t.equal(reason.toString(), 'upstream closes')
  t.equal(upstream.openWebSockets, 0)
})

t.test('a client that vanishes without a close frame frees the upstream socket', async (t) => {
  const { ws: base, upstream } = await setup(t)
  const { ws } = await connect(t, `${base}/ws/c`)
  ws.send('x')
  await nextMessage(ws)
  t.equal(upstream.openWebSockets, 1)
  const upstreamClosed = upstream.nextWebSocketClose(5000)
  ws.terminate()
  t.equal(await upstreamClosed, 1006, 'the upstream sees an abnormal closure')
})

t.test('upgrades the gateway refuses', async (t) => {
  const { ws: base, upstream } = await setup(t)
  const plain = await refused(base, '/not-a-ws-route', { 'x-request-id': 'ws-refused-1' })
  t.equal(plain.status, 400, 'an upgrade on a route without websocket: true is refused')
  t.match(plain.body, { error: 'GW_ERR_BAD_REQUEST', message: String, requestId: 'ws-refused-1' })
  t.equal(plain.requestId, 'ws-refused-1')

  const traversal = await refused(base, '/ws/../not-a-ws-route')
  t.equal(traversal.status, 400, 'a dot segment out of the websocket prefix is routed after normalization')
  t.equal(traversal.body.error, 'GW_ERR_BAD_REQUEST')

  const badPath = await refused(base, '/ws/a%2Fb')
  t.equal(badPath.status, 400)
  t.equal(badPath.body.error, 'GW_ERR_BAD_PATH')

  const post = await refused(base, '/ws/echo', {}, 'POST')
  t.equal(post.status, 400, 'an upgrade that is not a GET is refused with a reason (http-proxy destroyed it: a 499 in the log)')
  t.match(post.body, { error: 'GW_ERR_BAD_REQUEST', reason: /must be a GET/ })

  const dead = await refused(base, '/dead/x')
  t.equal(dead.status, 502, 'a refusing upstream answers 502')
  t.equal(dead.body.error, 'GW_ERR_UPSTREAM_UNAVAILABLE')

  t.equal(upstream.upgrades.length, 0, 'no refused upgrade reached the upstream')
  t.equal(upstream.requests, 0)
})

t.test('a HEAD upgrade is refused 400 with no content, which a client reads as a whole answer', async (t) => {
  const { ws: base } = await setup(t)
  const { port } = new URL(base)
  const head = `HEAD /ws/echo HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nx-request-id: ws-head\r\n` +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`
  const text = await rawExchange(Number(port), head)
  t.match(text, /^HTTP\/1\.1 400 [^]*\r\nx-request-id: ws-head\r\n/, 'refused 400 with its request id')
  t.ok(text.endsWith('\r\n\r\n'), `nothing after the head (a HEAD answer has no content): ${JSON.stringify(text.slice(text.indexOf('\r\n\r\n') + 4))}`)
  // node's client took the JSON after the head for a next answer and failed the request
  const req = http.request({ host: '127.0.0.1', port, path: '/ws/echo', method: 'HEAD', agent: false, headers: { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': randomBytes(16).toString('base64') } })
  const errors: string[] = []
  req.on('error', (err) => { errors.push(err.message) })
  req.end()
  const [res] = await once(req, 'response', { signal: AbortSignal.timeout(5000) }) as [IncomingMessage]
  res.resume()
  await once(req, 'close')
  t.equal(res.statusCode, 400, 'node\'s client reads the 400')
  t.same(errors, [], 'and no parse error after it')
})

t.test('a refused upgrade\'s socket is closed by the gateway, even when the client never closes its side', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await spawnGateway(t, backendConfig(upstream.url, '  - { name: plain, pathPrefix: /, upstream: backend }\n'))
  const pid = gw.child.pid as number
  const fds = (): number => readdirSync(`/proc/${pid}/fd`).length
  const before = fds()
  // half-open clients: they read the answer and the gateway's FIN, and never send their own
  const clients = await Promise.all(Array.from({ length: 20 }, async () => {
    const socket = net.connect({ port: gw.port, host: '127.0.0.1', allowHalfOpen: true })
    t.teardown(() => socket.destroy())
    let text = ''
    socket.setEncoding('latin1')
    socket.on('data', (c: string) => { text += c })
    socket.write('GET /x HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n')
    await once(socket, 'end')
    return text
  }))
  t.ok(clients.every((text) => text.startsWith('HTTP/1.1 400 ')), 'each got its 400')
  // ended alone, each socket stayed open in the gateway for as long as its client kept it
  const deadline = Date.now() + 10_000
  while (fds() > before && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50))
  t.ok(fds() <= before, `the gateway holds no socket of theirs (${fds()} file descriptors, ${before} before)`)
})

t.test('an upstream refusing an upgrade with a chunked answer: relayed with its framing whole and no hop-by-hop fields', async (t) => {
  const { server, url } = await startHttpServer(t, (_req, res) => { res.end() })
  server.on('upgrade', (_req, socket: Duplex) => {
    socket.end('HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n' +
      'connection: keep-alive, x-hop\r\nkeep-alive: timeout=5\r\nx-hop: 1\r\nx-kept: 1\r\n\r\n5\r\nnope!\r\n4\r\n, no\r\n0\r\n\r\n')
  })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}] }
routes:
  - { name: events, pathPrefix: /, websocket: true, upstream: backend }
`)
  const text = await rawExchange(gw.port, 'GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`)
  const [reply] = parseResponses(text)
  t.equal(reply?.status, 403)
  t.equal(reply?.body, 'nope!, no', 'the body as sent, delimited by the connection\'s end (a chunked header over the decoded body broke it)')
  t.same([reply?.headers['transfer-encoding'], reply?.headers['keep-alive'], reply?.headers['x-hop'], reply?.headers.connection], [undefined, undefined, undefined, 'close'])
  t.equal(reply?.headers['x-kept'], '1', 'end-to-end fields kept')
})

t.test('an upstream refusing an upgrade whose answer stalls mid-body: the client socket is cut after the idle timeout', async (t) => {
  const { server, url } = await startHttpServer(t, (_req, res) => { res.end() })
  const upstreamSockets: Duplex[] = []
  server.on('upgrade', (_req, socket: Duplex) => {
    upstreamSockets.push(socket)
    // a first chunk, then nothing: neither more body nor the end
    socket.write('HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n5\r\nnope!\r\n')
  })
  t.teardown(() => { for (const s of upstreamSockets) s.destroy() })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}], timeouts: { idle: 300ms } }
routes:
  - { name: events, pathPrefix: /, websocket: true, upstream: backend }
`)
  const client = net.connect(gw.port, '127.0.0.1')
  t.teardown(() => client.destroy())
  let received = ''
  client.on('data', (chunk: Buffer) => { received += chunk.toString('latin1') })
  client.write('GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`)
  // The client never ends its side. Before the fix nothing closed this socket (waited 5 s here).
  const closed = await Promise.race([once(client, 'close').then(() => true), new Promise((resolve) => setTimeout(() => resolve(false), 5000))])
  t.equal(closed, true, 'the gateway closed the client socket')
  t.match(received, /^HTTP\/1\.1 403 /, 'the answer started')
  t.match(received, /nope!/, 'with the body relayed until it stalled')
  for (let i = 0; i < 100 && gw.openConnections() > 0; i++) await new Promise((resolve) => setTimeout(resolve, 20))
  t.equal(gw.openConnections(), 0, 'no connection held')
})

t.test('the access log and metrics tell a refused upgrade from a tunnel', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream, await refusingUrl()))
  const base = gw.url.replace(/^http/, 'ws')
  const { ws } = await connect(t, `${base}/ws/log`, { 'x-request-id': 'ws-log-ok' })
  ws.send('x')
  await nextMessage(ws)
  t.equal((await refused(gw.url, '/dead/x', { 'x-request-id': 'ws-log-dead' })).status, 502)
  const line = (id: string): Record<string, unknown> | undefined => gw.lines.find((l) => l.msg === 'request' && l.requestId === id)
  t.match(line('ws-log-ok'), { route: 'events', status: 101, path: '/ws/log' })
  t.match(line('ws-log-dead'), { route: 'dead', status: 502 }, 'the status logged is the one the client got')
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(metrics, /gateway_requests_total\{route="dead",method="GET",status_class="5xx"\} 1/)
  t.match(metrics, /gateway_upstream_errors_total\{upstream="down",kind="refused"\} 1/)
})

t.test('the "websocket closed" line counts in bytesIn the frames the client sent with its handshake', async (t) => {
  // a raw upstream: counts what reaches it after the handshake's head
  let forwarded = 0
  const server = net.createServer((socket) => {
    socket.on('error', () => {})
    let head = true
    socket.on('data', (chunk: Buffer) => {
      if (!head) {
        forwarded += chunk.length
        return
      }
      head = false
      forwarded += chunk.length - chunk.indexOf('\r\n\r\n') - 4
      socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n')
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => server.close())
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
trustedProxies: [127.0.0.1]
upstreams:
  backend: { targets: [http://127.0.0.1:${(server.address() as net.AddressInfo).port}] }
routes:
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend }
`)
  // a masked 5-byte text frame ("hello", mask 0)
  const frame = Buffer.from([0x81, 0x85, 0, 0, 0, 0, 0x68, 0x65, 0x6c, 0x6c, 0x6f])
  const client = net.connect(gw.port, '127.0.0.1')
  t.teardown(() => client.destroy())
  client.on('error', () => {})
  const head = 'GET /ws/bytes HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nx-request-id: ws-bytes\r\n' +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`
  client.write(Buffer.concat([Buffer.from(head, 'latin1'), frame]))
  const [answer] = await once(client, 'data', { signal: AbortSignal.timeout(5000) }) as [Buffer]
  t.match(answer.toString('latin1'), /^HTTP\/1\.1 101 /, 'the tunnel opens')
  client.write(frame)
  await eventually('both frames reach the upstream', async () => forwarded === 2 * frame.length)
  await gw.close()
  await eventually('the closing line', async () => gw.lines.some((l) => l.msg === 'websocket closed' && l.requestId === 'ws-bytes'))
  t.match(gw.lines.find((l) => l.msg === 'websocket closed' && l.requestId === 'ws-bytes'), { bytesIn: 2 * frame.length },
    'both frames counted (the one sent with the handshake was left out)')
})

t.test('shutdown closes open WebSockets without waiting for the whole drain budget', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream, await refusingUrl()).replace('admin: 127.0.0.1:0\n', 'admin: 127.0.0.1:0\nserver: { shutdownTimeout: 8s }\n'))
  const { ws } = await connect(t, `${gw.url.replace(/^http/, 'ws')}/ws/held`)
  ws.send('x')
  await nextMessage(ws)
  const clientClosed = once(ws, 'close', { signal: AbortSignal.timeout(10_000) })
  const upstreamClosed = upstream.nextWebSocketClose(10_000)
  const started = Date.now()
  await gw.close()
  const took = Date.now() - started
  await clientClosed
  await upstreamClosed
  t.ok(took < 4000, `the gateway closed in ${took} ms with an idle WebSocket open (budget 8 s)`)
})

t.test('an upstream that breaks off its refusal mid-body: the client gets the truncated answer and the end, never a 502 inside it', async (t) => {
  const { server, url } = await startHttpServer(t, (_req, res) => { res.end() })
  server.on('upgrade', (req: IncomingMessage, socket: net.Socket) => {
    socket.write('HTTP/1.1 401 Unauthorized\r\ncontent-type: text/plain\r\ncontent-length: 100\r\n\r\nabcdefghij')
    // a reset (RST), or a plain close (FIN) before the 100 bytes announced
    setTimeout(() => { if (req.url === '/rst') socket.resetAndDestroy(); else socket.destroy() }, 50)
  })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}], timeouts: { idle: 60s } }
routes:
  - { name: events, pathPrefix: /, websocket: true, upstream: backend }
`)
  for (const path of ['/rst', '/fin']) {
    const started = Date.now()
    const text = await rawExchange(gw.port, `GET ${path} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
      `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`, 20_000)
    t.match(text, /^HTTP\/1\.1 401 /, `${path}: the upstream's answer is relayed`)
    t.ok(text.endsWith('abcdefghij'), `${path}: ends with the bytes the upstream sent, nothing of the gateway's after them`)
    t.notMatch(text, /HTTP\/1\.1 502/, `${path}: no answer of the gateway's inside the body`)
    // the upstream's idle timeout is 60 s: a client left waiting for the rest would hit it
    t.ok(Date.now() - started < 10_000, `${path}: the client's connection ended at once, not after timeouts.idle`)
  }
})

t.test('upgrade headers: a client header named like an Object member arrives as sent; the 101 carries the RateLimit headers', async (t) => {
  const { server, url } = await startHttpServer(t, (_req, res) => { res.end() })
  server.on('upgrade', (req: IncomingMessage, socket: Duplex) => {
    const body = JSON.stringify({ constructor: req.headers.constructor, tostring: req.headers.tostring })
    socket.end(`HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`)
  })
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  refusing: { targets: [${url}] }
  backend: { targets: [${upstream.url}] }
routes:
  - { name: refusing, pathPrefix: /refusing/, websocket: true, upstream: refusing }
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend, limits: { ip: { limit: 10, window: 1m } } }
`)
  const text = await rawExchange(gw.port, 'GET /refusing/x HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nconstructor: y\r\ntoString: z\r\n' +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`)
  t.same(parseResponses(text)[0]?.json, { constructor: 'y', tostring: 'z' }, 'not joined with inherited members')
  const { response } = await connect(t, `${gw.url.replace(/^http/, 'ws')}/ws/x`)
  t.equal(response.headers['ratelimit-policy'], '"events.ip";q=10;w=60', 'an allowed upgrade carries RateLimit-Policy, as an allowed response does')
  t.match(response.headers.ratelimit, /^"events\.ip";r=9;t=\d+$/)
})

t.test('an upgrade pipelined behind a request is answered after it, and its tunnel is not cut by the keep-alive timeout', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { keepAliveTimeout: 500ms }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend }
  - { name: plain, pathPrefix: /, upstream: backend }
`)
  const client = net.connect(gw.port, '127.0.0.1')
  t.teardown(() => client.destroy())
  let received = ''
  client.on('data', (chunk: Buffer) => { received += chunk.toString('latin1') })
  const closed = once(client, 'close').then(() => true)
  client.write('GET /slow?ms=200 HTTP/1.1\r\nHost: a\r\n\r\nGET /ws/x HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`)
  for (let i = 0; i < 250 && !received.includes('HTTP/1.1 101'); i++) await new Promise((resolve) => setTimeout(resolve, 20))
  const first = received.indexOf('HTTP/1.1 200')
  const second = received.indexOf('HTTP/1.1 101')
  t.ok(first === 0 && second > first, `the request's answer first, then the 101: ${JSON.stringify(received.slice(0, 40))}...`)
  // three keep-alive timeouts (each 0.5 s, and node adds 1 s) of silence: a tunnel is idle only after websocketIdleTimeout (5 min)
  t.equal(await Promise.race([closed, new Promise((resolve) => setTimeout(() => resolve(false), 4500))]), false, 'the tunnel is still open')
})

t.test('a client that resets its connection while the upstream is slow to answer the handshake is a client abort: the target is neither charged nor ejected', async (t) => {
  const { server, url } = await startHttpServer(t, (_req, res) => { res.end('plain ok') })
  // the upstream takes the handshake and has not answered when the client gives up
  const upstreamSockets: net.Socket[] = []
  server.on('upgrade', (_req: IncomingMessage, socket: net.Socket) => { upstreamSockets.push(socket) })
  t.teardown(() => { for (const s of upstreamSockets) s.destroy() })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
trustedProxies: [127.0.0.1]
upstreams:
  backend: { targets: [${url}], consecutiveFailures: 2 }
routes:
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend }
  - { name: plain, pathPrefix: /, upstream: backend }
`)
  for (const id of ['ws-abort-1', 'ws-abort-2']) {
    const client = net.connect(gw.port, '127.0.0.1')
    client.on('error', () => {})
    t.teardown(() => client.destroy())
    const arrived = once(server, 'upgrade', { signal: AbortSignal.timeout(10_000) }) as Promise<[IncomingMessage, net.Socket]>
    client.write(`GET /ws/${id} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nx-request-id: ${id}\r\n` +
      `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`)
    const [, upstreamSocket] = await arrived
    // the gateway gives up its upstream request (the upstream's socket is half-open: 'end', not 'close')
    const upstreamEnded = once(upstreamSocket, 'end', { signal: AbortSignal.timeout(10_000) })
    upstreamSocket.resume()
    client.resetAndDestroy()
    await upstreamEnded
    await eventually(`the access line of ${id}`, async () => gw.lines.some((l) => l.msg === 'request' && l.requestId === id), 10_000)
    t.match(gw.lines.find((l) => l.msg === 'request' && l.requestId === id), { status: 499, error: 'client_abort' }, `${id} is logged as the client's abort`)
  }
  // two resets in a row were two upstream failures: consecutiveFailures ejected the target, and
  // plain HTTP on that upstream got 503 GW_ERR_NO_HEALTHY_UPSTREAM
  const plain = await send(`${gw.url}/plain`)
  t.equal(plain.status, 200, `a plain request on the same upstream is served (${plain.text})`)
  const ready = await (await fetch(`${gw.adminUrl}/readyz`)).json() as { upstreams: Record<string, Array<Record<string, unknown>>> }
  t.match(ready.upstreams.backend?.[0], { healthy: true, consecutiveFailures: 0 }, '/readyz: the target is healthy, with no failure counted')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'backend' }), 0, 'no upstream error counted')
  t.notOk(gw.lines.some((l) => l.msg === 'upstream target ejected'), 'no ejection logged')
})

t.test('a handshake with a body is refused 400 without reaching the upstream, and its connection closed', async (t) => {
  let reached = 0
  const { server, url } = await startHttpServer(t, (req, res) => { reached++; req.resume(); res.end() })
  server.on('upgrade', (_req: IncomingMessage, socket: Duplex) => {
    reached++
    socket.end('HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n')
  })
  const gw = await startGateway(t, backendConfig(url, '  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend }\n'))
  const head = (path: string, framing: string): string => `GET ${path} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n${framing}\r\n`
  const cases = [
    { path: '/ws/length', raw: head('/ws/length', 'Content-Length: 5\r\n') + 'hello' },
    { path: '/ws/chunked', raw: head('/ws/chunked', 'Transfer-Encoding: chunked\r\n') + '5\r\nhello\r\n0\r\n\r\n' }
  ]
  for (const { path, raw } of cases) {
    // the gateway's close ends the exchange; a connection left open would run into this timeout
    const started = Date.now()
    const replies = parseResponses(await rawExchange(gw.port, raw, 20_000))
    t.equal(replies.length, 1, `${path}: one answer`)
    t.equal(replies[0]?.status, 400, `${path}: 400 (it was forwarded, its body withheld: the upstream's answer, or a 504 from one waiting for the body)`)
    t.match(replies[0]?.json, { error: 'GW_ERR_BAD_REQUEST', reason: /carries no body/, requestId: String }, `${path}: the JSON body says why`)
    t.equal(replies[0]?.headers.connection, 'close', `${path}: Connection: close`)
    t.ok(Date.now() - started < 10_000, `${path}: the gateway closed the connection`)
  }
  t.equal(reached, 0, 'nothing reached the upstream')
  await eventually('two access lines', async () => gw.lines.filter((l) => l.msg === 'request').length >= 2, 10_000)
  t.same(gw.lines.filter((l) => l.msg === 'request').map((l) => l.status), [400, 400], 'each logged as 400')
})

t.test('a handshake still waiting for its upstream when shutdownTimeout ends is answered and logged 503 shutting_down, and its target is not charged', async (t) => {
  const { server, url } = await startHttpServer(t, (_req, res) => { res.end() })
  // the upstream takes the handshake and never answers
  const upstreamSockets: Duplex[] = []
  server.on('upgrade', (_req: IncomingMessage, socket: Duplex) => { upstreamSockets.push(socket) })
  t.teardown(() => { for (const s of upstreamSockets) s.destroy() })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
trustedProxies: [127.0.0.1]
server: { shutdownTimeout: 500ms }
upstreams:
  backend: { targets: [${url}], consecutiveFailures: 1, timeouts: { response: 60s } }
routes:
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend }
`)
  const arrived = once(server, 'upgrade', { signal: AbortSignal.timeout(10_000) })
  const exchange = rawExchange(gw.port, 'GET /ws/pending HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nx-request-id: ws-cut-at-shutdown\r\n' +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`, 20_000)
  await arrived
  await gw.close()
  const [reply] = parseResponses(await exchange)
  t.equal(reply?.status, 503, 'the client is told the gateway shuts down')
  t.match(reply?.json, { error: 'GW_ERR_SHUTTING_DOWN', requestId: 'ws-cut-at-shutdown' }, 'its JSON body names the code and the request id')
  await eventually('the access line', async () => gw.lines.some((l) => l.msg === 'request' && l.requestId === 'ws-cut-at-shutdown'), 10_000)
  t.match(gw.lines.find((l) => l.msg === 'request' && l.requestId === 'ws-cut-at-shutdown'), { status: 503, error: 'shutting_down' },
    'logged as the gateway\'s cut (it was 502 error=reset, an upstream failure)')
  t.notOk(gw.lines.some((l) => l.msg === 'upstream target ejected'), 'the target is not charged a failure (consecutiveFailures: 1 ejected it)')
})

t.test('an upgrade held by a leaky-bucket delay: a client that leaves is logged 499 at once, a shutdown answers it 503 shutting_down at once', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
trustedProxies: [127.0.0.1]
server: { shutdownTimeout: 20s }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - name: events
    pathPrefix: /ws/
    websocket: true
    upstream: backend
    limits: { ip: { algorithm: leaky-bucket, limit: 1, window: 20s, burst: 3, onLimit: delay, maxDelay: 60s } }
`)
  const head = (id: string): string => `GET /ws/${id} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nx-request-id: ${id}\r\n` +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`
  const line = (id: string): Record<string, unknown> | undefined => gw.lines.find((l) => l.msg === 'request' && l.requestId === id)
  const first = rawConnection(gw.port)
  first.send(head('ws-first'))
  await first.untilText(/^HTTP\/1\.1 101/)
  // the next two wait about 20 s and 40 s for their slots
  const leaving = net.connect(gw.port, '127.0.0.1')
  leaving.on('error', () => {})
  leaving.write(head('ws-leaves'))
  const held = rawExchange(gw.port, head('ws-held'), 30_000)
  await eventually('both are held', async () => await metric(gw.adminUrl, 'gateway_requests_in_flight') === 2)
  leaving.resetAndDestroy()
  await eventually('the leaving client\'s line, long before its slot', async () => line('ws-leaves') !== undefined, 10_000)
  t.match(line('ws-leaves'), { status: 499, outcome: 'client_abort' }, 'logged 499 client_abort')
  const started = Date.now()
  await gw.close()
  const ms = Date.now() - started
  t.ok(ms < 10_000, `the drain did not wait for the held upgrade's slot (${ms} ms, shutdownTimeout 20 s)`)
  const [reply] = parseResponses(await held)
  t.equal(reply?.status, 503, 'the held client is told the gateway shuts down')
  t.match(reply?.json, { error: 'GW_ERR_SHUTTING_DOWN', requestId: 'ws-held' }, 'its JSON body names the code and the request id')
  t.match(line('ws-held'), { status: 503, error: 'shutting_down' }, 'logged 503 shutting_down')
})

t.test('an upgrade answered with a status outside 100-599 is a 502 GW_ERR_UPSTREAM_BAD_RESPONSE; a reason phrase with control bytes is replaced', async (t) => {
  const answers: Record<string, string> = {
    '/ws/000': 'HTTP/1.1 000 Zero\r\nContent-Length: 2\r\n\r\nok',
    '/ws/099': 'HTTP/1.1 099 Low\r\nContent-Length: 2\r\n\r\nok',
    '/ws/600': 'HTTP/1.1 600 Weird\r\nContent-Length: 2\r\n\r\nok',
    '/ws/control': 'HTTP/1.1 403 Forbidden\x01\x00x\r\nContent-Length: 2\r\n\r\nno'
  }
  const { server, url } = await startHttpServer(t, (_req, res) => { res.end() })
  server.on('upgrade', (req: IncomingMessage, socket: Duplex) => {
    socket.on('error', () => {})
    socket.end(Buffer.from(answers[req.url ?? ''] ?? 'HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n', 'latin1'))
  })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}], consecutiveFailures: 100 }
routes:
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend }
`)
  const upgrade = async (path: string): Promise<string> => await rawExchange(gw.port, `GET ${path} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`, 20_000)
  for (const path of ['/ws/000', '/ws/099', '/ws/600']) {
    const replies = parseResponses(await upgrade(path))
    t.equal(replies[0]?.status, 502, `${path}: a 502 (the status went to the client as it came)`)
    t.match(replies[0]?.json, { error: 'GW_ERR_UPSTREAM_BAD_RESPONSE' }, `${path}: a bad response`)
    await eventually('the access line', async () => gw.lines.some((l) => l.msg === 'request' && l.path === path), 10_000)
    t.match(gw.lines.find((l) => l.msg === 'request' && l.path === path), { status: 502, error: 'bad_response' }, `${path}: logged as a bad response`)
  }
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'backend', kind: 'bad_response' }), 3, 'each counted as kind bad_response')
  const readyz = await (await fetch(`${gw.adminUrl}/readyz`)).json() as { upstreams: { backend: Array<{ consecutiveFailures: number }> } }
  t.equal(readyz.upstreams.backend[0]?.consecutiveFailures, 3, 'and as the target\'s failures, not its successes')
  const control = await upgrade('/ws/control')
  t.equal(control.split('\r\n')[0], 'HTTP/1.1 403 Forbidden', 'a reason phrase with control bytes: the status\'s own')
  t.equal(parseResponses(control)[0]?.body, 'no', 'the answer relayed otherwise')
})

t.test('an upstream 101 without an Upgrade header is a 502 GW_ERR_UPSTREAM_BAD_RESPONSE of kind bad_response, no WebSocket opened', async (t) => {
  const { server, url } = await startHttpServer(t, (_req, res) => { res.end() })
  server.on('upgrade', (_req: IncomingMessage, socket: Duplex) => {
    socket.on('error', () => {})
    socket.end('HTTP/1.1 101 Switching Protocols\r\n\r\n')
  })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
trustedProxies: [127.0.0.1]
upstreams:
  backend: { targets: [${url}] }
routes:
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend }
`)
  const replies = parseResponses(await rawExchange(gw.port, 'GET /ws/x HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nx-request-id: ws-101-bare\r\n' +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`, 20_000))
  const reply = replies[0]
  t.equal(reply?.status, 502, 'the client gets a 502 (it got the bare 101, then a closed connection)')
  t.equal(replies.length, 1, 'and nothing after it')
  const readyz = await (await fetch(`${gw.adminUrl}/readyz`)).json() as { upstreams: { backend: Array<{ consecutiveFailures: number }> } }
  t.equal(readyz.upstreams.backend[0]?.consecutiveFailures, 1, 'a failure of the target\'s, toward its ejection (a success undid it)')
  t.match(reply?.json, { error: 'GW_ERR_UPSTREAM_BAD_RESPONSE', requestId: 'ws-101-bare' }, 'its JSON body names the code')
  await eventually('the access line', async () => gw.lines.some((l) => l.msg === 'request' && l.requestId === 'ws-101-bare'), 10_000)
  t.match(gw.lines.find((l) => l.msg === 'request' && l.requestId === 'ws-101-bare'), { status: 502, error: 'bad_response' }, 'logged as a bad response')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'backend', kind: 'bad_response' }), 1, 'counted as kind bad_response')
  t.equal(await metric(gw.adminUrl, 'gateway_requests_total', { route: 'events', status_class: '5xx' }), 1, 'counted as a 5xx')
  t.notOk(gw.lines.some((l) => l.msg === 'websocket closed'), 'no WebSocket was opened (nor closed)')
})

t.test('an upstream 101 reaches the client without its hop-by-hop fields; X-Request-Id on it follows the route\'s response rules', async (t) => {
  const { server, url } = await startHttpServer(t, (_req, res) => { res.end() })
  server.on('upgrade', (_req: IncomingMessage, socket: Duplex) => {
    socket.on('error', () => {})
    // a 101 that names an internal field in Connection, and every hop-by-hop field besides
    socket.end('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade, X-Internal\r\nX-Internal: secret\r\n' +
      'Keep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: x-sum\r\nX-Request-Id: the-upstream-s\r\nX-Kept: 1\r\n\r\n')
  })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
trustedProxies: [127.0.0.1]
upstreams:
  backend: { targets: [${url}] }
routes:
  - { name: removed, pathPrefix: /removed/, websocket: true, upstream: backend, headers: { response: { remove: [x-request-id] } } }
  - { name: set, pathPrefix: /set/, websocket: true, upstream: backend, headers: { response: { set: { x-request-id: fixed } } } }
  - { name: events, pathPrefix: /, websocket: true, upstream: backend }
`)
  const upgrade = async (path: string, id: string): Promise<Record<string, string>> => {
    const text = await rawExchange(gw.port, `GET ${path} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nx-request-id: ${id}\r\n` +
      `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`)
    const reply = parseResponses(text)[0]
    t.equal(reply?.status, 101, `${path}: switched`)
    return reply?.headers ?? {}
  }
  const headers = await upgrade('/ws', 'ws-hop')
  t.same([headers.connection, headers.upgrade], ['Upgrade', 'websocket'], 'the switch itself is kept: Connection: Upgrade and Upgrade')
  t.same(['x-internal', 'keep-alive', 'proxy-connection', 'te', 'trailer'].map(name => headers[name]), [undefined, undefined, undefined, undefined, undefined],
    'the other hop-by-hop fields and the field Connection named are not relayed')
  t.equal(headers['x-kept'], '1', 'end-to-end fields are')
  t.equal(headers['x-request-id'], 'ws-hop', 'the gateway\'s request id, not the upstream\'s')
  t.equal((await upgrade('/removed/ws', 'ws-removed'))['x-request-id'], undefined, 'a route that removes X-Request-Id: none, as on its HTTP answers')
  t.equal((await upgrade('/set/ws', 'ws-set'))['x-request-id'], 'fixed', 'a route that sets it: its value')
})

t.test('a tunnel is outside its upstream\'s maxConnections and queue: an HTTP request is forwarded beside an open tunnel, and an upgrade opens while the one connection is taken', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}], maxConnections: 1, timeouts: { queue: 300ms } }
routes:
  - { name: live, pathPrefix: /ws/, websocket: true, upstream: backend }
  - { name: plain, pathPrefix: /, upstream: backend }
`)
  const ws = gw.url.replace(/^http/, 'ws')
  const first = await connect(t, `${ws}/ws/one`)
  const beside = await send(`${gw.url}/beside`)
  t.equal(beside.status, 200, 'an HTTP request is forwarded while a tunnel is open: the tunnel holds none of the one connection')

  const hanging = http.request(`${gw.url}/hang`, { agent: false })
  hanging.on('error', () => {})
  t.teardown(() => hanging.destroy())
  hanging.end()
  await eventually('the hanging request holds the one connection', async () => upstream.log.includes('/hang'))
  const queued = await send(`${gw.url}/queued`)
  t.equal(queued.status, 503, 'an HTTP request finds the one connection taken and no room in time')
  t.equal(queued.json?.error, 'GW_ERR_UPSTREAM_BUSY')

  const second = await connect(t, `${ws}/ws/two`)
  second.ws.send('through')
  t.equal((await nextMessage(second.ws)).data.toString(), 'through', 'an upgrade opens and echoes while the one connection is taken')
  first.ws.send('still')
  t.equal((await nextMessage(first.ws)).data.toString(), 'still')
  t.same(upstream.upgrades.map(u => u.url), ['/ws/one', '/ws/two'])
})
