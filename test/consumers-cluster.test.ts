// The admin API and quotas on a real 3-master Redis Cluster (issue 9): GET /limits reads keys that
// live in different slots without consuming; DELETE /limits resets them and reaches both instances
// through the cluster's pub/sub; a plan's quota stays all-or-nothing with keys on other masters.
import t from 'tap'
import { Cluster } from 'ioredis'
import { startGateway } from './helpers/gateway.js'
import { startRedisCluster } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { eventually, send } from './helpers/ratelimit.js'
import { keySlot } from '../src/limit/keys.js'
import { awayFromQuotaEdge } from './helpers/window-edge.js'

const cluster = await startRedisCluster(t)
const reader = new Cluster(cluster.ports.map(port => ({ host: '127.0.0.1', port })), { scaleReads: 'master' })
t.teardown(() => reader.disconnect())

const TOKEN = 'cluster-admin-token-0123456789'

function config (upstream: string): string {
  return `listen: "127.0.0.1:0"
admin: { listen: "127.0.0.1:0", token: "${TOKEN}" }
redis: { cluster: [${cluster.urls.join(', ')}], timeout: 2s, onError: deny }
identity:
  apiKeys: { header: x-api-key, keys: { k-1: acme } }
consumers:
  acme: { plan: metered }
plans:
  metered:
    limits:
      user: { algorithm: sliding-window-log, limit: 100, window: 1h }
      quota: { limit: 3, period: month }
limits:
  ip: { algorithm: sliding-window-log, limit: 1000, window: 1h }
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
}

t.test('on Redis Cluster: quota exact, GET /limits reads every slot without consuming, DELETE resets both instances', async t => {
  const up = await startUpstream(t)
  const a = await startGateway(t, config(up.url))
  const b = await startGateway(t, config(up.url))
  const key = { headers: { 'x-api-key': 'k-1' } }
  // the quota is a calendar month in UTC: the burst and the reads that follow stay in one month
  await awayFromQuotaEdge('month', 30_000)
  const replies = await Promise.all(Array.from({ length: 20 }, (_, i) => send(`${(i % 2 === 0 ? a : b).url}/x`, key)))
  t.equal(replies.filter(r => r.status === 200).length, 3, 'exactly the quota of 3 across both instances')
  t.ok(replies.filter(r => r.status === 429).every(r => r.json?.limit === 'metered:quota'))

  const url = `${a.adminUrl}/limits?route=api&ip=127.0.0.1&user=acme`
  const read = await send(url)
  t.equal(read.status, 200, JSON.stringify(read.json))
  const limits = read.json?.limits as Array<{ name: string, key: string, remaining: number }>
  const slots = new Set(limits.map(l => keySlot(l.key)))
  t.ok(slots.size > 1, `the keys live in ${slots.size} slots`)
  const quota = limits.find(l => l.name === 'metered:quota')
  t.equal(quota?.remaining, 0)
  t.equal(limits.find(l => l.name === 'metered:user')?.remaining, 97, 'the user log holds only the 3 admitted requests')
  t.match(limits.find(l => l.name === 'identity.failures'), { remaining: 10, resetMs: 0 }, 'an untouched budget is whole')
  const again = await send(url)
  t.same((again.json?.limits as typeof limits).map(l => l.remaining), limits.map(l => l.remaining), 'reading consumed nothing')

  const reset = await send(url, { method: 'DELETE', headers: { authorization: `Bearer ${TOKEN}` } })
  t.equal(reset.status, 200, JSON.stringify(reset.json))
  t.equal(reset.json?.instances, null, 'a Cluster PUBLISH only counts one node\'s subscribers: not reported')
  t.equal(reset.json?.keysDeleted, 3, 'ip, user and quota keys existed (no identity failure was charged)')
  t.equal(await reader.exists(quota?.key as string), 0, 'the quota key is gone')
  t.equal((await send(`${a.url}/x`, key)).status, 200, 'A admits again')
  const resetAt = Date.now()
  await eventually('B admits again (the reset reached it through the cluster\'s pub/sub)', async () => (await send(`${b.url}/x`, key)).status === 200, 1000, 20)
  t.ok(Date.now() - resetAt < 1000, 'within 1 s')
})
