// WebSockets through `workers: 2`: a tunnel still open when the gateway is stopped gets its
// "websocket closed" line. A worker is ended by node's cluster as soon as it leaves its primary,
// and the closes of the sockets its drain destroyed (which write those lines) had not run yet.
import t from 'tap'
import { once } from 'node:events'
import { WebSocket } from 'ws'
import { startUpstream } from './helpers/upstream.js'
import { twoWorkers, until } from './helpers/workers.js'
import { metric } from './helpers/ratelimit.js'

t.test('SIGTERM with WebSockets open in the workers: each tunnel is closed and logged "websocket closed"', async t => {
  const upstream = await startUpstream(t)
  const { gw, adminUrl } = await twoWorkers(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
server: { shutdownTimeout: 1s }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend }
`)
  const paths = ['/ws/a', '/ws/b', '/ws/c', '/ws/d']
  const sockets: WebSocket[] = []
  for (const path of paths) {
    const ws = new WebSocket(`${gw.url.replace(/^http/, 'ws')}${path}`)
    t.teardown(() => ws.terminate())
    ws.on('error', () => {})
    await once(ws, 'open', { signal: AbortSignal.timeout(5000) })
    sockets.push(ws)
  }
  await until('the four tunnels are counted open', async () => await metric(adminUrl, 'gateway_websockets_open', { route: 'events' }) === 4)
  const closed = sockets.map(ws => once(ws, 'close'))
  gw.child.kill('SIGTERM')
  t.equal(await gw.exited, 0, 'the gateway exited with 0')
  await Promise.all(closed)
  const logged = gw.logs.filter(l => l.msg === 'websocket closed').map(l => l.path as string).sort()
  t.same(logged, paths, 'one "websocket closed" line per tunnel')
})
