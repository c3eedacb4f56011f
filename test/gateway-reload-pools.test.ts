// README (Reload): "Upstream pools whose settings did not change are kept", and a rebuilt pool keeps its targets' health. Observed from the
// upstream's side: a reload that changes only a limit reuses the same keep-alive connection; a
// reload that changes the upstream opens a new one.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { request } from 'undici'
import { startGateway } from './helpers/gateway.js'
import { refusingUrl, startHttpServer } from './helpers/upstream.js'

t.test('an unchanged upstream keeps its pool (and its connection) across a reload; a changed one does not', async t => {
  let connections = 0
  const { server, url } = await startHttpServer(t, (_req, res) => res.end('ok'))
  server.keepAliveTimeout = 60_000
  server.on('connection', () => { connections++ })
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
  writeFileSync(gw.runtime!.file, yaml(50, '3s'))
  t.match(await gw.reload(), { ok: true, generation: 3 })
  t.equal(await get(), 200)
  t.equal(connections, 2, 'a changed upstream gets a new pool, so a new connection')
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
