// Shadow limits count what they would have admitted, and only among requests the enforced
// limits let through: a request rejected anyway must not use up a shadow budget.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream, type Upstream } from './helpers/upstream.js'
import { eventually, metric, send } from './helpers/ratelimit.js'
import type { Teardown } from './helpers/teardown.js'

/** A gateway with one route `r` (users named by x-user-id) whose `limits:` block is `limits`. */
async function routeWithLimits (t: Teardown, limits: string): Promise<{ up: Upstream, gw: Awaited<ReturnType<typeof startGateway>> }> {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: r
    pathPrefix: /
    upstream: backend
    limits:${limits}`)
  return { up, gw }
}

t.test('regression: requests rejected by an enforced limit are not counted by shadow limits', async t => {
  const { up, gw } = await routeWithLimits(t, `
      api:  { algorithm: token-bucket, limit: 2, window: 1h }
      user: { algorithm: sliding-window-log, limit: 3, window: 1h, mode: shadow }
`)
  // a token bucket (one token per 30 min), not a fixed window: an epoch-aligned window would start
  // afresh if the run crossed the top of the hour, and admit a third
  const statuses: number[] = []
  for (let i = 0; i < 5; i++) statuses.push((await send(`${gw.url}/x`, { headers: { 'x-user-id': 'alice' } })).status)
  t.same(statuses, [200, 200, 429, 429, 429], 'the enforced api limit decides')
  const shadow = (result: string): Promise<number> => metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { route: 'r', dimension: 'user', result })
  await eventually('both admitted requests reach the shadow limit', async () => await shadow('allowed') === 2)
  t.equal(await shadow('allowed'), 2, 'the shadow limit saw the 2 admitted requests only')
  t.equal(await shadow('shadow'), 0, 'and never reached its own limit of 3')
  t.equal(up.requests, 2)
})

t.test('two shadow limits are decided each on its own: the tighter one\'s refusals are not counted against the other', async t => {
  const { gw } = await routeWithLimits(t, `
      ip:   { algorithm: sliding-window-log, limit: 1000, window: 1h, mode: shadow }
      user: { algorithm: sliding-window-log, limit: 2, window: 1h, mode: shadow }
`)
  const statuses: number[] = []
  for (let i = 0; i < 5; i++) statuses.push((await send(`${gw.url}/x`, { headers: { 'x-user-id': 'alice' } })).status)
  t.same(statuses, [200, 200, 200, 200, 200], 'shadow limits never reject')
  const count = (dimension: string, result: string): Promise<number> => metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { route: 'r', dimension, result })
  await eventually('every request reaches both shadow limits', async () => await count('ip', 'allowed') + await count('ip', 'shadow') === 5 && await count('user', 'allowed') + await count('user', 'shadow') === 5)
  t.same([await count('user', 'allowed'), await count('user', 'shadow')], [2, 3], 'the user limit would have refused 3')
  t.same([await count('ip', 'allowed'), await count('ip', 'shadow')], [5, 0], 'the ip limit, at 5 of 1000, would have refused none')
})
