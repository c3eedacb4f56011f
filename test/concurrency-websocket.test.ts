// Issue 10: a WebSocket holds its concurrency lease until either side closes, so `concurrency:
// { user: N }` on a websocket route caps the WebSockets a user has open across all instances.
import t from 'tap'
import { once } from 'node:events'
import net from 'node:net'
import { randomBytes } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import { WebSocket } from 'ws'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { eventually, metric, sleep } from './helpers/ratelimit.js'
import { writeFileSync } from 'node:fs'
import type { Teardown } from './helpers/teardown.js'

const redis = await startRedis(t)
const reader = redis.client()

type Outcome = { ok: true, ws: WebSocket } | { ok: false, status: number, retryAfter: string | undefined, body: Record<string, unknown> }

/** Opens a WebSocket as `user`; answers the open socket or the refusal the gateway wrote. */
async function open (t: Teardown, url: string, user: string): Promise<Outcome> {
  const ws = new WebSocket(url, { headers: { 'x-user-id': user } })
  t.teardown(() => ws.terminate())
  ws.on('error', () => {})
  return await Promise.race([
    once(ws, 'open', { signal: AbortSignal.timeout(5000) }).then((): Outcome => ({ ok: true, ws })),
    once(ws, 'unexpected-response').then(async ([, res]): Promise<Outcome> => {
      const r = res as IncomingMessage
      let text = ''
      for await (const chunk of r) text += String(chunk)
      return { ok: false, status: r.statusCode ?? 0, retryAfter: r.headers['retry-after'] as string | undefined, body: JSON.parse(text) as Record<string, unknown> }
    })
  ])
}

function config (upstream: string, store: 'redis' | 'memory', autoPipelining = false): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${store === 'redis' ? `redis: { url: ${redis.url}, timeout: 2s, onError: deny, keyPrefix: ws, autoPipelining: ${autoPipelining} }` : ''}
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: events
    pathPrefix: /ws/
    websocket: true
    upstream: backend
    concurrency: { user: 2 }
`
}

for (const store of ['redis', 'memory'] as const) {
  t.test(`${store}: at most 2 open WebSockets per user; a close from either side frees one`, async t => {
    const up = await startUpstream(t)
    const gw = await startGateway(t, config(up.url, store))
    const url = `${gw.url.replace(/^http/, 'ws')}/ws/feed`
    const first = await open(t, url, 'alice')
    const second = await open(t, url, 'alice')
    t.ok(first.ok && second.ok, 'two open')
    t.equal(await metric(gw.adminUrl, 'gateway_websockets_open', { route: 'events' }), 2, 'gateway_websockets_open{route} = 2')
    const third = await open(t, url, 'alice')
    t.match(third, { ok: false, status: 429, retryAfter: '1', body: { error: 'GW_ERR_CONCURRENCY_LIMITED', dimension: 'user', limit: 'events.concurrency.user' } }, 'the third is refused with 429')
    t.equal(up.upgrades.length, 2, 'the upstream saw 2 upgrades')
    t.ok((await open(t, url, 'bob')).ok, 'another user has a cap of his own')

    // the client closes one
    if (first.ok) first.ws.close()
    await eventually('gauge back to 2 (alice 1, bob 1)', async () => await metric(gw.adminUrl, 'gateway_websockets_open', { route: 'events' }) === 2, 3000)
    let reopened: Outcome = { ok: false, status: 0, retryAfter: undefined, body: {} }
    await eventually('a client close frees a lease', async () => (reopened = await open(t, url, 'alice')).ok, 3000, 100)
    t.ok(reopened.ok)

    // the upstream closes one ('close-me' makes the echo server close it)
    if (second.ok) second.ws.send('close-me')
    await eventually('an upstream close frees a lease', async () => (await open(t, url, 'alice')).ok, 3000, 100)
    if (store === 'redis') t.equal(await reader.zcard('ws:lease:events.user:alice'), 2, 'Redis holds exactly alice\'s 2 open WebSockets')
  })
}

t.test('a reload that rebuilds the Redis connection keeps the leases of open WebSockets until they close', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'redis'))
  const url = `${gw.url.replace(/^http/, 'ws')}/ws/feed`
  const key = 'ws:lease:events.user:bob'
  const first = await open(t, url, 'bob')
  const second = await open(t, url, 'bob')
  t.ok(first.ok && second.ok, 'two open')
  // a changed connection setting (a password rotation does the same): a new client, the old one retired
  writeFileSync(gw.configFile, config(up.url, 'redis', true))
  t.match(await gw.reload(), { ok: true })
  // the replaced runtime has no HTTP request in flight: its sweep runs at once
  await eventually('the replaced connection is retired', async () => gw.lines.some(l => l.msg === 'a replaced Redis connection stays open until the leases it holds are released'), 3000).catch(() => {})
  t.equal(await reader.zcard(key), 2, 'both leases still held in Redis')
  await sleep(300)
  const third = await open(t, url, 'bob')
  t.match(third, { ok: false, status: 429 }, 'the cap still counts the WebSockets opened before the reload')
  if (first.ok) first.ws.close()
  await eventually('the closed WebSocket\'s lease released through the old connection', async () => await reader.zcard(key) === 1, 3000)
  const fourth = await open(t, url, 'bob')
  t.ok(fourth.ok, 'a new WebSocket takes the freed place')
  t.equal(await reader.zcard(key), 2)
  // the last lease of the old connection given back: it closes (its client leaves Redis)
  const clients = async (): Promise<number> => String(await reader.call('CLIENT', 'LIST')).trim().split('\n').length
  const withOld = await clients()
  if (second.ok) second.ws.close()
  await eventually('the replaced connection closes', async () => await clients() < withOld, 3000).catch(() => {})
  t.ok(await clients() < withOld, 'one client fewer on Redis once its last lease is released')
  t.equal(await reader.zcard(key), 1, 'only the WebSocket opened after the reload still counts')
})

for (const store of ['redis', 'memory'] as const) {
  t.test(`${store}: a handshake pipelined behind a slow answer whose client resets the connection takes no lease: the route's cap is not locked`, async t => {
    const up = await startUpstream(t)
    const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${store === 'redis' ? `redis: { url: ${redis.url}, timeout: 2s, onError: deny, keyPrefix: wspipelined }` : ''}
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend, concurrency: { route: 1 } }
  - { name: plain, pathPrefix: /, upstream: backend }
`)
    const client = net.connect(gw.port, '127.0.0.1')
    client.on('error', () => {})
    t.teardown(() => client.destroy())
    // the handshake waits for the answer to /slow, which goes out first (RFC 9112 §9.3.2)
    client.write('GET /slow?ms=300 HTTP/1.1\r\nHost: a\r\n\r\nGET /ws/pipelined HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
      `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`)
    await eventually('the upstream has the slow request', async () => up.log.some(u => u.startsWith('/slow')), 10_000, 10)
    client.resetAndDestroy()
    await eventually('the pipelined handshake is logged', async () => gw.lines.some(l => l.msg === 'request' && l.path === '/ws/pipelined'), 10_000)
    t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/ws/pipelined'), { status: 499 }, 'the handshake is logged as the client\'s abort')
    // its lease was taken once the earlier answer closed, on a socket already closed, and never given back
    const next = await open(t, `${gw.url.replace(/^http/, 'ws')}/ws/next`, 'anyone')
    t.match(next, { ok: true }, 'the next WebSocket on the route opens (it got 429 GW_ERR_CONCURRENCY_LIMITED for good)')
    t.equal(up.upgrades.length, 1, 'the upstream saw the next handshake alone')
  })
}
