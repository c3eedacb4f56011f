// An https upstream behind a public Host: the TLS server name and the certificate check use the
// target's host name, not the client's Host (which passes through), for requests and WebSocket
// upgrades alike. The gateway trusts the upstream's self-signed certificate through
// NODE_EXTRA_CA_CERTS, as an operator would with a private CA.
import t from 'tap'
import { createHash } from 'node:crypto'
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { createServer } from 'node:https'
import { connect, type AddressInfo } from 'node:net'
import { createSecureContext } from 'node:tls'
import type { Duplex } from 'node:stream'
import { spawnGateway, startGateway } from './helpers/gateway.js'
import { localhostCertificate } from './helpers/tls.js'
import { parseResponses, rawExchange } from './helpers/raw-http.js'
import { eventually, metric, send } from './helpers/ratelimit.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'
import { hostileRelay } from './helpers/hostile-tls-relay.js'

t.test('an https target named by host name gets its own name as TLS server name, whatever Host the client sends', async t => {
  const { cert, key } = localhostCertificate(t, 'gw-https-upstream')
  const names: string[] = []
  const upstream = createServer({ cert: readFileSync(cert), key: readFileSync(key) }, (req, res) => {
    res.setHeader('content-type', 'application/json')
    res.end(JSON.stringify({ host: req.headers.host }))
  })
  upstream.on('secureConnection', (socket: import('node:tls').TLSSocket) => { names.push(String((socket as unknown as { servername?: string }).servername)) })
  upstream.on('upgrade', (req, socket: Duplex) => {
    const accept = createHash('sha1').update(`${String(req.headers['sec-websocket-key'])}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64')
    socket.end(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`)
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
  const port = (upstream.address() as AddressInfo).port
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [https://localhost:${port}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend, websocket: true }
`, [], { env: { NODE_EXTRA_CA_CERTS: cert } })
  for (const host of ['api.example.com', 'other.example.com']) {
    const res = await send(`${gw.url}/x`, { headers: { host } })
    t.equal(res.status, 200, `Host ${host}: the certificate of localhost is accepted`)
    t.same(res.json, { host }, 'the client\'s Host still reaches the upstream')
  }
  t.same([...new Set(names)], ['localhost'], 'the server name sent is the target\'s')
  t.equal(names.length, 1, 'one connection for both Hosts: a new Host no longer reconnects')
  const text = await rawExchange(gw.port, 'GET /ws HTTP/1.1\r\nHost: api.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
    'Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n')
  t.equal(parseResponses(text)[0]?.status, 101, 'a WebSocket upgrade too')
  t.same(names.slice(1), ['localhost'], 'with the target\'s name')
})

t.test('a WebSocket upgrade to https targets named by address: retried past a refusing one, with the client\'s Host as TLS server name', async t => {
  const { cert, key } = localhostCertificate(t, 'gw-https-upstream-ws')
  const names: string[] = []
  // the name each handshake asks for, whether or not the gateway accepts the certificate then
  const context = createSecureContext({ cert: readFileSync(cert), key: readFileSync(key) })
  const upstream = createServer({ cert: readFileSync(cert), key: readFileSync(key), SNICallback: (name, done) => { names.push(name); done(null, context) } })
  upstream.on('upgrade', (req, socket: Duplex) => {
    const accept = createHash('sha1').update(`${String(req.headers['sec-websocket-key'])}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64')
    socket.end(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`)
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
  const refusing = new URL(await refusingUrl())
  // the refusing target is ejected for 1 ms and weighted to be picked first for every upgrade
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend:
    targets: [{ url: "https://127.0.0.1:${refusing.port}", weight: 1000 }, "https://127.0.0.1:${(upstream.address() as AddressInfo).port}"]
    consecutiveFailures: 1000
    ejectFor: 1ms
routes:
  - { name: all, pathPrefix: /, upstream: backend, websocket: true }
`, [], { env: { NODE_EXTRA_CA_CERTS: cert } })
  const upgrade = (host: string): string => `GET /ws HTTP/1.1\r\nHost: ${host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
    'Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n'
  t.equal(parseResponses(await rawExchange(gw.port, upgrade('localhost')))[0]?.status, 101, 'opened over TLS on the second target')
  t.same(names, ['localhost'], 'the server name is the client\'s Host, whose name the certificate holds')
  const line = await gw.waitForLog(l => l.msg === 'request' && l.path === '/ws')
  t.match(line, { status: 101, retriedAfter: 'refused' }, 'after the first target refused')
  // a Host the certificate does not name: the check refuses the target, as it would a request
  t.equal(parseResponses(await rawExchange(gw.port, upgrade('api.example.com')))[0]?.status, 502, 'a certificate for another name: 502')
  // a refused certificate is a connection never made, retried as a refused one is: the retry may
  // meet the same target again, once its 1 ms ejection is over
  t.ok(names.length > 1 && names.slice(1).every(name => name === 'api.example.com'), 'asked for by the client\'s Host')
})

t.test('a request to an https target named by address: the client\'s Host is the TLS server name the certificate is checked against', async t => {
  const { cert, key } = localhostCertificate(t, 'gw-https-upstream-address')
  const names: string[] = []
  // the name each handshake asks for, whether or not the gateway accepts the certificate then
  const context = createSecureContext({ cert: readFileSync(cert), key: readFileSync(key) })
  const upstream = createServer({ cert: readFileSync(cert), key: readFileSync(key), SNICallback: (name, done) => { names.push(name); done(null, context) } }, (req, res) => {
    res.setHeader('content-type', 'application/json')
    res.end(JSON.stringify({ host: req.headers.host }))
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["https://127.0.0.1:${(upstream.address() as AddressInfo).port}"], retries: 0 }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`, [], { env: { NODE_EXTRA_CA_CERTS: cert } })
  const named = await send(`${gw.url}/x`, { headers: { host: 'localhost' } })
  t.same([named.status, named.json], [200, { host: 'localhost' }], 'Host localhost: the certificate names it')
  t.same(names, ['localhost'], 'sent as the server name')
  const other = await send(`${gw.url}/x`, { headers: { host: 'api.example.com' } })
  t.equal(other.status, 502, 'a Host the certificate does not name: 502')
  t.same(names.slice(1), ['api.example.com'], 'asked for by that Host')
})

t.test('a certificate the gateway refuses is a connection never made: kind tls, tried on another target (retryOn: connect-failure), the target ejected', async t => {
  // self-signed and not trusted (no NODE_EXTRA_CA_CERTS in this process): DEPTH_ZERO_SELF_SIGNED_CERT
  const { cert, key } = localhostCertificate(t, 'gw-https-refused')
  const untrusted = createServer({ cert: readFileSync(cert), key: readFileSync(key) }, (_req, res) => { res.end('never relayed') })
  await new Promise<void>(resolve => untrusted.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { untrusted.closeAllConnections(); untrusted.close() })
  const refused = `https://localhost:${(untrusted.address() as AddressInfo).port}`
  const good = await startUpstream(t)
  // mixed: the refused target is weighted to be picked first, and back from its ejection (1 ms) by the next request
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  alone: { targets: ["${refused}"], retries: 0 }
  mixed:
    targets: [{ url: "${refused}", weight: 1000 }, "${good.url}"]
    retryOn: [connect-failure]
    ejectFor: 1ms
routes:
  - { name: alone, pathPrefix: /alone/, upstream: alone }
  - { name: mixed, pathPrefix: /, upstream: mixed, websocket: true }
`)
  const alone = await send(`${gw.url}/alone/x`)
  t.equal(alone.status, 502)
  t.match(alone.json, { error: 'GW_ERR_UPSTREAM_UNAVAILABLE', message: /TLS certificate/ }, 'the stable code, with a message that says the certificate was refused')
  t.notMatch(String(alone.json?.message), /reset/, 'not "refused or reset the connection"')
  await eventually('the access line', async () => gw.lines.some(l => l.msg === 'request' && l.path === '/alone/x'))
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/alone/x'), { status: 502, error: 'tls' }, 'logged as kind tls, not reset')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'alone', kind: 'tls' }), 1, 'counted as kind tls')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'alone', kind: 'reset' }), 0, 'not as a reset')
  t.match(gw.lines.find(l => l.msg === 'upstream target ejected' && l.upstream === 'alone'), { target: refused, reason: 'connect_failure' }, 'ejected at once, as a refused connection is')
  t.match((await send(`${gw.url}/alone/y`)).json, { error: 'GW_ERR_NO_HEALTHY_UPSTREAM' }, 'and skipped while ejected')

  const request = await send(`${gw.url}/x`)
  t.equal(request.status, 200, 'a request goes to the other target: retryOn: [connect-failure] covers a refused certificate')
  await eventually('its access line', async () => gw.lines.some(l => l.msg === 'request' && l.path === '/x'))
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/x'), { status: 200, retriedAfter: 'tls' }, 'retried after kind tls')
  const upgrade = 'GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
    'Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n'
  const socket = connect(gw.port, '127.0.0.1')
  socket.on('error', () => {})
  t.teardown(() => socket.destroy())
  socket.write(upgrade)
  const [head] = await once(socket, 'data', { signal: AbortSignal.timeout(10_000) }) as [Buffer]
  socket.destroy()
  t.match(head.toString('latin1'), /^HTTP\/1\.1 101 /, 'a WebSocket upgrade too')
  await eventually('its access line', async () => gw.lines.some(l => l.msg === 'request' && l.path === '/ws'))
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/ws'), { status: 101, retriedAfter: 'tls' }, 'retried after kind tls')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'mixed', kind: 'tls' }), 2, 'each attempt counted as kind tls')
})

t.test('a TLS connection broken under a GET (a record that fails to decrypt, then a reset) is a reset: the GET is sent again on a new connection, no certificate counted as refused', async t => {
  const { cert, key } = localhostCertificate(t, 'gw-https-upstream-bad-record')
  const upstream = createServer({ cert: readFileSync(cert), key: readFileSync(key) }, (req, res) => {
    // quiet long enough for the relay to break the first connection under the request
    setTimeout(() => res.end(JSON.stringify({ url: req.url })), 400)
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
  const relay = await hostileRelay(t, (upstream.address() as AddressInfo).port)
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [https://localhost:${relay.port}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`, [], { env: { NODE_EXTRA_CA_CERTS: cert } })
  const res = await send(`${gw.url}/doc`)
  await relay.reset
  t.equal(res.status, 200, `answered by a second attempt (${JSON.stringify(res.json)})`)
  t.same(res.json, { url: '/doc' })
  t.equal(relay.connections, 2, 'the first connection broke under the request, the second answered')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_total', { upstream: 'backend', reason: 'reset' }), 1, 'sent again after a reset')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'backend', kind: 'tls' }), 0, 'no certificate refused')
})
