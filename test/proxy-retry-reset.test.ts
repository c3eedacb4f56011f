// An upstream connection that closes with no answer (a target shutting down in a rolling deploy, or
// closing an idle keep-alive connection as a request goes out on it) no longer costs the client a
// 502 when its request may be sent again: an idempotent method whose body is none or held whole is
// sent once more, to another target when one is free (nginx's proxy_next_upstream error). A POST,
// or a body already streamed, is not: the upstream may have acted on it. Once the answer's head
// came, nothing is sent again. The first attempt's failure is still the upstream's: counted in
// gateway_upstream_errors_total and logged as retriedAfter.
import t from 'tap'
import { request } from 'undici'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { startGateway } from './helpers/gateway.js'
import { recordingTarget } from './helpers/upstream.js'
import { metric } from './helpers/ratelimit.js'

const target = recordingTarget

const dying = (req: IncomingMessage): void => { req.socket.destroy() }
const answering = (name: string) => (_req: IncomingMessage, res: ServerResponse): void => { res.end(name) }

const config = (targets: string[], server = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${server}upstreams:
  backend: { targets: [${targets.join(', ')}], consecutiveFailures: 1000 }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

async function send (url: string, path: string, opts: { method?: string, body?: string } = {}): Promise<{ status: number, text: string }> {
  const res = await request(url + path, { method: (opts.method ?? 'GET') as 'GET', ...(opts.body !== undefined ? { body: opts.body } : {}) })
  return { status: res.statusCode, text: await res.body.text() }
}

async function resetsCounted (adminUrl: string): Promise<number> {
  return await metric(adminUrl, 'gateway_upstream_errors_total', { kind: 'reset' })
}

t.test('a GET whose connection closes with no answer is sent once more, to the other target', async t => {
  const bad = await target(t, dying)
  const good = await target(t, answering('good'))
  const gw = await startGateway(t, config([bad.url, good.url]))
  const answers = []
  for (let i = 0; i < 4; i++) answers.push(await send(gw.url, `/r${i}`))
  t.same(answers.map(a => [a.status, a.text]), [[200, 'good'], [200, 'good'], [200, 'good'], [200, 'good']], 'the client never sees the closed connection')
  t.ok(bad.seen.length >= 2, `the closing target had its turns (${bad.seen.length})`)
  t.equal(good.seen.length, 4)
  const retried = gw.lines.filter(l => l.msg === 'request' && l.retriedAfter === 'reset')
  t.equal(retried.length, bad.seen.length, 'each request the closing target dropped is logged retriedAfter: reset')
  t.same(retried.map(l => [l.status, l.target]).slice(0, 1), [[200, good.url]])
  t.equal(await resetsCounted(gw.adminUrl), bad.seen.length, 'and counted as the upstream\'s reset')
})

t.test('PUT and DELETE are idempotent: retried with their whole body; a POST is not', async t => {
  const bad = await target(t, dying)
  const good = await target(t, answering('good'))
  // a weight of 1000 on the closing target: every first attempt goes there, and so would the
  // second, were the retry not sent to another target
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [{ url: ${bad.url}, weight: 1000 }, ${good.url}], consecutiveFailures: 1000 }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  t.same(await send(gw.url, '/doc', { method: 'PUT', body: 'v2' }), { status: 200, text: 'good' })
  t.same(await send(gw.url, '/doc', { method: 'DELETE' }), { status: 200, text: 'good' })
  const posted = await send(gw.url, '/orders', { method: 'POST', body: 'one order' })
  t.equal(posted.status, 502, 'a POST the upstream may have acted on is not sent twice')
  t.match(JSON.parse(posted.text), { error: 'GW_ERR_UPSTREAM_UNAVAILABLE' })
  t.same(good.seen, ['PUT /doc v2', 'DELETE /doc'], 'the PUT went again with its body; the POST reached one target only')
  t.same(bad.seen, ['PUT /doc v2', 'DELETE /doc', 'POST /orders one order'])
})

t.test('a body streamed to the upstream is not sent again, whatever the method', async t => {
  const bad = await target(t, dying)
  const good = await target(t, answering('good'))
  const gw = await startGateway(t, config([bad.url, good.url], 'server: { bufferBodies: 0 }\n'))
  const put = await send(gw.url, '/doc', { method: 'PUT', body: 'streamed' })
  t.equal(put.status, 502)
  t.same(good.seen, [])
})

t.test('a lone target is asked again (a fresh connection); once only, then 502', async t => {
  // closes the connection of its first request, and that one alone: a keep-alive connection it dropped
  const flaky = await target(t, (req, res, nth) => { if (nth === 1) req.socket.destroy(); else res.end('second') })
  const gw = await startGateway(t, config([flaky.url]))
  t.same(await send(gw.url, '/a'), { status: 200, text: 'second' })
  t.same(flaky.seen, ['GET /a', 'GET /a'])

  const bad1 = await target(t, dying)
  const bad2 = await target(t, dying)
  const both = await startGateway(t, config([bad1.url, bad2.url]))
  const failed = await send(both.url, '/b')
  t.equal(failed.status, 502, 'the second attempt failing too is answered')
  t.same([bad1.seen, bad2.seen], [['GET /b'], ['GET /b']], 'two attempts, one per target, no third')
})

t.test('once the answer\'s head came, a cut is not sent again', async t => {
  const cutting = await target(t, (req, res) => {
    res.writeHead(200, { 'content-length': '100' })
    res.write('part', () => { req.socket.destroy() })
  })
  const good = await target(t, answering('good'))
  const gw = await startGateway(t, config([cutting.url, good.url]))
  const res = await request(gw.url + '/c')
  t.equal(res.statusCode, 200, 'the head went to the client as it came')
  await t.rejects(res.body.text(), 'and the body is cut')
  t.same([cutting.seen, good.seen], [['GET /c'], []])
})

t.test('both attempts count toward the target\'s consecutiveFailures', async t => {
  const bad = await target(t, dying)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${bad.url}], consecutiveFailures: 2, ejectFor: 1m }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  t.equal((await send(gw.url, '/a')).status, 502)
  t.same(bad.seen, ['GET /a', 'GET /a'], 'one GET, two resets in a row')
  const next = await send(gw.url, '/b')
  t.equal(next.status, 503, 'the target is ejected')
  t.match(JSON.parse(next.text), { error: 'GW_ERR_NO_HEALTHY_UPSTREAM' })
})

t.test('the second attempt is timed on its own: a 103 of the first does not shorten its deadline', async t => {
  // the first target answers 103 at once and drops the connection 1.5 s later; the second takes
  // 1 s to answer: 2.5 s after the request, within its own response timeout of 2 s, not within
  // the first attempt's 103 deadline (2 s after the request)
  const hinting = await target(t, (req, res) => {
    res.writeEarlyHints({ link: '</style.css>; rel=preload' })
    setTimeout(() => { req.socket.destroy() }, 1500)
  })
  const slow = await target(t, (_req, res) => { setTimeout(() => { res.end('slow') }, 1000) })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [{ url: ${hinting.url}, weight: 1000 }, ${slow.url}], consecutiveFailures: 1000, timeouts: { response: 2s } }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  t.same(await send(gw.url, '/h'), { status: 200, text: 'slow' })
  t.same([hinting.seen, slow.seen], [['GET /h'], ['GET /h']])
})
