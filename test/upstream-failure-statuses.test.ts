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

t.test('a failure status is a 5xx: a located error otherwise', async t => {
  t.throws(() => parseConfigText(config('http://127.0.0.1:9', 'http://127.0.0.1:10', ', failureStatuses: [429]'), 'gateway.yaml', {}),
    { message: /gateway\.yaml:4:\d+ upstreams\.backend\.failureStatuses\[0\]: a failure status is a 5xx/ })
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
