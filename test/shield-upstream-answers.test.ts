// Issue 15 item 10 (and from issue 11: 405 with Allow, DNS failures as their own kind): upstream
// answers the gateway relayed wrongly, and methods and codings it let through.
import t from 'tap'
import net from 'node:net'
import { once } from 'node:events'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { rawExchange, rawRequest } from './helpers/raw-http.js'
import { eventually, metric } from './helpers/ratelimit.js'
import type { Teardown } from './helpers/teardown.js'

// Answers written byte for byte, by request path: what node:http would never send itself.
const ANSWERS: Record<string, string> = {
  '/304': 'HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\nETag: "v1"\r\n\r\n',
  '/204': 'HTTP/1.1 204 No Content\r\nContent-Length: 10\r\nX-Done: yes\r\n\r\n',
  '/600': 'HTTP/1.1 600 Weird\r\nContent-Length: 2\r\n\r\nok',
  '/000': 'HTTP/1.1 000 Zero\r\nContent-Length: 2\r\n\r\nok',
  // a length and a coding at once: which one frames the body is a guess (request smuggling's
  // response side); nginx answers 502
  '/length-and-chunked': 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
  // a switch of protocols nobody asked for
  '/unasked-101': 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n',
  // the same without the fields undici itself refuses a 101 by (undici took it for an interim answer)
  '/bare-101': 'HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal',
  '/101-upgrade-only': 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n',
  '/gzip-chunked': 'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
  '/chunked-twice': 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
  '/chunked-upper': 'HTTP/1.1 200 OK\r\nTransfer-Encoding:  Chunked \r\n\r\n2\r\nok\r\n0\r\n\r\n',
  '/ok': 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok',
  // node:http's bound on a message's fields (2000), which undici's (16 KiB of names and values) is not
  '/fields-2000': `HTTP/1.1 200 OK\r\n${'x: a\r\n'.repeat(1999)}Content-Length: 2\r\n\r\nok`,
  '/fields-2001': `HTTP/1.1 200 OK\r\n${'x: a\r\n'.repeat(2000)}Content-Length: 2\r\n\r\nok`,
  '/continue': 'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal'
}

// Answers written in pieces, 50 ms apart (CLOSE ends the connection): a response head split by the
// network, and what a server of another protocol answers (memcached's "ERROR").
const CLOSE = Symbol('close')
const RESET = Symbol('reset')
const PIECES: Record<string, ReadonlyArray<string | typeof CLOSE | typeof RESET>> = {
  '/split': ['HTTP/1.1 ', '200 OK\r\nContent-Length: 2\r\n\r\nok'],
  '/split-short': ['HTTP', '/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'],
  '/split-continue': ['HTTP/1.1 100 Continue\r\n', '\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal'],
  // a body whose bytes, read apart from its head, look like a 100 Continue head
  '/body-like-continue': ['HTTP/1.1 200 OK\r\nContent-Length: 33\r\n\r\n', 'HTTP/1.1 100 Continue\r\n\r\nfinal!!!'],
  '/not-http': ['ERROR\r\n', CLOSE],
  // an upstream that dies mid-body: undici reports it as a length mismatch, as it does a length
  // beside a coding (/length-and-chunked), but this one is a broken connection
  '/cut-body': ['HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n0123456789', CLOSE],
  '/cut-head': ['HTTP/1.1 ', CLOSE],
  // a body without length or chunks, read until the connection closes: a close (FIN) ends it, a
  // reset cuts it
  '/until-close': ['HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n' + 'x'.repeat(1000), CLOSE],
  '/until-reset': ['HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n' + 'x'.repeat(1000), RESET]
}

// Answers that go on until the connection closes: an interim response every 200 ms, or a
// 100 Continue head that never ends, 8 KiB more every 20 ms.
const STREAMS: Record<string, (socket: net.Socket) => void> = {
  '/hints-forever': (socket) => { every(socket, 200, () => 'HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n') },
  '/processing-forever': (socket) => { every(socket, 200, () => 'HTTP/1.1 102 Processing\r\n\r\n') },
  '/continue-unending': (socket) => {
    socket.write('HTTP/1.1 100 Continue\r\nX-Pad: ')
    every(socket, 20, () => 'a'.repeat(8192))
  },
  '/hints-then-ok': (socket) => { void writePieces(socket, ['HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n', 'HTTP/1.1 103 Early Hints\r\n\r\n', 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok']) },
  // a 103 at 600 ms, the final head at 1200 ms: late for a deadline from the request's end (1 s), in time for one from the 103
  '/hint-then-late': (socket) => {
    setTimeout(() => { socket.write('HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n') }, 600)
    setTimeout(() => { if (!socket.destroyed) socket.write('HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate') }, 1200)
  }
}

function every (socket: net.Socket, ms: number, piece: () => string): void {
  const timer = setInterval(() => { if (!socket.destroyed) socket.write(piece()) }, ms)
  socket.once('close', () => { clearInterval(timer) })
}

async function writePieces (socket: net.Socket, pieces: ReadonlyArray<string | typeof CLOSE | typeof RESET>): Promise<void> {
  for (const piece of pieces) {
    if (piece === CLOSE) socket.end()
    else if (piece === RESET) socket.resetAndDestroy()
    else socket.write(piece)
    await new Promise(resolve => setTimeout(resolve, 50))
  }
}

async function rawUpstream (t: Teardown): Promise<string> {
  const server = net.createServer(socket => {
    socket.on('error', () => {})
    let buf = ''
    socket.on('data', (d: Buffer) => {
      buf += d.toString('latin1')
      const end = buf.indexOf('\r\n\r\n')
      if (end === -1) return
      const path = buf.split(' ')[1] ?? ''
      buf = buf.slice(end + 4)
      const pieces = PIECES[path]
      const stream = STREAMS[path]
      if (stream !== undefined) stream(socket)
      else if (pieces !== undefined) void writePieces(socket, pieces)
      else socket.write(ANSWERS[path] ?? 'HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n')
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => server.close())
  return `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`
}

const config = (upstream: string, routes = '  - { name: all, pathPrefix: /, upstream: backend }'): string => `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream}] }
routes:
${routes}
`

t.test('an upstream 304 (or 204) with Content-Length and no body is relayed, the 204 without its Content-Length', async t => {
  const gw = await startGateway(t, config(await rawUpstream(t)))
  const reply = await rawRequest(gw.port, 'GET /304 HTTP/1.1\r\nHost: a\r\nIf-None-Match: "v1"\r\n')
  t.equal(reply.status, 304)
  t.equal(reply.headers.etag, '"v1"')
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/304'), { status: 304, error: undefined }, 'logged as a success')
  const noContent = await rawRequest(gw.port, 'GET /204 HTTP/1.1\r\nHost: a\r\n')
  t.equal(noContent.status, 204, 'a 204 with Content-Length too')
  t.equal(noContent.headers['x-done'], 'yes')
  t.equal(noContent.headers['content-length'], undefined, 'without its Content-Length (RFC 9110 §8.6: never in a 204)')
  t.equal(reply.headers['content-length'], '10', 'a 304 keeps its Content-Length (the length a 200 would have)')
  t.equal((await rawRequest(gw.port, 'GET /ok HTTP/1.1\r\nHost: a\r\n')).status, 200, 'the next request is fine')
})

t.test('an upstream 100 Continue (even twice) then the final response: the final response is relayed', async t => {
  const gw = await startGateway(t, config(await rawUpstream(t)))
  const get = await rawRequest(gw.port, 'GET /continue HTTP/1.1\r\nHost: a\r\n')
  t.equal(get.status, 200)
  t.equal(get.body, 'final')
  const post = await rawRequest(gw.port, 'POST /continue HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n', 'data')
  t.equal(post.status, 200, 'with a request body too')
  t.equal(post.body, 'final')
  t.equal((await rawRequest(gw.port, 'GET /ok HTTP/1.1\r\nHost: a\r\n')).body, 'ok', 'the pooled connection still reads the next response right')
  t.equal(gw.lines.filter(l => l.msg === 'request' && l.error !== undefined).length, 0, 'no error logged')
})

t.test('interim responses do not hold a request past timeouts.response, and a 100 head that never ends is refused', async t => {
  const upstream = await rawUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream}], timeouts: { response: 1s } }
  slow: { targets: [${upstream}], timeouts: { response: 20s } }
routes:
  - { name: slow, pathPrefix: /continue-unending, upstream: slow }
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // undici starts its headers timer again at each interim response: one a second held the
  // request for good, with no answer and no log line
  for (const path of ['/hints-forever', '/processing-forever']) {
    const reply = await rawRequest(gw.port, `GET ${path} HTTP/1.1\r\nHost: a\r\n`)
    t.equal(reply.status, 504, `${path}: 504`)
    t.equal(reply.json?.error, 'GW_ERR_UPSTREAM_TIMEOUT')
    const line = gw.lines.find(l => l.msg === 'request' && l.path === path)
    t.match(line, { status: 504, error: 'response_timeout' }, `${path}: logged as a response timeout`)
    t.ok(Number(line?.durationMs) < 10_000, `${path}: within the deadline of the first interim response (${String(line?.durationMs)} ms)`)
  }
  const hinted = await rawRequest(gw.port, 'GET /hints-then-ok HTTP/1.1\r\nHost: a\r\n')
  t.equal(`${hinted.status} ${hinted.body}`, '200 ok', 'interim responses then the final one: relayed')
  const late = await rawRequest(gw.port, 'GET /hint-then-late HTTP/1.1\r\nHost: a\r\n')
  t.equal(`${late.status} ${late.body}`, '200 late', 'the final head is due within timeouts.response of the first interim one (below 10 s, the gateway keeps that deadline itself)')
  // held whole before, past any header limit (20 MB in a helper's run) and copied again at every
  // read, until the 20 s response timeout: a 502 now, as undici answers a final head that large
  const unending = await rawRequest(gw.port, 'GET /continue-unending HTTP/1.1\r\nHost: a\r\n')
  t.equal(unending.status, 502, 'a 100 Continue head past the header limit: 502')
  t.equal(unending.json?.error, 'GW_ERR_UPSTREAM_BAD_RESPONSE')
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/continue-unending'), { status: 502, error: 'bad_response' })
  t.equal((await rawRequest(gw.port, 'GET /ok HTTP/1.1\r\nHost: a\r\n')).body, 'ok', 'the gateway serves on')
})

t.test('a response head split by the network, or an answer that is not HTTP, never stalls the gateway', async t => {
  const gw = await startGateway(t, config(await rawUpstream(t)))
  const get = async (path: string): Promise<string> => {
    const reply = await rawRequest(gw.port, `GET ${path} HTTP/1.1\r\nHost: a\r\n`)
    return `${reply.status} ${reply.status === 200 ? reply.body : String(reply.json?.error)}`
  }
  // each used to put the bytes back on the socket and read them again for ever: the event loop
  // starved, every route and the admin listener stopped answering, SIGTERM with them
  t.equal(await get('/split'), '200 ok', 'a head split after "HTTP/1.1 "')
  t.equal(await get('/split-short'), '200 ok', 'a head split after "HTTP"')
  t.equal(await get('/split-continue'), '200 final', 'a 100 Continue whose blank line comes later')
  t.equal(await get('/body-like-continue'), '200 HTTP/1.1 100 Continue\r\n\r\nfinal!!!', 'a body that reads like a 100 Continue is relayed whole')
  t.equal(await get('/not-http'), '502 GW_ERR_UPSTREAM_BAD_RESPONSE', 'not HTTP: 502 at once')
  t.match(await get('/cut-head'), /^502 /, 'a head cut short by the upstream closing: 502')
  t.equal(await get('/ok'), '200 ok', 'the gateway still answers')
  t.equal((await fetch(`${gw.adminUrl}/healthz`)).status, 200, 'so does its admin listener')
})

t.test('an invalid upstream status (600, 000), an unknown transfer coding, a length beside a coding or a 101 unasked gets 502, counted as a bad response', async t => {
  // each counts toward the target's ejection (the next test): more than six in a row are allowed here
  const gw = await startGateway(t, config(await rawUpstream(t)).replace('targets: [', 'consecutiveFailures: 100, targets: ['))
  // Two Transfer-Encoding fields are two codings (RFC 9112 §6.1), even when both say chunked.
  const paths = ['/600', '/000', '/gzip-chunked', '/chunked-twice', '/length-and-chunked', '/unasked-101', '/bare-101', '/101-upgrade-only', '/fields-2001']
  for (const path of paths) {
    const reply = await rawRequest(gw.port, `GET ${path} HTTP/1.1\r\nHost: a\r\n`)
    t.equal(reply.status, 502, `${path}: 502`)
    t.equal(reply.json?.error, 'GW_ERR_UPSTREAM_BAD_RESPONSE', `${path}: a bad response, not an unavailable upstream`)
    t.match(gw.lines.find(l => l.msg === 'request' && l.path === path), { status: 502, error: 'bad_response', retriedAfter: undefined }, `${path}: logged as a bad response, not retried`)
  }
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { kind: 'bad_response' }), paths.length)
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { kind: 'reset' }), 0, 'none of them counted as a reset')
  const cut = await rawRequest(gw.port, 'GET /cut-body HTTP/1.1\r\nHost: a\r\n')
  t.equal(cut.status, 200, 'a body cut short by the upstream\'s close: its head went out')
  await eventually('the access line', async () => gw.lines.some(l => l.msg === 'request' && l.path === '/cut-body'), 10_000)
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/cut-body'), { error: 'reset' }, 'a broken connection, logged as a reset')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { kind: 'reset' }), 1, 'and counted as one')
  const many = await rawExchange(gw.port, 'GET /fields-2000 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n')
  t.equal(many.split('\r\n')[0], 'HTTP/1.1 200 OK', '2000 fields, node:http\'s own bound: relayed')
  t.equal((many.match(/\r\nx: a/g) ?? []).length, 1999, 'all of its fields')
  const chunked = await rawRequest(gw.port, 'GET /chunked-upper HTTP/1.1\r\nHost: a\r\n')
  t.equal(chunked.status, 200, 'one chunked coding, in any case and with spaces, is relayed')
  t.equal(chunked.headers['transfer-encoding'], 'chunked')
  t.equal(chunked.body, '2\r\nok\r\n0\r\n\r\n', 'the body, chunked again by node:http')
})

t.test('a body read until the upstream closes is whole at a close, and cut at a reset, never relayed as whole', async t => {
  const gw = await startGateway(t, config(await rawUpstream(t)).replace('targets: [', 'consecutiveFailures: 100, targets: ['))
  const whole = await rawRequest(gw.port, 'GET /until-close HTTP/1.1\r\nHost: a\r\n')
  t.equal(whole.status, 200)
  t.ok(whole.body.includes('x'.repeat(1000)) && whole.body.endsWith('\r\n0\r\n\r\n'), 'closed by a FIN: the body whole, its chunked answer ended with the last chunk')
  const cut = await rawRequest(gw.port, 'GET /until-reset HTTP/1.1\r\nHost: a\r\n')
  t.equal(cut.status, 200, 'its head went out')
  t.ok(cut.body.includes('x'.repeat(1000)), 'what came before the reset was relayed')
  t.notOk(cut.body.endsWith('0\r\n\r\n'), 'without the last chunk: the client knows its answer was cut')
  await eventually('the access line', async () => gw.lines.some(l => l.msg === 'request' && l.path === '/until-reset'), 10_000)
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/until-close'), { status: 200, error: undefined }, 'the close: a success')
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/until-reset'), { status: 502, sentStatus: 200, error: 'reset' }, 'the reset: logged as a broken connection')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { kind: 'reset' }), 1, 'and counted as one')
})

t.test('such heads count toward the target\'s ejection, as an answer that is not HTTP does', async t => {
  const gw = await startGateway(t, config(await rawUpstream(t)).replace('targets: [', 'consecutiveFailures: 2, ejectFor: 1m, targets: ['))
  const first = await rawRequest(gw.port, 'GET /600 HTTP/1.1\r\nHost: a\r\n')
  const second = await rawRequest(gw.port, 'GET /gzip-chunked HTTP/1.1\r\nHost: a\r\n')
  t.same([first.status, second.status], [502, 502])
  const third = await rawRequest(gw.port, 'GET /ok HTTP/1.1\r\nHost: a\r\n')
  t.equal(third.json?.error, 'GW_ERR_NO_HEALTHY_UPSTREAM', 'two in a row ejected the lone target')
  t.ok(gw.lines.some(l => l.msg === 'upstream target ejected' && l.reason === 'consecutive_failures'))
})

t.test('a request with a transfer coding other than chunked gets 501 and never reaches the upstream', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  const reply = await rawRequest(gw.port, 'POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n', '2\r\nok\r\n0\r\n\r\n')
  t.equal(reply.status, 501)
  t.equal(reply.json?.error, 'GW_ERR_NOT_IMPLEMENTED')
  t.equal(upstream.requests, 0)
  const chunked = await rawRequest(gw.port, 'POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n', '2\r\nok\r\n0\r\n\r\n')
  t.equal(chunked.status, 200, 'plain chunked passes')
})

t.test('TRACE gets 405 unless a route lists it; a method no route of the path accepts gets 405 with Allow', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url, `  - { name: login, path: /login, methods: [POST], upstream: backend }
  - { name: debug, pathPrefix: /debug/, methods: [GET, TRACE], upstream: backend }
  - { name: all, pathPrefix: /api/, upstream: backend }`))
  const trace = await rawRequest(gw.port, 'TRACE /api/x HTTP/1.1\r\nHost: a\r\nCookie: session=secret\r\n')
  t.equal(trace.status, 405, 'TRACE on a route without methods')
  t.equal(trace.json?.error, 'GW_ERR_METHOD_NOT_ALLOWED')
  t.equal(trace.headers.allow, 'GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS', 'Allow lists what the route takes, without TRACE')
  t.equal((await rawRequest(gw.port, 'TRACE /debug/x HTTP/1.1\r\nHost: a\r\n')).status, 200, 'a route that lists TRACE takes it')
  const get = await rawRequest(gw.port, 'GET /login HTTP/1.1\r\nHost: a\r\n')
  t.equal(get.status, 405, 'GET on a POST-only path: 405, not 404')
  t.equal(get.headers.allow, 'POST')
  t.equal((await rawRequest(gw.port, 'GET /nowhere HTTP/1.1\r\nHost: a\r\n')).status, 404, 'a path no route has: 404')
  t.same(upstream.log, ['/debug/x'], 'only the listed TRACE reached the upstream')
})

t.test('an upstream host name that does not resolve is logged and counted as dns, not refused', async t => {
  // .invalid never resolves (RFC 6761 §6.4)
  const gw = await startGateway(t, config('http://gw-test.invalid:80'))
  const reply = await rawRequest(gw.port, 'GET /x HTTP/1.1\r\nHost: a\r\n')
  t.equal(reply.status, 502)
  t.equal(reply.json?.error, 'GW_ERR_UPSTREAM_DNS')
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/x'), { error: 'dns' })
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { kind: 'dns' }), 1)
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { kind: 'refused' }), 0)
})
