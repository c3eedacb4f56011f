// GET /consumers/NAME for a consumer whose name holds "/" (a consumer name is any text): the
// name was decoded before the path was checked to be one segment, so /consumers/acme%2Fprod was a
// 404 and such a consumer could not be looked up at all.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import { awayFromQuotaEdge } from './helpers/window-edge.js'

t.test('GET /consumers/acme%2Fprod shows the consumer "acme/prod"; /consumers/acme/prod stays a 404', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: "127.0.0.1:0"
admin: 127.0.0.1:0
identity:
  apiKeys: { header: x-api-key, keys: { k-acme: "acme/prod" } }
consumers:
  "acme/prod": { plan: pro }
plans:
  pro: { limits: { quota: { limit: 5, period: day } } }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  await awayFromQuotaEdge('day', 10_000)
  t.equal((await send(`${gw.url}/x`, { headers: { 'x-api-key': 'k-acme' } })).status, 200)
  const admin = `http://127.0.0.1:${gw.adminPort}`
  const r = await send(`${admin}/consumers/acme%2Fprod`)
  t.equal(r.status, 200, 'found')
  t.match(r.json, { consumer: 'acme/prod', plan: 'pro', planFrom: 'consumers', quota: { name: 'pro:quota', used: 1, remaining: 4 } })
  t.equal((await send(`${admin}/consumers/acme%2fprod`)).json?.consumer, 'acme/prod', 'lower-case escape too')
  const two = await send(`${admin}/consumers/acme/prod`)
  t.same([two.status, two.json?.error], [404, 'GW_ERR_NOT_FOUND'], 'two segments are no consumer path')
  const empty = await send(`${admin}/consumers/`)
  t.same([empty.status, empty.json?.error], [404, 'GW_ERR_NOT_FOUND'], 'nor is an empty name')
})
