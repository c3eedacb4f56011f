// The reset bus's subscriber stopped (a reload, a shutdown) while it reconnects after a Redis blip.
// Its connection has sent its FIN, but Redis still answers the handshake's INFO: ioredis then marks
// it ready and, by its own autoResubscribe, sends SUBSCRIBE on a stream that takes no more writes.
// With the gateway's enableOfflineQueue: false that call is rejected with nobody to catch it, and
// Node ends the process on an unhandled rejection: the gateway crashed on a reload after a blip
// (seen in .ci/run: a test's gateway closed while Redis restarted).
import t from 'tap'
import { connect, createServer, type Socket } from 'node:net'
import { createRedisClient } from '../src/limit/redis-client.js'
import { ResetBus } from '../src/limit/limit-admin.js'
import { startRedis } from './helpers/redis.js'

/**
 * A TCP relay in front of Redis adding `delayMs` to every byte and FIN in both directions, as a
 * distant network does; `onInfo(n)` is called when connection n (1, 2, ...) sends INFO.
 */
async function slowRelay (target: number, delayMs: number, onInfo: (connection: number) => void): Promise<{ port: number, cut: (connection: number) => void, close: () => void }> {
  const sockets = new Map<number, [Socket, Socket]>()
  let count = 0
  const server = createServer({ allowHalfOpen: true }, (client) => {
    const n = ++count
    const redis = connect({ port: target, host: '127.0.0.1', allowHalfOpen: true })
    sockets.set(n, [client, redis])
    const later = (fn: () => void): void => { setTimeout(fn, delayMs) }
    client.on('data', (d: Buffer) => {
      // the INFO command itself, not CLIENT SETINFO
      if (d.toString('latin1').toLowerCase().includes('$4\r\ninfo\r\n')) onInfo(n)
      later(() => { if (!redis.destroyed) redis.write(d) })
    })
    redis.on('data', (d: Buffer) => later(() => { if (!client.destroyed) client.write(d) }))
    client.on('end', () => later(() => redis.end()))
    redis.on('end', () => later(() => client.end()))
    client.on('error', () => redis.destroy())
    redis.on('error', () => client.destroy())
    client.on('close', () => later(() => redis.destroy()))
    redis.on('close', () => later(() => client.destroy()))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const address = server.address()
  if (address === null || typeof address === 'string') throw new Error('no port')
  return {
    port: address.port,
    cut: (n) => { for (const s of sockets.get(n) ?? []) s.destroy() },
    close: () => { server.close(); for (const pair of sockets.values()) for (const s of pair) s.destroy() }
  }
}

/** Publishes a reset for key `key` every 100 ms until the bus applied it (false after 10 s). */
async function delivered (publisher: ReturnType<Awaited<ReturnType<typeof startRedis>>['client']>, received: string[], key: string): Promise<boolean> {
  const deadline = Date.now() + 10_000
  while (!received.includes(key) && Date.now() < deadline) {
    await publisher.publish('gw:admin:reset', JSON.stringify({ ipKey: null, denyKeys: [], keys: [key] }))
    await new Promise(resolve => setTimeout(resolve, 100))
  }
  return received.includes(key)
}

t.test('the reset bus subscribes again after its connection is cut (its own resubscription, not ioredis\'s)', async t => {
  const redis = await startRedis(t)
  const relay = await slowRelay(redis.port, 0, () => {})
  t.teardown(relay.close)
  const client = createRedisClient({ url: `redis://127.0.0.1:${relay.port}` })
  t.teardown(() => client.disconnect())
  await new Promise<void>((resolve) => client.once('ready', () => resolve()))
  const received: string[] = []
  const bus = new ResetBus(client, 'gw:admin:reset', (m) => received.push(...m.keys), () => {})
  bus.start()
  t.teardown(() => bus.stop())
  const publisher = redis.client()
  t.ok(await delivered(publisher, received, 'before'), 'a reset reaches it')
  relay.cut(2)
  t.ok(await delivered(publisher, received, 'after'), 'a reset published after the cut reaches it')
})

t.test('stopping the reset bus while its subscriber reconnects rejects nothing unhandled', async t => {
  const redis = await startRedis(t)
  const unhandled: string[] = []
  const onUnhandled = (reason: unknown): void => { unhandled.push(reason instanceof Error ? reason.message : String(reason)) }
  process.on('unhandledRejection', onUnhandled)
  t.teardown(() => { process.off('unhandledRejection', onUnhandled) })

  let bus: ResetBus | null = null
  let stoppedAt = 0
  let subscriberConnection = 0
  const relay = await slowRelay(redis.port, 150, (n) => {
    // the subscriber's second connection (after the cut) asks INFO: the gateway stops it now
    if (bus !== null && subscriberConnection !== 0 && n > subscriberConnection && stoppedAt === 0) {
      stoppedAt = Date.now()
      bus.stop()
    }
  })
  t.teardown(relay.close)
  const client = createRedisClient({ url: `redis://127.0.0.1:${relay.port}`, connectTimeoutMs: 5000 })
  t.teardown(() => client.disconnect())
  await new Promise<void>((resolve) => client.once('ready', () => resolve()))

  const received: string[] = []
  bus = new ResetBus(client, 'gw:admin:reset', (m) => received.push(...m.keys), () => {})
  bus.start()
  // the subscriber is the relay's second connection; its subscription works before the cut
  subscriberConnection = 2
  t.ok(await delivered(redis.client(), received, 'k'), 'subscribed through the relay before the cut')

  relay.cut(subscriberConnection)
  const stopDeadline = Date.now() + 10_000
  while (stoppedAt === 0 && Date.now() < stopDeadline) await new Promise(resolve => setTimeout(resolve, 50))
  t.ok(stoppedAt > 0, 'the bus was stopped during its reconnect\'s handshake')
  // the INFO reply (150 ms each way) comes after the stop; give it and its aftermath time
  await new Promise(resolve => setTimeout(resolve, 1000))
  t.same(unhandled, [], 'no rejected call left to Node (it ends the process)')
})
