// `gateway limits reset --ip A` unblocks one client: its own budgets (ip, user, quota, the failed
// identity budget) are reset, never a budget every client shares (`global`, a route's `api`),
// which reset gave a flood the whole gateway's or route's rate again. Real bin/gateway process.
import t from 'tap'
import { spawnGateway, type GatewayProcess } from './helpers/gateway.js'
import type { Teardown } from './helpers/teardown.js'
import { startUpstream } from './helpers/upstream.js'
import { gateway } from './helpers/cli.js'

const TOKEN = 'admin-token-0123456789abcdef'

interface Entry { name: string, remaining: number }

/** bin/gateway with a global budget of 3 and the route api's of 50 (`more`: other gateway-wide limits). */
async function limitedGateway (t: Teardown, more = ''): Promise<GatewayProcess> {
  const up = await startUpstream(t)
  return await spawnGateway(t, `listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0, token: ${TOKEN} }
limits:
  global: { algorithm: fixed-window, limit: 3, window: 1h }${more}
upstreams: { b: { targets: [${up.url}] } }
routes:
  - { name: api, pathPrefix: /, upstream: b, limits: { api: { algorithm: fixed-window, limit: 50, window: 1h } } }
`)
}

t.test('a client\'s reset keeps the global and api budgets every client shares', async t => {
  const gw = await limitedGateway(t, '\n  ip: { algorithm: fixed-window, limit: 100, window: 1h }')
  const statuses: number[] = []
  for (let i = 0; i < 4; i++) statuses.push((await fetch(`${gw.url}/x`)).status)
  t.same(statuses, [200, 200, 200, 429], 'the global budget of 3 is spent')
  const admin = `127.0.0.1:${gw.adminPort}`
  const reset = await gateway(['limits', 'reset', '--route', 'api', '--ip', '127.0.0.1', '--admin', admin, '--token', TOKEN])
  t.equal(reset.code, 0, reset.stderr)
  // it read "reset global, api.api, ip": the gateway's and the route's caps, for every client
  t.match(reset.stdout, /^route api, ip 127\.0\.0\.1: reset ip \(/)
  const got = await gateway(['limits', 'get', '--route', 'api', '--ip', '127.0.0.1', '--admin', admin, '--json'])
  t.equal(got.code, 0, got.stderr)
  const remaining = Object.fromEntries((JSON.parse(got.stdout) as { limits: Entry[] }).limits.map(l => [l.name, l.remaining]))
  t.same(remaining, { global: 0, 'api.api': 47, ip: 100 }, 'the shared budgets as spent, the client\'s own whole again')
  t.equal((await fetch(`${gw.url}/x`)).status, 429, 'the spent global budget still holds')
})

t.test('--shared (shared=true) resets the global and the route\'s api budget too, on purpose', async t => {
  const gw = await limitedGateway(t)
  for (let i = 0; i < 4; i++) await fetch(`${gw.url}/x`)
  t.equal((await fetch(`${gw.url}/x`)).status, 429)
  const admin = `127.0.0.1:${gw.adminPort}`
  const reset = await gateway(['limits', 'reset', '--route', 'api', '--shared', '--admin', admin, '--token', TOKEN])
  t.equal(reset.code, 0, reset.stderr)
  t.match(reset.stdout, /reset global, api\.api \(/)
  const got = await gateway(['limits', 'get', '--route', 'api', '--admin', admin, '--json'])
  const remaining = Object.fromEntries((JSON.parse(got.stdout) as { limits: Entry[] }).limits.map(l => [l.name, l.remaining]))
  t.same(remaining, { global: 3, 'api.api': 50 }, 'both whole again')
  t.equal((await fetch(`${gw.url}/x`)).status, 200, 'and requests pass')
  const bad = await fetch(`http://${admin}/limits?route=api&shared=yes`, { method: 'DELETE', headers: { authorization: `Bearer ${TOKEN}` } })
  t.same([bad.status, ((await bad.json()) as { error: string }).error], [400, 'GW_ERR_BAD_REQUEST'])
  const usage = await gateway(['limits', 'get', '--route', 'api', '--shared', '--admin', admin])
  t.equal(usage.code, 2, '--shared on a get is a usage error')
})
