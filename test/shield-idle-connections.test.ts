// A connection that sends nothing is closed after server.headersTimeout, over TLS too. node's HTTP
// layer answers one that sends no request within headersTimeout with a 408; a TLS handshake never
// finished was held by node's own default, 120 s, so a client that connected and sent no
// ClientHello held its place in server.maxConnections 12 times as long. A request that began is
// never cut by this: not one whose bytes came in the PROXY header's packet, not a quiet WebSocket.
import t from 'tap'
import { connect, type Socket } from 'node:net'
import { connect as tlsConnect } from 'node:tls'
import { once } from 'node:events'
import { startGateway } from './helpers/gateway.js'
import { startHttpServer, startUpstream } from './helpers/upstream.js'
import { parseResponses } from './helpers/raw-http.js'
import { metric } from './helpers/ratelimit.js'
import { localhostCertificate } from './helpers/tls.js'
import type { Teardown } from './helpers/teardown.js'

/**
 * A gateway with headersTimeout 1s (and `more` at the top level) whose every path goes to an
 * upstream that answers after 2.5 s, longer than that; its listener's port.
 */
async function gatewayToSlowUpstream (t: Teardown, more = ''): Promise<{ port: number, adminUrl: string, lines: Array<Record<string, unknown>> }> {
  const { url } = await startHttpServer(t, (_req, res) => { setTimeout(() => res.end('slow'), 2500) })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${more}
server: { headersTimeout: 1s }
upstreams:
  slow: { targets: [${url}] }
routes:
  - { name: slow, pathPrefix: /, upstream: slow }
`)
  return { port: Number(new URL(gw.url).port), adminUrl: gw.adminUrl, lines: gw.lines }
}

/** A connection to `port` that wrote `first` (nothing when empty). */
async function opened (port: number, first = ''): Promise<Socket> {
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  if (first !== '') socket.write(first)
  return socket
}

/**
 * What `socket` read, and the ms from now until it closed (null when still open after `within`
 * ms). It reads all along: a paused socket would not see the gateway's close.
 */
async function closedWithin (socket: Socket, within: number): Promise<{ after: number | null, text: string }> {
  const began = Date.now()
  let text = ''
  socket.setEncoding('latin1')
  socket.on('data', (chunk: string) => { text += chunk })
  const after = await Promise.race([
    once(socket, 'close').then(() => Date.now() - began),
    new Promise<null>(resolve => setTimeout(() => resolve(null), within))
  ])
  return { after, text }
}

const inTime = (after: number | null): boolean => after !== null && after >= 900 && after < 5000
const statuses = (text: string): number[] => parseResponses(text).map(r => r.status)

t.test('a connection that sends nothing gets 408 after headersTimeout; one whose request waits on a slow upstream does not', async t => {
  const { port } = await gatewayToSlowUpstream(t)
  const [idle, served] = await Promise.all([
    closedWithin(await opened(port), 8000),
    closedWithin(await opened(port, 'GET /a HTTP/1.1\r\nHost: a\r\n\r\n'), 4000)
  ])
  t.ok(inTime(idle.after), `the silent connection closed (${String(idle.after)} ms)`)
  t.same(statuses(idle.text), [408], 'with a 408')
  t.equal(served.after, null, 'the busy one kept open')
  t.same(statuses(served.text), [200], 'and answered after 2.5 s')
})

t.test('behind proxyProtocol: the header and then nothing gets 408; a request in the header\'s packet waiting on a slow upstream, or a quiet WebSocket, is kept', async t => {
  const { url: slow } = await startHttpServer(t, (_req, res) => { setTimeout(() => res.end('slow'), 2500) })
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
proxyProtocol: { from: [127.0.0.1], timeout: 5s }
server: { headersTimeout: 1s }
upstreams:
  slow: { targets: [${slow}] }
  live: { targets: [${up.url}] }
routes:
  - { name: live, pathPrefix: /live, upstream: live, websocket: true }
  - { name: slow, pathPrefix: /, upstream: slow }
`)
  const port = Number(new URL(gw.url).port)
  const header = 'PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n'
  const [idle, served, quiet] = await Promise.all([
    closedWithin(await opened(port, header), 8000),
    closedWithin(await opened(port, header + 'GET /a HTTP/1.1\r\nHost: a\r\n\r\n'), 4000),
    closedWithin(await opened(port, header + 'GET /live HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n'), 3000)
  ])
  t.ok(inTime(idle.after), `the header alone: closed (${String(idle.after)} ms)`)
  t.same(statuses(idle.text), [408])
  t.same(statuses(served.text), [200], 'the request that came with the header answered after 2.5 s')
  t.equal(served.after, null, 'its connection kept')
  t.match(quiet.text, /^HTTP\/1\.1 101 /, 'the WebSocket opened')
  t.equal(quiet.after, null, 'and was left open 3 s without a frame')
})

t.test('over TLS: a handshake never begun or never finished is closed after headersTimeout, and counted; a handshake and then nothing gets 408; a request waiting on a slow upstream is kept', async t => {
  const { cert, key } = localhostCertificate(t, 'gw-idle-tls')
  const { port, adminUrl, lines } = await gatewayToSlowUpstream(t, `tls: { cert: ${cert}, key: ${key} }`)
  const secure = async (): Promise<Socket> => {
    const socket = tlsConnect({ port, host: '127.0.0.1', servername: 'localhost', rejectUnauthorized: false })
    socket.on('error', () => {})
    await once(socket, 'secureConnect')
    return socket
  }
  const busy = await secure()
  busy.write('GET /a HTTP/1.1\r\nHost: a\r\n\r\n')
  const [noHello, partHello, noRequest, served] = await Promise.all([
    closedWithin(await opened(port), 8000),
    // the first bytes of a TLS record, and no more
    closedWithin(await opened(port, '\x16\x03\x01'), 8000),
    closedWithin(await secure(), 8000),
    closedWithin(busy, 4000)
  ])
  // closed by then, at once: answered as a bad request they waited the 2 s of a closing answer
  const atOnce = (after: number | null): boolean => after !== null && after >= 900 && after < 2500
  t.ok(atOnce(noHello.after), `no ClientHello: closed (${String(noHello.after)} ms), not after node's 120 s`)
  t.ok(atOnce(partHello.after), `a ClientHello begun and never finished: closed (${String(partHello.after)} ms)`)
  t.same([noHello.text, partHello.text], ['', ''], 'unanswered: there was no request')
  t.equal(await metric(adminUrl, 'gateway_tls_handshake_timeouts_total'), 2, 'both counted')
  t.same(lines.filter(l => l.msg === 'request' && l.status !== 200 && l.status !== 408), [], 'neither logged as a request')
  t.equal(await metric(adminUrl, 'gateway_requests_total', { status_class: '4xx' }), 1, 'nor counted as one: the 4xx is the 408 below')
  t.ok(inTime(noRequest.after), `a handshake and then nothing: closed (${String(noRequest.after)} ms)`)
  t.same(statuses(noRequest.text), [408], 'with a 408')
  t.same(statuses(served.text), [200], 'the request answered after 2.5 s')
  t.equal(served.after, null)
})
