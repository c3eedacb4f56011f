// Redis over TLS with a private CA, against a real redis-server serving TLS: the limits are decided
// there (redis.tls: { ca }), a client certificate gets through a server with tls-auth-clients yes,
// a CA that did not sign the server's certificate leaves the gateway serving on its fallback and
// saying why, and a CA file that is missing or not a certificate is a located config error. Redis
// Cluster over TLS (tls-cluster yes) too; Sentinel over TLS is in test/redis-sentinel-tls.test.ts.
import t from 'tap'
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs'
import { connect, createServer, type Socket } from 'node:net'
import { join } from 'node:path'
import { setTimeout as delay } from 'node:timers/promises'
import { probeTlsFailure } from '../src/limit/redis-client.js'
import { startGateway } from './helpers/gateway.js'
import { makeRedisTlsCerts, startTlsRedis, startTlsRedisCluster } from './helpers/redis.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'
import { tempDir, type Teardown } from './helpers/teardown.js'
import { limitedConfig, readyz, statuses } from './helpers/redis-tls-gateway.js'
import { gateway } from './helpers/cli.js'
import { eventually } from './helpers/ratelimit.js'
import { answering, config as workersConfig, replaceOne, twoWorkers, until } from './helpers/workers.js'

const dir = tempDir(t, 'redis-tls')
const certs = makeRedisTlsCerts(dir, 'ca')
// a second CA, which signed nothing the servers show
const other = makeRedisTlsCerts(dir, 'other')

t.test('rediss:// with a private CA: a limit of 3 is decided by the TLS Redis', async t => {
  const redis = await startTlsRedis(t, certs)
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'tls-ca', `{ url: ${redis.tlsUrl}, tls: { ca: ${certs.ca} }, timeout: 2s, onError: deny }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429], '3 x 200, then 429')
  t.equal(up.requests, 3)
  const ready = await readyz(gw.adminUrl)
  t.equal(ready.redis.state, 'up', '/readyz: Redis is up')
  const keys = await redis.tlsClient().keys('gw:*tls-ca*')
  t.ok(keys.length > 0, `the limit's key is in the TLS Redis (${keys.join(', ')})`)
  t.same(gw.lines.filter(l => /TLS|not reachable/.test(String(l.msg))), [], 'nothing logged about TLS or reachability')
})

t.test('tls: { ca } on a redis:// URL turns TLS on; servername names the certificate', async t => {
  const redis = await startTlsRedis(t, certs)
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'tls-name', `{ url: "redis://127.0.0.1:${redis.tlsPort}", tls: { ca: ${certs.ca}, servername: localhost }, timeout: 2s, onError: deny }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429])
  t.ok((await redis.tlsClient().keys('gw:*tls-name*')).length > 0, 'the key is in the TLS Redis')
})

t.test('a client certificate for a server with tls-auth-clients yes', async t => {
  const redis = await startTlsRedis(t, certs, true)
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'tls-client', `{ url: ${redis.tlsUrl}, tls: { ca: ${certs.ca}, cert: ${certs.clientCert}, key: ${certs.clientKey} }, timeout: 2s, onError: deny }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429])
  t.ok((await redis.tlsClient().keys('gw:*tls-client*')).length > 0, 'the key is in the TLS Redis')
})

t.test('a CA that did not sign the server certificate: served by the fallback, the reason logged, /readyz not up', async t => {
  const redis = await startTlsRedis(t, certs)
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'tls-wrong', `{ url: ${redis.tlsUrl}, tls: { ca: ${other.ca} }, timeout: 200ms, onError: allow }`))
  t.same(await statuses(`${gw.url}/x`, 5), [200, 200, 200, 200, 200], 'onError: allow admits every request, no 5xx')
  const ready = await readyz(gw.adminUrl)
  t.equal(ready.status, 'degraded')
  t.equal(ready.redis.state, 'fallback', '/readyz: Redis is not up')
  t.equal(ready.redis.connected, false)
  const tls = gw.lines.filter(l => String(l.msg).startsWith('Redis TLS handshake failed'))
  t.equal(tls.length, 1, 'the refused certificate is warned of once, not at every reconnect')
  t.match(tls[0], { level: 40, code: /CERT|VERIFY/ }, 'with the reason Node gave')
  const notReady = gw.lines.find(l => String(l.msg).startsWith('Redis is not reachable yet'))
  t.match(notReady, { cause: /certificate/i }, 'the start-up warning says why Redis is not reachable')
  t.same(await redis.tlsClient().keys('gw:*tls-wrong*'), [], 'nothing was counted in that Redis')
})

t.test('rediss:// or tls: true without a ca: checked against the default CAs, which did not sign a private CA\'s certificate; no key skips the check', async t => {
  const redis = await startTlsRedis(t, certs)
  const up = await startUpstream(t)
  for (const [route, redisConfig] of [['tls-default-url', `{ url: ${redis.tlsUrl}, timeout: 200ms, onError: allow }`], ['tls-default-true', `{ url: "redis://127.0.0.1:${redis.tlsPort}", tls: true, timeout: 200ms, onError: allow }`]] as const) {
    const gw = await startGateway(t, limitedConfig(up.url, route, redisConfig))
    t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 200], `${route}: the fallback serves (onError: allow)`)
    t.equal((await readyz(gw.adminUrl)).redis.state, 'fallback', `${route}: Redis is not up`)
    t.match(gw.lines.find(l => String(l.msg).startsWith('Redis TLS handshake failed')), { code: /CERT|VERIFY|SIGNED|ISSUER/ }, `${route}: the certificate was refused`)
    t.same(await redis.tlsClient().keys(`gw:*${route}*`), [], `${route}: nothing counted in that Redis`)
    await gw.close()
  }
  const dir = tempDir(t, 'gw-redis-tls-skip')
  const file = join(dir, 'gateway.yaml')
  writeFileSync(file, limitedConfig(up.url, 'skip', `{ url: ${redis.tlsUrl}, tls: { ca: ${certs.ca}, rejectUnauthorized: false } }`))
  const run = await gateway(['validate', '-c', file])
  t.equal(run.code, 1, 'a key that would skip the check is refused')
  t.match(run.stderr, /redis\.tls\.rejectUnauthorized: unknown key/)
})

t.test('a server asking for a client certificate the gateway does not show: logged, served by the fallback', async t => {
  const redis = await startTlsRedis(t, certs, true)
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'tls-nocert', `{ url: ${redis.tlsUrl}, tls: { ca: ${certs.ca} }, timeout: 200ms, onError: allow }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 200])
  t.equal((await readyz(gw.adminUrl)).redis.state, 'fallback')
  t.ok(gw.lines.some(l => String(l.msg).startsWith('Redis TLS handshake failed') && l.level === 40 && l.code === 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED'), 'warned of, with the alert the server sent')
})

t.test('the handshake check waits for a TLS 1.3 server\'s verdict on the client certificate: refused, accepted, or none asked', async t => {
  const asking = await startTlsRedis(t, certs, true)
  const plain = await startTlsRedis(t, certs)
  // under TLS 1.3 the client's handshake is over before the server has read its certificate: the
  // refusal is an alert after it
  t.match(await probeTlsFailure({ url: asking.tlsUrl, tls: { ca: readFileSync(certs.ca) } }), { code: 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED' }, 'no certificate shown: the server\'s alert')
  t.equal(await probeTlsFailure({ url: asking.tlsUrl, tls: { ca: readFileSync(certs.ca), cert: readFileSync(certs.clientCert), key: readFileSync(certs.clientKey) } }), null, 'its certificate shown: accepted')
  t.equal(await probeTlsFailure({ url: plain.tlsUrl, tls: { ca: readFileSync(certs.ca) } }), null, 'a server asking for none: accepted')
  t.equal(await probeTlsFailure({ url: plain.url }), null, 'no TLS: nothing asked')
})

/**
 * A relay in front of `port` that loses a TLS server's last words the way a loaded machine does:
 * when the server refuses a client certificate after a TLS 1.3 handshake and closes while the
 * client's first commands are still unread, its kernel answers them with a reset, and the client
 * reads "ECONNRESET" where the alert was. Here: the server's bytes that follow the client's first
 * application data (the third encrypted record of a client showing no certificate: its empty
 * Certificate and its Finished come first) are held 200 ms; if the server ends the connection
 * meanwhile, they are dropped and the client's connection is reset. A client that writes nothing
 * after its handshake gets every byte.
 */
async function alertLosingRelay (t: Teardown, port: number): Promise<{ port: number, lost: () => number }> {
  let lost = 0
  const server = createServer((client) => {
    const upstream = connect(port, '127.0.0.1')
    let pending = Buffer.alloc(0)
    let encrypted = 0
    let held: Buffer[] | null = null
    let holding = false
    client.on('data', (chunk: Buffer) => {
      upstream.write(chunk)
      pending = Buffer.concat([pending, chunk])
      while (pending.length >= 5 && pending.length >= 5 + pending.readUInt16BE(3)) {
        if (pending[0] === 23 && ++encrypted === 3 && held === null) {
          held = []
          holding = true
          setTimeout(() => { holding = false; for (const b of held ?? []) client.write(b) }, 200)
        }
        pending = pending.subarray(5 + pending.readUInt16BE(3))
      }
    })
    upstream.on('data', (chunk: Buffer) => { if (holding) held?.push(chunk); else client.write(chunk) })
    const ended = (): void => {
      if (!holding) { client.end(); return }
      lost++
      client.resetAndDestroy()
    }
    upstream.on('end', ended).on('error', ended)
    client.on('error', () => upstream.destroy()).on('close', () => upstream.destroy())
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { server.close() })
  return { port: (server.address() as { port: number }).port, lost: () => lost }
}

t.test('a server that starts asking for a client certificate, its alert lost to a reset: the reason is still named', async t => {
  const redis = await startTlsRedis(t, certs)
  const relay = await alertLosingRelay(t, redis.tlsPort)
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'tls-lost-alert', `{ url: "rediss://127.0.0.1:${relay.port}", tls: { ca: ${certs.ca}, servername: localhost }, timeout: 2s, onError: allow }`))
  t.same(await statuses(`${gw.url}/x`, 2), [200, 200])
  t.ok((await redis.tlsClient().keys('gw:*tls-lost-alert*')).length > 0, 'decided by the TLS Redis through the relay')
  // the operator turns client certificates on; the gateway's connections are dropped and come back
  await redis.client().config('SET', 'tls-auth-clients', 'yes')
  await redis.client().call('CLIENT', 'KILL', 'TYPE', 'normal')
  await redis.client().call('CLIENT', 'KILL', 'TYPE', 'pubsub')
  await eventually('the refusal warned of', async () => gw.lines.some(l => String(l.msg).startsWith('Redis TLS handshake failed')))
  const warned = gw.lines.filter(l => String(l.msg).startsWith('Redis TLS handshake failed'))
  t.match(warned, [{ level: 40, code: 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED' }], 'once, with the alert the client itself never read')
  t.ok(relay.lost() > 0, `the client's connections were reset, the alert lost (${relay.lost()} times)`)
  t.same(await statuses(`${gw.url}/y`, 1), [200], 'served by the fallback meanwhile (onError: allow), no 5xx')
})

t.test('a reload re-reads the CA file: a CA fixed on disk moves the limits onto the TLS Redis', async t => {
  const redis = await startTlsRedis(t, certs)
  const up = await startUpstream(t)
  const caFile = join(tempDir(t, 'redis-tls-rotate'), 'redis-ca.pem')
  copyFileSync(other.ca, caFile)
  const gw = await startGateway(t, limitedConfig(up.url, 'tls-rotate', `{ url: ${redis.tlsUrl}, tls: { ca: ${caFile} }, timeout: 2s, onError: deny }`))
  t.equal((await readyz(gw.adminUrl)).redis.state, 'fallback', 'the wrong CA: Redis is not up')
  copyFileSync(certs.ca, caFile)
  const result = await gw.reload()
  t.equal(result.ok, true, 'the same file, reloaded')
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429], 'decided by the TLS Redis now')
  t.equal((await readyz(gw.adminUrl)).redis.state, 'up')
  t.ok((await redis.tlsClient().keys('gw:*tls-rotate*')).length > 0, 'the key is in the TLS Redis')
})

t.test('Redis Cluster over TLS (tls-cluster yes) with a private CA: the limit is decided on its nodes', async t => {
  const cluster = await startTlsRedisCluster(t, certs)
  const up = await startUpstream(t)
  const seeds = cluster.tlsPorts.map(p => `"redis://127.0.0.1:${p}"`).join(', ')
  const gw = await startGateway(t, limitedConfig(up.url, 'tls-cluster', `{ cluster: [${seeds}], tls: { ca: ${certs.ca} }, timeout: 2s, onError: deny }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429], '3 x 200, then 429')
  t.equal((await readyz(gw.adminUrl)).redis.state, 'up')
  const keys = (await Promise.all(cluster.tlsPorts.map(async p => await cluster.tlsClient(p).keys('gw:*tls-cluster*')))).flat()
  t.ok(keys.length > 0, `the limit's key is on a node, read over TLS (${keys.join(', ')})`)
})

t.test('Redis Cluster over TLS with a CA that did not sign its certificates: the fallback serves, the reason is logged', async t => {
  const cluster = await startTlsRedisCluster(t, certs)
  const up = await startUpstream(t)
  // a seed that refuses connections listed first: the reason is the others' (it was looked for at the first seed alone)
  const down = new URL(await refusingUrl())
  const seeds = [`"redis://${down.hostname}:${down.port}"`, ...cluster.tlsPorts.map(p => `"redis://127.0.0.1:${p}"`)].join(', ')
  const gw = await startGateway(t, limitedConfig(up.url, 'tls-cluster-wrong', `{ cluster: [${seeds}], tls: { ca: ${other.ca} }, timeout: 200ms, onError: allow }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 200], 'onError: allow admits, no 5xx')
  t.not((await readyz(gw.adminUrl)).redis.state, 'up', '/readyz: Redis is not up')
  // ioredis drops the error of the connection it asks for the slot map on: the gateway's own
  // handshake with a seed names the reason
  const tls = gw.lines.find(l => String(l.msg).startsWith('Redis TLS handshake failed'))
  t.match(tls, { level: 40, code: /CERT|VERIFY/ }, 'the refused certificate is logged, with Node\'s code')
})

t.test('the seeds are asked at once, each for at most 2 s: three silent seeds listed first delay the reason by one bound, not three', async t => {
  const redis = await startTlsRedis(t, certs)
  // accept and never answer the handshake (a node hung, or a port a firewall swallows)
  const held: Socket[] = []
  const closed: Array<Promise<void>> = []
  const silentPorts = await Promise.all([0, 1, 2].map(async () => await new Promise<number>((resolve) => {
    const server = createServer((socket) => {
      held.push(socket)
      closed.push(new Promise(resolve => socket.once('close', () => { resolve() })))
      socket.on('error', () => {}).resume()
    }).listen(0, '127.0.0.1', () => { resolve((server.address() as { port: number }).port) })
    t.teardown(() => { for (const s of held) s.destroy(); server.close() })
  })))
  const seeds = [...silentPorts.map(p => `redis://127.0.0.1:${p}`), `redis://127.0.0.1:${redis.tlsPort}`]
  const started = Date.now()
  const err = await probeTlsFailure({ cluster: seeds, tls: { ca: readFileSync(other.ca) } })
  const took = Date.now() - started
  t.match(err, { code: /CERT|VERIFY/ }, 'the last seed\'s refused certificate is the reason')
  t.equal(held.length, 3, 'each silent seed was asked')
  // one after the other the answer would take 3 x 2 s; at once, one bound
  t.ok(took >= 1900 && took < 4500, `answered after one bound of 2 s (${took} ms)`)
  const allClosed = await Promise.race([Promise.all(closed).then(() => true), delay(2000, false)])
  t.ok(allClosed, 'the gateway closed every silent seed\'s connection')
})

t.test('workers: 2 (bin/gateway): both workers decide on the TLS Redis with the CA the primary read', async t => {
  const redis = await startTlsRedis(t, certs)
  const upstream = await answering(t, 'ok')
  // a copy of its own: it is broken on disk below
  const ca = join(tempDir(t, 'redis-tls-workers'), 'ca.pem')
  copyFileSync(certs.ca, ca)
  const running = await twoWorkers(t, `${workersConfig(upstream).replace('routes:', `redis: { url: ${redis.tlsUrl}, tls: { ca: ${ca} }, timeout: 2s, onError: deny }\nroutes:`)}`.replace('upstream: b }', 'upstream: b, limits: { api: { algorithm: fixed-window, limit: 3, window: 1h } } }'))
  const { gw, adminUrl } = running
  const got: number[] = []
  // a new connection each, so both workers take some
  for (let i = 0; i < 6; i++) got.push((await fetch(`${gw.url}/x`, { headers: { connection: 'close' } })).status)
  t.same(got.filter(s => s === 200).length, 3, `3 x 200 across the workers (${got.join(' ')})`)
  t.same(got.filter(s => s === 429).length, 3)
  t.match(await (await fetch(`${adminUrl}/readyz`)).json(), { status: 'ready' })
  t.ok((await redis.tlsClient().keys('gw:*all*')).length > 0, 'the key is in the TLS Redis')
  // A worker started after the CA broke on disk connects with the primary's copy: reading the disk
  // it would fail its handshake, and onError: deny would answer 503 where Redis answers 429.
  copyFileSync(other.ca, ca)
  const replacement = await replaceOne(running)
  const after: number[] = []
  for (let i = 0; i < 6; i++) after.push((await fetch(`${gw.url}/x`, { headers: { connection: 'close' } })).status)
  t.same(new Set(after), new Set([429]), `every request refused by the TLS Redis, none 503 (${after.join(' ')})`)
  await until('the replacement\'s access lines', () => gw.logs.some(l => l.pid === replacement && l.status === 429))
  t.pass('the replacement answered some of them')
  t.notOk(gw.logs.some(l => l.pid === replacement && String(l.msg).startsWith('Redis TLS handshake failed')), 'the replacement logged no failed handshake')
})

t.test('gateway validate: redis.tls files that are missing or not PEM are located errors', async t => {
  const up = 'http://127.0.0.1:9'
  const cases: Array<{ what: string, redis: (d: string) => string, want: RegExp }> = [
    { what: 'a missing ca', redis: d => `{ url: "rediss://127.0.0.1:6380", tls: { ca: ${join(d, 'nope.pem')} } }`, want: /gateway\.yaml:4:\d+ redis\.tls\.ca: file not found: .*nope\.pem/ },
    { what: 'a ca that is not a certificate', redis: d => `{ url: "rediss://127.0.0.1:6380", tls: { ca: ${join(d, 'garbage.pem')} } }`, want: /gateway\.yaml:4:\d+ redis\.tls\.ca: .*garbage\.pem holds no PEM certificate/ },
    { what: 'a missing client key', redis: d => `{ url: "rediss://127.0.0.1:6380", tls: { ca: ${certs.ca}, cert: ${certs.clientCert}, key: ${join(d, 'nokey.pem')} } }`, want: /gateway\.yaml:4:\d+ redis\.tls\.key: file not found/ },
    // a key pasted where its path goes (key: "${REDIS_KEY}"): never quoted
    { what: 'a key given as its PEM text', redis: () => `{ url: "rediss://127.0.0.1:6380", tls: { ca: ${certs.ca}, cert: ${certs.clientCert}, key: "-----BEGIN PRIVATE KEY-----\\nMIIsecretKeyMaterial\\n-----END PRIVATE KEY-----" } }`, want: /gateway\.yaml:4:\d+ redis\.tls\.key: expected the path of a PEM file, not its text \(which is not quoted here\)/ },
    { what: 'a cert without its key', redis: () => `{ url: "rediss://127.0.0.1:6380", tls: { ca: ${certs.ca}, cert: ${certs.clientCert} } }`, want: /gateway\.yaml:4:\d+ redis\.tls\.cert: cert and key go together/ },
    { what: 'a client key of another certificate', redis: () => `{ url: "rediss://127.0.0.1:6380", tls: { cert: ${certs.clientCert}, key: ${other.clientKey} } }`, want: /gateway\.yaml:4:\d+ redis\.tls: cert and key cannot be used together/ }
  ]
  for (const c of cases) {
    const d = tempDir(t, 'redis-tls-validate')
    writeFileSync(join(d, 'garbage.pem'), 'not a certificate\n')
    const file = join(d, 'gateway.yaml')
    writeFileSync(file, limitedConfig(up, 'v', c.redis(d)))
    const run = await gateway(['validate', '-c', file])
    t.equal(run.code, 1, `${c.what}: exit 1`)
    t.match(run.stderr + run.stdout, c.want, c.what)
    t.notMatch(run.stderr + run.stdout, /MIIsecret/, `${c.what}: no key material in the message`)
  }
  const d = tempDir(t, 'redis-tls-validate')
  const file = join(d, 'gateway.yaml')
  writeFileSync(file, limitedConfig(up, 'v', `{ url: "rediss://127.0.0.1:6380", tls: { ca: ${certs.ca}, cert: ${certs.clientCert}, key: ${certs.clientKey} } }`))
  const run = await gateway(['validate', '-c', file])
  t.equal(run.code, 0, `the same files, all present: valid (${run.stderr})`)
})
