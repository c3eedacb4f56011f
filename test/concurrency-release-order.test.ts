// Issue 10's benchmark: a release waits (RELEASE_WAIT_MS at most) to ride with the next call to
// Redis. Regression guard for that wait: a client at its cap that sends its next request right
// after a response must never be refused by the lease the finished request still seemed to hold
// (the limiter flushes waiting releases before it calls Redis), and a release with no call to
// ride with still reaches Redis on its own.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { eventually, send } from './helpers/ratelimit.js'

const redis = await startRedis(t)
const reader = redis.client()

t.test('`user: 1`: 100 requests, each sent as soon as the previous answered, are all admitted', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s, onError: deny, keyPrefix: seq }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: one
    pathPrefix: /
    upstream: backend
    concurrency: { user: 1 }
`)
  const statuses: Record<number, number> = {}
  for (let i = 0; i < 100; i++) {
    const r = await send(`${gw.url}/x`, { headers: { 'x-user-id': 'bob' } })
    statuses[r.status] = (statuses[r.status] ?? 0) + 1
  }
  t.same(statuses, { 200: 100 }, 'never refused by its own finished request')
  // no request follows this one: its release goes on its own, within RELEASE_WAIT_MS
  const key = 'seq:lease:one.user:bob'
  const slow = send(`${gw.url}/slow?ms=300`, { headers: { 'x-user-id': 'bob' } })
  await eventually('the slow request holds its lease', async () => await reader.zcard(key) === 1, 2000, 5)
  t.equal((await slow).status, 200)
  const answered = Date.now()
  await eventually('the lease is back in Redis', async () => await reader.zcard(key) === 0, 2000, 2)
  t.ok(Date.now() - answered < 1000, `released without a following request (${Date.now() - answered} ms after the answer)`)
})
