// upstreams.X.failureStatuses: answer statuses that count toward consecutiveFailures like a reset
// (Envoy's consecutive_5xx, nginx's max_fails with proxy_next_upstream http_503). A target that
// answers 503 to everything (its database is down) is ejected by passive health alone; a status
// not listed ends the run of failures as any answer does. Targets are balanced 1:1 by smooth
// weighted round robin, first target first, so which request reaches which target is the
// balancer's order, not chance.
import t from 'tap'
import { request } from 'undici'
import type { ServerResponse } from 'node:http'
import { startGateway } from './helpers/gateway.js'
import { startHttpServer } from './helpers/upstream.js'
import type { Teardown } from './helpers/teardown.js'
import { parseConfigText } from '../src/config/load.js'
import { testPool } from './helpers/proxy-plan.js'
import { request as httpRequest } from 'node:http'

async function target (t: Teardown, answer: (res: ServerResponse, nth: number) => void): Promise<{ url: string, seen: number }> {
  const up = { url: '', seen: 0 }
  up.url = (await startHttpServer(t, (_req, res) => { answer(res, ++up.seen) })).url
  return up
}

const config = (a: string, b: string, extra: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${a}, ${b}], consecutiveFailures: 2, ejectFor: 1m${extra} }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

async function statuses (url: string, n: number): Promise<number[]> {
  const out: number[] = []
  for (let i = 0; i < n; i++) {
    const res = await request(`${url}/r${i}`)
    await res.body.dump()
    out.push(res.statusCode)
  }
  return out
}

t.test('failureStatuses: [503]: a target answering 503 to everything is ejected after consecutiveFailures of them', async t => {
  const sick = await target(t, (res) => { res.statusCode = 503; res.end('db down') })
  const good = await target(t, (res) => { res.end('ok') })
  const gw = await startGateway(t, config(sick.url, good.url, ', failureStatuses: [502, 503, 504]'))
  t.same(await statuses(gw.url, 8), [503, 200, 503, 200, 200, 200, 200, 200], 'two 503s in a row from it, then only the other target')
  t.equal(sick.seen, 2)
  t.ok(gw.lines.some(l => l.msg === 'upstream target ejected' && l.target === sick.url && l.reason === 'consecutive_failures'), 'logged as any ejection')
  const ready = await (await request(`${gw.adminUrl}/readyz`)).body.json() as { upstreams: Record<string, Array<{ url: string, healthy: boolean }>> }
  t.equal(ready.upstreams.backend?.find(x => x.url === sick.url)?.healthy, false)
})

t.test('without failureStatuses (the default) an answer is never a failure: the 503 target keeps its turns', async t => {
  const sick = await target(t, (res) => { res.statusCode = 503; res.end('db down') })
  const good = await target(t, (res) => { res.end('ok') })
  const gw = await startGateway(t, config(sick.url, good.url, ''))
  t.same(await statuses(gw.url, 6), [503, 200, 503, 200, 503, 200])
})

t.test('a status not listed ends the run: 503, 500, 503 is no two in a row', async t => {
  const flaky = await target(t, (res, nth) => { res.statusCode = nth === 2 ? 500 : 503; res.end() })
  const good = await target(t, (res) => { res.end('ok') })
  const gw = await startGateway(t, config(flaky.url, good.url, ', failureStatuses: [503]'))
  t.same(await statuses(gw.url, 6), [503, 200, 500, 200, 503, 200], 'the 500 reset the count: not ejected')
  t.equal(gw.lines.some(l => l.msg === 'upstream target ejected'), false)
})

t.test('with retryOn: [503] too, the 503s that eject the target never reach the client', async t => {
  const sick = await target(t, (res) => { res.statusCode = 503; res.end('db down') })
  const good = await target(t, (res) => { res.end('ok') })
  const gw = await startGateway(t, config(sick.url, good.url, ', failureStatuses: [503], retryOn: [connect-failure, reset, 503]'))
  t.same(await statuses(gw.url, 6), [200, 200, 200, 200, 200, 200])
  t.equal(sick.seen, 2, 'asked until ejected')
})

t.test('failureStatuses by group: gateway-error counts a 504 and not a 500; 5xx counts a 500', async t => {
  const timingOut = await target(t, (res) => { res.statusCode = 504; res.end() })
  const erring = await target(t, (res) => { res.statusCode = 500; res.end() })
  const good = await target(t, (res) => { res.end('ok') })
  const byGateway = await startGateway(t, config(timingOut.url, good.url, ', failureStatuses: [gateway-error]'))
  t.same(await statuses(byGateway.url, 6), [504, 200, 504, 200, 200, 200], 'two 504s eject it')
  const notA500 = await startGateway(t, config(erring.url, good.url, ', failureStatuses: [gateway-error]'))
  t.same(await statuses(notA500.url, 6), [500, 200, 500, 200, 500, 200], 'a 500 is no gateway error')
  const all = await startGateway(t, config(erring.url, good.url, ', failureStatuses: [5xx]'))
  t.same(await statuses(all.url, 6), [500, 200, 500, 200, 200, 200], 'a 500 is a 5xx')
})

t.test('a failure status is a 5xx: a located error otherwise', async t => {
  t.throws(() => parseConfigText(config('http://127.0.0.1:9', 'http://127.0.0.1:10', ', failureStatuses: [429]'), 'gateway.yaml', {}),
    { message: /gateway\.yaml:4:\d+ upstreams\.backend\.failureStatuses\[0\]: a failure status is a 5xx, gateway-error \(502, 503, 504\) or 5xx/ })
})

t.test('a head the gateway cannot relay (status 600) still counts as a failure, not as an answer', async t => {
  // a raw server: node:http would not write a status of 600
  const { createServer } = await import('node:net')
  const server = createServer((socket) => {
    socket.once('data', () => { socket.end('HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n') })
    socket.on('error', () => {})
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { server.close() })
  const odd = `http://127.0.0.1:${(server.address() as import('node:net').AddressInfo).port}`
  const good = await target(t, (res) => { res.end('ok') })
  const gw = await startGateway(t, config(odd, good.url, ', failureStatuses: [503]'))
  t.same(await statuses(gw.url, 6), [502, 200, 502, 200, 200, 200], 'two bad heads in a row eject it')
})

t.test('an answer never takes the last target in rotation out: one client cannot empty an upstream', async t => {
  // both answer 503 on this path (one endpoint's failure, asked for by one client)
  const a = await target(t, (res) => { res.statusCode = 503; res.end() })
  const b = await target(t, (res) => { res.statusCode = 503; res.end() })
  const gw = await startGateway(t, config(a.url, b.url, ', failureStatuses: [503]'))
  t.same(await statuses(gw.url, 10), Array(10).fill(503), 'the upstream\'s 503s, never the gateway\'s GW_ERR_NO_HEALTHY_UPSTREAM')
  t.equal(gw.lines.filter(l => l.msg === 'upstream target ejected').length, 1, 'one of the two ejected, the other kept')
  const lone = await target(t, (res) => { res.statusCode = 503; res.end() })
  const one = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${lone.url}], consecutiveFailures: 1, failureStatuses: [503] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  t.same(await statuses(one.url, 3), [503, 503, 503])
  t.equal(lone.seen, 3, 'a lone target is never ejected by its answers')
})

t.test('failures met while a target is out count toward nothing: back, it has its whole run again', async t => {
  const pool = testPool(t, ['http://127.0.0.1:9', 'http://127.0.0.1:10'], { consecutiveFailures: 3, failureStatuses: [503] })
  const [first] = pool.targets
  if (first === undefined) throw new Error('no target')
  pool.eject(first)
  for (let i = 0; i < 10; i++) pool.answered(first, 503)
  t.equal(pool.health().find(h => h.url === first.url)?.consecutiveFailures, 0, 'the 503s of its requests still in flight are not counted')
  first.ejectedUntil = 0
  pool.answered(first, 503)
  pool.answered(first, 503)
  t.equal(pool.health().find(h => h.url === first.url)?.healthy, true, 'two after its return: not yet consecutiveFailures')
  pool.answered(first, 503)
  t.equal(pool.health().find(h => h.url === first.url)?.healthy, false, 'the third ejects it')
})

t.test('the answer to a WebSocket upgrade counts as an HTTP request\'s does', async t => {
  const sick = await target(t, (res) => { res.statusCode = 503; res.end('db down') })
  const good = await target(t, (res) => { res.end('ok') })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [{ url: ${sick.url}, weight: 1000 }, ${good.url}], consecutiveFailures: 2, ejectFor: 1m, failureStatuses: [503] }
routes:
  - { name: ws, pathPrefix: /ws/, upstream: backend, websocket: true }
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const upgrade = async (): Promise<number> => await new Promise((resolve, reject) => {
    const req = httpRequest(`${gw.url}/ws/x`, { headers: { connection: 'upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==' } })
    req.on('response', (res) => { res.resume(); resolve(res.statusCode ?? 0) })
    req.on('upgrade', (res, socket) => { socket.destroy(); resolve(res.statusCode ?? 0) })
    req.on('error', reject)
    req.end()
  })
  t.equal(await statuses(gw.url, 1).then(s => s[0]), 503, 'an HTTP request: one failure')
  t.equal(await upgrade(), 503, 'an upgrade answered 503: the second, not a success that ends the run')
  t.same(await statuses(gw.url, 2), [200, 200], 'the sick target is out')
})
