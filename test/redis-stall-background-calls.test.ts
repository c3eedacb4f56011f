// The calls the gateway makes to Redis on its own (the instance heartbeat, an open breaker's
// probe) against a Redis that is stalled but still connected (CLIENT PAUSE here; SIGSTOP, a long
// script): it answers nothing and fails nothing, so a call sent on a timer while the one before it
// still waits would pile up in the client for as long as the stall lasts. Each waits for the one
// before it. Real redis-server, the gateway's own client, heartbeat and guard; the calls counted
// are Redis's own (INFO commandstats).
import t from 'tap'
import { startRedis } from './helpers/redis.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { InstanceHeartbeat } from '../src/limit/heartbeat.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'
import type { LimitSpec } from '../src/limit/types.js'
import type { Redis } from 'ioredis'
import type { Teardown } from './helpers/teardown.js'

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** Calls of `command` Redis has run since its last CONFIG RESETSTAT. */
async function callsOf (reader: { info(section: string): Promise<string> }, command: string): Promise<number> {
  const line = (await reader.info('commandstats')).split('\r\n').find((l) => l.startsWith(`cmdstat_${command}:`))
  return line === undefined ? 0 : Number(/calls=(\d+)/.exec(line)?.[1] ?? 0)
}

/** A redis-server of its own, the gateway's client on it (ready), and a plain client to read its stats. */
async function clientAndReader (t: Teardown): Promise<{ client: ReturnType<typeof createRedisClient>, reader: Redis }> {
  const redis = await startRedis(t)
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  return { client, reader: redis.client() }
}

t.test('the heartbeat sends no beat while the one before it waits for a paused Redis', async t => {
  const { client, reader } = await clientAndReader(t)
  const heartbeat = new InstanceHeartbeat(client, 'gw:instances', 200)
  t.teardown(() => heartbeat.stop(100))
  heartbeat.start()
  await sleep(500)
  t.ok(await callsOf(reader, 'eval') >= 2, 'it beats every 200 ms while Redis answers')
  await reader.call('CONFIG', 'RESETSTAT')
  const pausedAt = Date.now()
  await reader.call('CLIENT', 'PAUSE', '3000', 'ALL')
  // the reader's own INFO waits for the pause's end; a moment later every beat sent was run
  await callsOf(reader, 'eval')
  const pausedFor = Date.now() - pausedAt
  await sleep(30)
  const during = await callsOf(reader, 'eval')
  t.ok(pausedFor >= 2500, `paused ${pausedFor} ms: about ${Math.floor(pausedFor / 200)} intervals`)
  t.ok(during <= 4, `beats Redis ran for the pause: ${during} (one waited; more may have gone out as it ended)`)
  await sleep(700)
  t.ok(await callsOf(reader, 'eval') >= during + 2, 'and it beats every 200 ms again')
})

t.test('an open breaker sends no probe while the one before it waits for a paused Redis', async t => {
  const { client, reader } = await clientAndReader(t)
  const states: string[] = []
  const guard = new RedisGuard({
    store: createRedisStore({ client }),
    ping: () => client.ping(),
    fallbackMaxKeys: 100,
    timeoutMs: 100,
    failureThreshold: 2,
    instances: () => 1,
    telemetry: NOOP_TELEMETRY,
    onStateChange: (state) => { states.push(state) }
  })
  t.teardown(() => guard.close())
  const spec: LimitSpec = Object.freeze({ id: 'fw', algorithm: 'fixed-window', limit: 1000, windowMs: 60_000, burst: 1000, maxDelayMs: 0 })
  await reader.call('CONFIG', 'RESETSTAT')
  const pausedAt = Date.now()
  await client.call('CLIENT', 'PAUSE', '2500', 'ALL')
  const levels = await Promise.all(['a', 'b'].map(async (k) => (await guard.decide([{ key: k, spec, cost: 1 }], [{ onError: 'local' }], k)).level))
  t.same(levels, ['fallback', 'fallback'], 'two calls timed out')
  t.equal(guard.breaker, 'open', 'and opened the breaker, which probes every 250 ms')
  await callsOf(reader, 'ping')
  const pausedFor = Date.now() - pausedAt
  await sleep(30)
  const during = await callsOf(reader, 'ping')
  t.ok(pausedFor >= 2000, `paused ${pausedFor} ms: about ${Math.floor(pausedFor / 250)} probe ticks`)
  t.ok(during <= 4, `PINGs Redis ran for the pause: ${during} (one waited; more may have gone out as it ended)`)
  for (let i = 0; i < 40 && guard.breaker !== 'closed'; i++) await sleep(50)
  t.equal(guard.breaker, 'closed', 'the probe after the pause closed it')
  t.same(states, ['open', 'closed'])
})
