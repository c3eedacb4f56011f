// README (Reload): "Upstream pools whose settings did not change are kept", and a rebuilt pool keeps its targets' health. Observed from the
// upstream's side: a reload that changes only a limit reuses the same keep-alive connection; a
// reload that changes the upstream opens a new one.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { request } from 'undici'
import { startGateway } from './helpers/gateway.js'
import { refusingUrl, startHttpServer } from './helpers/upstream.js'
import { metric } from './helpers/ratelimit.js'

/** Polls `check` every 20 ms until it holds; fails after 15 s. */
async function until (check: () => boolean | Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 15_000
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error('condition not met within 15 s')
    await new Promise(resolve => setTimeout(resolve, 20))
  }
}

t.test('an unchanged upstream keeps its pool (and its connection) across a reload; a changed one does not', async t => {
  let connections = 0
  let closed = 0
  let closedAt = 0
  const { server, url } = await startHttpServer(t, (_req, res) => res.end('ok'))
  server.keepAliveTimeout = 60_000
  server.on('connection', (socket) => {
    connections++
    socket.on('close', () => { closed++; closedAt = Date.now() })
  })
  const yaml = (limit: number, connectTimeout: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}], timeouts: { connect: ${connectTimeout} } }
routes:
  - name: all
    pathPrefix: /
    upstream: backend
    limits: { ip: { algorithm: fixed-window, limit: ${limit}, window: 1h } }
`
  const gw = await startGateway(t, yaml(100, '2s'))
  const get = async (): Promise<number> => {
    const res = await request(`${gw.url}/x`)
    await res.body.dump()
    return res.statusCode
  }
  t.equal(await get(), 200)
  t.equal(connections, 1)
  writeFileSync(gw.runtime!.file, yaml(50, '2s'))
  t.match(await gw.reload(), { ok: true, generation: 2 })
  t.equal(await get(), 200)
  t.equal(connections, 1, 'a reload that changes only a limit reuses the upstream connection')
  t.equal(closed, 0)
  writeFileSync(gw.runtime!.file, yaml(50, '3s'))
  const reloaded = Date.now()
  t.match(await gw.reload(), { ok: true, generation: 3 })
  t.equal(await get(), 200)
  t.equal(connections, 2, 'a changed upstream gets a new pool, so a new connection')
  // the upstream keeps idle connections for a minute, and an upstream pool drops an idle one
  // after 4 s: closed sooner, it was the reload that closed the replaced pool (left open, its
  // pool, timers and health checks would outlive the config that made it)
  await until(() => closed === 1)
  t.ok(closedAt - reloaded < 2500, `the replaced pool's idle connection is closed by the reload (${closedAt - reloaded} ms after it), not by its idle timer`)
  t.equal(await get(), 200, 'the new pool serves on')
  t.equal(closed, 1, 'and its connection stays open')
})

t.test('a reload that changes an upstream\'s timeouts keeps its targets\' passive health: an ejected target stays out', async t => {
  const { url } = await startHttpServer(t, (_req, res) => res.end('ok'))
  const refusing = await refusingUrl()
  const yaml = (response: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${refusing}, ${url}], ejectFor: 1m, timeouts: { response: ${response} } }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`
  const gw = await startGateway(t, yaml('10s'))
  const health = async (): Promise<Array<{ url: string, healthy: boolean }>> =>
    ((await (await fetch(`${gw.adminUrl}/readyz`)).json()) as { upstreams: { backend: Array<{ url: string, healthy: boolean }> } }).upstreams.backend
  // round-robin: within two requests one goes to the refusing target, which is ejected (and retried on the other)
  for (let i = 0; i < 2; i++) t.equal((await request(`${gw.url}/x`)).statusCode, 200)
  t.same((await health()).map((h) => h.healthy), [false, true], 'the refusing target is ejected')
  writeFileSync(gw.runtime!.file, yaml('20s'))
  t.match(await gw.reload(), { ok: true, generation: 2 })
  t.same((await health()).map((h) => h.healthy), [false, true], 'still ejected after the reload (its pool was rebuilt: a new one started healthy)')
})

t.test('requests waiting for a connection of a pool a reload replaces get it: none is answered 503 shutting_down', async t => {
  // every answer held until the test lets them go: one request on the one connection, two waiting
  const held: Array<() => void> = []
  let holding = true
  const { url } = await startHttpServer(t, (_req, res) => {
    if (holding) held.push(() => res.end('ok'))
    else res.end('ok')
  })
  // requestTimeout 0s: the replaced runtime's drain gave up after 1 s, then its pool refused
  // whatever still waited
  const yaml = (connect: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { requestTimeout: 0s }
upstreams:
  backend: { targets: [${url}], maxConnections: 1, timeouts: { connect: ${connect}, queue: 1m } }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`
  const gw = await startGateway(t, yaml('2s'))
  const answers = [0, 1, 2].map(async i => {
    const res = await request(`${gw.url}/r${i}`)
    return `${res.statusCode} ${await res.body.text()}`
  })
  await until(async () => held.length === 1 && await metric(gw.adminUrl, 'gateway_upstream_pending', { upstream: 'backend' }) === 2)
  writeFileSync(gw.runtime!.file, yaml('3s'))
  t.match(await gw.reload(), { ok: true, generation: 2 }, 'the changed connect timeout rebuilds the pool')
  // past the replaced runtime's drain (1 s here), where the old pool refused its waiting requests
  await new Promise(resolve => setTimeout(resolve, 2500))
  holding = false
  for (const answer of held) answer()
  t.same(await Promise.all(answers), ['200 ok', '200 ok', '200 ok'], 'each request waited its turn on the replaced pool and was answered')
})
