// Lease releases and renewals are sent without waiting for an answer (src/limit/concurrency.ts).
// A Redis that is stalled but still connected (CLIENT PAUSE here; SIGSTOP, a long script) answers
// nothing and fails nothing, so without a bound they would pile up in the client for as long as
// the stall lasts. Real redis-server, the gateway's own client, guard and keeper.
import t from 'tap'
import { startRedis } from './helpers/redis.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { LeaseKeeper, MAX_WAITING_SENDS, type HeldLease } from '../src/limit/concurrency.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

t.test('Redis paused: lease calls waiting for it stay bounded, the rest are dropped and reported; all settle when it resumes', async t => {
  const redis = await startRedis(t)
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const guard = new RedisGuard({ store: createRedisStore({ client }), fallbackMaxKeys: 100, timeoutMs: 100, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {} })
  t.teardown(() => guard.close())
  const errors: string[] = []
  const keeper = new LeaseKeeper({ redis: { client, guard }, ttlMs: 10_000, onError: (err, what) => errors.push(`${what}: ${(err as Error).message}`) })
  t.teardown(() => keeper.close(100))
  await redis.client().call('CLIENT', 'PAUSE', '2500', 'ALL')
  let mostWaiting = 0
  // one release every 12 ms for 1.8 s: each goes out in a call of its own (10 ms batching)
  for (let i = 0; i < 150; i++) {
    const lease: HeldLease = { keys: [`lease:{u${i}}`], member: `m${i}`, level: 'redis', units: 1, released: false, heldAt: -1 }
    keeper.hold(lease)
    keeper.release(lease)
    await sleep(12)
    mostWaiting = Math.max(mostWaiting, keeper.waiting)
  }
  t.equal(mostWaiting, MAX_WAITING_SENDS, `at most ${MAX_WAITING_SENDS} sends waited for the paused Redis`)
  t.ok(keeper.dropped > 0, `the rest were dropped (${keeper.dropped})`)
  t.equal(errors.filter((e) => e.includes('lease releases already wait for Redis')).length, keeper.dropped, 'each drop reported, saying the leases expire within leaseTtl')
  for (let i = 0; i < 200 && keeper.waiting > 0; i++) await sleep(25)
  t.equal(keeper.waiting, 0, 'every call sent was answered once Redis resumed')
})
