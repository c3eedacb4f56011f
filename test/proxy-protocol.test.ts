// proxyProtocol: behind a TCP load balancer (AWS NLB, HAProxy in tcp mode) every connection comes
// from the balancer, which names the client in a PROXY protocol header (v1 text, v2 binary) before
// the client's bytes. The gateway reads it from the peers `from` names: the client's address is
// then the one the ip limits count, ipRestriction checks, X-Forwarded-For carries and the log
// shows. A connection from such a peer without a valid header is closed and counted; a peer not
// named is served as it comes, and a header it sends is a bad request.
import t from 'tap'
import { connect, type Socket } from 'node:net'
import { connect as tlsConnect } from 'node:tls'
import { readFileSync, writeFileSync } from 'node:fs'
import { once } from 'node:events'
import { spawnGateway, startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { makeRedisTlsCerts, startRedis } from './helpers/redis.js'
import { twoWorkers } from './helpers/workers.js'
import { parseResponses, type RawReply } from './helpers/raw-http.js'
import { gateway } from './helpers/cli.js'
import { tempDir } from './helpers/teardown.js'
import { parseProxyHeader, V1_MAX_LENGTH, V2_MAX_LENGTH } from '../src/identify/proxy-protocol.js'

const SIGNATURE = [0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a]

/** A version 2 block: command 1 (PROXY) or 0 (LOCAL), family/protocol byte, the address bytes and the TLVs given. */
function v2 (command: number, familyProtocol: number, body: number[]): Buffer {
  return Buffer.from([...SIGNATURE, 0x20 | command, familyProtocol, body.length >> 8, body.length & 0xff, ...body])
}
const v2Ipv4 = (a: number[], port: number, tlvs: number[] = []): Buffer => v2(1, 0x11, [...a, 10, 0, 0, 1, port >> 8, port & 0xff, 0, 80, ...tlvs])
/** From `a` followed by zeros and a last byte 1 (2001:db8::1 for [0x20, 0x01, 0x0d, 0xb8]), to 2001:db8::2. */
const v2Ipv6 = (a: number[], port: number): Buffer => v2(1, 0x21, [...a, ...Array(15 - a.length).fill(0), 1, 0x20, 0x01, 0x0d, 0xb8, ...Array(11).fill(0), 2, port >> 8, port & 0xff, 1, 187])

t.test('the header, read as the specification writes it (pure)', async t => {
  const line = 'PROXY TCP4 203.0.113.7 10.0.0.1 51234 443\r\n'
  t.same(parseProxyHeader(Buffer.from(line + 'GET / HTTP/1.1\r\n')), { state: 'done', header: { kind: 'proxied', address: '203.0.113.7', port: 51234 }, length: line.length })
  t.same(parseProxyHeader(Buffer.from('PROXY TCP6 2001:DB8:0:0::7 2001:db8::1 1 2\r\n')), { state: 'done', header: { kind: 'proxied', address: '2001:db8::7', port: 1 }, length: 44 }, 'an IPv6 address in its one spelling')
  t.same(parseProxyHeader(Buffer.from('PROXY UNKNOWN whatever follows\r\n')), { state: 'done', header: { kind: 'local' }, length: 32 }, 'UNKNOWN: the peer stays the address')
  for (let i = 1; i < line.length; i++) {
    t.same(parseProxyHeader(Buffer.from(line.slice(0, i))), { state: 'incomplete' }, `${i} bytes of a v1 line: incomplete`)
  }
  t.same(parseProxyHeader(Buffer.from('PROXY TCP4 ' + '1'.repeat(V1_MAX_LENGTH))), { state: 'invalid', reason: 'malformed' }, 'no CRLF within 107 bytes')
  for (const bad of ['PROXY TCP4 203.0.113 10.0.0.1 1 2\r\n', 'PROXY TCP4 2001:db8::7 10.0.0.1 1 2\r\n', 'PROXY TCP6 203.0.113.7 2001:db8::1 1 2\r\n',
    'PROXY TCP4 203.0.113.7 10.0.0.1 65536 443\r\n', 'PROXY TCP4 203.0.113.7 10.0.0.1 0443 443\r\n', 'PROXY TCP4 203.0.113.7 10.0.0.1 1\r\n',
    'PROXY UDP4 203.0.113.7 10.0.0.1 1 2\r\n', 'PROXY TCP4  203.0.113.7 10.0.0.1 1 2\r\n', 'PROXY TCP6 fe80::7%eth0 fe80::1 1 2\r\n']) {
    t.same(parseProxyHeader(Buffer.from(bad)), { state: 'invalid', reason: 'malformed' }, JSON.stringify(bad))
  }
  t.same(parseProxyHeader(Buffer.from('GET / HTTP/1.1\r\n')), { state: 'invalid', reason: 'missing' }, 'HTTP where the header belongs')
  t.same(parseProxyHeader(Buffer.from([0x16, 0x03, 0x01])), { state: 'invalid', reason: 'missing' }, 'a TLS handshake where the header belongs')

  const four = v2Ipv4([198, 51, 100, 9], 40000, [0x04, 0x00, 0x03, 1, 2, 3])
  t.same(parseProxyHeader(Buffer.concat([four, Buffer.from('GET')])), { state: 'done', header: { kind: 'proxied', address: '198.51.100.9', port: 40000 }, length: four.length }, 'v2 over IPv4, a TLV passed over')
  for (let i = 1; i < four.length; i++) t.same(parseProxyHeader(four.subarray(0, i)).state, 'incomplete', `${i} bytes of a v2 block: incomplete`)
  t.same(parseProxyHeader(v2Ipv6([0x20, 0x01, 0x0d, 0xb8], 8443)), { state: 'done', header: { kind: 'proxied', address: '2001:db8::1', port: 8443 }, length: 52 }, 'v2 over IPv6')
  // a dual-stack balancer's IPv4 client, spelt as node spells such a peer of its own
  t.same(parseProxyHeader(v2Ipv6([...Array(10).fill(0), 0xff, 0xff, 203, 0, 113], 1)), { state: 'done', header: { kind: 'proxied', address: '::ffff:203.0.113.1', port: 1 }, length: 52 }, 'v2: an IPv4-mapped address')
  for (const text of ['::ffff:203.0.113.20', '::FFFF:cb00:7114', '0:0:0:0:0:ffff:cb00:7114']) {
    t.match(parseProxyHeader(Buffer.from(`PROXY TCP6 ${text} ::1 1 2\r\n`)), { header: { address: '::ffff:203.0.113.20' } }, `v1: ${text}`)
  }
  t.same(parseProxyHeader(v2(0, 0x11, Array(12).fill(1))), { state: 'done', header: { kind: 'local' }, length: 28 }, 'LOCAL: the balancer\'s own connection')
  t.same(parseProxyHeader(v2(1, 0x00, [])), { state: 'done', header: { kind: 'local' }, length: 16 }, 'UNSPEC: no client address')
  t.same(parseProxyHeader(v2(1, 0x31, Array(216).fill(0x61))), { state: 'done', header: { kind: 'local' }, length: 232 }, 'a Unix socket (stream): no client address')
  t.same(parseProxyHeader(v2(1, 0x12, [198, 51, 100, 9, 10, 0, 0, 1, 0, 53, 0, 53])), { state: 'done', header: { kind: 'local' }, length: 28 }, 'UDP over IPv4: not a TCP client')
  t.same(parseProxyHeader(v2(1, 0x22, Array(36).fill(1))), { state: 'done', header: { kind: 'local' }, length: 52 }, 'UDP over IPv6: not a TCP client')
  t.same(parseProxyHeader(v2Ipv4([198, 51, 100, 9], 0)), { state: 'done', header: { kind: 'proxied', address: '198.51.100.9', port: 0 }, length: 28 }, 'port 0 is a port')
  t.same(parseProxyHeader(v2(1, 0x11, [1, 2, 3])), { state: 'invalid', reason: 'malformed' }, 'an IPv4 block too short for its addresses')
  t.same(parseProxyHeader(Buffer.from([...SIGNATURE, 0x11, 0x11, 0, 0])), { state: 'invalid', reason: 'malformed' }, 'version 1 in a v2 block')
  t.same(parseProxyHeader(Buffer.from([...SIGNATURE, 0x22, 0x11, 0, 0])), { state: 'invalid', reason: 'malformed' }, 'an unknown command')
  for (const familyProtocol of [0x01, 0x10, 0x13, 0x41]) {
    t.same(parseProxyHeader(v2(1, familyProtocol, Array(12).fill(1))), { state: 'invalid', reason: 'malformed' }, `family and protocol 0x${familyProtocol.toString(16)}: the specification has it rejected`)
  }
  t.same(parseProxyHeader(v2(0, 0x41, [])), { state: 'done', header: { kind: 'local' }, length: 16 }, 'LOCAL: the family is ignored, as the specification says')
  const long = V2_MAX_LENGTH - 16 + 1
  t.same(parseProxyHeader(Buffer.from([...SIGNATURE, 0x21, 0x11, long >> 8, long & 0xff])), { state: 'invalid', reason: 'malformed' }, 'a block longer than the bound is refused before its bytes come')
})

const yaml = (up: string, extra = '', ipLimit = 2): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
proxyProtocol: { from: [127.0.0.1], timeout: 500ms }
ipRestriction: { deny: [192.0.2.0/24] }
${extra}upstreams:
  backend: { targets: [${up}] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    limits:
      ip: { algorithm: fixed-window, limit: ${ipLimit}, window: 1h }
`

const portOf = (url: string): number => Number(new URL(url).port)

/** Writes the pieces on a fresh connection (from `localAddress`), one write each, and returns what came back until it closed. */
async function exchange (port: number, pieces: Array<string | Buffer>, localAddress = '127.0.0.1'): Promise<{ text: string, replies: RawReply[] }> {
  const socket = connect({ port, host: '127.0.0.1', localAddress })
  socket.on('error', () => {})
  await once(socket, 'connect')
  for (const piece of pieces) {
    socket.write(piece)
    await new Promise(resolve => setTimeout(resolve, 10))
  }
  let text = ''
  socket.setEncoding('latin1')
  socket.setTimeout(10_000, () => socket.destroy())
  for await (const chunk of socket) text += chunk as string
  return { text, replies: parseResponses(text) }
}

const get = (path: string, close = true): string => `GET ${path} HTTP/1.1\r\nHost: gw\r\n${close ? 'Connection: close\r\n' : ''}\r\n`
const forwardedFor = (r: RawReply | undefined): unknown => (r?.json?.headers as Record<string, unknown> | undefined)?.['x-forwarded-for']

async function metric (adminUrl: string, reason: string): Promise<number> {
  const text = await (await fetch(`${adminUrl}/metrics`)).text()
  const m = new RegExp(`^gateway_proxy_protocol_refused_total\\{reason="${reason}"\\} (\\d+)`, 'm').exec(text)
  return m === null ? 0 : Number(m[1])
}

t.test('the client the header names is the client: X-Forwarded-For, the access log, the ip limit, ipRestriction', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url))
  const port = portOf(gw.url)
  const one = await exchange(port, ['PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n' + get('/a', false) + get('/b')])
  t.same(one.replies.map(r => r.status), [200, 200], 'header and two requests in one write')
  t.same(one.replies.map(forwardedFor), ['203.0.113.7', '203.0.113.7'], 'the upstream is told the client, on every request of the connection')
  const third = await exchange(port, ['PROXY TCP4 203.0.113.7 10.0.0.1 51235 80\r\n', get('/c')])
  t.equal(third.replies[0]?.status, 429, 'the third request of that client, on another connection of the balancer: its ip limit of 2')
  const other = await exchange(port, [v2Ipv6([0x20, 0x01, 0x0d, 0xb8], 40000), get('/d')])
  t.equal(other.replies[0]?.status, 200, 'another client behind the same balancer has its own budget')
  t.equal(forwardedFor(other.replies[0]), '2001:db8::1', 'a v2 header over IPv6')
  const denied = await exchange(port, [v2Ipv4([192, 0, 2, 5], 1234), get('/e')])
  t.equal(denied.replies[0]?.status, 403, 'ipRestriction checks the client the header names')
  const logged = gw.lines.filter(l => l.msg === 'request').map(l => [l.path, l.ip, l.status])
  t.same(logged, [['/a', '203.0.113.7', 200], ['/b', '203.0.113.7', 200], ['/c', '203.0.113.7', 429], ['/d', '2001:db8::1', 200], ['/e', '192.0.2.5', 403]])
})

t.test('trustedProxies applies to the client the header names, as to a direct peer', async t => {
  const up = await startUpstream(t)
  // an HTTP proxy of our own (203.0.113.0/24) behind the TCP balancer
  const gw = await startGateway(t, yaml(up.url, 'trustedProxies: [203.0.113.0/24]\n', 100))
  const port = portOf(gw.url)
  const viaProxy = await exchange(port, ['PROXY TCP4 203.0.113.20 10.0.0.1 1 80\r\n' + 'GET /via HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: 198.51.100.3\r\nConnection: close\r\n\r\n'])
  t.equal(forwardedFor(viaProxy.replies[0]), '198.51.100.3, 203.0.113.20', 'the chain of the trusted proxy, with it appended')
  const direct = await exchange(port, ['PROXY TCP4 198.51.100.50 10.0.0.1 1 80\r\n' + 'GET /direct HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: 10.9.9.9\r\nConnection: close\r\n\r\n'])
  t.equal(forwardedFor(direct.replies[0]), '198.51.100.50', 'a client that is no trusted proxy: its own chain is dropped')
  // the same proxy named by a dual-stack balancer (v2, IPv6 family, IPv4-mapped): appended as the
  // IPv4 address it is, as for a peer node itself reports as ::ffff:a.b.c.d
  const mapped = v2Ipv6([...Array(10).fill(0), 0xff, 0xff, 203, 0, 113], 1)
  const viaMapped = await exchange(port, [Buffer.concat([mapped, Buffer.from('GET /mapped HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: 198.51.100.3\r\nConnection: close\r\n\r\n')])])
  t.equal(forwardedFor(viaMapped.replies[0]), '198.51.100.3, 203.0.113.1')
  t.same(gw.lines.filter(l => l.msg === 'request').map(l => [l.path, l.ip]), [['/via', '198.51.100.3'], ['/direct', '198.51.100.50'], ['/mapped', '198.51.100.3']])
})

t.test('the header may come in pieces, and a LOCAL one leaves the balancer as the client', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, '', 100))
  const port = portOf(gw.url)
  const line = 'PROXY TCP4 203.0.113.8 10.0.0.1 1 80\r\n'
  const pieces = await exchange(port, [line.slice(0, 3), line.slice(3, 20), line.slice(20), get('/p')])
  t.equal(forwardedFor(pieces.replies[0]), '203.0.113.8')
  const block = v2Ipv4([203, 0, 113, 9], 1)
  const binary = await exchange(port, [block.subarray(0, 5), block.subarray(5, 17), Buffer.concat([block.subarray(17), Buffer.from(get('/q'))])])
  t.equal(forwardedFor(binary.replies[0]), '203.0.113.9')
  // an h2c offer is declined and its connection handed to node's HTTP layer again, header read once
  const h2c = 'GET /h2c HTTP/1.1\r\nHost: gw\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n'
  const declined = await exchange(port, ['PROXY TCP4 203.0.113.12 10.0.0.1 1 80\r\n' + h2c, get('/after-h2c')])
  t.same(declined.replies.map(r => [r.status, forwardedFor(r)]), [[200, '203.0.113.12'], [200, '203.0.113.12']], 'a declined upgrade, and the request after it')
  // also when the connection's address is one `from` names (a LOCAL header keeps the balancer's)
  const declinedLocal = await exchange(port, [Buffer.concat([v2(0, 0x00, []), Buffer.from(h2c)]), get('/after-h2c')])
  t.same(declinedLocal.replies.map(r => [r.status, forwardedFor(r)]), [[200, '127.0.0.1'], [200, '127.0.0.1']], 'no second header is asked of it')
  const local = await exchange(port, [v2(0, 0x00, []), get('/health')])
  t.equal(forwardedFor(local.replies[0]), '127.0.0.1', 'LOCAL: the peer\'s own address')
})

t.test('after the header, the connection is HTTP\'s: a large first write is the request, and a silence is server.headersTimeout\'s', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, 'server: { headersTimeout: 1s }\n', 100).replace('timeout: 500ms', 'timeout: 20s'))
  const port = portOf(gw.url)
  // one write: the header, a request head and 1 MiB of body (the socket reads it 64 KiB at a time)
  const body = Buffer.alloc(1024 * 1024, 'b')
  const large = await exchange(port, [Buffer.concat([Buffer.from(`PROXY TCP4 203.0.113.50 10.0.0.1 1 80\r\nPOST /upload HTTP/1.1\r\nHost: gw\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`), body])])
  t.equal(large.replies[0]?.status, 200)
  t.same(large.replies[0]?.json, { bytes: body.length }, 'every byte reached the upstream')
  const started = Date.now()
  const silent = await exchange(port, ['PROXY TCP4 203.0.113.51 10.0.0.1 1 80\r\n'])
  t.equal(silent.replies[0]?.status, 408, 'a header and then nothing: the 408 of headersTimeout')
  t.ok(Date.now() - started < 5000, `within about headersTimeout (1 s), not proxyProtocol.timeout (20 s): ${Date.now() - started} ms`)
  t.equal(await metric(gw.adminUrl, 'timeout'), 0, 'not a refused header')
})

t.test('a connection from a proxyProtocol peer without a valid header is closed unanswered, counted and warned of', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url))
  const port = portOf(gw.url)
  const missing = await exchange(port, [get('/m')])
  t.equal(missing.text, '', 'plain HTTP where the header belongs: closed, nothing answered')
  const malformed = await exchange(port, ['PROXY TCP4 203.0.113 10.0.0.1 1 2\r\n' + get('/x')])
  t.equal(malformed.text, '')
  const started = Date.now()
  const silent = await exchange(port, [])
  t.equal(silent.text, '', 'nothing sent: closed after the timeout')
  t.ok(Date.now() - started < 5000, `closed after about timeout (500ms): ${Date.now() - started} ms`)
  t.same([await metric(gw.adminUrl, 'missing'), await metric(gw.adminUrl, 'malformed'), await metric(gw.adminUrl, 'timeout')], [1, 1, 1])
  t.equal(up.log.length, 0, 'nothing reached the upstream')
  const warned = gw.lines.filter(l => String(l.msg).startsWith('connection closed: a proxyProtocol peer sent no valid PROXY protocol header'))
  t.equal(warned.length, 1, 'warned of once for the three within 10 s')
  t.match(warned[0], { level: 40, reason: 'missing', peer: '127.0.0.1' })
  // a balancer's TCP health check: connect, then leave
  const probe = connect(port, '127.0.0.1')
  await once(probe, 'connect')
  probe.end()
  await once(probe, 'close')
  // and one that leaves half-way through its header
  const half = connect(port, '127.0.0.1')
  await once(half, 'connect')
  half.end('PROXY TCP4 203.0.113.7')
  await once(half, 'close')
  await new Promise(resolve => setTimeout(resolve, 700))
  t.same([await metric(gw.adminUrl, 'missing'), await metric(gw.adminUrl, 'malformed'), await metric(gw.adminUrl, 'timeout')], [1, 1, 1], 'a connection that leaves before a whole header is not counted')
})

t.test('a header dribbled a byte at a time is still bound by timeout, counted from the connection', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url))
  const socket = connect(portOf(gw.url), '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  const started = Date.now()
  // a byte every 50 ms: each within the 500 ms, the whole line (39 bytes) about 2 s
  const line = 'PROXY TCP4 203.0.113.60 10.0.0.1 1 80\r\n'
  let sent = 0
  const dribble = setInterval(() => { if (sent < line.length && !socket.destroyed) socket.write(line[sent++] as string) }, 50)
  await Promise.race([once(socket, 'close'), new Promise(resolve => setTimeout(resolve, 3000))])
  clearInterval(dribble)
  socket.destroy()
  const elapsed = Date.now() - started
  t.ok(elapsed >= 400 && elapsed < 1500, `closed after about the 500 ms timeout: ${elapsed} ms`)
  t.equal(await metric(gw.adminUrl, 'timeout'), 1)
})

t.test('a header that would complete once the gateway is shutting down: the connection is closed unserved', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url))
  const socket = connect(portOf(gw.url), '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  socket.write('PROXY TCP4 203.0.113.13 10.0.0.1')
  const closing = gw.close()
  await new Promise(resolve => setTimeout(resolve, 50))
  socket.write(' 1 80\r\n' + get('/late'))
  let text = ''
  socket.setEncoding('latin1')
  // closed as the drain began: the write after it may meet a reset
  try {
    for await (const chunk of socket) text += chunk as string
  } catch (err) {
    t.equal((err as NodeJS.ErrnoException).code, 'ECONNRESET')
  }
  await closing
  t.equal(text, '', 'nothing answered')
  t.equal(up.log.length, 0, 'nothing forwarded')
})

t.test('SIGTERM: a connection still waiting for its header is closed at once, and the process does not wait out the timeout', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, yaml(up.url).replace('timeout: 500ms', 'timeout: 30s'))
  const socket = connect(gw.port, '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  socket.write('PROXY TCP4 203.0.113.14')
  await new Promise(resolve => setTimeout(resolve, 100))
  const started = Date.now()
  gw.child.kill('SIGTERM')
  const socketClosed = once(socket, 'close').then(() => Date.now() - started)
  const code = await Promise.race([gw.exited, new Promise(resolve => setTimeout(() => resolve('still running after 5 s'), 5000))])
  t.equal(code, 0, 'exited 0 within 5 s, not after the 30 s the header may take')
  t.ok(await Promise.race([socketClosed, new Promise<number>(resolve => setTimeout(() => resolve(Infinity), 1000))]) < 5000, 'the connection was closed, not left to its timer')
  t.equal(gw.logs.some(l => String(l.msg).startsWith('connection closed: a proxyProtocol peer')), false, 'not refused as late: the gateway stopped')
  t.equal(gw.logs.at(-1)?.msg, 'gateway stopped')
})

t.test('a peer proxyProtocol does not name is served as it comes; a header it sends is a bad request', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url))
  const port = portOf(gw.url)
  // 127.0.0.2 is loopback too, but not the 127.0.0.1 that `from` names
  const plain = await exchange(port, [get('/plain')], '127.0.0.2')
  t.equal(plain.replies[0]?.status, 200)
  t.equal(forwardedFor(plain.replies[0]), '127.0.0.2')
  const forged = await exchange(port, ['PROXY TCP4 10.9.9.9 10.0.0.1 1 80\r\n' + get('/forged')], '127.0.0.2')
  t.equal(forged.replies[0]?.status, 400, 'a client cannot name itself someone else')
  t.equal(forged.replies[0]?.json?.error, 'GW_ERR_BAD_REQUEST')
  t.equal(up.log.includes('/forged'), false)
})

t.test('a dual-stack listener: a balancer node reports as ::ffff:127.0.0.1 is the 127.0.0.1 that from names', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, '', 100).replace('listen: 127.0.0.1:0', 'listen: "[::]:0"'))
  const port = portOf(gw.url)
  const proxied = await exchange(port, ['PROXY TCP4 203.0.113.40 10.0.0.1 1 80\r\n' + get('/dual')])
  t.equal(forwardedFor(proxied.replies[0]), '203.0.113.40')
  t.equal((await exchange(port, [get('/dual-missing')])).text, '', 'without a header: closed')
  t.equal(forwardedFor((await exchange(port, [get('/dual-other')], '127.0.0.2')).replies[0]), '127.0.0.2', 'a peer from does not name: served as it comes')
})

t.test('TLS: the header comes before the handshake, and the requests of the TLS connection carry its client', async t => {
  const certs = makeRedisTlsCerts(tempDir(t, 'proxy-protocol-tls'), 'ca')
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, `tls: { cert: ${certs.serverCert}, key: ${certs.serverKey} }\n`))
  const raw: Socket = connect(portOf(gw.url), '127.0.0.1')
  raw.on('error', () => {})
  await once(raw, 'connect')
  raw.write('PROXY TCP4 203.0.113.10 10.0.0.1 1 443\r\n')
  const secure = tlsConnect({ socket: raw, servername: 'localhost', ca: readFileSync(certs.ca) })
  await once(secure, 'secureConnect')
  secure.write(get('/tls'))
  let text = ''
  secure.setEncoding('latin1')
  for await (const chunk of secure) text += chunk as string
  const [reply] = parseResponses(text)
  t.equal(reply?.status, 200)
  t.equal(forwardedFor(reply), '203.0.113.10')
  t.match(gw.lines.find(l => l.msg === 'request'), { path: '/tls', ip: '203.0.113.10' })
})

t.test('workers: 2 (bin/gateway, Redis): each worker reads the header; the client it names is the one the shared ip limit counts, the upstream is told and the log shows', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  // exact counts: 2 s, not the default 50 ms (startRedis in test/helpers/redis.ts says why)
  const r = await twoWorkers(t, yaml(up.url, `workers: 2\nredis: { url: ${redis.url}, timeout: 2s }\n`))
  // one connection each, as a balancer opens them: node's cluster hands them to the workers in turn
  const replies: Array<[number | undefined, unknown]> = []
  for (const [i, client] of ['203.0.113.21', '203.0.113.22', '203.0.113.21', '203.0.113.22', '203.0.113.21'].entries()) {
    const { replies: [reply] } = await exchange(r.gw.port, [`PROXY TCP4 ${client} 10.0.0.1 ${i + 1} 80\r\n` + get(`/w${i}`)])
    replies.push([reply?.status, forwardedFor(reply)])
  }
  t.same(replies, [[200, '203.0.113.21'], [200, '203.0.113.22'], [200, '203.0.113.21'], [200, '203.0.113.22'], [429, undefined]], 'the third request of .21 is over its limit of 2, whichever worker counted the first two')
  const missing = await exchange(r.gw.port, [get('/m')])
  t.equal(missing.text, '', 'a connection without a header is closed by the worker too')
  for (let i = 0; i < 5; i++) await r.gw.waitForLog(l => l.msg === 'request' && l.path === `/w${i}`)
  const logged = r.gw.logs.filter(l => l.msg === 'request')
  t.same(logged.map(l => [l.path, l.ip]).sort(), [['/w0', '203.0.113.21'], ['/w1', '203.0.113.22'], ['/w2', '203.0.113.21'], ['/w3', '203.0.113.22'], ['/w4', '203.0.113.21']])
  t.equal(new Set(logged.map(l => l.pid)).size, 2, 'both workers served some')
  t.equal(await metric(r.adminUrl, 'missing'), 1, 'the refusal is in the primary\'s /metrics')
})

t.test('a WebSocket upgrade on a proxied connection: the upstream\'s handshake carries the client, the ip limit and the log have it', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, '', 1).replace('    upstream: backend\n', '    upstream: backend\n    websocket: true\n'))
  const port = portOf(gw.url)
  const upgrade = (path: string): string => `GET ${path} HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  socket.write('PROXY TCP4 203.0.113.30 10.0.0.1 1 80\r\n' + upgrade('/ws'))
  const [head] = await once(socket, 'data') as [Buffer]
  t.match(head.toString('latin1'), /^HTTP\/1\.1 101 /)
  t.equal(up.upgrades[0]?.headers['x-forwarded-for'], '203.0.113.30')
  socket.destroy()
  const second = await exchange(port, ['PROXY TCP4 203.0.113.30 10.0.0.1 2 80\r\n' + upgrade('/ws2')])
  t.equal(second.replies[0]?.status, 429, 'the same client on another connection: its ip limit of 1 counted the upgrade')
  const other = connect(port, '127.0.0.1')
  other.on('error', () => {})
  await once(other, 'connect')
  other.write('PROXY TCP4 203.0.113.31 10.0.0.1 3 80\r\n' + upgrade('/ws3'))
  const [otherHead] = await once(other, 'data') as [Buffer]
  t.match(otherHead.toString('latin1'), /^HTTP\/1\.1 101 /, 'another client behind the balancer has its own budget')
  other.destroy()
  t.same(up.upgrades.map(u => u.headers['x-forwarded-for']), ['203.0.113.30', '203.0.113.31'])
  t.same(gw.lines.filter(l => l.msg === 'request').map(l => [l.path, l.ip]), [['/ws', '203.0.113.30'], ['/ws2', '203.0.113.30'], ['/ws3', '203.0.113.31']])
})

t.test('a reload takes proxyProtocol on and off for the connections that follow', async t => {
  const up = await startUpstream(t)
  const without = yaml(up.url).replace('proxyProtocol: { from: [127.0.0.1], timeout: 500ms }\n', '')
  const gw = await startGateway(t, without)
  const port = portOf(gw.url)
  t.equal(forwardedFor((await exchange(port, [get('/before')])).replies[0]), '127.0.0.1')
  writeFileSync(gw.configFile, yaml(up.url))
  t.equal((await gw.reload()).ok, true)
  t.equal(forwardedFor((await exchange(port, ['PROXY TCP4 203.0.113.11 10.0.0.1 1 80\r\n', get('/after')])).replies[0]), '203.0.113.11')
  writeFileSync(gw.configFile, without)
  t.equal((await gw.reload()).ok, true)
  t.equal(forwardedFor((await exchange(port, [get('/off')])).replies[0]), '127.0.0.1')
})

t.test('mistakes are located errors', async t => {
  const file = `${tempDir(t, 'proxy-protocol-config')}/gateway.yaml`
  const validate = async (proxyProtocol: string): Promise<{ code: number, stderr: string }> => {
    writeFileSync(file, `proxyProtocol: ${proxyProtocol}
upstreams:
  backend: { targets: [http://127.0.0.1:9] }
routes:
  - { name: a, pathPrefix: /, upstream: backend }
`)
    return await gateway(['validate', '-c', file])
  }
  const zero = await validate('{ from: [10.0.0.0/8], timeout: 0s }')
  t.equal(zero.code, 1)
  t.match(zero.stderr, /gateway\.yaml:1:\d+ proxyProtocol\.timeout: must be more than 0/)
  const ranges = await validate('{ from: [10.1.2.3/8, balancer.internal] }')
  t.equal(ranges.code, 1)
  t.match(ranges.stderr, /gateway\.yaml:1:\d+ proxyProtocol\.from\[0\]: "10\.1\.2\.3\/8" has bits set beyond its \/8/)
  t.match(ranges.stderr, /gateway\.yaml:1:\d+ proxyProtocol\.from\[1\]: "balancer\.internal" is not an IP address/)
  t.match((await validate('{ from: [] }')).stderr, /proxyProtocol\.from: expected at least one address or CIDR/)
  t.equal((await validate('{ from: [loopback, 10.0.0.0/8, "2001:db8::/32"], timeout: 2s }')).code, 0, 'keywords, CIDRs of both families')
})
