// createRedisClient against real servers: a password-protected server by URL or option, a
// Sentinel-managed master, and the fail-fast behaviour the limiter's fallback relies on.
import t from 'tap'
import { startRedis, startRedisSentinel } from './helpers/redis.js'
import { createRedisClient, reconnectDelayMs, whenReady } from '../src/limit/redis-client.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import type { LimitCheck, LimitSpec } from '../src/limit/types.js'

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
