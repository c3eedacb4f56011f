// Issue 15 item 4: WebSocket tunnels outlive every request timeout, so they get their own idle
// timeout and a gateway-wide cap, and a client that leaves closes the upstream side too.
import t from 'tap'
import net from 'node:net'
import http from 'node:http'
import { once } from 'node:events'
import { WebSocket } from 'ws'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { rawExchange, parseResponses } from './helpers/raw-http.js'
import type { Teardown } from './helpers/teardown.js'

const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

async function open (t: Teardown, url: string): Promise<WebSocket> {
  const ws = new WebSocket(url)
  t.teardown(() => ws.terminate())
  await once(ws, 'open', { signal: AbortSignal.timeout(5000) })
  return ws
}

const UPGRADE = 'GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n'

t.test('server.websocketIdleTimeout closes a silent tunnel on both sides; a busy one stays open', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { websocketIdleTimeout: 1s }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: ws, pathPrefix: /, websocket: true, upstream: backend }
`)
  const base = gw.url.replace(/^http/, 'ws')
  const silent = await open(t, `${base}/silent`)
  const busy = await open(t, `${base}/busy`)
  const started = Date.now()
  const silentClosed = once(silent, 'close')
  const upstreamClosed = upstream.nextWebSocketClose(8000)
  const chatter = setInterval(() => busy.send('ping'), 200)
  t.teardown(() => clearInterval(chatter))
  await silentClosed
  const ms = Date.now() - started
  t.ok(ms >= 900 && ms < 6000, `the silent tunnel closed after ${ms} ms (timeout 1 s)`)
  await upstreamClosed
  t.pass('the upstream side of the silent tunnel was closed too')
  await sleep(1500)
  t.equal(busy.readyState, WebSocket.OPEN, 'a tunnel with traffic every 200 ms is still open after 2.5 s')
  clearInterval(chatter)
})

t.test('server.maxWebSockets: an upgrade beyond the cap gets 503 JSON; a freed slot is reused', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { maxWebSockets: 2 }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: ws, pathPrefix: /, websocket: true, upstream: backend }
`)
  const base = gw.url.replace(/^http/, 'ws')
  const first = await open(t, `${base}/1`)
  await open(t, `${base}/2`)
  const [third] = parseResponses(await rawExchange(gw.port, UPGRADE, 5000))
  t.equal(third?.status, 503, 'the third tunnel is refused')
  t.match(third?.json, { error: 'GW_ERR_TOO_MANY_TUNNELS', requestId: String })
  t.equal(upstream.upgrades.length, 2, 'the refused upgrade never reached the upstream')
  t.match(gw.lines.find(l => l.msg === 'request' && l.status === 503), { error: 'too_many_tunnels' })
  first.close()
  await once(first, 'close')
  await sleep(100)
  await open(t, `${base}/3`)
  t.equal(upstream.upgrades.length, 3, 'once one closed, a new tunnel opens')
})

t.test('a client that ends its side closes the tunnel even when the upstream keeps its side open', async t => {
  // An upstream that answers 101 and then ignores the socket: it never closes it on its own.
  const upstreamSockets: net.Socket[] = []
  const server = http.createServer()
  server.on('upgrade', (_req, socket: net.Socket) => {
    upstreamSockets.push(socket)
    socket.on('error', () => {})
    socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n')
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => { for (const s of upstreamSockets) s.destroy(); server.close() })
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [http://127.0.0.1:${(server.address() as net.AddressInfo).port}] }
routes:
  - { name: ws, pathPrefix: /, websocket: true, upstream: backend }
`)
  const client = net.connect(gw.port, '127.0.0.1')
  t.teardown(() => client.destroy())
  client.on('error', () => {})
  client.write(UPGRADE)
  await once(client, 'data')
  const upstreamSocket = upstreamSockets[0]
  if (upstreamSocket === undefined) throw new Error('no upstream socket')
  const upstreamEnded = once(upstreamSocket, 'end')
  const clientClosed = once(client, 'close')
  client.end()
  // The client only closes once the gateway ended its side too (no CLOSE-WAIT left on the
  // gateway); CLOSE_GRACE in websocket.ts is 2 s, so this is well within 6 s.
  await Promise.race([Promise.all([upstreamEnded, clientClosed]), sleep(6000).then(() => { throw new Error('the tunnel stayed half-open') })])
  t.pass('the gateway closed its side towards the client and towards the upstream')
  await sleep(100)
  t.equal(gw.openConnections(), 0, 'the gateway holds no socket of that tunnel')
})
