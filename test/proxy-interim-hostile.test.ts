// Upstream `100 Continue` heads the gateway drops on the socket (src/proxy/interim-responses.ts),
// against a raw upstream written byte for byte: a 100 head whose lines end in a bare LF (RFC 9112
// §2.2 lets a recipient accept one) must end at its first empty line, or the final head is dropped
// with it and the final response's body, which an attacker may write, is relayed as the response;
// and a 100 after a `103 Early Hints` or a `102 Processing` must be dropped as one at the start is,
// where it reached undici, which destroyed the connection: a 502 counted as a reset, the GET sent
// again, each toward the ejection of a healthy target.
import t from 'tap'
import net from 'node:net'
import { once } from 'node:events'
import { startGateway } from './helpers/gateway.js'
import { rawRequest } from './helpers/raw-http.js'
import { eventually, metric } from './helpers/ratelimit.js'
import type { Teardown } from './helpers/teardown.js'

// The text of a response with a cookie, as the body of the final one (a file an attacker uploaded).
const EVIL = 'HTTP/1.1 200 OK\r\nSet-Cookie: session=attacker\r\nContent-Length: 4\r\n\r\nEVIL'
const NOT_FOUND = `HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: ${EVIL.length}\r\n\r\n${EVIL}`
const OK = 'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal'
const HINTS = 'HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n'
const CONTINUE = 'HTTP/1.1 100 Continue\r\n\r\n'

// Answers by request path, in pieces written 50 ms apart (one piece: one write). A number is a
// pause of that many milliseconds instead.
const ANSWERS: Record<string, ReadonlyArray<string | number>> = {
  // 100 heads ended by each mix of CRLF and bare LF, then the 404 whose body reads as a response
  '/lf-lf': ['HTTP/1.1 100 Continue\n\n' + NOT_FOUND],
  '/lf-crlf': ['HTTP/1.1 100 Continue\n\r\n' + NOT_FOUND],
  '/crlf-lf': ['HTTP/1.1 100 Continue\r\n\n' + NOT_FOUND],
  '/field-lf-lf': ['HTTP/1.1 100 Continue\r\nX-Pad: a\n\n' + NOT_FOUND],
  '/no-reason-lf': ['HTTP/1.1 100\n\n' + NOT_FOUND],
  '/twice-lf': ['HTTP/1.1 100 Continue\n\nHTTP/1.1 100 Continue\r\n\n' + NOT_FOUND],
  // the same, split by the network inside the empty line
  '/split-lf': ['HTTP/1.1 100 Continue\n', '\n' + NOT_FOUND],
  '/split-lf-cr': ['HTTP/1.1 100 Continue\n\r', '\n' + NOT_FOUND],
  // after an interim response
  '/hints-lf': [HINTS + 'HTTP/1.1 100 Continue\n\n' + NOT_FOUND],
  // a 100 after other interim responses, all in one write
  '/hints-continue': [HINTS + CONTINUE + OK],
  '/processing-continue': ['HTTP/1.1 102 Processing\r\n\r\n' + CONTINUE + OK],
  '/mixed': [HINTS + CONTINUE + 'HTTP/1.1 102 Processing\r\n\r\n' + CONTINUE + CONTINUE + 'HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 100\r\n\r\n' + OK],
  // split inside each head, and a final body whose second piece reads as a 100 head (relayed whole)
  '/split-mixed': [
    'HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n', '\r\nHTTP/1.1 10', '0 Continue\r\n', '\r\nHTTP/1.1 1', '03 Early Hints\r\n\r\n' + CONTINUE +
    'HTTP/1.1 200 OK\r\nContent-Length: 33\r\n\r\n', 'HTTP/1.1 100 Continue\r\n\r\nfinal!!!'
  ],
  // response: 1s. The 103 at 600 ms starts the deadline again (undici must see it), the 100 at
  // 900 ms is dropped, the final head at 1200 ms is in time.
  '/hint-continue-late': [600, HINTS, 300, CONTINUE, 300, 'HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate'],
  '/ok': ['HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok']
}

// Answers that go on until the connection closes: a 103, then a 100 head that never ends.
const STREAMS: Record<string, (socket: net.Socket) => void> = {
  '/hints-continue-unending': (socket) => {
    socket.write(HINTS + 'HTTP/1.1 100 Continue\r\nX-Pad: ')
    const timer = setInterval(() => { if (!socket.destroyed) socket.write('a'.repeat(8192)) }, 20)
    socket.once('close', () => { clearInterval(timer) })
  }
}

async function writePieces (socket: net.Socket, pieces: ReadonlyArray<string | number>): Promise<void> {
  for (const [i, piece] of pieces.entries()) {
    if (typeof piece === 'number') {
      await new Promise(resolve => setTimeout(resolve, piece))
      continue
    }
    if (socket.destroyed) return
    socket.write(piece)
    if (i < pieces.length - 1 && typeof pieces[i + 1] !== 'number') await new Promise(resolve => setTimeout(resolve, 50))
  }
}

/** A raw upstream answering by path, and how many requests reached it by path. */
async function rawUpstream (t: Teardown): Promise<{ url: string, hits: Map<string, number> }> {
  const hits = new Map<string, number>()
  const sockets = new Set<net.Socket>()
  const server = net.createServer(socket => {
    sockets.add(socket)
    socket.once('close', () => sockets.delete(socket))
    socket.on('error', () => {})
    let buf = ''
    socket.on('data', (d: Buffer) => {
      buf += d.toString('latin1')
      for (;;) {
        const end = buf.indexOf('\r\n\r\n')
        if (end === -1) return
        const head = buf.slice(0, end)
        const path = head.split(' ')[1] ?? ''
        const length = /\r\ncontent-length: *(\d+)/i.exec(head)
        buf = buf.slice(end + 4 + (length === null ? 0 : Number(length[1])))
        hits.set(path, (hits.get(path) ?? 0) + 1)
        const stream = STREAMS[path]
        if (stream !== undefined) stream(socket)
        else void writePieces(socket, ANSWERS[path] ?? ['HTTP/1.1 500 Unknown\r\nContent-Length: 0\r\n\r\n'])
      }
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => {
    for (const socket of sockets) socket.destroy()
    server.close()
  })
  return { url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`, hits }
}

const config = (upstream: string, extra = ''): string => `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream}]${extra} }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

t.test('a 100 Continue head whose lines end in a bare LF ends at its first empty line: the final response is relayed as it came, never the text in its body', async t => {
  const upstream = await rawUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  const paths = ['/lf-lf', '/lf-crlf', '/crlf-lf', '/field-lf-lf', '/no-reason-lf', '/twice-lf', '/split-lf', '/split-lf-cr', '/hints-lf']
  for (const path of paths) {
    const reply = await rawRequest(gw.port, `GET ${path} HTTP/1.1\r\nHost: a\r\n`)
    t.equal(reply.status, 404, `${path}: the upstream's 404, not the 200 written in its body`)
    t.equal(reply.headers['set-cookie'], undefined, `${path}: no cookie of the body's reaches the client`)
    t.equal(reply.headers['content-type'], 'text/plain', `${path}: the 404's own headers`)
    t.equal(reply.body, EVIL, `${path}: the body relayed whole, as text`)
    t.equal(upstream.hits.get(path), 1, `${path}: sent upstream once`)
  }
  await eventually('the access lines', async () => paths.every(path => gw.lines.some(l => l.msg === 'request' && l.path === path)), 10_000)
  for (const path of paths) {
    t.match(gw.lines.find(l => l.msg === 'request' && l.path === path), { status: 404, error: undefined, retriedAfter: undefined }, `${path}: logged as the upstream's 404`)
  }
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total'), 0, 'no upstream error counted')
  t.equal((await rawRequest(gw.port, 'GET /ok HTTP/1.1\r\nHost: a\r\n')).body, 'ok', 'the gateway serves on')
})

t.test('a 100 Continue after a 103 Early Hints or a 102 Processing is dropped: the final response is relayed, sent upstream once, no reset counted, the target kept', async t => {
  const upstream = await rawUpstream(t)
  // two failures in a row would eject the lone target for a minute
  const gw = await startGateway(t, config(upstream.url, ', consecutiveFailures: 2, ejectFor: 1m'))
  const paths = ['/hints-continue', '/processing-continue', '/mixed', '/split-mixed', '/hints-continue', '/processing-continue', '/mixed', '/split-mixed']
  for (const path of paths) {
    const reply = await rawRequest(gw.port, `GET ${path} HTTP/1.1\r\nHost: a\r\n`)
    const body = path === '/split-mixed' ? 'HTTP/1.1 100 Continue\r\n\r\nfinal!!!' : 'final'
    t.same([reply.status, reply.body], [200, body], `${path}: the final response (a body that reads as a 100 head relayed whole)`)
  }
  const post = await rawRequest(gw.port, 'POST /hints-continue HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n', 'data')
  t.same([post.status, post.body], [200, 'final'], 'with a request body too')
  t.same(Object.fromEntries(upstream.hits), { '/hints-continue': 3, '/processing-continue': 2, '/mixed': 2, '/split-mixed': 2 }, 'each request sent upstream once, none again')
  await eventually('the access lines', async () => gw.lines.filter(l => l.msg === 'request').length === paths.length + 1, 10_000)
  for (const line of gw.lines.filter(l => l.msg === 'request')) {
    t.match(line, { status: 200, error: undefined, retriedAfter: undefined }, `${String(line.path)}: logged as a 200, no error, no retry`)
  }
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total'), 0, 'no upstream error (reset) counted')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_total'), 0, 'no retry')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_ejections_total'), 0, 'the target never ejected')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_target_healthy'), 1, 'and in rotation')
  t.equal((await rawRequest(gw.port, 'GET /ok HTTP/1.1\r\nHost: a\r\n')).body, 'ok', 'it serves on')
})

t.test('the 103 before a dropped 100 still reaches undici: it starts the response deadline again', async t => {
  const upstream = await rawUpstream(t)
  const gw = await startGateway(t, config(upstream.url, ', timeouts: { response: 1s }'))
  const late = await rawRequest(gw.port, 'GET /hint-continue-late HTTP/1.1\r\nHost: a\r\n')
  t.equal(`${late.status} ${late.body}`, '200 late', 'the final head at 1.2 s is due within 1 s of the 103 at 0.6 s, the 100 at 0.9 s dropped')
  t.equal(upstream.hits.get('/hint-continue-late'), 1, 'sent upstream once')
})

t.test('a 100 head after a 103 that never ends is held no further than the header limit: 502, and the gateway serves on', async t => {
  const upstream = await rawUpstream(t)
  const gw = await startGateway(t, config(upstream.url, ', timeouts: { response: 20s }'))
  const started = Date.now()
  const reply = await rawRequest(gw.port, 'GET /hints-continue-unending HTTP/1.1\r\nHost: a\r\n')
  t.equal(reply.status, 502)
  t.equal(reply.json?.error, 'GW_ERR_UPSTREAM_BAD_RESPONSE')
  t.ok(Date.now() - started < 10_000, `at the header limit, not at the 20 s response timeout (${Date.now() - started} ms)`)
  await eventually('the access line', async () => gw.lines.some(l => l.msg === 'request' && l.path === '/hints-continue-unending'), 10_000)
  t.match(gw.lines.find(l => l.msg === 'request' && l.path === '/hints-continue-unending'), { status: 502, error: 'bad_response' })
  t.equal((await rawRequest(gw.port, 'GET /ok HTTP/1.1\r\nHost: a\r\n')).body, 'ok', 'the gateway serves on')
})
