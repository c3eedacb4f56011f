// Regression (issue 8, item 7): a limit's id names its parameters but not its cost, and the deny
// cache used to survive a reload that lowered the cost: the client kept the old, longer lockout.
// Observed through HTTP: Retry-After after the reload is the new cost's wait.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import { scriptCalls, startRedis } from './helpers/redis.js'

const config = (upstream: string, cost: number): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: r
    pathPrefix: /
    upstream: backend
    limits:
      api: { algorithm: token-bucket, limit: 10, window: 1h, cost: ${cost} }
`

t.test('lowering a limit\'s cost by reload drops the lockout the old cost earned', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 5))
  const url = `${gw.url}/x`
  t.same([(await send(url)).status, (await send(url)).status], [200, 200], 'two requests of cost 5 fill the bucket of 10')
  const before = await send(url)
  t.equal(before.status, 429)
  const waitBefore = Number(before.headers['retry-after'])
  t.ok(waitBefore > 1700 && waitBefore <= 1800, `cost 5 at 10/h: retry after ${waitBefore} s (~30 min)`)
  t.equal(Number((await send(url)).headers['retry-after']) <= waitBefore, true, 'the deny cache answers the next attempt')

  writeFileSync(gw.runtime?.file as string, config(up.url, 1))
  t.ok((await gw.reload()).ok, 'reloaded with cost 1')
  const after = await send(url)
  t.equal(after.status, 429, 'the bucket is still empty')
  const waitAfter = Number(after.headers['retry-after'])
  t.ok(waitAfter > 0 && waitAfter <= 360, `cost 1 at 10/h: retry after ${waitAfter} s (~6 min), not the old ${waitBefore} s`)
})

t.test('a reload to another Redis drops the lockouts the old one earned', async t => {
  // README: the deny cache "... or a new Redis endpoint, starts without the old lockouts"
  const [first, second] = [await startRedis(t), await startRedis(t)]
  const up = await startUpstream(t)
  // exact counts: 2 s, not the default 50 ms (startRedis in test/helpers/redis.ts says why)
  const withRedis = (url: string): string => `redis: { url: ${url}, timeout: 2s }\n${config(up.url, 5)}`
  const gw = await startGateway(t, withRedis(first.url))
  const url = `${gw.url}/x`
  t.same([(await send(url)).status, (await send(url)).status, (await send(url)).status], [200, 200, 429], 'the budget of the first Redis is spent')
  // script calls: FCALL, or EVALSHA or EVAL before the function library is loaded
  const calls = async (): Promise<number> => await scriptCalls(second.client())
  writeFileSync(gw.runtime?.file as string, withRedis(second.url))
  t.ok((await gw.reload()).ok, 'reloaded onto the second Redis')
  const before = await calls()
  t.equal((await send(url)).status, 200, 'the second Redis has its own, full budget: no lockout carried over')
  t.ok(await calls() > before, 'the request was decided by the second Redis, not by a cached denial')
})

t.test('a lockout never passes to another user whose id ends like a cost: "bob#2" at cost 1 is not "bob" at cost 2', async t => {
  const up = await startUpstream(t)
  const yaml = (cost: number): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: r
    pathPrefix: /
    upstream: backend
    limits:
      user: { algorithm: fixed-window, limit: 4, window: 1h, cost: ${cost} }
`
  const gw = await startGateway(t, yaml(1))
  const url = `${gw.url}/x`
  const as = async (user: string): Promise<number> => (await send(url, { headers: { 'x-user-id': user } })).status
  const statuses = []
  for (let i = 0; i < 5; i++) statuses.push(await as('bob#2'))
  t.same(statuses, [200, 200, 200, 200, 429], 'the user "bob#2" spends its budget of 4')
  t.equal(await as('bob#2'), 429, 'and is held in the deny cache')
  writeFileSync(gw.runtime?.file as string, yaml(2))
  t.ok((await gw.reload()).ok, 'reloaded with cost 2')
  t.equal(await as('bob'), 200, 'the user "bob" has its own budget (it got "bob#2"\'s refusal)')
  t.equal(await as('bob#2'), 429, '"bob#2" is still out of budget')
})
