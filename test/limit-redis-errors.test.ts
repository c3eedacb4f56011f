// Redis errors are classified by class and reply code (src/limit/redis-client.ts), the way
// gateway_redis_errors_total{kind} counts them: each kind below is a real failure of a real
// redis-server or Cluster (only the guard's own timeout, an error of ours, is built here).
import t from 'tap'
import { Redis } from 'ioredis'
import { eventually } from './helpers/ratelimit.js'
import { nodeClient, startRedis, startRedisCluster, startRedisReplica } from './helpers/redis.js'
import { classifyRedisError, createRedisClient, replyCode, whenReady } from '../src/limit/redis-client.js'
import { createRedisStore, SlotGroupError } from '../src/limit/redis-store.js'
import { mayHaveRun, RedisGuard } from '../src/limit/redis-guard.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'
import type { LimitSpec } from '../src/limit/types.js'

async function failureOf (call: () => Promise<unknown>): Promise<unknown> {
  try {
    await call()
  } catch (err) {
    return err
  }
  throw new Error('the call was expected to fail')
}

const redis = await startRedis(t)

t.test('error replies by their code', async (t) => {
  const client = redis.client()
  const noscript = await failureOf(async () => await client.evalsha('0'.repeat(40), 0))
  t.equal(replyCode(noscript), 'NOSCRIPT')
  t.equal(classifyRedisError(noscript), 'noscript')
  const scriptError = await failureOf(async () => await client.eval('return redis.call("NOSUCHCOMMAND")', 0))
  t.equal(classifyRedisError(scriptError), 'other', 'a script error is not an outage')
  const wrongType = await failureOf(async () => {
    await client.set('errors:string', 'x')
    return await client.lpush('errors:string', 'y')
  })
  t.equal(replyCode(wrongType), 'WRONGTYPE')
  t.equal(classifyRedisError(wrongType), 'other')
})

t.test('READONLY from a replica: the server is up but cannot take the write', async (t) => {
  const replica = await startRedisReplica(t, redis.port)
  const readonly = await failureOf(async () => await replica.client().set('errors:k', '1'))
  t.equal(replyCode(readonly), 'READONLY')
  t.equal(classifyRedisError(readonly), 'unavailable')
})

t.test('MOVED from a Cluster master that does not own the slot', async (t) => {
  const cluster = await startRedisCluster(t)
  // A plain connection to one master does not follow redirections: some of these keys live elsewhere.
  const node = nodeClient(t, cluster.ports[0] as number)
  let moved: unknown = null
  for (let i = 0; i < 20 && moved === null; i++) moved = await node.set(`errors:${i}`, '1').then(() => null, (err: unknown) => err)
  t.equal(replyCode(moved), 'MOVED')
  t.equal(classifyRedisError(moved), 'cluster')
})

t.test('CLUSTERDOWN until ioredis stops following it: the error it gives up with is a Cluster one', async (t) => {
  const cluster = await startRedisCluster(t)
  const client = createRedisClient({ cluster: cluster.ports.map((p) => `redis://127.0.0.1:${p}`), onError: () => {} })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  await client.set('errors:down', '1')
  // every node forgets the key's slot: with cluster-require-full-coverage (the default) each
  // answers CLUSTERDOWN, which ioredis retries every 100 ms up to its 16 redirections. The owner
  // first: a node that forgot the slot takes it back when the owner still claims it.
  const slot = await client.call('CLUSTER', 'KEYSLOT', 'errors:down') as number
  const ranges = await client.call('CLUSTER', 'SLOTS') as Array<[number, number, [string, number]]>
  const owner = ranges.find(([from, to]) => from <= slot && slot <= to)?.[2][1]
  t.ok(owner !== undefined && cluster.ports.includes(owner), `the slot's owner (${owner})`)
  for (const port of [owner as number, ...cluster.ports.filter((p) => p !== owner)]) {
    await nodeClient(t, port).call('CLUSTER', 'DELSLOTS', String(slot)).catch(() => {})
  }
  const down = await failureOf(async () => await client.get('errors:down'))
  t.match((down as Error).message, /^Too many Cluster redirections\. Last error: .*CLUSTERDOWN/, 'ioredis gave up following CLUSTERDOWN')
  t.equal(classifyRedisError(down), 'cluster', 'counted as kind cluster, not other')
})

t.test('no connection: a refused socket, a client that will not queue', async (t) => {
  const dead = await startRedis()
  const deadPort = dead.port
  await dead.stop()
  // the gateway's own client settings: no offline queue, so a call fails at once while Redis is away
  const client = createRedisClient({ url: `redis://127.0.0.1:${deadPort}`, connectTimeoutMs: 500, onError: () => {} })
  t.teardown(() => client.disconnect())
  const offline = await failureOf(async () => await client.ping())
  t.equal(classifyRedisError(offline), 'connection', `${(offline as Error).message}`)
  const refused = await new Promise<unknown>((resolve) => {
    const probe = new Redis({ port: deadPort, host: '127.0.0.1', lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 })
    probe.on('error', resolve)
    probe.connect().catch(() => {})
    t.teardown(() => probe.disconnect())
  })
  t.equal((refused as { code?: string }).code, 'ECONNREFUSED')
  t.equal(classifyRedisError(refused), 'connection')
})

t.test('no connection under Cluster: a client with no master to ask fails the call as a lost connection', async (t) => {
  const dead = await startRedis()
  const deadPort = dead.port
  await dead.stop()
  const cluster = createRedisClient({ cluster: [`redis://127.0.0.1:${deadPort}`], connectTimeoutMs: 500, onError: () => {} })
  t.teardown(() => cluster.disconnect())
  const offline = await failureOf(async () => await cluster.ping())
  // ioredis rejects it with a message and no code: counted as 'other', a lease release it carried was not kept
  t.equal(classifyRedisError(offline), 'connection', `${(offline as Error).message}`)
})

t.test('a Cluster call failing in several slot groups may have run when any group\'s failure may have', async (t) => {
  // a call ioredis never sent: a Cluster client with no master to ask
  const dead = await startRedis(t)
  const deadPort = dead.port
  await dead.stop()
  const cluster = createRedisClient({ cluster: [`redis://127.0.0.1:${deadPort}`], connectTimeoutMs: 500, onError: () => {} })
  t.teardown(() => cluster.disconnect())
  const notSent = await failureOf(async () => await cluster.ping())
  t.notOk(mayHaveRun(notSent), `never sent: ${(notSent as Error).message}`)
  // a call whose connection closed while Redis held it
  const client = createRedisClient({ url: redis.url, onError: () => {} })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const waiting = failureOf(async () => await client.blpop('errors:nothing', 5))
  const admin = redis.client()
  let blocked: string | undefined
  await eventually('the call is held by Redis', async () => {
    blocked = /^id=(\d+) .*cmd=blpop/m.exec(await admin.call('CLIENT', 'LIST') as string)?.[1]
    return blocked !== undefined
  })
  await admin.call('CLIENT', 'KILL', 'ID', blocked as string)
  const lost = await waiting
  t.ok(mayHaveRun(lost), `lost with its connection: ${(lost as Error).message}`)
  t.ok(mayHaveRun(new SlotGroupError([0, 2], [notSent, lost])), 'one group never sent, the other lost: it may have run')
  t.ok(mayHaveRun(new SlotGroupError([0, 2], [lost, notSent])), 'in either order')
  t.notOk(mayHaveRun(new SlotGroupError([0, 2], [notSent, notSent])), 'no group sent: it ran nothing')
})

t.test('the guard\'s own timeout, by its code', async (t) => {
  t.equal(classifyRedisError(Object.assign(new Error('no answer within 50ms'), { code: 'GW_ERR_REDIS_TIMEOUT' })), 'timeout')
  t.equal(classifyRedisError('not an error'), 'other')
})

t.test('a check the store refuses before calling Redis (the request\'s fault) fails that decision, not Redis: the breaker stays closed', async (t) => {
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const states: string[] = []
  const failures: string[] = []
  const guard = new RedisGuard({
    store: createRedisStore({ client }),
    fallbackMaxKeys: 100,
    timeoutMs: 1000,
    instances: () => 1,
    telemetry: { ...NOOP_TELEMETRY, redisCall: (_s, ok, kind) => { if (!ok) failures.push(String(kind)) } },
    onStateChange: (state) => { states.push(state) }
  })
  t.teardown(() => guard.close())
  // a window of 0 is what identity.failureLimit let through before the config checked it
  const invalid: LimitSpec = Object.freeze({ id: 'zero-window', algorithm: 'gcra', limit: 10, windowMs: 0, burst: 10, maxDelayMs: 0 })
  const valid: LimitSpec = Object.freeze({ id: 'fw-10-60000', algorithm: 'fixed-window', limit: 10, windowMs: 60_000, burst: 10, maxDelayMs: 0 })
  const LOCAL = [{ onError: 'local' as const }]
  for (let i = 0; i < 5; i++) {
    await t.rejects(guard.decide([{ key: `caller-${i}`, spec: invalid, cost: 1 }], LOCAL, `bad${i}`), { name: 'RangeError', message: 'limit zero-window: windowMs must be an integer >= 1' })
  }
  t.equal(guard.breaker, 'closed', 'five such requests leave the breaker closed (three Redis failures open it)')
  t.same(states, [], 'no state change')
  t.same(failures, [], 'no Redis failure counted')
  const answered = await guard.decide([{ key: 'caller-ok', spec: valid, cost: 1 }], LOCAL, 'good')
  t.equal(answered.level, 'redis', 'the next valid request is decided by Redis, not the fallback')
  t.equal(answered.decision.allowed, true)
})
