// Who a limit counts against, seen through HTTP: the client IP (X-Forwarded-For believed only
// from trusted proxies, IPv6 grouped per /64) and the user (header, API key, JWT HS256/RS256).
import t from 'tap'
import { SignJWT, exportSPKI, generateKeyPair } from 'jose'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { send, statusCounts, type Reply } from './helpers/ratelimit.js'

const redis = await startRedis(t)
const admin = redis.client()

function config (upstream: string, top: string, routeLimits: string, listen = '127.0.0.1:0'): string {
  return `listen: "${listen}"
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s, onError: deny }
${top}
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: r
    pathPrefix: /
    upstream: backend
${routeLimits === '' ? '' : `    limits:\n${routeLimits}`}
`
}

async function statuses (n: number, url: string, headers: Record<string, string> = {}, localAddress?: string): Promise<number[]> {
  const out: number[] = []
  for (let i = 0; i < n; i++) out.push((await send(url, { headers, ...(localAddress !== undefined ? { localAddress } : {}) })).status)
  return out
}

const IP_LIMIT = 'limits:\n  ip: { algorithm: sliding-window-log, limit: 3, window: 1h }'

t.test('X-Forwarded-For from an untrusted peer is ignored: spoofing it does not evade the IP limit', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, IP_LIMIT, ''))
  const replies: Reply[] = []
  for (let i = 0; i < 6; i++) replies.push(await send(`${gw.url}/x`, { headers: { 'x-forwarded-for': `203.0.113.${i}` } }))
  t.same(replies.map(r => r.status), [200, 200, 200, 429, 429, 429], 'six different XFF values, one budget')
  t.equal(replies[3]?.json?.limit, 'ip')
  t.same(await admin.keys('gw:\\*.ip.*'), [(await admin.keys('gw:\\*.ip.*:127.0.0.1'))[0]], 'the only IP key is the socket address')
  t.ok(gw.lines.some(l => typeof l.msg === 'string' && l.msg.includes('trustedProxies is empty')), 'the likely misconfiguration is logged')
  t.equal(gw.lines.filter(l => typeof l.msg === 'string' && l.msg.includes('trustedProxies is empty')).length, 1, 'once')
  const access = gw.lines.filter(l => l.msg === 'request')
  t.ok(access.every(l => l.ip === '127.0.0.1'), 'the access log names the socket address')
})

t.test('behind a trusted proxy each X-Forwarded-For client has its own budget and a spoofed left-most entry is ignored', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `trustedProxies: [127.0.0.1, 10.0.0.0/8]\n${IP_LIMIT}`, ''))
  const url = `${gw.url}/x`
  const xff = (v: string): Record<string, string> => ({ 'x-forwarded-for': v })
  t.same(await statuses(4, url, xff('198.51.100.1')), [200, 200, 200, 429], 'client 198.51.100.1: 3 then 429')
  t.same(await statuses(4, url, xff('198.51.100.2')), [200, 200, 200, 429], 'client 198.51.100.2 has its own budget')
  // The client sent "X-Forwarded-For: 192.0.2.99" itself; our proxy appended the address it saw.
  t.same(await statuses(2, url, xff('192.0.2.99, 198.51.100.1')), [429, 429], 'a spoofed left-most entry does not give a fresh budget')
  // through two of our proxies: the right-most untrusted entry is the client
  t.same(await statuses(4, url, xff('192.0.2.7, 198.51.100.3, 10.1.2.3')), [200, 200, 200, 429], 'trusted hops are skipped')
  const keys = (await admin.keys('gw:\\*.ip.*')).map(k => k.slice(k.lastIndexOf(':') + 1)).sort()
  t.same(keys, ['198.51.100.1', '198.51.100.2', '198.51.100.3'], 'keys for the real clients only (no 127.0.0.1, no spoofed address)')
  const upstreamXff = gw.lines.filter(l => l.msg === 'request').map(l => l.ip)
  t.ok(upstreamXff.includes('198.51.100.3'), 'the access log names the resolved client')
})

t.test('a request refused before it has a route is logged under its client behind a trusted proxy, not the proxy', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'trustedProxies: [127.0.0.1]\nlocal: { limit: 2, window: 1h, burst: 2 }', ''))
  const replies: Reply[] = []
  // TRACE is taken by no route here: 405, charged to the client by the local level
  for (let i = 0; i < 3; i++) replies.push(await send(`${gw.url}/x`, { method: 'TRACE', headers: { 'x-forwarded-for': '203.0.113.9' } }))
  t.same(replies.map(r => r.status), [405, 405, 429])
  t.equal(replies[2]?.json?.limit, 'local')
  const access = gw.lines.filter(l => l.msg === 'request')
  t.same(access.map(l => [l.status, l.ip]), [[405, '203.0.113.9'], [405, '203.0.113.9'], [429, '203.0.113.9']], 'the access log names the client the local level charged')
})

t.test('IPv6 clients are limited per /64: two addresses in one /64 share a budget', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `trustedProxies: ["::1"]\n${IP_LIMIT}`, '', '[::1]:0'))
  const url = `http://[::1]:${gw.port}/x`
  const xff = (v: string): Record<string, string> => ({ 'x-forwarded-for': v })
  t.same(await statuses(2, url, xff('2001:db8:aa:1::1'), '::1'), [200, 200])
  t.same(await statuses(2, url, xff('2001:db8:aa:1:ffff:ffff:ffff:fffe'), '::1'), [200, 429], 'same /64: the third request of the prefix is refused')
  t.same(await statuses(4, url, xff('2001:db8:aa:2::1'), '::1'), [200, 200, 200, 429], 'the next /64 has its own budget')
  // without XFF the IPv6 peer itself is grouped the same way
  t.same(await statuses(4, url, {}, '::1'), [200, 200, 200, 429], 'the peer ::1 is a client too')
  // <prefix>:<limit id>:<value>, and the value has colons of its own
  const keys = (await admin.keys('gw:\\*.ip.*')).map(k => k.split(':').slice(2).join(':')).sort()
  t.same(keys, ['2001:db8:aa:1::/64', '2001:db8:aa:2::/64', '::/64'], 'one key per /64')
})

const USER_LIMIT = '      user: { algorithm: sliding-window-log, limit: 2, window: 1h }'

t.test('identity header: user limits are kept per user; anonymous requests skip them', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'identity: { header: x-user-id }', USER_LIMIT))
  const url = `${gw.url}/x`
  t.same(await statuses(3, url, { 'x-user-id': 'alice' }), [200, 200, 429])
  t.same(await statuses(3, url, { 'x-user-id': 'bob' }), [200, 200, 429])
  t.same(await statuses(5, url), [200, 200, 200, 200, 200], 'anonymous: no user limit applies')
  const keys = (await admin.keys('gw:r.user.*')).map(k => k.slice(k.lastIndexOf(':') + 1)).sort()
  t.same(keys, ['alice', 'bob'])
  // braces in a user name are encoded: a client cannot choose its Redis Cluster slot
  t.same(await statuses(1, url, { 'x-user-id': '{slot}x' }), [200])
  t.equal((await admin.keys('gw:r.user.*:%7Bslot%7Dx')).length, 1)
})

t.test('identity header with trustedProxies: believed from those peers only, removed from anyone else', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const quiet = await startGateway(t, config(up.url, 'identity: { header: x-user-id }', USER_LIMIT))
  const warnings = (): number => quiet.lines.filter(l => typeof l.msg === 'string' && l.msg.startsWith('identity.header is believed from every client')).length
  t.equal(warnings(), 1, 'without trustedProxies: a warning at start')
  t.match(await quiet.reload(), { ok: true })
  t.equal(warnings(), 2, 'and on each reload')
  const gw = await startGateway(t, config(up.url, 'identity: { header: x-user-id }\ntrustedProxies: [127.0.0.2]', USER_LIMIT))
  t.notOk(gw.lines.some(l => typeof l.msg === 'string' && l.msg.startsWith('identity.header is believed')), 'with trustedProxies: none')
  const url = `${gw.url}/x`
  // a direct client claiming alice: anonymous, so no user limit, and the claim never reaches the upstream
  const direct: Reply[] = []
  for (let i = 0; i < 3; i++) direct.push(await send(url, { headers: { 'x-user-id': 'alice' }, localAddress: '127.0.0.1' }))
  t.same(direct.map(r => r.status), [200, 200, 200])
  t.same(direct.map(r => (r.json as { headers?: Record<string, unknown> } | null)?.headers?.['x-user-id']), [undefined, undefined, undefined], 'the forged header is removed')
  t.same(await admin.keys('gw:r.user.*'), [], 'nothing charged to alice')
  // the auth layer (a trusted peer) names alice: her limit applies
  t.same(await statuses(3, url, { 'x-user-id': 'alice' }, '127.0.0.2'), [200, 200, 429])
  // An auth layer that appends its header to the client's: node joins the two as "mallory, bob",
  // which must not become a user with a fresh budget (nor reach the upstream).
  const before = up.requests
  for (const headers of [{ 'x-user-id': ['mallory', 'bob'] }, { 'x-user-id': 'mallory, bob' }]) {
    const r = await send(url, { headers, localAddress: '127.0.0.2' })
    t.equal(r.status, 401, 'a repeated identity header is refused')
    t.same([r.json?.error, r.json?.reason], ['GW_ERR_UNAUTHORIZED', 'identity header repeated or holds a comma'])
  }
  t.equal(up.requests, before, 'neither reached the upstream')
  t.same((await admin.keys('gw:r.user.*')).map(k => k.slice(k.lastIndexOf(':') + 1)), ['alice'], 'no budget for a joined name')
})

t.test('identity required: a request without identity gets 401 JSON before any limit', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'identity: { header: x-user-id, required: true }', USER_LIMIT))
  const r = await send(`${gw.url}/x`)
  t.equal(r.status, 401)
  t.equal(r.json?.error, 'GW_ERR_UNAUTHORIZED')
  t.type(r.json?.requestId, 'string')
  t.equal(up.requests, 0)
  t.same(await statuses(3, `${gw.url}/x`, { 'x-user-id': 'alice' }), [200, 200, 429])
})

t.test('API keys: the key names the user; an unknown key gets 401 JSON', async t => {
  await admin.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'identity: { apiKeys: { header: x-api-key, keys: { k-123: alice, k-456: bob, k-789: alice } } }', USER_LIMIT))
  const url = `${gw.url}/x`
  t.same(await statuses(1, url, { 'x-api-key': 'k-123' }), [200])
  t.same(await statuses(2, url, { 'x-api-key': 'k-789' }), [200, 429], 'two keys of alice share her budget')
  t.same(await statuses(3, url, { 'x-api-key': 'k-456' }), [200, 200, 429])
  const unknown = await send(url, { headers: { 'x-api-key': 'k-000' } })
  t.equal(unknown.status, 401)
  t.equal(unknown.json?.error, 'GW_ERR_UNAUTHORIZED')
  t.equal(up.requests, 4)
  const keys = (await admin.keys('gw:r.user.*')).map(k => k.slice(k.lastIndexOf(':') + 1)).sort()
  t.same(keys, ['alice', 'bob'], 'keyed by user, never by the key itself')
})

t.test('JWT HS256: verified tokens name the user; expired or badly signed tokens get 401', async t => {
  await admin.flushall()
  const secret = 'a-test-secret-of-at-least-32-bytes!!'
  const key = new TextEncoder().encode(secret)
  const sign = (sub: string, exp: string | number = '5m'): Promise<string> =>
    new SignJWT({}).setProtectedHeader({ alg: 'HS256' }).setSubject(sub).setIssuedAt().setExpirationTime(exp).sign(key)
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `identity: { jwt: { secret: "${secret}", claim: sub }, required: true }`, USER_LIMIT))
  const url = `${gw.url}/x`
  const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` })
  t.same(await statuses(3, url, bearer(await sign('alice'))), [200, 200, 429])
  t.same(await statuses(1, url, bearer(await sign('alice'))), [429], 'a new token of the same user: same budget')
  t.same(await statuses(3, url, bearer(await sign('bob'))), [200, 200, 429])
  const expired = await send(url, { headers: bearer(await sign('carol', Math.floor(Date.now() / 1000) - 60)) })
  t.equal(expired.status, 401, 'expired')
  t.equal(expired.json?.error, 'GW_ERR_UNAUTHORIZED')
  const forged = await new SignJWT({}).setProtectedHeader({ alg: 'HS256' }).setSubject('carol').setExpirationTime('5m').sign(new TextEncoder().encode('another-secret-of-at-least-32-bytes!'))
  t.equal((await send(url, { headers: bearer(forged) })).status, 401, 'bad signature')
  t.equal((await send(url, { headers: bearer('not.a.jwt') })).status, 401, 'garbage')
  t.equal((await send(url)).status, 401, 'required: no token')
  const keys = (await admin.keys('gw:r.user.*')).map(k => k.slice(k.lastIndexOf(':') + 1)).sort()
  t.same(keys, ['alice', 'bob'])
})

t.test('JWT RS256 (public key PEM): per-user limits; a token signed by another key gets 401', async t => {
  await admin.flushall()
  const { publicKey, privateKey } = await generateKeyPair('RS256', { extractable: true })
  const other = await generateKeyPair('RS256')
  const pem = await exportSPKI(publicKey)
  const sign = (sub: string, k = privateKey): Promise<string> =>
    new SignJWT({}).setProtectedHeader({ alg: 'RS256' }).setSubject(sub).setExpirationTime('5m').sign(k)
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `identity: { jwt: { publicKey: ${JSON.stringify(pem)} } }`, USER_LIMIT))
  const url = `${gw.url}/x`
  const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` })
  t.same(await statuses(3, url, bearer(await sign('dave'))), [200, 200, 429])
  t.same(await statuses(3, url, bearer(await sign('erin'))), [200, 200, 429])
  t.equal((await send(url, { headers: bearer(await sign('dave', other.privateKey)) })).status, 401, 'signed by another key')
  const anonymous = await Promise.all([send(url), send(url), send(url)])
  t.same(statusCounts(anonymous), { 200: 3 }, 'not required: anonymous requests skip user limits')
})
