// SIGTERM while Redis is stalled but connected (CLIENT PAUSE here; SIGSTOP, a long script or a
// hung host the same): the drain closes the open WebSockets and the gateway exits, without waiting
// for a Redis that does not answer. Its heartbeat's last call (taking the instance off the count)
// was waited for without a bound: the gateway ran on until Redis answered, or until the
// supervisor's SIGKILL, which drops its unflushed log lines.
import t from 'tap'
import { once } from 'node:events'
import { WebSocket } from 'ws'
import { spawnGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { eventually, metric } from './helpers/ratelimit.js'

t.test('SIGTERM with Redis paused and a WebSocket open: the tunnel is closed and the gateway exits', async t => {
  const redis = await startRedis(t)
  const upstream = await startUpstream(t)
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { shutdownTimeout: 1s }
redis: { url: ${redis.url}, timeout: 500ms }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: events, pathPrefix: /ws/, websocket: true, upstream: backend, concurrency: { ip: 5 } }
`)
  const ws = new WebSocket(`${gw.url.replace(/^http/, 'ws')}/ws/a`)
  t.teardown(() => ws.terminate())
  ws.on('error', () => {})
  await once(ws, 'open', { signal: AbortSignal.timeout(5000) })
  await eventually('the tunnel is counted open', async () => await metric(gw.adminUrl, 'gateway_websockets_open', { route: 'events' }) === 1)
  const closed = once(ws, 'close')
  // longer than the wait below: without a bound the gateway exits only once the pause ends (the
  // Redis is killed at teardown, paused or not)
  await redis.client().call('CLIENT', 'PAUSE', '60000', 'ALL')
  gw.child.kill('SIGTERM')
  const exit = await Promise.race([gw.exited, new Promise<string>(resolve => setTimeout(() => resolve('still running'), 20_000).unref())])
  t.equal(exit, 0, 'the gateway exited (code 0) within 20 s of SIGTERM, Redis still paused')
  await closed
  t.pass('the client saw its WebSocket closed')
  t.ok(gw.logs.some(l => l.msg === 'websocket closed' && l.path === '/ws/a'), 'the tunnel got its "websocket closed" line')
  t.ok(gw.logs.some(l => l.msg === 'gateway stopped'), 'the gateway logged "gateway stopped"')
  // The lease release and the heartbeat's last call each give up after 1 s: awaited one after the
  // other they cannot take less than 2 s by the gateway's own clock, together about 1 s (1.06-1.08 s
  // here), which leaves 0.85 s for a loaded machine
  const at = (msg: string): number => Date.parse(gw.logs.find(l => l.msg === msg)?.time as string)
  t.ok(at('gateway stopped') - at('shutting down') < 1950, `the closing Redis calls are given up together (${at('gateway stopped') - at('shutting down')} ms from "shutting down" to "gateway stopped")`)
})
