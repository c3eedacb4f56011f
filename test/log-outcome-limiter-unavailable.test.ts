// README (Logs): the access line's `outcome` says when the gateway answered itself, and
// `limiter_unavailable` is one of its values: a request refused 503 GW_ERR_LIMITER_UNAVAILABLE
// because Redis is away and the limit says `onError: deny`. An operator counting these lines (how
// many clients a Redis outage refused) finds them by that value. README (Errors): the body names
// the code and the request id, the same id as X-Request-Id.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { eventually } from './helpers/ratelimit.js'

t.test('a request refused because Redis is away (onError: deny) is logged with outcome limiter_unavailable', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
redis: { url: ${redis.url}, timeout: 500ms, onError: deny }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    limits:
      ip: { algorithm: token-bucket, limit: 1000, window: 1h }
`)
  const ok = await fetch(`${gw.url}/before`)
  t.equal(ok.status, 200, 'Redis up: the request passes')
  await redis.kill()
  const refused = await fetch(`${gw.url}/during`)
  const id = refused.headers.get('x-request-id')
  t.equal(refused.status, 503)
  t.match(await refused.json(), { error: 'GW_ERR_LIMITER_UNAVAILABLE', requestId: id }, 'the body names the code and the X-Request-Id')
  t.equal(up.log.includes('/during'), false, 'the upstream never saw it')

  let line: Record<string, unknown> | undefined
  await eventually('the refused request\'s access line', async () => {
    line = gw.lines.find(l => l.msg === 'request' && l.requestId === id)
    return line !== undefined
  }, 10_000)
  t.match(line, { path: '/during', route: 'api', status: 503, outcome: 'limiter_unavailable' }, 'logged as the gateway\'s own answer, limiter_unavailable')
  t.equal(line?.target, undefined, 'no upstream target: it was never forwarded')
  const before = gw.lines.find(l => l.msg === 'request' && l.path === '/before')
  t.equal(before?.outcome, undefined, 'a forwarded request has no outcome')
})
