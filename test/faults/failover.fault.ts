// Issue 8 fault suite, failovers: a Sentinel-managed master killed (its synced replica promoted)
// and a 3+3 Redis Cluster master killed (its replica promoted). Run by `npm run test:faults`.
import t from 'tap'
import { Redis } from 'ioredis'
import { startFastSentinel, startRedis, startRedisReplica, startReplicatedCluster, type RedisServer, type RestartableSentinel } from '../helpers/redis.js'
import type { Teardown } from '../helpers/teardown.js'
import { report, runScenario } from './scenario.js'
import { closeRedisClient, createRedisClient } from '../../src/limit/redis-client.js'

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

async function until (what: string, probe: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await probe().catch(() => false)) return
    await sleep(20)
  }
  throw new Error(`${what}: timed out`)
}

/** A master, its replica in sync, and a sentinel watching them as `name` (down after 1 s). */
async function sentinelled (t: Teardown, name: string): Promise<{ master: RedisServer, replica: RedisServer, sentinel: RestartableSentinel }> {
  const master = await startRedis(t)
  const replica = await startRedisReplica(t, master.port)
  const replicaClient = replica.client()
  await until('replica in sync', async () => /master_link_status:up/.test(await replicaClient.info('replication')), 15_000)
  return { master, replica, sentinel: await startFastSentinel(t, master.port, name, 1000) }
}

t.test('Sentinel: master SIGKILLed with users mid-budget, replica promoted: at most 1.1x, no 5xx, back on Redis within 1 s', async t => {
  const { master, replica, sentinel } = await sentinelled(t, 'gwfault')
  const sentinelClient = new Redis({ host: '127.0.0.1', port: sentinel.port, maxRetriesPerRequest: 1 })
  sentinelClient.on('error', () => {})
  t.teardown(() => sentinelClient.disconnect())

  const o = await runScenario(t, {
    redis: `sentinels: ["127.0.0.1:${sentinel.port}"], name: gwfault`,
    fault: async (at) => {
      await at(1500)
      await master.kill()
      await until('sentinel promotes the replica', async () => {
        const addr = await sentinelClient.call('SENTINEL', 'get-master-addr-by-name', 'gwfault') as string[]
        return Number(addr[1]) === replica.port
      }, 30_000)
      return Date.now()
    },
    durationMs: 12_000
  })
  t.comment(report('Sentinel failover', o))
  t.ok(o.maxRatio <= 1.1, `max ${o.maxRatio.toFixed(2)}x <= 1.1x`)
  t.equal(o.fiveHundreds, 0)
  t.ok(o.recoveryMs !== null && o.recoveryMs <= 1000, `recovery ${o.recoveryMs} ms <= 1000 ms`)
})

t.test('Sentinel: master frozen (SIGSTOP, its socket left open) with users mid-budget, replica promoted: the gateway leaves it at +switch-master, at most 1.1x, no 5xx, back on Redis within 1 s of the switch', async t => {
  const { master, replica, sentinel } = await sentinelled(t, 'gwfrozen')
  // the time of the switch as the sentinel publishes it: what a client acts on
  const subscriber = new Redis({ host: '127.0.0.1', port: sentinel.port, maxRetriesPerRequest: 1 })
  subscriber.on('error', () => {})
  t.teardown(() => subscriber.disconnect())
  const switched = new Promise<void>((resolve) => {
    subscriber.on('message', (channel: string, message: string) => {
      if (channel === '+switch-master' && message.startsWith('gwfrozen ') && message.endsWith(` ${replica.port}`)) resolve()
    })
  })
  await subscriber.subscribe('+switch-master')

  const o = await runScenario(t, {
    redis: `sentinels: ["127.0.0.1:${sentinel.port}"], name: gwfrozen`,
    fault: async (at) => {
      await at(1500)
      // no reset reaches the gateway: only the sentinels' +switch-master tells it to move
      master.freeze()
      await Promise.race([switched, sleep(30_000).then(() => { throw new Error('no +switch-master within 30 s') })])
      return Date.now()
    },
    durationMs: 12_000
  })
  t.comment(report('Sentinel, master frozen', o))
  t.ok(o.maxRatio <= 1.1, `max ${o.maxRatio.toFixed(2)}x <= 1.1x`)
  t.equal(o.fiveHundreds, 0)
  t.ok(o.recoveryMs !== null && o.recoveryMs <= 1000, `recovery ${o.recoveryMs} ms <= 1000 ms`)
  if (o.recoveryMs === null || o.recoveryMs > 1000) for (const line of o.breakerLog) t.comment(line)
})

t.test('Sentinel: a client started while its sentinel is down watches for +switch-master once the sentinel is up, and leaves a frozen master at the switch', async t => {
  const { master, replica, sentinel } = await sentinelled(t, 'gwlate')
  await sentinel.down()
  // the gateway's own client, as it builds it for `redis: { sentinels, name }`
  const client = createRedisClient({ sentinels: [{ host: '127.0.0.1', port: sentinel.port }], name: 'gwlate', onError: () => {} })
  t.teardown(() => closeRedisClient(client))
  // Longer than ioredis's 20 attempts of a queued command at the reconnect delays (about 4.5 s):
  // a subscription queued at the start was dropped by then, and never made again.
  await sleep(6000)
  await sentinel.up()
  const answers = async (): Promise<boolean> => await Promise.race([client.ping().then(() => true, () => false), sleep(250).then(() => false)])
  await until('the client on the master', answers, 15_000)
  const sentinelClient = new Redis({ host: '127.0.0.1', port: sentinel.port, maxRetriesPerRequest: 1 })
  sentinelClient.on('error', () => {})
  t.teardown(() => sentinelClient.disconnect())
  await until('the client\'s watcher subscribed', async () =>
    /name=edge-gateway-switch-watch .*sub=1/.test(await sentinelClient.call('CLIENT', 'LIST') as string), 5000)
  const switched = new Promise<number>((resolve) => {
    sentinelClient.on('message', (channel: string, message: string) => {
      if (channel === '+switch-master' && message.startsWith('gwlate ') && message.endsWith(` ${replica.port}`)) resolve(Date.now())
    })
  })
  await sentinelClient.subscribe('+switch-master')
  // no reset reaches the client: only the sentinel's +switch-master tells it to move
  master.freeze()
  const switchedAt = await Promise.race([switched, sleep(30_000).then(() => { throw new Error('no +switch-master within 30 s') })])
  await until('the client answered by the promoted replica', async () =>
    await answers() && (client as unknown as { stream?: { remotePort?: number } }).stream?.remotePort === replica.port, 5000)
  const movedMs = Date.now() - switchedAt
  t.ok(movedMs <= 2000, `on the promoted replica ${movedMs} ms after the switch (<= 2000 ms)`)
})

t.test('Cluster 3+3: a master SIGKILLed with users mid-budget, replica promoted: at most 1.1x, no 5xx', async t => {
  const cluster = await startReplicatedCluster(t, 2000)
  const victim = await cluster.masterOf(0) as number
  const o = await runScenario(t, {
    redis: `cluster: [${cluster.urls.join(', ')}]`,
    fault: async (at) => {
      await at(1500)
      await cluster.kill(victim)
      await until('replica promoted for slot 0', async () => {
        const m = await cluster.masterOf(0)
        return m !== null && m !== victim
      }, 30_000)
      return Date.now()
    },
    durationMs: 12_000
  })
  t.comment(report('Cluster failover', o))
  t.ok(o.maxRatio <= 1.1, `max ${o.maxRatio.toFixed(2)}x <= 1.1x`)
  t.equal(o.fiveHundreds, 0)
  // Back on Redis within 1 s of the replica's promotion. Earlier runs reported up to 5 s here:
  // the breakers had closed within 0.1 s, and the figure was the last of the later reopenings
  // (single 50 ms timeouts on this loaded machine), which recoveryMs no longer counts.
  t.ok(o.recoveryMs !== null && o.recoveryMs <= 1000, `recovery ${o.recoveryMs} ms <= 1000 ms`)
  if (o.recoveryMs === null || o.recoveryMs > 1000) for (const line of o.breakerLog) t.comment(line)
})
