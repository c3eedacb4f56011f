// The WebSocket proxy through the front door: a `ws` client, a node:http server handing its
// 'upgrade' events to createWebSocketProxy().upgrade, and the upstream's `ws` echo endpoint.
import t from 'tap'
import { once } from 'node:events'
import type { IncomingMessage } from 'node:http'
import WebSocket from 'ws'
import type { UpstreamConfig } from '../src/proxy/upstream-pool.js'
import { createWebSocketProxy } from '../src/proxy/websocket.js'
import type { ForwardPlan, ForwardResult } from '../src/proxy/forward.js'
import { testPlan, testPool } from './helpers/proxy-plan.js'
import { refusingUrl, startBlackhole, startHttpServer, startUpstream } from './helpers/upstream.js'
import type { Teardown } from './helpers/teardown.js'

function planOf (t: Teardown, urls: string[], over: Partial<UpstreamConfig> = {}, plan: Partial<ForwardPlan> = {}): ForwardPlan {
  return testPlan(testPool(t, urls, { name: 'ws', ...over }), plan)
}

interface Front { url: string, results: ForwardResult[], connections: () => Promise<number>, close: () => void }

async function startFront (t: Teardown, plan: ForwardPlan): Promise<Front> {
  const results: ForwardResult[] = []
  const proxy = createWebSocketProxy()
  t.teardown(() => proxy.close())
  const { server, url } = await startHttpServer(t, (_req, res) => res.end())
  server.on('upgrade', (req: IncomingMessage, socket, head: Buffer) => {
    socket.on('error', () => socket.destroy())
    proxy.upgrade(req, socket, head, plan, { requestId: 'ws-rid', clientIp: '192.0.2.7', proto: 'https', path: req.url ?? '/' }, (result) => results.push(result))
  })
  return {
    url: url.replace('http:', 'ws:'),
    results,
    connections: async () => await new Promise<number>((resolve, reject) => server.getConnections((err, n) => err !== null ? reject(err) : resolve(n))),
    close: () => proxy.close()
  }
}

async function open (url: string): Promise<{ ws: WebSocket, response: IncomingMessage }> {
  const ws = new WebSocket(url)
  // 'open' follows 'upgrade' in the same tick: listen for both before awaiting either.
  const upgraded = once(ws, 'upgrade')
  await once(ws, 'open')
  const [response] = await upgraded as [IncomingMessage]
  return { ws, response }
}

async function settle (check: () => boolean | Promise<boolean>, timeoutMs = 3000): Promise<boolean> {
  const until = Date.now() + timeoutMs
  while (Date.now() < until) {
    if (await check()) return true
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  return false
}

t.test('the upstream gets the path as given: an "http:/" in it, a "//" and a target base path are not rewritten', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(t, [upstream.url + '/base'], {}, { stripPrefix: '/live' }))
  // http-proxy's urlJoin collapsed "//" and turned the first "http:/" into "http://"
  const paths = ['/live/fetch/http:/example.com/x?u=http://a//b', '/live/a//b/https:/c', '/live/plain']
  for (const path of paths) {
    const { ws } = await open(front.url + path)
    ws.close()
    await once(ws, 'close')
  }
  t.same(upstream.upgrades.map(u => u.url), ['/base/fetch/http:/example.com/x?u=http://a//b', '/base/a//b/https:/c', '/base/plain'])
})

t.test('echo through the proxy, with forwarded headers and the request id', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(t, [upstream.url], {}, { stripPrefix: '/live' }))
  const { ws, response } = await open(front.url + '/live/chat?room=1')
  t.equal(response.headers['x-request-id'], 'ws-rid', 'request id on the 101 answer')
  ws.send('hello')
  const [text] = await once(ws, 'message') as [Buffer]
  t.equal(text.toString(), 'hello')
  ws.send(Buffer.from([0, 1, 2, 255]))
  const [binary, isBinary] = await once(ws, 'message') as [Buffer, boolean]
  t.ok(isBinary)
  t.same([...binary], [0, 1, 2, 255])
  const big = Buffer.alloc(4 * 1024 * 1024, 7)
  ws.send(big)
  const [echoedBig] = await once(ws, 'message') as [Buffer]
  t.equal(echoedBig.length, big.length, 'a 4 MiB frame passes')
  const seen = upstream.upgrades[0]
  t.equal(seen?.url, '/chat?room=1', 'prefix stripped, query kept')
  t.equal(seen?.headers['x-forwarded-for'], '192.0.2.7')
  t.equal(seen?.headers['x-forwarded-proto'], 'https')
  t.equal(seen?.headers['x-forwarded-host'], front.url.slice('ws://'.length))
  t.equal(seen?.headers['x-request-id'], 'ws-rid')
  t.equal(seen?.headers.upgrade, 'websocket')
  t.match(front.results, [{ status: 101, target: upstream.url, errorKind: null, errorCode: null }], 'done reports the open tunnel once')
  ws.close()
  await once(ws, 'close')
})

t.test('the upstream closing closes the client', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(t, [upstream.url]))
  const { ws } = await open(front.url + '/')
  ws.send('close-me')
  const [code, reason] = await once(ws, 'close') as [number, Buffer]
  t.equal(code, 4000, 'the close frame is relayed')
  t.equal(reason.toString(), 'upstream closes')
  t.ok(await settle(async () => await front.connections() === 0), 'no client socket left on the proxy')
})

t.test('the client closing closes the upstream', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(t, [upstream.url]))
  const { ws } = await open(front.url + '/')
  const closed = upstream.nextWebSocketClose()
  ws.close(1000)
  t.equal(await closed, 1000)
  t.ok(await settle(async () => upstream.openWebSockets === 0 && await front.connections() === 0), 'no socket left')
})

t.test('a client that vanishes (no close frame) closes the upstream', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(t, [upstream.url]))
  const { ws } = await open(front.url + '/')
  const closed = upstream.nextWebSocketClose()
  ws.terminate()
  t.equal(await closed, 1006, 'abnormal closure seen upstream')
  t.ok(await settle(async () => upstream.openWebSockets === 0 && await front.connections() === 0), 'no socket left')
})

t.test('an upstream that refuses gets the client a plain 502', async (t) => {
  const front = await startFront(t, planOf(t, [await refusingUrl()]))
  const ws = new WebSocket(front.url + '/')
  ws.on('error', () => {})
  const [, response] = await once(ws, 'unexpected-response') as [unknown, IncomingMessage]
  t.equal(response.statusCode, 502)
  t.equal(response.headers['x-request-id'], 'ws-rid')
  const chunks: Buffer[] = []
  for await (const chunk of response) chunks.push(chunk as Buffer)
  t.match(JSON.parse(Buffer.concat(chunks).toString()), { error: 'GW_ERR_UPSTREAM_UNAVAILABLE', requestId: 'ws-rid' })
  t.ok(await settle(async () => await front.connections() === 0), 'the client socket is destroyed')
  const again = new WebSocket(front.url + '/')
  again.on('error', () => {})
  const [, second] = await once(again, 'unexpected-response') as [unknown, IncomingMessage]
  t.equal(second.statusCode, 503, 'the refusing target was ejected')
  second.resume()
  t.match(front.results, [
    { status: 502, errorKind: 'refused', errorCode: 'GW_ERR_UPSTREAM_UNAVAILABLE' },
    { status: 503, errorKind: 'no_healthy', errorCode: 'GW_ERR_NO_HEALTHY_UPSTREAM', target: null }
  ])
  t.match((front.results[0]?.error?.cause as { code?: string }).code, 'ECONNREFUSED', 'the socket error kept as cause')
})

t.test('an upstream that cannot be connected to in time gets the client a 504', async (t) => {
  const front = await startFront(t, planOf(t, [await startBlackhole(t)], { connectTimeoutMs: 300 }))
  const ws = new WebSocket(front.url + '/')
  ws.on('error', () => {})
  const [, response] = await once(ws, 'unexpected-response') as [unknown, IncomingMessage]
  t.equal(response.statusCode, 504)
  response.resume()
  t.match(front.results, [{ status: 504, errorKind: 'connect_timeout', errorCode: 'GW_ERR_UPSTREAM_TIMEOUT' }])
})

t.test('an upstream that answers the upgrade with an error status is relayed', async (t) => {
  const { url } = await startHttpServer(t, (_req, res) => {
    res.writeHead(403, { 'content-type': 'text/plain', 'content-length': '20', 'x-upstream-said': 'no' })
    res.end('no websocket for you')
  })
  const front = await startFront(t, planOf(t, [url]))
  const ws = new WebSocket(front.url + '/')
  ws.on('error', () => {})
  const [, response] = await once(ws, 'unexpected-response') as [unknown, IncomingMessage]
  const chunks: Buffer[] = []
  for await (const chunk of response) chunks.push(chunk as Buffer)
  t.equal(response.statusCode, 403, 'the upstream status, not a gateway 502')
  t.equal(response.headers['x-upstream-said'], 'no', 'the upstream headers')
  t.equal(Buffer.concat(chunks).toString(), 'no websocket for you', 'the upstream body')
  t.equal(front.results.length, 1)
  t.equal(front.results[0]?.status, 403, 'the result records the relayed status')
  t.ok(await settle(async () => await front.connections() === 0), 'no client socket left')
})

t.test('close() tears down open tunnels and refuses new upgrades', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(t, [upstream.url]))
  const { ws } = await open(front.url + '/')
  const closed = once(ws, 'close')
  front.close()
  const [code] = await closed as [number]
  t.equal(code, 1006)
  t.ok(await settle(() => upstream.openWebSockets === 0), 'upstream side closed too')
  const late = new WebSocket(front.url + '/')
  late.on('error', () => {})
  const [, response] = await once(late, 'unexpected-response') as [unknown, IncomingMessage]
  t.equal(response.statusCode, 503)
  response.resume()
})
