// Waiting for an upstream connection: with every target at maxConnections a request waits its
// turn, oldest first, at most maxPending of them and each at most timeouts.queue; beyond either,
// 503 GW_ERR_UPSTREAM_BUSY at once, not a queue without end behind an upstream that slowed down.
import t from 'tap'
import type { ServerResponse } from 'node:http'
import { PassThrough } from 'node:stream'
import { Agent, request } from 'undici'
import { forwardRequest, type ForwardPlan, type ForwardResult } from '../src/proxy/forward.js'
import type { UpstreamPool } from '../src/proxy/upstream-pool.js'
import { testPool, testPlan } from './helpers/proxy-plan.js'
import { backendConfig, startGateway } from './helpers/gateway.js'
import { refusingUrl, startHttpServer, startUpstream } from './helpers/upstream.js'
import type { Teardown } from './helpers/teardown.js'

const client = new Agent({ keepAliveTimeout: 1000, connections: 64 })
t.teardown(() => client.close())

/** An upstream that holds every response until the test releases it, oldest first. */
async function startHoldingUpstream (t: Teardown): Promise<{ url: string, seen: string[], held: ServerResponse[], maxAtOnce: () => number, release: () => void }> {
  const seen: string[] = []
  const held: ServerResponse[] = []
  let open = 0
  let most = 0
  const { url } = await startHttpServer(t, (req, res) => {
    seen.push(req.url ?? '')
    most = Math.max(most, ++open)
    res.on('close', () => { open-- })
    held.push(res)
  })
  return {
    url,
    seen,
    held,
    maxAtOnce: () => most,
    release: () => { held.shift()?.end(JSON.stringify({ ok: true })) }
  }
}

async function startFront (t: Teardown, plan: ForwardPlan): Promise<{ url: string, results: Map<string, ForwardResult> }> {
  const results = new Map<string, ForwardResult>()
  const { url } = await startHttpServer(t, (req, res) => {
    forwardRequest(req, res, plan, { requestId: 'rid', clientIp: '127.0.0.1', proto: 'http', path: req.url ?? '/' }, (result) => results.set(req.url ?? '', result))
  })
  return { url, results }
}

async function call (url: string, signal?: AbortSignal, payload?: string): Promise<{ status: number, error?: string }> {
  const res = await request(url, { dispatcher: client, signal, ...(payload === undefined ? {} : { method: 'POST' as const, body: payload }) })
  const answer = await res.body.json() as { error?: string }
  return { status: res.statusCode, error: answer.error }
}

async function until (what: string, cond: () => boolean): Promise<void> {
  const deadline = Date.now() + 5000
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}

async function busyFront (t: Teardown, over: Parameters<typeof testPool>[2]): Promise<{ pool: UpstreamPool, front: Awaited<ReturnType<typeof startFront>>, up: Awaited<ReturnType<typeof startHoldingUpstream>> }> {
  const up = await startHoldingUpstream(t)
  const pool = testPool(t, [up.url], over)
  return { pool, front: await startFront(t, testPlan(pool)), up }
}

t.test('with every connection busy, requests wait oldest first, maxPending of them; the next gets 503 at once', async (t) => {
  const { pool, front, up } = await busyFront(t, { maxConnectionsPerTarget: 2, maxPending: 2, queueTimeoutMs: 10_000 })
  const answers = ['/1', '/2'].map((path) => call(front.url + path))
  await until('two requests at the upstream', () => up.held.length === 2)
  answers.push(call(front.url + '/3'))
  await until('one waiting', () => pool.pending === 1)
  answers.push(call(front.url + '/4'))
  await until('two waiting', () => pool.pending === 2)
  const refused = await call(front.url + '/5')
  t.same(refused, { status: 503, error: 'GW_ERR_UPSTREAM_BUSY' }, 'the queue is full: refused without waiting')
  t.match(front.results.get('/5'), { status: 503, errorKind: 'queue_full', errorCode: 'GW_ERR_UPSTREAM_BUSY', target: null })
  t.same(up.seen, ['/1', '/2'], 'the waiting requests did not reach the upstream')
  up.release()
  await until('the oldest waiting request at the upstream', () => up.seen.length === 3)
  t.equal(up.seen[2], '/3', 'the freed connection went to the oldest waiting request')
  up.release()
  up.release()
  await until('the last waiting request at the upstream', () => up.seen.length === 4)
  up.release()
  t.same((await Promise.all(answers)).map((a) => a.status), [200, 200, 200, 200])
  t.same(up.seen, ['/1', '/2', '/3', '/4'])
  t.equal(up.maxAtOnce(), 2, 'never more than maxConnections at the upstream')
  t.equal(pool.pending, 0)
})

t.test('a request that waits timeouts.queue gets 503; the upstream never sees it', async (t) => {
  const { pool, front, up } = await busyFront(t, { maxConnectionsPerTarget: 1, queueTimeoutMs: 200 })
  const first = call(front.url + '/held')
  await until('the first request at the upstream', () => up.held.length === 1)
  const waited = await call(front.url + '/waits')
  t.same(waited, { status: 503, error: 'GW_ERR_UPSTREAM_BUSY' })
  t.match(front.results.get('/waits'), { status: 503, errorKind: 'queue_timeout', target: null })
  t.equal(pool.pending, 0, 'it left the queue')
  up.release()
  t.equal((await first).status, 200)
  t.same(up.seen, ['/held'], 'the timed-out request was never sent')
})

t.test('a waiting request whose client leaves gives up its place', async (t) => {
  const { pool, front, up } = await busyFront(t, { maxConnectionsPerTarget: 1, maxPending: 1, queueTimeoutMs: 10_000 })
  const first = call(front.url + '/held')
  await until('the first request at the upstream', () => up.held.length === 1)
  const leaving = new AbortController()
  const gone = call(front.url + '/leaves', leaving.signal).catch((err: unknown) => err)
  await until('one waiting', () => pool.pending === 1)
  leaving.abort()
  await gone
  await until('the abandoned request settled', () => front.results.has('/leaves'))
  t.match(front.results.get('/leaves'), { status: 499, errorKind: 'client_abort' })
  t.equal(pool.pending, 0)
  const next = call(front.url + '/next')
  await until('the next request waiting in the freed place', () => pool.pending === 1)
  up.release()
  await until('the next request at the upstream', () => up.held.length === 1)
  up.release()
  t.equal((await first).status, 200)
  t.equal((await next).status, 200, 'not refused: the abandoned place was given up')
  t.same(up.seen, ['/held', '/next'], 'the abandoned request was never sent')
})

t.test('maxPending: 0 refuses instead of waiting; a free connection is used at once', async (t) => {
  const { front, up } = await busyFront(t, { maxConnectionsPerTarget: 1, maxPending: 0 })
  const first = call(front.url + '/held')
  await until('the first request at the upstream', () => up.held.length === 1)
  t.same(await call(front.url + '/refused'), { status: 503, error: 'GW_ERR_UPSTREAM_BUSY' })
  up.release()
  t.equal((await first).status, 200)
  const again = call(front.url + '/again')
  await until('the next request at the upstream', () => up.held.length === 1)
  up.release()
  t.equal((await again).status, 200)
  t.same(up.seen, ['/held', '/again'])
})

t.test('gateway.yaml: maxPending and timeouts.queue reach the pool, and refusals are counted', async (t) => {
  const up = await startHoldingUpstream(t)
  const yaml = backendConfig(up.url, '  - { name: all, pathPrefix: /, upstream: backend }')
    .replace('backend: { targets: [', 'backend: { maxConnections: 1, maxPending: 1, timeouts: { queue: 1s }, targets: [')
  const gw = await startGateway(t, yaml)
  const first = call(gw.url + '/held')
  await until('the first request at the upstream', () => up.held.length === 1)
  const waits = call(gw.url + '/waits')
  await until('one waiting', () => gw.runtime?.pools.get('backend')?.pending === 1)
  const waiting = await (await request(gw.adminUrl + '/metrics', { dispatcher: client })).body.text()
  t.match(waiting, /gateway_upstream_pending\{upstream="backend"\} 1\n/, 'the waiting request is in the pending gauge')
  // the second waits (maxPending 1): the third finds the queue full
  const full = await call(gw.url + '/full')
  t.same(full, { status: 503, error: 'GW_ERR_UPSTREAM_BUSY' })
  t.same(await waits, { status: 503, error: 'GW_ERR_UPSTREAM_BUSY' }, 'timeouts.queue: 1s')
  up.release()
  t.equal((await first).status, 200)
  const metrics = await (await request(gw.adminUrl + '/metrics', { dispatcher: client })).body.text()
  t.match(metrics, /gateway_upstream_errors_total\{upstream="backend",kind="queue_full"\} 1\n/)
  t.match(metrics, /gateway_upstream_errors_total\{upstream="backend",kind="queue_timeout"\} 1\n/)
  t.match(metrics, /gateway_upstream_pending\{upstream="backend"\} 0\n/)
  t.same(up.seen, ['/held'])
})

t.test('places given up while every connection stays busy do not pile up', async (t) => {
  const pool = testPool(t, ['http://127.0.0.1:9'], { maxConnectionsPerTarget: 1, maxPending: 4, queueTimeoutMs: 60_000 })
  const waiter = { granted: () => {}, refused: () => {} }
  const held = pool.acquire(waiter)
  t.equal(typeof held === 'object' && held !== null && 'url' in held, true, 'the one connection is taken')
  for (let i = 0; i < 10_000; i++) {
    const place = pool.acquire(waiter)
    if (place === null || place === 'full' || 'url' in place) throw new Error('expected a place in the queue')
    pool.cancel(place)
  }
  t.equal(pool.pending, 0)
  t.ok(pool.queuedPlaces <= 64, `cancelled places are dropped (${pool.queuedPlaces} kept of 10,000)`)
})

t.test('a retry after a refused connection waits for a busy target instead of failing', async (t) => {
  const up = await startHoldingUpstream(t)
  // equal weights: the first request goes to the first target, the second to the refusing one
  const pool = testPool(t, [up.url, await refusingUrl()], { maxConnectionsPerTarget: 1, queueTimeoutMs: 10_000 })
  const front = await startFront(t, testPlan(pool))
  const first = call(front.url + '/held')
  await until('the first request at the upstream', () => up.held.length === 1)
  const second = call(front.url + '/retried')
  await until('the retry waiting', () => pool.pending === 1)
  up.release()
  await until('the retry at the upstream', () => up.held.length === 1)
  up.release()
  t.equal((await first).status, 200)
  t.equal((await second).status, 200, 'served by the busy target once it was free (it was 502 refused)')
  t.same(up.seen, ['/held', '/retried'])
})

t.test('a target back from ejection takes the waiting requests at once', async (t) => {
  const held = await startHoldingUpstream(t)
  const other = await startUpstream(t, 'other')
  const pool = testPool(t, [held.url, other.url], { maxConnectionsPerTarget: 1, ejectMs: 300, queueTimeoutMs: 10_000 })
  const front = await startFront(t, testPlan(pool))
  pool.eject(pool.targets[1]!)
  const first = call(front.url + '/held')
  await until('the first request at the upstream', () => held.held.length === 1)
  const waiting = call(front.url + '/waits')
  await until('one waiting', () => pool.pending === 1)
  // the held target never frees: only the other target's return can serve it
  t.equal((await waiting).status, 200, 'served when the ejected target came back')
  t.same(other.log, ['/waits'])
  held.release()
  t.equal((await first).status, 200)
})

t.test('closing the pool answers the waiting requests 503 shutting down; the one in flight finishes', async (t) => {
  const { pool, front, up } = await busyFront(t, { maxConnectionsPerTarget: 1, queueTimeoutMs: 10_000 })
  const first = call(front.url + '/held')
  await until('the first request at the upstream', () => up.held.length === 1)
  const waiting = call(front.url + '/waits')
  await until('one waiting', () => pool.pending === 1)
  const closed = pool.close()
  t.same(await waiting, { status: 503, error: 'GW_ERR_SHUTTING_DOWN' })
  t.match(front.results.get('/waits'), { errorKind: 'shutting_down' })
  up.release()
  t.equal((await first).status, 200)
  await closed
  t.same(up.seen, ['/held'])
})

t.test('a streamed body waiting for a connection is not timed out as a slow client', async (t) => {
  const up = await startHoldingUpstream(t)
  const pool = testPool(t, [up.url], { maxConnectionsPerTarget: 1, queueTimeoutMs: 10_000 })
  // bodies over 10 bytes stream; a client pause of 300 ms is a client timeout
  const front = await startFront(t, testPlan(pool, { bufferBodies: 10, clientBodyTimeoutMs: 300 }))
  const first = call(front.url + '/held')
  await until('the first request at the upstream', () => up.held.length === 1)
  const posted = call(front.url + '/post', undefined, 'x'.repeat(100))
  await until('the POST waiting', () => pool.pending === 1)
  // longer than clientBodyTimeout, with the whole body sent
  await new Promise((resolve) => setTimeout(resolve, 700))
  t.notOk(front.results.has('/post'), 'still waiting, not answered 408')
  up.release()
  await until('the POST at the upstream', () => up.held.length === 1)
  up.release()
  t.equal((await first).status, 200)
  t.equal((await posted).status, 200)
})

t.test('a body that outgrew bufferBodies while waiting for a connection keeps what was read counted in the body budget', async (t) => {
  const up = await startHoldingUpstream(t)
  const pool = testPool(t, [up.url], { maxConnectionsPerTarget: 1, queueTimeoutMs: 10_000 })
  const plan = testPlan(pool, { bufferBodies: 1000 })
  const front = await startFront(t, plan)
  const first = call(front.url + '/held')
  await until('the first request at the upstream', () => up.held.length === 1)
  // 800 bytes (buffered, counted), then 1200 more: the body streams from there, after what was read
  const body = new PassThrough()
  const posted = request(front.url + '/post', { dispatcher: client, method: 'POST', body, headers: { 'content-length': '2000' } })
  body.write('a'.repeat(800))
  await until('the first 800 bytes counted', () => plan.bodyBudget.held === 800)
  body.end('b'.repeat(1200))
  await until('the POST waiting for the connection', () => pool.pending === 1)
  await new Promise((resolve) => setTimeout(resolve, 100))
  t.equal(plan.bodyBudget.held, 800, 'the 800 bytes read are still in memory, and still counted (they were released: 0)')
  up.release()
  await until('the POST at the upstream', () => up.held.length === 1)
  up.release()
  t.equal((await first).status, 200)
  t.equal((await posted).statusCode, 200)
  await until('everything given back', () => plan.bodyBudget.held === 0)
  t.equal(plan.bodyBudget.held, 0)
})
