// Redis Sentinel with TLS, against real processes: a redis-server master serving TLS with a
// private CA and a redis-sentinel watching it over TLS (tls-replication yes), asked by the gateway
// over plain TCP: the limits are decided on the master, read back over TLS, and a CA that did not
// sign the master's certificate leaves the gateway serving on its fallback and saying why.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { makeRedisTlsCerts, startTlsRedis, startTlsSentinel } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { tempDir } from './helpers/teardown.js'

const dir = tempDir(t, 'redis-sentinel-tls')
const certs = makeRedisTlsCerts(dir, 'ca')
// a second CA, which signed nothing the servers show
const other = makeRedisTlsCerts(dir, 'other')

function config (upstream: string, route: string, redis: string): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
redis: ${redis}
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: ${route}
    pathPrefix: /
    upstream: backend
    limits:
      api: { algorithm: fixed-window, limit: 3, window: 1h }
`
}

async function statuses (url: string, n: number): Promise<number[]> {
  const out: number[] = []
  for (let i = 0; i < n; i++) out.push((await fetch(url)).status)
  return out
}

async function readyz (adminUrl: string): Promise<{ status: string, redis: { state: string, connected: boolean } }> {
  return await (await fetch(`${adminUrl}/readyz`)).json() as { status: string, redis: { state: string, connected: boolean } }
}

const tlsWarnings = (lines: ReadonlyArray<Record<string, unknown>>): Array<Record<string, unknown>> =>
  lines.filter(l => String(l.msg).startsWith('Redis TLS handshake failed'))

t.test('sentinels over plain TCP, the master over TLS with a private CA: a limit of 3 is decided on the master', async t => {
  const master = await startTlsRedis(t, certs)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'plainsent')
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'sent-plain', `{ sentinels: ["127.0.0.1:${sentinel.port}"], name: plainsent, tls: { ca: ${certs.ca} }, timeout: 2s, onError: deny }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 429], '3 x 200, then 429')
  t.equal(up.requests, 3)
  t.equal((await readyz(gw.adminUrl)).redis.state, 'up', '/readyz: Redis is up')
  const keys = await master.tlsClient().keys('gw:*sent-plain*')
  t.ok(keys.length > 0, `the limit's key is on the master, read over TLS (${keys.join(', ')})`)
  t.same(gw.lines.filter(l => /TLS|not reachable/.test(String(l.msg))), [], 'nothing logged about TLS or reachability')
})

t.test('sentinels over plain TCP with a CA that did not sign the master\'s certificate: served by the fallback, the reason warned of once', async t => {
  const master = await startTlsRedis(t, certs)
  const sentinel = await startTlsSentinel(t, certs, master.tlsPort, 'wrongmaster')
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'sent-wrong-master', `{ sentinels: ["127.0.0.1:${sentinel.port}"], name: wrongmaster, tls: { ca: ${other.ca} }, timeout: 200ms, onError: allow }`))
  t.same(await statuses(`${gw.url}/x`, 4), [200, 200, 200, 200], 'onError: allow admits every request, no 5xx')
  t.equal((await readyz(gw.adminUrl)).redis.state, 'fallback')
  const tls = tlsWarnings(gw.lines)
  t.equal(tls.length, 1, 'warned of once')
  t.match(tls[0], { level: 40, code: /CERT|VERIFY/ }, 'with the reason Node gave')
  t.same(await master.tlsClient().keys('gw:*sent-wrong-master*'), [], 'nothing was counted on the master')
})
