// README promises about memory and metrics, held through HTTP: the local level and the deny cache
// hold at most `local.maxKeys` clients, and the metrics that show them move with the traffic.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { limitCalls, metric, send } from './helpers/ratelimit.js'

const redis = await startRedis(t)
const admin = redis.client()

const CLIENTS = 200
const MAX_KEYS = 50
const clientIp = (i: number): string => `198.51.${100 + Math.floor(i / 250)}.${1 + (i % 250)}`

t.test('local.maxKeys bounds the local level and the deny cache; gateway_ratelimit_local_keys and gateway_redis_duration_seconds move', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
trustedProxies: [127.0.0.1]
redis: { url: ${redis.url}, timeout: 2s }
local: { limit: 1000, window: 1s, maxKeys: ${MAX_KEYS} }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: b
    pathPrefix: /
    upstream: backend
    limits:
      ip: { algorithm: token-bucket, limit: 1, window: 1h }
`)
  // a token bucket (one token an hour), not a fixed window: an epoch-aligned window would start
  // afresh if the run crossed the top of the hour, and a client's second request would pass
  const from = (i: number): { headers: Record<string, string> } => ({ headers: { 'x-forwarded-for': clientIp(i) } })
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_local_keys'), 0, 'no client yet')
  t.equal(await metric(gw.adminUrl, 'gateway_redis_duration_seconds_count'), 0, 'no Redis call yet')

  const statuses: number[] = []
  for (let i = 0; i < CLIENTS; i++) {
    statuses.push((await send(`${gw.url}/x`, from(i))).status, (await send(`${gw.url}/x`, from(i))).status)
  }
  t.same(statuses, Array.from({ length: CLIENTS }, () => [200, 429]).flat(), 'each client: its one unit, then a rejection by Redis')
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_local_keys'), MAX_KEYS, `${CLIENTS} clients, the local level holds ${MAX_KEYS}`)
  t.equal(await metric(gw.adminUrl, 'gateway_redis_duration_seconds_count'), 2 * CLIENTS, 'one Redis call per request, each timed')

  // The deny cache holds the newest MAX_KEYS rejected clients: the newest is answered from it,
  // the oldest was evicted and goes back to Redis (which still rejects it).
  let calls = await limitCalls(admin)
  t.equal((await send(`${gw.url}/x`, from(CLIENTS - 1))).status, 429)
  t.equal(await limitCalls(admin) - calls, 0, 'the newest rejected client: deny cache, no Redis call')
  calls = await limitCalls(admin)
  t.equal((await send(`${gw.url}/x`, from(0))).status, 429)
  t.equal(await limitCalls(admin) - calls, 1, 'the oldest rejected client was evicted from the bounded deny cache: asked Redis again')
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_local_keys'), MAX_KEYS, 'still bounded')
})
