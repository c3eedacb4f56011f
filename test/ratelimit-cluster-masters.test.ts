// README (Redis keys and Redis Cluster): limits are read and written on masters only, because a
// replica may lag and let a client past its limit. Observed on a real 3+3 Cluster: every limiter
// script ran on a master, none on a replica; /readyz lists each master's breaker.
import t from 'tap'
import { Redis } from 'ioredis'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { scriptCalls, startReplicatedCluster } from './helpers/redis.js'
import { burst, statusCounts as statusCountsOf } from './helpers/ratelimit.js'

async function scriptCallsOn (port: number): Promise<number> {
  const client = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 1 })
  try {
    await client.connect()
    return await scriptCalls(client)
  } finally {
    client.disconnect()
  }
}

t.test('on a 3+3 Cluster every limiter script runs on a master, none on a replica', async t => {
  const cluster = await startReplicatedCluster(t)
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { cluster: [${cluster.urls.join(", ")}], timeout: 2s }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - name: all
    pathPrefix: /
    upstream: backend
    limits:
      user: { algorithm: sliding-window, limit: 3, window: 1h }
`)
  // 30 users spread their keys over the three masters' slots
  const replies = await burst(120, `${gw.url}/x`, i => ({ headers: { 'x-user-id': `user-${i % 30}` } }))
  t.same(statusCountsOf(replies), { 200: 90, 429: 30 }, 'exactly 3 per user')
  const masters = await cluster.masters()
  t.equal(masters.length, 3)
  const replicas = cluster.ports.filter(p => !masters.includes(p))
  t.equal(replicas.length, 3)
  const onMasters = await Promise.all(masters.map(scriptCallsOn))
  const onReplicas = await Promise.all(replicas.map(scriptCallsOn))
  t.ok(onMasters.every(n => n > 0), `every master ran scripts: ${onMasters.join(', ')}`)
  t.same(onReplicas, [0, 0, 0], 'no script ran on a replica')
  // /readyz (and the admin page) show each master's own breaker
  const ready = await (await fetch(`${gw.adminUrl}/readyz`)).json() as { redis: { nodes: Array<{ node: string, state: string }> } }
  t.same(ready.redis.nodes.map(n => Number(/:(\d+)$/.exec(n.node)?.[1])).sort(), [...masters].sort(), 'one breaker per master')
  t.ok(ready.redis.nodes.every(n => n.state === 'closed'))
})
