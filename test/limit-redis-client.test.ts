// createRedisClient against real servers: a password-protected server by URL or option, a
// Sentinel-managed master, and the fail-fast behaviour the limiter's fallback relies on.
import t from 'tap'
import type { Cluster, Redis } from 'ioredis'
import { nodeClient, startRedis, startRedisCluster, startRedisSentinel } from './helpers/redis.js'
import { clusterNodes, createRedisClient, reconnectDelayMs, whenReady } from '../src/limit/redis-client.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import type { LimitCheck, LimitSpec } from '../src/limit/types.js'

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))
const gcra: LimitSpec = Object.freeze({ id: 'client-test', algorithm: 'gcra', limit: 5, windowMs: 60_000, burst: 5, maxDelayMs: 0 })
const checks = (key: string): LimitCheck[] => [{ key, spec: gcra, cost: 1 }]

const secured = await startRedis(t, { args: ['--requirepass', 's3cret'], password: 's3cret' })

t.test('url with a password, or the password option', async (t) => {
  for (const opts of [{ url: `redis://:s3cret@127.0.0.1:${secured.port}` }, { url: secured.url, password: 's3cret' }]) {
    const client = createRedisClient(opts)
    t.teardown(() => client.disconnect())
    await whenReady(client)
    const store = createRedisStore({ client })
    const key = `pw:${Object.keys(opts).join('+')}`
    t.same((await store.decide(checks(key), 'r')).remaining, 4)
    t.ok(await secured.client().exists(key), 'the state is on that server')
  }
})

t.test('a wrong password: errors go to onError and calls fail, nothing is thrown unhandled', async (t) => {
  const errors: Error[] = []
  const client = createRedisClient({ url: secured.url, password: 'wrong', onError: (err) => errors.push(err) })
  t.teardown(() => client.disconnect())
  await t.rejects(whenReady(client, 1000))
  await t.rejects(createRedisStore({ client }).decide(checks('never'), 'r'))
  t.ok(errors.some((e) => /WRONGPASS|invalid password|NOAUTH/i.test(e.message)), errors[0]?.message ?? 'no error reported')
})

t.test('sentinels: commands go to the master they name', async (t) => {
  const sentinel = await startRedisSentinel(t, secured.port, 'edge', 's3cret')
  const client = createRedisClient({ sentinels: [{ host: '127.0.0.1', port: sentinel.port }], name: 'edge', password: 's3cret' })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const store = createRedisStore({ client })
  t.same([(await store.decide(checks('via-sentinel'), 'a')).remaining, (await store.decide(checks('via-sentinel'), 'b')).remaining], [4, 3])
  t.equal(await secured.client().exists('via-sentinel'), 1, 'written on the master')
})

t.test('nothing listening: calls fail at once instead of queueing for a reconnect', async (t) => {
  const gone = await startRedis(t)
  const url = gone.url
  await gone.stop()
  const errors: Error[] = []
  const client = createRedisClient({ url, onError: (err) => errors.push(err) })
  t.teardown(() => client.disconnect())
  const started = Date.now()
  await t.rejects(createRedisStore({ client }).decide(checks('k'), 'r'), /enableOfflineQueue|Connection|closed/i)
  t.ok(Date.now() - started < 200, `failed in ${Date.now() - started} ms`)
  await new Promise((resolve) => setTimeout(resolve, 300))
  t.ok(errors.some((e) => /ECONNREFUSED/.test(e.message)), 'connection errors reach onError')
})

t.test('under Cluster, a call whose answer was lost with its connection fails; it is not sent again to run a second time', async (t) => {
  const cluster = await startRedisCluster(t, { args: ['--enable-debug-command', 'yes'] })
  const client = createRedisClient({ cluster: cluster.urls, onError: () => {} }) as Cluster
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const store = createRedisStore({ client, maxBatch: 1 })
  const window: LimitSpec = Object.freeze({ id: 'lost-answer', algorithm: 'fixed-window', limit: 10, windowMs: 600_000, burst: 10, maxDelayMs: 0 })
  // every key of the test in one slot ({dora}), so on one master
  const checkOf = (key: string): LimitCheck[] => [{ key: `${key}:{dora}`, spec: window, cost: 1 }]
  t.equal((await store.decide(checkOf('warm'), 'warm')).remaining, 9, 'scripts loaded while the Cluster answers')
  const port = Number(clusterNodes(client).nodeOf('warm:{dora}').split(':')[1])
  t.ok(cluster.ports.includes(port), `the slot's master (${port})`)
  const [reader, blocker, killer, watcher] = [0, 1, 2, 3].map(() => nodeClient(t, port)) as [Redis, Redis, Redis, Redis]
  await Promise.all([blocker.ping(), killer.ping()])
  // each run of the script writes its key's window: one hset event per run
  const runs: string[] = []
  await reader.config('SET', 'notify-keyspace-events', 'Kh')
  await watcher.psubscribe('__keyspace@0__:lost*')
  watcher.on('pmessage', (_pattern: string, channel: string, event: string) => { runs.push(`${channel.slice('__keyspace@0__:'.length)} ${event}`) })
  const clientConnections = async (): Promise<string[]> => {
    const list = await reader.call('CLIENT', 'LIST', 'TYPE', 'normal') as string
    return [...list.matchAll(/^id=(\d+) .* name=edge-gateway /gm)].map((m) => m[1] as string)
  }
  // The master sleeps; the call arrives, then the kill of the client's connections. Read in that
  // order when it wakes, the call runs and the connection closes before its reply goes out. A
  // round where that did not happen (the kill read first, so the call never ran; or read after the
  // call's answer went out, on a stalled machine) is redone on a key of its own.
  let outcome = ''
  let key = ''
  const ran = (): boolean => runs.some((r) => r.startsWith(`${key}:`))
  for (let round = 0; round < 3 && !(outcome === 'Connection is closed.' && ran()); round++) {
    key = `lost${round}`
    // a call on another key of the slot (re)connects the client to the master
    t.ok((await store.decide(checkOf('connect'), 'connect')).allowed)
    const ids = await clientConnections()
    t.ok(ids.length > 0, 'the client is connected to the slot\'s master')
    const sleeping = blocker.call('DEBUG', 'SLEEP', '1')
    await sleep(50)
    const call = store.decide(checkOf(key), key).then(() => 'answered', (err: Error) => err.message)
    await sleep(150)
    const kills = Promise.all(ids.map(async (id) => await killer.call('CLIENT', 'KILL', 'ID', id).catch(() => 0)))
    await sleeping
    await kills
    outcome = await call
    // ioredis's default retryDelayOnFailover would send it again 100 ms after the close
    await sleep(400)
  }
  t.equal(outcome, 'Connection is closed.', 'the call failed with its connection (its caller falls back)')
  t.same(runs.filter((r) => r.startsWith(`${key}:`)), [`${key}:{dora} hset`], 'Redis ran the call once')
  t.equal((await store.decide(checkOf(key), 'after')).remaining, 8, 'its window counts the lost call once, then this one')
})

t.test('options', async (t) => {
  t.throws(() => createRedisClient({}), TypeError, 'no server given')
  t.throws(() => createRedisClient({ url: 'redis://a', cluster: ['redis://b:1'] }), TypeError, 'two modes at once')
  t.throws(() => createRedisClient({ sentinels: [{ host: 'a', port: 1 }] }), TypeError, 'sentinels without a master name')
  t.throws(() => createRedisClient({ sentinels: [{ host: 'a', port: 1 }], name: 'm', sentinelTls: true }), TypeError, 'sentinelTls without tls settings to use')
  const client = createRedisClient({ url: secured.url, password: 's3cret', enableAutoPipelining: true })
  t.teardown(() => client.disconnect())
  t.equal(client.options.enableAutoPipelining, true)
  t.equal(client.options.enableOfflineQueue, false)
  const delays = Array.from({ length: 12 }, (_, i) => reconnectDelayMs(i + 1))
  t.ok(delays.every((d) => d >= 50 && d < 250), `capped backoff: ${delays.join(', ')}`)
  t.ok((delays[0] as number) < (delays[5] as number), 'growing')
})
