// Upstream pools through the front door: weighted round-robin, passive ejection, retry on another
// target, 503 with every target ejected, connect timeouts, graceful close.
import t from 'tap'
import { Agent, request } from 'undici'
import { UpstreamPool, type UpstreamConfig } from '../src/proxy/upstream-pool.js'
import { forwardRequest, mayRetry, type ForwardPlan, type ForwardResult } from '../src/proxy/forward.js'
import { TEST_UPSTREAM, testPool as poolOf, testPlan as planOf } from './helpers/proxy-plan.js'
import { refusingUrl, startBlackhole, startHttpServer, startUpstream } from './helpers/upstream.js'
import type { Teardown } from './helpers/teardown.js'

const client = new Agent({ keepAliveTimeout: 1000 })
t.teardown(() => client.close())

async function startFront (t: Teardown, plan: ForwardPlan): Promise<{ url: string, results: ForwardResult[] }> {
  const results: ForwardResult[] = []
  const { url } = await startHttpServer(t, (req, res) => {
    forwardRequest(req, res, plan, { requestId: 'rid', clientIp: '127.0.0.1', proto: 'http', path: req.url ?? '/' }, (result) => results.push(result))
  })
  return { url, results }
}

async function call (url: string, method: 'GET' | 'POST' | 'PUT' = 'GET', body?: string): Promise<{ status: number, json: { name?: string, error?: string, body?: string } }> {
  const res = await request(url, { method, body, dispatcher: client })
  return { status: res.statusCode, json: await res.body.json() as { name?: string, error?: string } }
}

t.test('traffic follows the weights (smooth weighted round-robin)', async (t) => {
  const ups = [await startUpstream(t, 'a'), await startUpstream(t, 'b'), await startUpstream(t, 'c')]
  const front = await startFront(t, planOf(poolOf(t, [
    { url: ups[0]!.url, weight: 1 },
    { url: ups[1]!.url, weight: 2 },
    { url: ups[2]!.url, weight: 3 }
  ])))
  const order: string[] = []
  for (let i = 0; i < 300; i++) order.push((await call(front.url + '/')).json.name ?? '')
  t.same(ups.map((u) => u.requests), [50, 100, 150], '1:2:3 of 300 requests')
  // Smooth: the heaviest target never takes more than its share in a row (c, b, a, c, b, c ...).
  t.same(order.slice(0, 6), ['c', 'b', 'a', 'c', 'b', 'c'])
})

t.test('an idempotent request is retried once on another target when the first refuses', async (t) => {
  const second = await startUpstream(t, 'second')
  const front = await startFront(t, planOf(poolOf(t, [{ url: await refusingUrl() }, { url: second.url }])))
  const answer = await call(front.url + '/first')
  t.equal(answer.status, 200)
  t.equal(answer.json.name, 'second')
  t.equal(second.requests, 1, 'the second target saw exactly one request')
  t.match(front.results[0], { status: 200, target: second.url, errorKind: null })
  // The refusing target is ejected: everything goes to the healthy one for ejectMs.
  for (let i = 0; i < 10; i++) t.equal((await call(front.url + '/')).status, 200)
  t.equal(second.requests, 11)
})

t.test('a PUT with a body is retried when the body was not sent yet', async (t) => {
  const second = await startUpstream(t, 'second')
  const front = await startFront(t, planOf(poolOf(t, [{ url: await refusingUrl() }, { url: second.url }])))
  const answer = await call(front.url + '/put', 'PUT', 'the whole body')
  t.equal(answer.status, 200)
  t.equal(answer.json.body, 'the whole body', 'the retried request carries the whole body')
})

t.test('a POST whose connection was refused is retried on another target with its whole body', async (t) => {
  const second = await startUpstream(t, 'second')
  const front = await startFront(t, planOf(poolOf(t, [{ url: await refusingUrl() }, { url: second.url }])))
  const answer = await call(front.url + '/', 'POST', 'payload')
  t.equal(answer.status, 200)
  t.equal(answer.json.body, 'payload', 'nothing of the body was lost on the refused attempt')
  t.equal(second.requests, 1)
  t.match(front.results[0], { status: 200, target: second.url, errorKind: null })
})

t.test('a POST the target received and then reset is not retried: 502, the other target never sees it', async (t) => {
  let resetting = 0
  const { url: resetUrl } = await startHttpServer(t, (req) => {
    req.resume()
    req.on('end', () => { resetting++; req.socket.destroy() })
  })
  const second = await startUpstream(t, 'second')
  const front = await startFront(t, planOf(poolOf(t, [{ url: resetUrl }, { url: second.url }])))
  const answer = await call(front.url + '/', 'POST', 'payload')
  t.equal(answer.status, 502)
  t.equal(answer.json.error, 'GW_ERR_UPSTREAM_UNAVAILABLE')
  t.equal(resetting, 1, 'the first target received the POST once')
  t.equal(second.requests, 0, 'a POST that may have been processed is never sent twice')
  t.match(front.results[0], { status: 502, errorKind: 'reset' })
})

t.test('503 GW_ERR_NO_HEALTHY_UPSTREAM while every target is ejected, until ejectMs passes', async (t) => {
  const front = await startFront(t, planOf(poolOf(t, [{ url: await refusingUrl() }, { url: await refusingUrl() }], { ejectMs: 500 })))
  const first = await call(front.url + '/')
  t.equal(first.status, 502, 'both targets refused: the retry failed too')
  const during = await call(front.url + '/')
  t.equal(during.status, 503)
  t.equal(during.json.error, 'GW_ERR_NO_HEALTHY_UPSTREAM')
  t.match(front.results[1], { status: 503, errorKind: 'no_healthy', target: null })
  await new Promise((resolve) => setTimeout(resolve, 600))
  t.equal((await call(front.url + '/')).status, 502, 'after the cool-down the targets are tried again')
})

t.test('504 on connect timeout, the target is ejected and GET goes to the next target', async (t) => {
  const blackhole = await startBlackhole(t)
  const healthy = await startUpstream(t, 'healthy')
  const alone = await startFront(t, planOf(poolOf(t, [{ url: blackhole }], { connectTimeoutMs: 300 })))
  const started = Date.now()
  const timedOut = await call(alone.url + '/')
  t.equal(timedOut.status, 504)
  t.equal(timedOut.json.error, 'GW_ERR_UPSTREAM_TIMEOUT')
  t.ok(Date.now() - started < 2000)
  t.match(alone.results[0], { errorKind: 'connect_timeout' })
  t.equal((await call(alone.url + '/')).status, 503, 'ejected after the connect timeout')

  const pair = await startFront(t, planOf(poolOf(t, [{ url: blackhole }, { url: healthy.url }], { connectTimeoutMs: 300 })))
  const retried = await call(pair.url + '/')
  t.equal(retried.status, 200)
  t.equal(retried.json.name, 'healthy')
})

t.test('pick() skips ejected targets and honours exclude', async (t) => {
  const pool = poolOf(t, [{ url: 'http://127.0.0.1:1' }, { url: 'http://127.0.0.1:2' }])
  const [a, b] = pool.targets
  t.equal(pool.pick([a!]), b)
  pool.eject(b!)
  t.equal(pool.pick(), a)
  t.equal(pool.pick([a!]), null)
  pool.eject(a!)
  t.equal(pool.pick(), null)
})

t.test('identical configs have identical signatures', async (t) => {
  const config: UpstreamConfig = { ...TEST_UPSTREAM, targets: [{ url: 'http://127.0.0.1:1', weight: 1 }] }
  const one = poolOf(t, [{ url: 'http://127.0.0.1:1' }])
  const same = new UpstreamPool(JSON.parse(JSON.stringify(config)) as UpstreamConfig)
  t.teardown(() => same.destroy())
  t.equal(one.signature, same.signature)
  t.not(poolOf(t, [{ url: 'http://127.0.0.1:1', weight: 2 }]).signature, one.signature)
  t.not(poolOf(t, [{ url: 'http://127.0.0.1:1' }], { responseTimeoutMs: 1 }).signature, one.signature)
})

t.test('close() lets in-flight requests finish', async (t) => {
  const upstream = await startUpstream(t)
  const pool = poolOf(t, [{ url: upstream.url }])
  const front = await startFront(t, planOf(pool))
  const order: string[] = []
  // the upstream holds the answer for 2 s; the check at 300 ms keeps a wide margin either way
  const pending = call(front.url + '/slow?ms=2000').then((answer) => { order.push('answered'); return answer })
  while (upstream.requests === 0) await new Promise((resolve) => setTimeout(resolve, 5))
  const closed = pool.close().then(() => { order.push('closed') })
  await new Promise((resolve) => setTimeout(resolve, 300))
  t.same(order, [], 'while the request is in flight the pool is not closed yet')
  const answer = await pending
  await closed
  t.equal(answer.status, 200, 'the in-flight request was answered, not cut')
  t.equal(order.length, 2, 'then the pool closed')
})

t.test('a config without targets or with a bad URL is refused', async (t) => {
  t.throws(() => new UpstreamPool({ ...TEST_UPSTREAM, targets: [] }), /no targets/)
  t.throws(() => new UpstreamPool({ ...TEST_UPSTREAM, targets: [{ url: 'ftp://x', weight: 1 }] }), /http/)
  t.throws(() => new UpstreamPool({ ...TEST_UPSTREAM, targets: [{ url: 'http://x', weight: -1 }] }), /weight/)
})

t.test('the retry rule: nothing is retried once undici began writing it, whatever its method or body', async (t) => {
  // sent: an EHOSTUNREACH on a reused keep-alive socket arrives after the request may have reached the target
  t.equal(mayRetry(true, 'POST', true), false, 'a POST without a body (or held whole) that was sent')
  t.equal(mayRetry(true, 'GET', true), false, 'a GET that was sent')
  t.equal(mayRetry(false, 'POST', true), true, 'a POST never sent, its body held whole')
  t.equal(mayRetry(false, 'POST', false), false, 'a POST never sent whose body streams from the client')
  t.equal(mayRetry(false, 'PUT', false), true, 'an idempotent request never sent')
})
