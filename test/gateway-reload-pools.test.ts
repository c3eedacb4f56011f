// README (Reload): "Upstream pools whose targets did not change are kept." Observed from the
// upstream's side: a reload that changes only a limit reuses the same keep-alive connection; a
// reload that changes the upstream opens a new one.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { request } from 'undici'
import { startGateway } from './helpers/gateway.js'
import { startHttpServer } from './helpers/upstream.js'

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
