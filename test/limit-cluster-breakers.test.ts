// Issue 8: one circuit breaker per Redis Cluster master. With a master dead (and no failover
// yet), only the keys of its slots are decided by the fallback; keys on the healthy masters stay
// on Redis, and the breaker that opens is the dead master's (the old single breaker sent every
// user to the fallback and flipped 27 times in 6 s as its probes landed on healthy shards).
import t from 'tap'
import type { Cluster } from 'ioredis'
import { startReplicatedCluster } from './helpers/redis.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { clusterNodes, createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { keySlot, limitKey } from '../src/limit/keys.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'
import type { LimitSpec } from '../src/limit/types.js'

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))
const LOCAL = [{ onError: 'local' as const }]
const SPEC: LimitSpec = Object.freeze({ id: 'breakers', algorithm: 'fixed-window', limit: 1000, windowMs: 600_000, burst: 1000, maxDelayMs: 0 })

// A long node timeout: no failover happens during the test, the dead master stays dead.
const servers = await startReplicatedCluster(t, 60_000)
const cluster = createRedisClient({ cluster: servers.urls }) as Cluster
t.teardown(() => cluster.disconnect())
await whenReady(cluster, 15_000)

t.test('a dead master sends only its own slots to the fallback', async t => {
  const transitions: string[] = []
  const store = createRedisStore({ client: cluster })
  const guard = new RedisGuard({
    store,
    fallbackMaxKeys: 100,
    timeoutMs: 100,
    instances: () => 1,
    telemetry: NOOP_TELEMETRY,
    onStateChange: (state, reason) => transitions.push(`${state} ${reason}`),
    ...clusterNodes(cluster)
  })
  const masters = await servers.masters()
  t.equal(masters.length, 3)
  const owners = new Map<number, number>()
  for (const [start, end, master] of await cluster.cluster('SLOTS') as unknown as Array<[number, number, [string, number]]>) {
    for (let s = start; s <= end; s++) owners.set(s, master[1])
  }
  let n = 0
  const keys = masters.map((port) => {
    for (;;) {
      const key = limitKey('gw', 'breakers', `client-${n++}`)
      if (owners.get(keySlot(key)) === port) return key
    }
  })
  // A store's first call to a master loads the function library there: on a loaded machine that
  // outlasted the 100 ms timeout once in CI ('fallback' below). Warmed through a guard of its own
  // with a long timeout, so the guard under test counts no failure and its breakers stay shut.
  const warm = new RedisGuard({ store, fallbackMaxKeys: 100, timeoutMs: 10_000, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {}, ...clusterNodes(cluster) })
  for (const key of keys) await warm.decide([{ key, spec: SPEC, cost: 1 }], LOCAL, 'r')
  for (const key of keys) t.equal((await guard.decide([{ key, spec: SPEC, cost: 1 }], LOCAL, 'r')).level, 'redis')
  const [dead, ...healthy] = keys as [string, ...string[]]
  await servers.kill(masters[0] as number)
  const levels: Record<string, string[]> = { dead: [], healthy: [] }
  for (let round = 0; round < 30; round++) {
    levels.dead?.push((await guard.decide([{ key: dead, spec: SPEC, cost: 1 }], LOCAL, 'r')).level)
    for (const key of healthy) levels.healthy?.push((await guard.decide([{ key, spec: SPEC, cost: 1 }], LOCAL, 'r')).level)
    await sleep(30)
  }
  t.ok(levels.healthy?.every((l) => l === 'redis'), `healthy masters' keys stayed on Redis: ${levels.healthy?.filter((l) => l !== 'redis').length} fallback decisions`)
  t.ok((levels.dead?.filter((l) => l === 'fallback').length ?? 0) >= 25, 'the dead master\'s key went to the fallback')
  t.ok(transitions.length > 0 && transitions.every((x) => x.includes(`:${masters[0]}:`)), `only the dead master's breaker changed state (${transitions.length} transitions)`)
  t.equal(guard.breaker, 'open', '/readyz shows the fallback while a master serving slots is dead')
})
