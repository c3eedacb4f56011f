// The access log as an operator reads it: the gateway's own answers count their bytes, the
// outcome and the limit's name are separate fields, host and user agent are there, secrets in
// query strings are not, and a WebSocket gets a closing line.
import t from 'tap'
import http from 'node:http'
import { once } from 'node:events'
import { WebSocket } from 'ws'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { rawRequest } from './helpers/raw-http.js'

type Line = Record<string, unknown>
const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

// The request id is the gateway's (a client's X-Request-Id is believed from trusted proxies only):
// lines are found by the id the response carries.
// `body`: a POST announcing `announced` bytes that sends `sent` and no more (a body refused, or one
// that stalls), its connection closed once answered.
function send (port: number, path: string, headers: Record<string, string> = {}, body?: { sent: string, announced: number }): Promise<{ status: number, bytes: number, id: string }> {
  return new Promise((resolve, reject) => {
    const posting = body === undefined ? {} : { method: 'POST', headers: { ...headers, 'content-length': String(body.announced) } }
    const req = http.request({ host: '127.0.0.1', port, path, headers, agent: false, ...posting }, res => {
      let bytes = 0
      res.on('data', (c: Buffer) => { bytes += c.length })
      res.on('end', () => {
        resolve({ status: res.statusCode ?? 0, bytes, id: String(res.headers['x-request-id']) })
        if (body !== undefined) req.destroy()
      })
    })
    req.on('error', reject)
    if (body === undefined) req.end()
    else req.write(body.sent)
  })
}

/** A gateway config with one route to `upstream` and `extra` top-level settings. */
const oneRoute = (upstream: string, extra: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${extra}
upstreams:
  backend: { targets: ["${upstream}"] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`

async function lineOf (lines: Line[], match: (l: Line) => boolean): Promise<Line> {
  for (let i = 0; i < 500; i++) {
    const found = lines.find(match)
    if (found !== undefined) return found
    await sleep(10)
  }
  throw new Error('no such log line')
}

t.test('the gateway\'s own 401/404/429 answers: bytesOut, outcome and the limit name, host and userAgent', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { header: x-user, required: true }
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - name: api
    pathPrefix: /api/
    upstream: backend
    limits:
      ip: { algorithm: token-bucket, limit: 1, window: 1m }
`)
  // a token bucket (one token a minute), not a fixed window: an epoch-aligned minute would start
  // afresh if the clock crossed hh:mm:00 between alice's two requests
  const byId = (id: string): Promise<Line> => lineOf(gw.lines, l => l.msg === 'request' && l.requestId === id)

  const notFound = await send(gw.port, '/nowhere', { 'user-agent': 'probe/1.0', host: 'edge.example' })
  t.equal(notFound.status, 404)
  t.ok(notFound.bytes > 0)
  t.match(await byId(notFound.id), { status: 404, bytesOut: notFound.bytes, host: 'edge.example', userAgent: 'probe/1.0', route: '-' })

  const unauthorized = await send(gw.port, '/api/x')
  t.equal(unauthorized.status, 401)
  const ua = await byId(unauthorized.id)
  t.match(ua, { status: 401, bytesOut: unauthorized.bytes, outcome: 'unauthorized' })
  t.equal(ua.limit, undefined, 'no limit was involved')

  const ok = await send(gw.port, '/api/x', { 'x-user': 'alice' })
  t.equal(ok.status, 200)
  const okLine = await byId(ok.id)
  t.equal(okLine.outcome, undefined, 'forwarded: no outcome of the gateway\'s own')
  t.equal(okLine.bytesOut, ok.bytes)

  const limited = await send(gw.port, '/api/x', { 'x-user': 'alice' })
  t.equal(limited.status, 429)
  t.match(await byId(limited.id), { status: 429, bytesOut: limited.bytes, outcome: 'rejected', limit: 'api.ip' })
})

t.test('the access line names the limit that refused: the local level as local, a gateway-wide limit by its own name', async t => {
  const up = await startUpstream(t)
  const yaml = (extra: string): string => oneRoute(up.url, extra)
  // a token bucket each (one token a minute): no window edge between the two requests
  for (const [extra, limit] of [['local: { limit: 1, window: 1m, burst: 1 }', 'local'], ['limits: { ip: { algorithm: token-bucket, limit: 1, window: 1m } }', 'ip']]) {
    const gw = await startGateway(t, yaml(extra as string))
    t.equal((await send(gw.port, '/x')).status, 200)
    const limited = await send(gw.port, '/x')
    t.equal(limited.status, 429)
    const line = await lineOf(gw.lines, l => l.msg === 'request' && l.requestId === limited.id)
    // exact: a match would take any name holding these letters
    t.same([line.status, line.outcome, line.limit, line.bytesOut], [429, 'rejected', limit, limited.bytes], `${limit as string}: ${extra as string}`)
  }
})

t.test('the forward\'s own error answers count their bytes too: 502 from a target that refuses, 503 with no healthy target', async t => {
  // a port nothing listens on: each connection is refused
  const closed = http.createServer()
  closed.listen(0, '127.0.0.1')
  await once(closed, 'listening')
  const refusing = `http://127.0.0.1:${(closed.address() as { port: number }).port}`
  closed.close()
  await once(closed, 'close')
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  gone: { targets: ["${refusing}"], retries: 0, consecutiveFailures: 1, ejectFor: 1m }
routes:
  - { name: api, pathPrefix: /, upstream: gone }
`)
  const byId = (id: string): Promise<Line> => lineOf(gw.lines, l => l.msg === 'request' && l.requestId === id)
  const refused = await send(gw.port, '/x')
  t.equal(refused.status, 502)
  t.ok(refused.bytes > 0, 'a JSON body')
  t.match(await byId(refused.id), { status: 502, bytesOut: refused.bytes, error: 'refused' })
  // the one failure ejected the only target
  const none = await send(gw.port, '/x')
  t.equal(none.status, 503)
  t.ok(none.bytes > 0, 'a JSON body')
  t.match(await byId(none.id), { status: 503, bytesOut: none.bytes })
})

t.test('a body refused 413 or 408 and the forward\'s 504 count their bytes too', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { clientBodyTimeout: 300ms }
upstreams:
  backend: { targets: ["${up.url}"], retries: 0, timeouts: { response: 300ms } }
routes:
  - { name: small, pathPrefix: /small/, upstream: backend, maxBodySize: 10 }
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const byId = (id: string): Promise<Line> => lineOf(gw.lines, l => l.msg === 'request' && l.requestId === id)
  const tooLarge = await send(gw.port, '/small/x', {}, { sent: 'x'.repeat(100), announced: 100 })
  t.equal(tooLarge.status, 413)
  t.ok(tooLarge.bytes > 0, 'a JSON body')
  t.match(await byId(tooLarge.id), { status: 413, bytesOut: tooLarge.bytes })
  // 5 bytes of the 50 announced, then nothing: clientBodyTimeout
  const stalled = await send(gw.port, '/x', {}, { sent: 'x'.repeat(5), announced: 50 })
  t.equal(stalled.status, 408)
  t.ok(stalled.bytes > 0, 'a JSON body')
  t.match(await byId(stalled.id), { status: 408, bytesOut: stalled.bytes })
  const slow = await send(gw.port, '/slow?ms=3000')
  t.equal(slow.status, 504)
  t.ok(slow.bytes > 0, 'a JSON body')
  t.match(await byId(slow.id), { status: 504, bytesOut: slow.bytes })
})

t.test('query parameters named in log.redactQuery are redacted (default list, then a custom one)', async t => {
  const up = await startUpstream(t)
  const yaml = (extra: string): string => oneRoute(up.url, extra)
  const gw = await startGateway(t, yaml(''))
  const path = '/x?token=abc&q=1&API_KEY=k1&Signature=s&password=p&secret=z&key=kk&other=2'
  const r = await send(gw.port, path)
  t.equal(r.status, 200)
  // the upstream still gets the query as sent: only the log line is redacted
  t.equal(up.log.at(-1), path)
  const line = await lineOf(gw.lines, l => l.requestId === r.id)
  t.equal(line.path, '/x?token=[redacted]&q=1&API_KEY=[redacted]&Signature=[redacted]&password=[redacted]&secret=[redacted]&key=[redacted]&other=2')
  // The spellings an upstream reads as a listed name: qs, PHP and Rails cut a "[...]" suffix,
  // some frameworks split on ";" too, and a decoded name is trimmed ("token%20", "+key"). Each was
  // logged in clear; each is redacted in the log and reaches the upstream as sent.
  const spellings: Array<[sent: string, logged: string]> = [
    ['/x?token[]=S1', '/x?token[]=[redacted]'],
    ['/x?api_key[0]=S2', '/x?api_key[0]=[redacted]'],
    ['/x?x=1;token=S3', '/x?x=1;token=[redacted]'],
    ['/x?token%20=S4', '/x?token%20=[redacted]'],
    ['/x?TOKEN%5B%5D=S5&q=1', '/x?TOKEN%5B%5D=[redacted]&q=1'],
    ['/x?a=1&+key=S6;b=2&&Secret[x][y]=S7;', '/x?a=1&+key=[redacted];b=2&&Secret[x][y]=[redacted];'],
    // credentials clients put in a query by default: OAuth 2.0's (RFC 6750 §2.3), presigned URLs'
    ['/x?access_token=S8&client_secret=S9&apikey=S10', '/x?access_token=[redacted]&client_secret=[redacted]&apikey=[redacted]'],
    ['/x?sv=2024&sig=S11&X-Amz-Credential=S12&X-Amz-Signature=S13&X-Amz-Security-Token=S14&X-Goog-Signature=S15&X-Goog-Credential=S16',
      '/x?sv=2024&sig=[redacted]&X-Amz-Credential=[redacted]&X-Amz-Signature=[redacted]&X-Amz-Security-Token=[redacted]&X-Goog-Signature=[redacted]&X-Goog-Credential=[redacted]'],
    // names that merely contain a listed one, and listed names as values, are left as they are
    ['/x?tokens=1&my_token[]=2;q=token&api_keys[0]=3', '/x?tokens=1&my_token[]=2;q=token&api_keys[0]=3']
  ]
  for (const [sent, logged] of spellings) {
    const res = await send(gw.port, sent)
    t.equal(up.log.at(-1), sent, `${sent} reaches the upstream as sent`)
    t.equal((await lineOf(gw.lines, l => l.requestId === res.id)).path, logged, `${sent} is logged as ${logged}`)
  }
  const noQuery = await send(gw.port, '/plain')
  t.equal(noQuery.status, 200)
  t.equal((await lineOf(gw.lines, l => l.requestId === noQuery.id)).path, '/plain')

  const custom = await startGateway(t, yaml('log: { redactQuery: [q, sig] }'))
  const rc = await send(custom.port, '/x?token=abc&q=1&sig=2')
  t.equal((await lineOf(custom.lines, l => l.requestId === rc.id)).path, '/x?token=abc&q=[redacted]&sig=[redacted]')

  const none = await startGateway(t, yaml('log: { redactQuery: [] }'))
  const rn = await send(none.port, '/x?token=abc&api_key=k1&q=1')
  t.equal((await lineOf(none.lines, l => l.requestId === rn.id)).path, '/x?token=abc&api_key=k1&q=1', 'redactQuery: [] logs every query as sent')
})

// An absolute-form target holding userinfo is refused before routing (RFC 9110 §4.2.4) and its line
// shows the target as sent: the client's password was in the log in clear.
t.test('an absolute-form target with a user and password is logged without them', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const targets: Array<[sent: string, logged: string]> = [
    ['http://alice:S3cretPw@x/abs?a=1&token=T', 'http://[redacted]@x/abs?a=1&token=[redacted]'],
    ['HTTP://S3cretPw@x', 'HTTP://[redacted]@x']
  ]
  for (const [sent, logged] of targets) {
    const r = await rawRequest(gw.port, `GET ${sent} HTTP/1.1\r\nHost: x\r\n`)
    t.equal(r.status, 400, sent)
    const line = await lineOf(gw.lines, l => l.requestId === r.headers['x-request-id'])
    t.equal(line.path, logged, `${sent} is logged as ${logged}`)
  }
  t.notOk(gw.lines.some(l => JSON.stringify(l).includes('S3cretPw')), 'no line holds the password')
})

t.test('a WebSocket gets a closing line with its duration and bytes both ways', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - { name: ws, pathPrefix: /ws, upstream: backend, websocket: true }
`)
  const ws = new WebSocket(`ws://127.0.0.1:${gw.port}/ws?token=secret`)
  // 'open' follows 'upgrade' in the same tick: both are awaited from the start
  const opened = once(ws, 'open')
  const [upgrade] = await once(ws, 'upgrade') as [http.IncomingMessage]
  const wsl = String(upgrade.headers['x-request-id'])
  await opened
  const message = 'm'.repeat(1000)
  ws.send(message)
  const [echo] = await once(ws, 'message') as [Buffer]
  t.equal(echo.toString(), message)
  const open = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(open, /^gateway_websockets_open\{route="ws"\} 1$/m)
  await sleep(300)
  ws.close()
  const closed = await lineOf(gw.lines, l => l.msg === 'websocket closed' && l.requestId === wsl)
  t.match(closed, { route: 'ws', target: up.url, path: '/ws?token=[redacted]' })
  // a 1000-byte text frame: 4 bytes of header (+4 of mask from the client), both ways, plus the close frames
  t.ok((closed.bytesIn as number) >= 1008 && (closed.bytesIn as number) < 1100, `bytesIn ${String(closed.bytesIn)}`)
  t.ok((closed.bytesOut as number) >= 1004 && (closed.bytesOut as number) < 1100, `bytesOut ${String(closed.bytesOut)}`)
  t.ok((closed.durationMs as number) >= 250, `durationMs ${String(closed.durationMs)}`)
  t.match(gw.lines.find(l => l.msg === 'request' && l.requestId === wsl), { status: 101 })
  const after = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(after, /^gateway_websockets_open\{route="ws"\} 0$/m)
})
