// The admin API on an `auth: none` route: the gateway identifies nobody there (a key sent is not
// verified, and removed), so a request meets no user limit, plan or quota. GET /limits and
// GET /consumers/NAME listed the consumer's plan limits for such a route all the same: a consumer
// whose quota was spent showed `remaining: 0` on a route that admitted it.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import { awayFromQuotaEdge } from './helpers/window-edge.js'

interface LimitEntry { name: string, remaining: number }

t.test('GET /limits and /consumers/NAME list no plan limit on an auth: none route', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: "127.0.0.1:0"
admin: 127.0.0.1:0
identity:
  apiKeys: { header: x-api-key, keys: { k-bob: bob } }
consumers:
  bob: { plan: free }
plans:
  free:
    limits:
      user: { algorithm: sliding-window-log, limit: 100, window: 1h }
      quota: { limit: 2, period: day }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /api/, upstream: backend, auth: required }
  - { name: docs, pathPrefix: /docs/, upstream: backend, auth: none }
`)
  await awayFromQuotaEdge('day', 10_000)
  const key = { headers: { 'x-api-key': 'k-bob' } }
  t.equal((await send(`${gw.url}/api/a`, key)).status, 200)
  t.equal((await send(`${gw.url}/api/b`, key)).status, 200)
  t.equal((await send(`${gw.url}/api/c`, key)).status, 429, 'bob spent his quota on the api route')
  t.equal((await send(`${gw.url}/docs/x`, key)).status, 200, 'the docs route identifies nobody: bob is admitted there')

  const admin = `http://127.0.0.1:${gw.adminPort}`
  const onDocs = await send(`${admin}/limits?route=docs&user=bob`)
  t.equal(onDocs.status, 200)
  const names = ((onDocs.json?.limits ?? []) as LimitEntry[]).map(l => l.name)
  t.same(names, [], 'no limit of bob\'s plan is listed for the docs route')
  t.equal(onDocs.json?.plan, null, 'and no plan')
  const onApi = await send(`${admin}/limits?route=api&user=bob`)
  t.same(((onApi.json?.limits ?? []) as LimitEntry[]).map(l => [l.name, l.remaining]), [['free:user', 98], ['free:quota', 0]], 'the api route lists them, quota spent')

  const consumer = await send(`${admin}/consumers/bob`)
  t.equal(consumer.status, 200)
  const routes = consumer.json?.routes as Record<string, { auth: string, limits: unknown[] }>
  t.same(routes.docs, { auth: 'none', limits: [] }, 'the consumer view lists no limit on the docs route')
  t.equal(routes.api?.limits.length, 2, 'and the plan\'s user limit and quota on the api route')
  t.match(consumer.json?.quota, { name: 'free:quota', used: 2, remaining: 0 })
})
