// README (Redis keys and Redis Cluster, Limits): each limit's key in Redis as an operator would
// look for it (KEYS, TYPE), for every scope and every algorithm's state. Real redis-server.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { startRedis } from './helpers/redis.js'

const ALGORITHMS: Array<[string, string]> = [
  // algorithm, the TYPE of its key (README's table: "one integer", HASH, ZSET)
  ['gcra', 'string'],
  ['token-bucket', 'hash'],
  ['leaky-bucket', 'hash'],
  ['sliding-window-log', 'zset'],
  ['sliding-window', 'hash'],
  ['fixed-window', 'hash']
]

t.test('keys: <prefix>:<scope>.<dimension>.<hash>:<value> for the gateway, a route, a plan, the failed-identity budget; the quota by its period; each algorithm\'s state as the README\'s table says', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const routes = ALGORITHMS.map(([algorithm], i) => `  - { name: r${i}, pathPrefix: /r${i}/, upstream: backend, limits: { ip: { algorithm: ${algorithm}, limit: 100, window: 1h } } }\n`).join('')
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: "${redis.url}", timeout: 1s }
identity: { apiKeys: { header: x-api-key, keys: { k-alice-1: alice } } }
consumers: { alice: { plan: free } }
plans:
  free:
    limits:
      user: { limit: 100, window: 1h }
      quota: { limit: 1000, period: day }
    routes:
      planned: { user: { limit: 50, window: 1h } }
limits:
  ip: { limit: 100, window: 1h }
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - { name: planned, pathPrefix: /planned/, upstream: backend, limits: { api: { limit: 10, window: 1h } } }
${routes}`)
  const statusOf = async (path: string, key?: string): Promise<number> => {
    const res = await fetch(`${gw.url}${path}`, { headers: key === undefined ? {} : { 'x-api-key': key } })
    await res.arrayBuffer()
    return res.status
  }
  t.equal(await statusOf('/planned/x', 'k-alice-1'), 200)
  for (let i = 0; i < ALGORITHMS.length; i++) t.equal(await statusOf(`/r${i}/x`), 200)
  t.equal(await statusOf('/planned/x', 'not-a-key'), 401, 'a failed identity, charged to its budget')

  const client = redis.client()
  const keys = (await client.keys('gw:*')).sort()
  const one = (pattern: RegExp): string => {
    const found = keys.filter(k => pattern.test(k))
    t.equal(found.length, 1, `one key matches ${pattern.source}`)
    return found[0] ?? ''
  }
  const hash = '[A-Za-z0-9_-]{8}'
  t.equal(await client.type(one(new RegExp(`^gw:\\*\\.ip\\.${hash}:127\\.0\\.0\\.1$`))), 'string', 'the gateway-wide ip limit (gcra, the default)')
  one(new RegExp(`^gw:planned\\.api\\.${hash}:_$`))
  one(new RegExp(`^gw:free:\\*\\.user\\.${hash}:alice$`))
  one(new RegExp(`^gw:free:planned\\.user\\.${hash}:alice$`))
  one(/^gw:quota\.day:alice$/)
  one(new RegExp(`^gw:\\*identity\\.ip\\.${hash}:127\\.0\\.0\\.1$`))
  for (const [i, [algorithm, type]] of ALGORITHMS.entries()) {
    t.equal(await client.type(one(new RegExp(`^gw:r${i}\\.ip\\.${hash}:127\\.0\\.0\\.1$`))), type, `${algorithm}: ${type}`)
  }
})
