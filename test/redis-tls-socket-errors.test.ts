// A TLS connection to Redis that fails twice: a record that does not decrypt, then a reset. A TLS
// socket emits both as 'error'; ioredis listened for one, and the second ended the gateway with
// "Unhandled 'error' event" (it happened in CI, a sentinel test's teardown). Against a real
// redis-server serving TLS, through a relay that, once the gateway's connection has gone quiet,
// writes it a bogus application-data record and resets the connection when the gateway answers
// it (its alert): the gateway, run as bin/gateway, logs the error, reconnects and decides on Redis.
import t, { type Test } from 'tap'
import { createServer, connect, type Socket } from 'node:net'
import { once } from 'node:events'
import { spawnGateway } from './helpers/gateway.js'
import { makeRedisTlsCerts, startTlsRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { tempDir } from './helpers/teardown.js'
import { limitedConfig, readyz, statuses } from './helpers/redis-tls-gateway.js'

const dir = tempDir(t, 'redis-tls-socket-errors')
const certs = makeRedisTlsCerts(dir, 'ca')

// TLS 1.3 application data, 32 bytes the client cannot decrypt
const BOGUS_RECORD = Buffer.from([0x17, 0x03, 0x03, 0x00, 0x20, ...Buffer.alloc(32, 7)])

interface HostileRelay { port: number, connections: number, resets: number, reset: Promise<void> }

/**
 * Forwards to `targetPort`; the first connection that stays quiet for `quietMs` is written the
 * bogus record, and reset (RST) as soon as the client sends anything after it.
 */
async function hostileRelay (t: Test, targetPort: number, quietMs = 150): Promise<HostileRelay> {
  let hostileLeft = 1
  let resolveReset: () => void = () => {}
  const relay: HostileRelay = { port: 0, connections: 0, resets: 0, reset: new Promise(resolve => { resolveReset = resolve }) }
  const sockets = new Set<Socket>()
  const server = createServer((client) => {
    relay.connections++
    const redis = connect(targetPort, '127.0.0.1')
    for (const s of [client, redis]) {
      sockets.add(s)
      s.on('error', () => {})
      s.on('close', () => sockets.delete(s))
    }
    let injected = false
    let quiet: NodeJS.Timeout | undefined
    const rearm = (): void => {
      clearTimeout(quiet)
      if (hostileLeft === 0 || injected) return
      quiet = setTimeout(() => {
        if (hostileLeft === 0) return
        hostileLeft--
        injected = true
        client.write(BOGUS_RECORD)
      }, quietMs)
    }
    redis.on('data', (d: Buffer) => { client.write(d); rearm() })
    client.on('data', (d: Buffer) => {
      if (injected) {
        client.resetAndDestroy()
        redis.destroy()
        relay.resets++
        resolveReset()
        return
      }
      redis.write(d)
      rearm()
    })
    client.on('close', () => { clearTimeout(quiet); redis.destroy() })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  relay.port = (server.address() as { port: number }).port
  t.teardown(async () => {
    for (const s of sockets) s.destroy()
    server.close()
  })
  return relay
}

t.test('a bogus TLS record then a reset on the Redis connection: the gateway serves on, reconnects and decides on Redis', async t => {
  const master = await startTlsRedis(t, certs)
  const relay = await hostileRelay(t, master.tlsPort)
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, limitedConfig(up.url, 'tls-hostile', `{ url: "rediss://127.0.0.1:${relay.port}", tls: { ca: ${certs.ca} }, timeout: 2s, onError: allow }`))
  // the gateway's connection goes quiet soon after start-up
  await relay.reset
  t.equal(relay.resets, 1, 'the relay wrote the bogus record and reset the connection when the gateway answered it')
  const before = relay.connections
  const deadline = Date.now() + 15_000
  let state = ''
  while (Date.now() < deadline && gw.child.exitCode === null) {
    const ready = await readyz(gw.adminUrl).catch(() => null)
    state = ready?.redis.state ?? 'no answer'
    if (ready?.redis.state === 'up' && ready.redis.connected && relay.connections > before) break
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  t.equal(gw.child.exitCode, null, `the gateway is still running (stderr: ${gw.stderr().slice(0, 400)})`)
  t.equal(state, 'up', '/readyz: Redis is up again')
  t.ok(relay.connections > before, `reconnected through the relay (${before} connections, then ${relay.connections})`)
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429], '3 x 200, then 429: decided on Redis')
  t.ok((await master.tlsClient().keys('gw:*tls-hostile*')).length > 0, 'the key is on Redis')
})
