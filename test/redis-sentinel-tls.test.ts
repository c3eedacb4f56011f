// Redis Sentinel with TLS, against real processes: a redis-server master serving TLS with a
// private CA and a redis-sentinel watching it over TLS (tls-replication yes). The sentinels are
// asked over plain TCP (the shape supported first) or, with redis.sentinelTls, over TLS to a
// sentinel that serves TLS alone (port 0, tls-port); the limits are decided on the master, read
// back over TLS. A CA that did not sign the sentinel's certificate leaves the gateway serving on
// its fallback and saying why; a reload that turns sentinelTls on reconnects; a failover to a TLS
// replica keeps the limit decided on Redis.
import t, { type Test } from 'tap'
import { writeFileSync } from 'node:fs'
import { startGateway } from './helpers/gateway.js'
import { makeRedisTlsCerts, startTlsRedis, startTlsRedisReplica, startTlsSentinel } from './helpers/redis.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'
import { tempDir } from './helpers/teardown.js'
import { limitedConfig, readyz, statuses } from './helpers/redis-tls-gateway.js'
import { telling } from '../src/runtime-resources.js'

const dir = tempDir(t, 'redis-sentinel-tls')
const certs = makeRedisTlsCerts(dir, 'ca')
// a second CA, which signed nothing the servers show
const other = makeRedisTlsCerts(dir, 'other')

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

async function until (what: string, probe: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await probe().catch(() => false)) return
    await sleep(50)
  }
  throw new Error(`${what}: timed out after ${timeoutMs} ms`)
}

const tlsWarnings = (lines: ReadonlyArray<Record<string, unknown>>): Array<Record<string, unknown>> =>
  lines.filter(l => String(l.msg).startsWith('Redis TLS handshake failed'))

/** The limit of 3 decided on the master: 3 x 200 then 429, Redis up, the key on the master, no TLS line. */
async function decidedOnMaster (t: Test, gw: { url: string, adminUrl: string, lines: ReadonlyArray<Record<string, unknown>> }, up: { requests: number }, master: { tlsClient: () => { keys: (pattern: string) => Promise<string[]> } }, route: string): Promise<void> {
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429], '3 x 200, then 429')
  t.equal(up.requests, 3)
  t.equal((await readyz(gw.adminUrl)).redis.state, 'up', '/readyz: Redis is up')
  const keys = await master.tlsClient().keys(`gw:*${route}*`)
  t.ok(keys.length > 0, `the limit's key is on the master, read over TLS (${keys.join(', ')})`)
  t.same(gw.lines.filter(l => /TLS|not reachable/.test(String(l.msg))), [], 'nothing logged about TLS or reachability')
}

t.test('sentinels over plain TCP, the master over TLS with a private CA: a limit of 3 is decided on the master', async t => {
  const master = await startTlsRedis(t, certs)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'plainsent')
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'sent-plain', `{ sentinels: ["127.0.0.1:${sentinel.port}"], name: plainsent, tls: { ca: ${certs.ca} }, timeout: 2s, onError: deny }`))
  await decidedOnMaster(t, gw, up, master, 'sent-plain')
})

t.test('sentinelTls: true against a sentinel serving TLS alone: the sentinel is asked over TLS, the limit decided on the master', async t => {
  const master = await startTlsRedis(t, certs)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'tlssent', { tlsOnly: true })
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'sent-tls', `{ sentinels: ["127.0.0.1:${sentinel.port}"], name: tlssent, tls: { ca: ${certs.ca}, servername: localhost }, sentinelTls: true, timeout: 2s, onError: deny }`))
  await decidedOnMaster(t, gw, up, master, 'sent-tls')
})

t.test('sentinelTls: the client certificate of redis.tls is shown to a sentinel with tls-auth-clients yes', async t => {
  const master = await startTlsRedis(t, certs, true)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'authsent', { tlsOnly: true, authClients: true })
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'sent-auth', `{ sentinels: ["127.0.0.1:${sentinel.port}"], name: authsent, tls: { ca: ${certs.ca}, cert: ${certs.clientCert}, key: ${certs.clientKey} }, sentinelTls: true, timeout: 2s, onError: deny }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429], '3 x 200, then 429')
  t.ok((await master.tlsClient().keys('gw:*sent-auth*')).length > 0, 'the key is on the master')
})

t.test('sentinelTls with a CA that did not sign the sentinel\'s certificate: served by the fallback, the reason warned of once', async t => {
  const master = await startTlsRedis(t, certs)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'wrongsent', { tlsOnly: true })
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'sent-wrong', `{ sentinels: ["127.0.0.1:${sentinel.port}"], name: wrongsent, tls: { ca: ${other.ca} }, sentinelTls: true, timeout: 200ms, onError: allow }`))
  t.same(await statuses(`${gw.url}/x`, 5), [200, 200, 200, 200, 200], 'onError: allow admits every request, no 5xx')
  const ready = await readyz(gw.adminUrl)
  t.equal(ready.status, 'degraded')
  t.equal(ready.redis.state, 'fallback', '/readyz: Redis is not up')
  t.equal(ready.redis.connected, false)
  // ioredis drops the errors of its sentinel connections ("All sentinels are unreachable" carries
  // no code): the gateway's own handshake with the first sentinel names the reason
  const tls = tlsWarnings(gw.lines)
  t.equal(tls.length, 1, 'the refused certificate is warned of once, not at every retry')
  t.match(tls[0], { level: 40, code: /CERT|VERIFY/ }, 'with the reason Node gave')
  const notReady = gw.lines.find(l => String(l.msg).startsWith('Redis is not reachable yet'))
  t.match(notReady, { cause: /certificate/i }, 'the start-up warning says why Redis is not reachable')
  t.same(await master.tlsClient().keys('gw:*sent-wrong*'), [], 'nothing was counted on the master')
})

t.test('sentinelTls: the refused certificate is named though the first sentinel listed is down', async t => {
  const master = await startTlsRedis(t, certs)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'downfirst', { tlsOnly: true })
  const up = await startUpstream(t)
  const down = new URL(await refusingUrl())
  const gw = await startGateway(t, limitedConfig(up.url, 'sent-down-first', `{ sentinels: ["${down.hostname}:${down.port}", "127.0.0.1:${sentinel.port}"], name: downfirst, tls: { ca: ${other.ca} }, sentinelTls: true, timeout: 200ms, onError: allow }`))
  t.same(await statuses(`${gw.url}/x`, 2), [200, 200], 'onError: allow admits')
  // it asked the first sentinel alone: ECONNREFUSED, no TLS reason, while the second refused the certificate
  const tls = tlsWarnings(gw.lines)
  t.equal(tls.length, 1, 'the refused certificate is warned of')
  t.match(tls[0], { code: /CERT|VERIFY/ }, 'with the reason the second sentinel gave')
  t.match(gw.lines.find(l => String(l.msg).startsWith('Redis is not reachable yet')), { cause: /certificate/i })
})

t.test('sentinelTls: the master down behind a healthy sentinel is the reason logged, not another sentinel being down', async t => {
  const master = await startTlsRedis(t, certs)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'mdown', { tlsOnly: true })
  await master.kill()
  const up = await startUpstream(t)
  const down = new URL(await refusingUrl())
  const gw = await startGateway(t, limitedConfig(up.url, 'mdown', `{ sentinels: ["127.0.0.1:${sentinel.port}", "${down.hostname}:${down.port}"], name: mdown, tls: { ca: ${certs.ca}, servername: localhost }, sentinelTls: true, timeout: 1s, onError: allow }`))
  const line = gw.lines.find(l => String(l.msg).startsWith('Redis is not reachable yet'))
  // it named the second sentinel's refused connection, though the first answered and named the master
  t.notMatch(String(line?.cause), new RegExp(`:${down.port}\\b`), 'not the sentinel that is down')
  t.match(String(line?.cause), new RegExp(`:${master.tlsPort}\\b`), 'the master the sentinel named')
  t.same(tlsWarnings(gw.lines), [], 'no TLS failure claimed')
})

t.test('the reason logged is the last error, not a summary of ioredis\'s after it', async t => {
  const refused = 'connect ECONNREFUSED 127.0.0.1:29883'
  // what replaced the master's refusal when the healthy sentinel was slowed past the timeout
  t.equal(telling(refused, 'All sentinels are unreachable. Retrying from scratch after 64ms. Last error: Connection is closed.'), refused)
  t.equal(telling(refused, 'Connection is closed.'), refused)
  // any other later error is the news: Redis back with another password, a new master unresolved
  for (const later of ['WRONGPASS invalid username-password pair or user is disabled.', 'NOAUTH Authentication required.', 'getaddrinfo ENOTFOUND redis-2.internal', 'connect ETIMEDOUT', 'Stream isn\'t writeable and enableOfflineQueue options is false']) {
    t.equal(telling(refused, later), later, later)
  }
  t.equal(telling('Connection is closed.', refused), refused)
  t.equal(telling(null, 'Connection is closed.'), 'Connection is closed.')
})

t.test('sentinels over plain TCP with a CA that did not sign the master\'s certificate: served by the fallback, the reason warned of once', async t => {
  const master = await startTlsRedis(t, certs)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'wrongmaster')
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'sent-wrong-master', `{ sentinels: ["127.0.0.1:${sentinel.port}"], name: wrongmaster, tls: { ca: ${other.ca} }, timeout: 200ms, onError: allow }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 200], 'onError: allow admits every request, no 5xx')
  t.equal((await readyz(gw.adminUrl)).redis.state, 'fallback')
  const tls = tlsWarnings(gw.lines)
  t.equal(tls.length, 1, 'warned of once')
  t.match(tls[0], { level: 40, code: /CERT|VERIFY/ }, 'with the reason Node gave')
  t.same(await master.tlsClient().keys('gw:*sent-wrong-master*'), [], 'nothing was counted on the master')
})

t.test('a reload that turns sentinelTls on reconnects: the limits move from the fallback onto the master', async t => {
  const master = await startTlsRedis(t, certs)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'reloadsent', { tlsOnly: true })
  const up = await startUpstream(t)
  const redis = (sentinelTls: boolean): string => `{ sentinels: ["127.0.0.1:${sentinel.port}"], name: reloadsent, tls: { ca: ${certs.ca} }, sentinelTls: ${sentinelTls}, timeout: 2s, onError: allow }`
  const gw = await startGateway(t, limitedConfig(up.url, 'sent-reload', redis(false)))
  t.equal((await readyz(gw.adminUrl)).redis.state, 'fallback', 'plain TCP to a sentinel serving TLS alone: Redis is not up')
  writeFileSync(gw.configFile, limitedConfig(up.url, 'sent-reload', redis(true)))
  const result = await gw.reload()
  t.equal(result.ok, true, `reloaded (${result.ok ? '' : result.error})`)
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429], 'decided on the master now: 3 x 200, then 429')
  t.equal((await readyz(gw.adminUrl)).redis.state, 'up')
  t.ok((await master.tlsClient().keys('gw:*sent-reload*')).length > 0, 'the key is on the master')
})

t.test('a failover over TLS: the TLS replica the TLS-only sentinel promotes decides the limit, the count carried over', async t => {
  const master = await startTlsRedis(t, certs)
  const replica = await startTlsRedisReplica(t, certs, master.tlsPort)
  await until('replica in sync over TLS', async () => /master_link_status:up/.test(await replica.tlsClient().info('replication')), 15_000)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'failsent', { tlsOnly: true, downAfterMs: 1000 })
  // Sentinel learns of replicas from the master's INFO: it must know this one before the master dies
  await until('sentinel knows the replica', async () => (await sentinel.command('SENTINEL replicas failsent')).includes(String(replica.tlsPort)), 15_000)
  const up = await startUpstream(t)
  const gw = await startGateway(t, limitedConfig(up.url, 'sent-failover', `{ sentinels: ["127.0.0.1:${sentinel.port}"], name: failsent, tls: { ca: ${certs.ca} }, sentinelTls: true, timeout: 2s, onError: deny }`))
  t.same(await statuses(`${gw.url}/x`, 1), [200], 'one of 3 spent on the first master')
  t.equal(await master.tlsClient().wait(1, 5000), 1, 'the count reached the replica')
  await master.kill()
  await until('the sentinel promotes the replica', async () => (await sentinel.masterAddr()).endsWith(`:${replica.tlsPort}`), 20_000)
  await until('the gateway is back on Redis', async () => {
    const ready = await readyz(gw.adminUrl)
    return ready.redis.state === 'up' && ready.redis.connected
  }, 15_000)
  t.same(await statuses(`${gw.url}/x`, 3), [200, 200, 429], 'the 2 left, then 429: decided on the new master')
  const keys = await replica.tlsClient().keys('gw:*sent-failover*')
  t.ok(keys.length > 0, `the limit's key is on the promoted replica, read over TLS (${keys.join(', ')})`)
  t.same(tlsWarnings(gw.lines), [], 'no TLS handshake refused on the way')
})
