// A reload still compiling when a shutdown begins (SIGHUP, then SIGTERM while a big file parses):
// nothing is swapped in, and what the compile opened is closed with the rest. Committed, the
// reload opened a Redis connection nothing closed: the process never exited (a second SIGTERM only
// said "already shutting down"), after logging "configuration reloaded" behind "gateway stopped".
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { spawnGateway } from './helpers/gateway.js'

const yaml = (redisUrl: string, upstream: string, routes: number): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: "${redisUrl}" }
limits:
  ip: { algorithm: fixed-window, limit: 100, window: 1h }
upstreams:
  backend: { targets: [${upstream}] }
routes:
${Array.from({ length: routes }, (_, i) => `  - { name: r${i}, path: /r${i}, upstream: backend }`).join('\n')}
  - { name: all, pathPrefix: /, upstream: backend }
`

const gatewayClients = async (redis: { client: () => { call: (...args: string[]) => Promise<unknown> } }): Promise<number> =>
  String(await redis.client().call('CLIENT', 'LIST')).split('\n').filter(l => l.includes('name=edge-gateway')).length

t.test('in process: a reload the shutdown overtakes is abandoned, and no Redis connection is left open', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(redis.url, up.url, 5))
  t.equal((await fetch(`${gw.url}/x`)).status, 200)
  t.ok(await gatewayClients(redis) > 0, 'the gateway is connected')
  const reloading = gw.reload()
  await gw.close()
  t.match(await reloading, { ok: false, error: 'the gateway is shutting down' }, 'not applied')
  t.ok(gw.lines.some(l => l.msg === 'reload abandoned: the gateway is shutting down'), 'and logged as abandoned (README, Reload)')
  const stopped = gw.lines.findIndex(l => l.msg === 'gateway stopped')
  t.ok(stopped >= 0)
  t.notOk(gw.lines.some(l => l.msg === 'configuration reloaded'), 'nothing swapped in while stopping')
  // give a connection the compile might have opened the time to show
  await new Promise(resolve => setTimeout(resolve, 300))
  t.equal(await gatewayClients(redis), 0, 'no connection of the gateway left in Redis')
})

t.test('bin/gateway: SIGHUP then SIGTERM while a big file compiles: the process exits 0', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, yaml(redis.url, up.url, 1500))
  t.equal((await fetch(`${gw.url}/x`)).status, 200)
  gw.child.kill('SIGHUP')
  await new Promise(resolve => setTimeout(resolve, 50))
  gw.child.kill('SIGTERM')
  const code = await Promise.race([gw.exited, new Promise(resolve => setTimeout(() => resolve('still running after 20 s'), 20_000))])
  t.equal(code, 0, 'exited')
  t.equal(await gatewayClients(redis), 0, 'no connection of the gateway left in Redis')
})
