// upstreams.X.retryOn and retryBudget: what sends a request again, and how many may be sent again
// at once. retryOn lists conditions (connect-failure, reset, timeout) and answer statuses (503):
// an answer of a listed status to a request that may be repeated (idempotent, its body none or
// held whole) is dropped before any of it reaches the client, and the request goes to another
// target; the last attempt's answer reaches the client whatever its status. retryBudget bounds the
// retries after a timeout or a status an upstream has in flight (Envoy's retry_budget): an
// overloaded upstream is not sent its load twice. Refused and reset connections are retried
// outside it, as before it existed. Targets are weighted 1000 to 1 where the test needs the first attempt on one target.
import t from 'tap'
import { request } from 'undici'
import { writeFileSync } from 'node:fs'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { startGateway } from './helpers/gateway.js'
import { recordingTarget, startHttpServer } from './helpers/upstream.js'
import { gateway } from './helpers/cli.js'
import { tempDir } from './helpers/teardown.js'
import { metric } from './helpers/ratelimit.js'
import { twoWorkers, until } from './helpers/workers.js'
import { withinRetryBudget } from '../src/proxy/retry-policy.js'

const target = recordingTarget

const busy = (name: string) => (_req: IncomingMessage, res: ServerResponse): void => {
  res.writeHead(503, { 'retry-after': '7', 'content-type': 'text/plain' })
  res.end(`${name} busy`)
}
const answering = (name: string) => (_req: IncomingMessage, res: ServerResponse): void => { res.end(name) }

/** One upstream: `first` takes (almost) every first attempt, `second` the retries. */
const config = (first: string, second: string, upstream: string, server = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${server}upstreams:
  backend: { targets: [{ url: ${first}, weight: 1000 }, ${second}], consecutiveFailures: 1000${upstream} }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

/** One upstream of the targets given (YAML flow items) and settings, one route to it. */
const upstreamOf = (targets: string, settings: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${targets}], ${settings} }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

async function send (url: string, path: string, opts: { method?: string, body?: string } = {}): Promise<{ status: number, text: string, retryAfter: unknown }> {
  const res = await request(url + path, { method: (opts.method ?? 'GET') as 'GET', ...(opts.body !== undefined ? { body: opts.body } : {}) })
  return { status: res.statusCode, text: await res.body.text(), retryAfter: res.headers['retry-after'] }
}

t.test('retryOn: [503]: a GET answered 503 by one target is answered by the other; a POST gets the 503', async t => {
  const a = await target(t, busy('a'))
  const b = await target(t, answering('b'))
  const gw = await startGateway(t, config(a.url, b.url, ', retryOn: [connect-failure, reset, 503]'))
  t.same(await send(gw.url, '/doc'), { status: 200, text: 'b', retryAfter: undefined }, 'the client never sees the 503')
  t.same(await send(gw.url, '/doc', { method: 'PUT', body: 'v2' }), { status: 200, text: 'b', retryAfter: undefined }, 'a PUT, its body held whole, is sent again with it')
  t.same(await send(gw.url, '/orders', { method: 'POST', body: 'one' }), { status: 503, text: 'a busy', retryAfter: '7' }, 'a POST is not repeated: the upstream\'s own answer')
  t.same(a.seen, ['GET /doc', 'PUT /doc v2', 'POST /orders one'])
  t.same(b.seen, ['GET /doc', 'PUT /doc v2'])
  const lines = gw.lines.filter(l => l.msg === 'request')
  t.same(lines.map(l => [l.status, l.retriedAfter, l.target]), [[200, 'status_503', b.url], [200, 'status_503', b.url], [503, undefined, a.url]])
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_total', { reason: 'status_503' }), 2, 'each retry counted with its cause')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'backend' }), 0, 'an answer is no failure of the upstream\'s connection')
})

t.test('without a status in retryOn (the default) a 503 is the client\'s', async t => {
  const a = await target(t, busy('a'))
  const b = await target(t, answering('b'))
  const gw = await startGateway(t, config(a.url, b.url, ''))
  t.same(await send(gw.url, '/doc'), { status: 503, text: 'a busy', retryAfter: '7' })
  t.same(b.seen, [])
})

t.test('the last attempt\'s answer reaches the client whatever its status, with its headers and body', async t => {
  const a = await target(t, busy('a'))
  const b = await target(t, busy('b'))
  const gw = await startGateway(t, config(a.url, b.url, ', retryOn: [503], retries: 1'))
  t.same(await send(gw.url, '/x'), { status: 503, text: 'b busy', retryAfter: '7' }, 'two attempts, the second answer relayed')
  t.same([a.seen, b.seen], [['GET /x'], ['GET /x']])
  t.match(gw.lines.find(l => l.msg === 'request'), { status: 503, retriedAfter: 'status_503', target: b.url })
})

t.test('a streamed body is not sent again: the 503 is the client\'s', async t => {
  const a = await target(t, busy('a'))
  const b = await target(t, answering('b'))
  const gw = await startGateway(t, config(a.url, b.url, ', retryOn: [503]', 'server: { bufferBodies: 0 }\n'))
  t.same(await send(gw.url, '/doc', { method: 'PUT', body: 'streamed' }), { status: 503, text: 'a busy', retryAfter: '7' })
  t.same(b.seen, [])
})

t.test('retryOn: [timeout]: a GET whose head does not come within timeouts.response goes to the other target', async t => {
  const silent = await target(t, () => {})
  const b = await target(t, answering('b'))
  const timeouts = ', timeouts: { response: 300ms }'
  const gw = await startGateway(t, config(silent.url, b.url, `${timeouts}, retryOn: [connect-failure, reset, timeout]`))
  t.same(await send(gw.url, '/slow'), { status: 200, text: 'b', retryAfter: undefined })
  t.match(gw.lines.find(l => l.msg === 'request'), { status: 200, retriedAfter: 'response_timeout', target: b.url })
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_total', { reason: 'response_timeout' }), 1)
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { kind: 'response_timeout' }), 1, 'the timed-out attempt is still the upstream\'s failure')
  const posted = await send(gw.url, '/slow', { method: 'POST', body: 'x' })
  t.equal(posted.status, 504, 'a POST is not repeated after a timeout')

  const silent2 = await target(t, () => {})
  const b2 = await target(t, answering('b'))
  const byDefault = await startGateway(t, config(silent2.url, b2.url, timeouts))
  t.equal((await send(byDefault.url, '/slow')).status, 504, 'the default retryOn has no timeout')
  t.same(b2.seen, [])
})

t.test('an answer dropped for a retry closes its upstream connection (as nginx does), though it was whole and kept alive', async t => {
  const sockets: Socket[] = []
  const a = await startHttpServer(t, (req, res) => { sockets.push(req.socket); res.writeHead(503, { 'content-length': '6' }); res.end('a busy') })
  const b = await target(t, answering('b'))
  const gw = await startGateway(t, config(a.url, b.url, ', retryOn: [503], retries: 1'))
  t.equal((await send(gw.url, '/one')).status, 200)
  const first = sockets[0]
  const deadline = Date.now() + 10_000
  while (first?.destroyed === false && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 20))
  t.equal(first?.destroyed, true, 'the connection that carried the 503 is closed')
  t.equal((await send(gw.url, '/two')).status, 200)
  t.equal(sockets.length, 2)
  t.not(sockets[1], first, 'the next request to that target came on another connection')
})

t.test('retryOn: [timeout] with retries: 2 and no target answering: the client waits retries + 1 times timeouts.response for its 504, each to the millisecond', async t => {
  const silent = await Promise.all([0, 1, 2].map(async () => await target(t, () => {})))
  const gw = await startGateway(t, upstreamOf(silent.map(s => s.url).join(', '), 'timeouts: { response: 100ms }, retries: 2, retryOn: [timeout], consecutiveFailures: 100'))
  const started = performance.now()
  const res = await send(gw.url, '/slow')
  const waited = performance.now() - started
  t.equal(res.status, 504)
  t.same(silent.map(s => s.seen), [['GET /slow'], ['GET /slow'], ['GET /slow']], 'each target was asked once, in turn')
  // timers never fire early by more than their rounding: three whole waits
  t.ok(waited >= 3 * 100 - 5, `the client waited ${Math.round(waited)} ms`)
  // undici's own headersTimeout ticks every 499 ms: three of its waits take 1.5 s at the very least (3 s here)
  t.ok(waited < 1450, `each wait was 100 ms, not undici's half-second tick or more (${Math.round(waited)} ms for three)`)
  t.match(gw.lines.find(l => l.msg === 'request'), { status: 504, retriedAfter: 'response_timeout' })
})

t.test('workers: 2 (bin/gateway): the retry budget is each worker\'s, so the fleet retries at once minConcurrent times its workers', async t => {
  const a = await target(t, (req, res) => { setTimeout(() => { busy('a')(req, res) }, 300) })
  const b = await target(t, (req, res) => { setTimeout(() => { answering('b')(req, res) }, 800) })
  const yaml = config(a.url, b.url, ', retryOn: [503], retryBudget: { percent: 0, minConcurrent: 1 }').replace('admin: 127.0.0.1:0\n', 'admin: 127.0.0.1:0\nworkers: 2\n')
  const r = await twoWorkers(t, yaml)
  const statuses = await Promise.all([0, 1, 2, 3].map(async i => (await fetch(`${r.gw.url}/r${i}`, { headers: { connection: 'close' } })).status))
  const requests = (): Array<Record<string, unknown>> => r.gw.logs.filter(l => l.msg === 'request')
  await until('four access lines', () => requests().length === 4)
  const served = new Set(requests().map(l => l.pid))
  t.equal(served.size, 2, 'the primary hands connections to both workers in turn')
  t.equal(statuses.filter(s => s === 200).length, 2, `one retry at once per worker, two in the fleet (${statuses.join(', ')})`)
  t.equal(statuses.filter(s => s === 503).length, 2, 'the others over their worker\'s budget: the upstream\'s 503')
})

t.test('retryOn without connect-failure (or reset): a refused (or reset) connection is the client\'s 502', async t => {
  const b = await target(t, answering('b'))
  const gw = await startGateway(t, config('http://127.0.0.1:9', b.url, ', retryOn: [reset]'))
  const first = await send(gw.url, '/r')
  t.equal(first.status, 502)
  t.same(b.seen, [])
  const withIt = await startGateway(t, config('http://127.0.0.1:9', b.url, ', retryOn: [connect-failure]'))
  t.equal((await send(withIt.url, '/r')).status, 200)
  // and without reset, a connection closed before an answer is the client's too
  const dying = await target(t, (req) => { req.socket.destroy() })
  const c = await target(t, answering('c'))
  const noReset = await startGateway(t, config(dying.url, c.url, ', retryOn: [connect-failure]'))
  t.equal((await send(noReset.url, '/r')).status, 502)
  t.same(c.seen, [])
})

t.test('retryBudget: retries in flight beyond minConcurrent are refused; the client gets the failed attempt\'s answer', async t => {
  const a = await target(t, busy('a'))
  // holds every request until released: the retries it has stay in flight
  const held: ServerResponse[] = []
  const b = await target(t, (_req, res) => { held.push(res) })
  const gw = await startGateway(t, config(a.url, b.url, ', retryOn: [503], retryBudget: { percent: 0, minConcurrent: 2 }'))
  const answers = Array.from({ length: 6 }, async (_, i) => await send(gw.url, `/r${i}`))
  // four are answered with a's 503 while two retries wait at b
  const settled: Array<{ status: number, text: string }> = []
  for (const p of answers) void p.then(r => settled.push(r))
  while (settled.length < 4) await new Promise(resolve => setTimeout(resolve, 10))
  t.same(settled.map(r => [r.status, r.text]), Array(4).fill([503, 'a busy']), 'over the budget: the upstream\'s 503 as it came')
  t.equal(b.seen.length, 2, 'two retries in flight, as minConcurrent allows')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_over_budget_total', { upstream: 'backend' }), 4)
  for (const res of held) res.end('b')
  const all = await Promise.all(answers)
  t.same(all.filter(r => r.status === 200).map(r => r.text), ['b', 'b'])
  // the budget's places come back as the retried requests end
  held.length = 0
  const next = send(gw.url, '/again')
  while (held.length === 0) await new Promise(resolve => setTimeout(resolve, 10))
  for (const res of held) res.end('b')
  t.same((await next).status, 200, 'a retry is sent again once the earlier ones ended')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_total', { reason: 'status_503' }), 3)
})

t.test('the budget is a share of the requests in flight and those waiting for a connection: waiting ones make room for a retry', async t => {
  /** a (first attempts) answers 503 once told to, b holds; both take one connection; `queued` requests wait behind them. */
  const retryWith = async (queued: number): Promise<{ retried: number, overBudget: number, first: number }> => {
    const heldA: ServerResponse[] = []
    const heldB: ServerResponse[] = []
    const a = await target(t, (_req, res) => { heldA.push(res) })
    const b = await target(t, (_req, res) => { heldB.push(res) })
    const gw = await startGateway(t, upstreamOf(`{ url: ${a.url}, weight: 1000 }, ${b.url}`,
      'maxConnections: 1, maxPending: 10, timeouts: { queue: 10s }, retries: 1, retryOn: [503], retryBudget: { percent: 34, minConcurrent: 0 }'))
    const first = send(gw.url, '/first')
    await until('a holds the first request', () => heldA.length === 1)
    const others = [send(gw.url, '/second')]
    await until('b holds the second', () => heldB.length === 1)
    for (let i = 0; i < queued; i++) others.push(send(gw.url, `/queued${i}`))
    await until(`${queued} waiting`, async () => await metric(gw.adminUrl, 'gateway_upstream_pending', { upstream: 'backend' }) === queued)
    heldA[0]?.writeHead(503).end('a busy')
    // decided once a is free again: the retry (or the client's 503) has released it to the oldest waiting
    if (queued > 0) await until('a takes the first waiting request', () => heldA.length === 2)
    // let every request end: whatever a or b holds now or later is answered 200
    let done = false
    const all = Promise.all([first, ...others]).finally(() => { done = true })
    while (!done) {
      for (const res of [...heldA.splice(0), ...heldB.splice(0)]) if (!res.headersSent) res.end('ok')
      await new Promise(resolve => setTimeout(resolve, 10))
    }
    const [answer] = await all
    // counted as each request ends
    const retried = await metric(gw.adminUrl, 'gateway_upstream_retries_total', { upstream: 'backend', reason: 'status_503' })
    const overBudget = await metric(gw.adminUrl, 'gateway_upstream_retries_over_budget_total', { upstream: 'backend' })
    return { retried, overBudget, first: answer?.status ?? 0 }
  }
  // in flight: b's one (and a's, until its answer frees it): 34% of 1 or 2 rounds to 0
  t.same(await retryWith(0), { retried: 0, overBudget: 1, first: 503 }, 'no one waiting: the retry is over the budget, the client gets a\'s 503')
  // and two waiting: 34% of 3 or 4 is 1
  t.same(await retryWith(2), { retried: 1, overBudget: 0, first: 200 }, 'two waiting: room for the retry')
})

t.test('a request takes one place in the budget for all its retries', async t => {
  const a = await target(t, busy('a'))
  const b = await target(t, busy('b'))
  const c = await target(t, answering('c'))
  const gw = await startGateway(t, upstreamOf(`{ url: ${a.url}, weight: 1000 }, { url: ${b.url}, weight: 100 }, ${c.url}`, 'retries: 2, retryOn: [503], retryBudget: { percent: 0, minConcurrent: 1 }'))
  t.same(await send(gw.url, '/x'), { status: 200, text: 'c', retryAfter: undefined }, 'a, then b, then c: two retries within one place')
  t.same([a.seen, b.seen, c.seen], [['GET /x'], ['GET /x'], ['GET /x']])
  t.same(gw.lines.filter(l => l.msg === 'request').map(l => l.retriedAfter), ['status_503'], 'the access line names the first retry\'s cause')
  t.equal((await send(gw.url, '/y')).status, 200, 'and gave it back: the next request is retried too')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_over_budget_total', { upstream: 'backend' }), 0)
})

t.test('connections never made or closed before an answer are retried outside the budget; a timeout is not', async t => {
  const b = await target(t, answering('b'))
  const noBudget = ', retryBudget: { percent: 0, minConcurrent: 0 }'
  const gw = await startGateway(t, config('http://127.0.0.1:9', b.url, noBudget))
  t.same(await send(gw.url, '/r'), { status: 200, text: 'b', retryAfter: undefined }, 'the refused attempt cost the upstream nothing')
  const dying = await target(t, (req) => { req.socket.destroy() })
  const c = await target(t, answering('c'))
  const resets = await startGateway(t, config(dying.url, c.url, noBudget))
  t.same(await send(resets.url, '/r'), { status: 200, text: 'c', retryAfter: undefined }, 'a closed connection: a target going away, not an overloaded one')
  const silent = await target(t, () => {})
  const d = await target(t, answering('d'))
  const timeouts = await startGateway(t, config(silent.url, d.url, `${noBudget}, timeouts: { response: 300ms }, retryOn: [timeout]`))
  t.equal((await send(timeouts.url, '/r')).status, 504, 'a timeout is an overloaded target\'s sign: over the budget')
  t.same(d.seen, [])
  t.equal(await metric(timeouts.adminUrl, 'gateway_upstream_retries_over_budget_total', { upstream: 'backend' }), 1)
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_over_budget_total', { upstream: 'backend' }), 0)
  t.equal(await metric(resets.adminUrl, 'gateway_upstream_retries_over_budget_total', { upstream: 'backend' }), 0)
})

t.test('with the defaults, many requests reset at once are all retried (a rolling deploy)', async t => {
  const dying = await target(t, (req) => { req.socket.destroy() })
  // answers once all eight retries are in, so that they are in flight together
  const held: ServerResponse[] = []
  const b = await target(t, (_req, res) => {
    held.push(res)
    if (held.length === 8) for (const r of held) r.end('b')
  })
  const gw = await startGateway(t, config(dying.url, b.url, ''))
  const answers = await Promise.all(Array.from({ length: 8 }, async (_, i) => await send(gw.url, `/r${i}`)))
  t.same(answers.map(a => a.status), Array(8).fill(200))
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_total', { reason: 'reset' }), 8)
})

t.test('a retry\'s own connection failure is retried too: 503, refused, then answered', async t => {
  const a = await target(t, busy('a'))
  const c = await target(t, answering('c'))
  const gw = await startGateway(t, upstreamOf(`{ url: ${a.url}, weight: 1000 }, { url: 'http://127.0.0.1:9', weight: 100 }, ${c.url}`, 'retries: 2, retryOn: [connect-failure, reset, 503]'))
  t.same(await send(gw.url, '/x'), { status: 200, text: 'c', retryAfter: undefined })
  t.same([a.seen, c.seen], [['GET /x'], ['GET /x']])
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_total', { reason: 'refused' }), 1)
})

t.test('an answer is not dropped for a retry that has no target to go to: the client gets it as it came', async t => {
  // a holds its first request, then answers 503; b holds every request: with one connection each
  // and no queue, a's 503 (which ejects it) finds b busy and nowhere to wait
  let releaseFirst: (() => void) | null = null
  const a = await target(t, (_req, res, nth) => {
    if (nth === 1) releaseFirst = () => res.end('first')
    else busy('a')(_req, res)
  })
  const b = await target(t, () => {})
  const gw = await startGateway(t, upstreamOf(`{ url: ${a.url}, weight: 1000 }, ${b.url}`, 'maxConnections: 1, maxPending: 0, consecutiveFailures: 1, failureStatuses: [503], retryOn: [503]'))
  const first = send(gw.url, '/first')
  while (releaseFirst === null) await new Promise(resolve => setTimeout(resolve, 10))
  void request(gw.url + '/held').catch(() => {})
  while (b.seen.length === 0) await new Promise(resolve => setTimeout(resolve, 10))
  ;(releaseFirst as () => void)()
  t.equal((await first).text, 'first')
  t.same(await send(gw.url, '/x'), { status: 503, text: 'a busy', retryAfter: '7' }, 'the upstream\'s 503, not the gateway\'s GW_ERR_UPSTREAM_BUSY')
  t.same(a.seen, ['GET /first', 'GET /x'])
})

t.test('a retried request gives its place in the budget back once its answer comes, not when its body ends', async t => {
  const a = await target(t, busy('a'))
  // b starts its answers and ends them when told
  const open: ServerResponse[] = []
  const b = await target(t, (_req, res) => { res.writeHead(200); res.write('head'); open.push(res) })
  const gw = await startGateway(t, config(a.url, b.url, ', retryOn: [503], retryBudget: { percent: 0, minConcurrent: 1 }'))
  const first = await request(gw.url + '/stream1')
  t.equal(first.statusCode, 200, 'the first request, retried, streams from b')
  const second = await request(gw.url + '/stream2')
  t.equal(second.statusCode, 200, 'the second is retried while the first still streams')
  for (const res of open) res.end()
  t.same([await first.body.text(), await second.body.text()], ['head', 'head'])
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_over_budget_total', { upstream: 'backend' }), 0)
})

t.test('a retry that fails gives its place in the budget back as its request ends', async t => {
  const a = await target(t, busy('a'))
  const dying = await target(t, (req) => { req.socket.destroy() })
  const gw = await startGateway(t, config(a.url, dying.url, ', retryOn: [503], retryBudget: { percent: 0, minConcurrent: 1 }'))
  t.equal((await send(gw.url, '/one')).status, 502, 'a\'s 503, then b\'s reset: the last attempt\'s failure')
  t.equal((await send(gw.url, '/two')).status, 502, 'retried again: the first request\'s place came back')
  t.equal(dying.seen.length, 2)
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_over_budget_total', { upstream: 'backend' }), 0)
})

t.test('withinRetryBudget: a share of the requests in flight, never below minConcurrent', async t => {
  t.equal(withinRetryBudget({ percent: 20, minConcurrent: 3 }, 2, 0), true, 'below minConcurrent')
  t.equal(withinRetryBudget({ percent: 20, minConcurrent: 3 }, 3, 10), false, '20% of 10 is 2: minConcurrent 3 holds')
  t.equal(withinRetryBudget({ percent: 20, minConcurrent: 3 }, 3, 20), true, '20% of 20 is 4')
  t.equal(withinRetryBudget({ percent: 20, minConcurrent: 3 }, 4, 20), false)
  t.equal(withinRetryBudget({ percent: 0, minConcurrent: 0 }, 0, 1000), false, 'no budget: no retry')
})

t.test('a route\'s retries and retryOn are its own, over its upstream\'s', async t => {
  const a = await target(t, busy('a'))
  const b = await target(t, answering('b'))
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [{ url: ${a.url}, weight: 1000 }, ${b.url}], consecutiveFailures: 1000, retryOn: [503] }
routes:
  - { name: strict, pathPrefix: /strict/, upstream: backend, retryOn: [connect-failure, reset] }
  - { name: once, pathPrefix: /once/, upstream: backend, retries: 0 }
  - { name: inherit, pathPrefix: /, upstream: backend }
`)
  t.same((await send(gw.url, '/strict/x')).text, 'a busy', 'its own retryOn has no 503')
  t.same((await send(gw.url, '/once/x')).text, 'a busy', 'retries: 0: sent once')
  t.same((await send(gw.url, '/x')).text, 'b', 'the upstream\'s retryOn')
  const shown = (JSON.parse(await (await request(gw.adminUrl + '/config')).body.text()) as { config: { routes: Array<Record<string, unknown>> } }).config
  t.match(shown.routes[0], { name: 'strict', retryOn: ['connect-failure', 'reset'] })
})

t.test('a reload changes retryOn for the requests that follow', async t => {
  const a = await target(t, busy('a'))
  const b = await target(t, answering('b'))
  const gw = await startGateway(t, config(a.url, b.url, ''))
  t.equal((await send(gw.url, '/x')).status, 503)
  writeFileSync(gw.runtime!.file, config(a.url, b.url, ', retryOn: [502, 503]'))
  t.equal((await gw.reload()).ok, true)
  t.equal((await send(gw.url, '/x')).status, 200)
})

t.test('retryOn by group: gateway-error sends again a 502, 503 or 504 and not a 500; 5xx any 500-599', async t => {
  const failing = (status: number) => (_req: IncomingMessage, res: ServerResponse): void => { res.statusCode = status; res.end(`a ${status}`) }
  for (const status of [502, 503, 504, 500]) {
    const a = await target(t, failing(status))
    const b = await target(t, answering('b'))
    const gateway = await startGateway(t, config(a.url, b.url, ', retryOn: [gateway-error]'))
    const fiveXX = await startGateway(t, config(a.url, b.url, ', retryOn: [5xx]'))
    const expected = status === 500 ? { status: 500, text: 'a 500', retryAfter: undefined } : { status: 200, text: 'b', retryAfter: undefined }
    t.same(await send(gateway.url, '/doc'), expected, `gateway-error, a ${status}`)
    t.same(await send(fiveXX.url, '/doc'), { status: 200, text: 'b', retryAfter: undefined }, `5xx, a ${status}`)
    t.equal(await metric(fiveXX.adminUrl, 'gateway_upstream_retries_total', { reason: `status_${status}` }), 1, 'counted by the status itself')
  }
  const a = await target(t, failing(429))
  const b = await target(t, answering('b'))
  const gw = await startGateway(t, config(a.url, b.url, ', retryOn: [5xx]'))
  t.equal((await send(gw.url, '/doc')).status, 429, 'a 4xx is not in 5xx')
  t.same(b.seen, [])
})

t.test('a retryOn entry that is not a condition or a status 400-599 is a located error; /config shows the defaults', async t => {
  const dir = tempDir(t, 'gw-retry-on')
  const file = `${dir}/gateway.yaml`
  writeFileSync(file, config('http://127.0.0.1:9', 'http://127.0.0.1:10', ', retryOn: [reset, 302]'))
  const run = await gateway(['validate', '-c', file])
  t.equal(run.code, 1)
  t.match(run.stderr, /gateway\.yaml:4:\d+ upstreams\.backend\.retryOn\[1\]: expected connect-failure, reset, timeout, an answer status 400-599, gateway-error \(502, 503, 504\) or 5xx/)
  const b = await target(t, answering('b'))
  const gw = await startGateway(t, config(b.url, b.url, ''))
  const shown = (JSON.parse(await (await request(gw.adminUrl + '/config')).body.text()) as { config: { upstreams: Record<string, unknown> } }).config
  t.match(shown.upstreams.backend, { retries: 1, retryOn: ['connect-failure', 'reset'], retryBudget: { percent: 20, minConcurrent: 3 } })
})
