// A TLS connection to Redis that fails twice: a record that does not decrypt, then a reset. A TLS
// socket emits both as 'error'; ioredis listened for one, and the second ended the gateway with
// "Unhandled 'error' event" (it happened in CI, a sentinel test's teardown). Against a real
// redis-server serving TLS, through a relay that, once the gateway's connection has gone quiet,
// writes it a bogus application-data record and resets the connection when the gateway answers
// it (its alert): the gateway, run as bin/gateway, logs the error, reconnects and decides on Redis.
import t from 'tap'
import { spawnGateway } from './helpers/gateway.js'
import { makeRedisTlsCerts, startTlsRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { tempDir } from './helpers/teardown.js'
import { limitedConfig, readyz, statuses } from './helpers/redis-tls-gateway.js'
import { hostileRelay } from './helpers/hostile-tls-relay.js'

const dir = tempDir(t, 'redis-tls-socket-errors')
const certs = makeRedisTlsCerts(dir, 'ca')

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
