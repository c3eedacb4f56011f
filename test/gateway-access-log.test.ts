// The access log of a real gateway: exactly one JSON line per request, however it ended
// (forwarded, unrouted, bad path, upstream failure, client gone), with the fields the README lists.
import t from 'tap'
import http from 'node:http'
import { startGateway } from './helpers/gateway.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'

type Line = Record<string, unknown>

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** One request with a raw path; answers the status and the body length in bytes. */
function send (port: number, path: string, options: { method?: string, headers?: Record<string, string>, body?: string } = {}): Promise<{ status: number, bytes: number }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method: options.method ?? 'GET', headers: options.headers ?? {}, agent: false }, (res) => {
      let bytes = 0
      res.on('data', (chunk: Buffer) => { bytes += chunk.length })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end(options.body)
  })
}

t.test('one access line per request with requestId, ip, user, method, path, route, target, status, duration and bytes', async (t) => {
  const upstream = await startUpstream(t)
  const refusing = await refusingUrl()
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
# the test client stands for a trusted proxy: the request ids it sends are kept (issue 15 item 11)
trustedProxies: [127.0.0.1]
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${upstream.url}] }
  dead: { targets: [${refusing}] }
routes:
  - { name: dead, pathPrefix: /dead/, upstream: dead }
  - { name: api, pathPrefix: /api/, stripPrefix: /api, upstream: backend }
`)
  const accessLines = (): Line[] => gw.lines.filter((l) => l.msg === 'request')
  const lineOf = async (requestId: string): Promise<Line> => {
    for (let i = 0; i < 500; i++) {
      const found = accessLines().filter((l) => l.requestId === requestId)
      if (found.length > 0) return found[0] as Line
      await sleep(10)
    }
    throw new Error(`no access line for ${requestId}`)
  }
  let sent = 0

  const plain = await send(gw.port, '/api//v1/../items?q=%2e%2e&x=1', { headers: { 'x-request-id': 'log-1', 'x-forwarded-for': '203.0.113.9' } })
  sent++
  t.equal(plain.status, 200)
  const l1 = await lineOf('log-1')
  t.match(l1, {
    level: 30,
    requestId: 'log-1',
    ip: '203.0.113.9',
    method: 'GET',
    path: '/api/items?q=%2e%2e&x=1',
    route: 'api',
    target: upstream.url,
    status: 200,
    bytesIn: 0,
    bytesOut: plain.bytes
  })
  t.equal(l1.user, undefined, 'anonymous')
  t.type(l1.durationMs, 'number')
  t.ok((l1.durationMs as number) >= 0)
  t.equal(l1.error, undefined)

  const body = 'u'.repeat(1000)
  const upload = await send(gw.port, '/api/upload', { method: 'POST', body, headers: { 'x-request-id': 'log-2', 'x-user-id': 'alice' } })
  sent++
  t.equal(upload.status, 200)
  t.match(await lineOf('log-2'), { method: 'POST', path: '/api/upload', user: 'alice', status: 200, bytesIn: 1000, bytesOut: upload.bytes })

  const download = await send(gw.port, '/api/download?bytes=1048576', { headers: { 'x-request-id': 'log-3' } })
  sent++
  t.equal(download.bytes, 1048576)
  t.match(await lineOf('log-3'), { status: 200, bytesIn: 0, bytesOut: 1048576 })

  const slow = await send(gw.port, '/api/slow?ms=300', { headers: { 'x-request-id': 'log-4' } })
  sent++
  t.equal(slow.status, 200)
  t.ok(((await lineOf('log-4')).durationMs as number) >= 290, 'durationMs covers the upstream wait')

  t.equal((await send(gw.port, '/nowhere', { headers: { 'x-request-id': 'log-5' } })).status, 404)
  sent++
  t.match(await lineOf('log-5'), { requestId: 'log-5', ip: '127.0.0.1', method: 'GET', path: '/nowhere', route: '-', status: 404 })

  t.equal((await send(gw.port, '/api/a%2Fb', { headers: { 'x-request-id': 'log-6' } })).status, 400)
  sent++
  t.match(await lineOf('log-6'), { route: '-', status: 400 })

  t.equal((await send(gw.port, '/dead/x', { headers: { 'x-request-id': 'log-7' } })).status, 502)
  sent++
  t.match(await lineOf('log-7'), { route: 'dead', status: 502, error: 'refused', target: refusing })

  // a client that goes away: still one line, with 499
  const gone = http.request({ host: '127.0.0.1', port: gw.port, path: '/api/hang', headers: { 'x-request-id': 'log-8' }, agent: false })
  gone.on('error', () => {})
  gone.end()
  sent++
  while (!upstream.log.includes('/hang')) await sleep(10)
  gone.destroy()
  t.match(await lineOf('log-8'), { route: 'api', status: 499, error: 'client_abort', path: '/api/hang' })

  await sleep(200)
  const lines = accessLines()
  t.equal(lines.length, sent, 'exactly one access line per request')
  t.same(lines.map((l) => l.requestId).sort(), ['log-1', 'log-2', 'log-3', 'log-4', 'log-5', 'log-6', 'log-7', 'log-8'])
})

t.test('requests refused before they could be parsed are logged and counted too', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { maxHeaderSize: 2048 }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const tooLarge = await new Promise<{ status: number, requestId: unknown }>((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: gw.port, path: '/x', headers: { 'x-pad': 'p'.repeat(4000) }, agent: false }, (res) => {
      res.resume()
      res.on('end', () => resolve({ status: res.statusCode ?? 0, requestId: res.headers['x-request-id'] }))
    })
    req.on('error', reject)
    req.end()
  })
  t.equal(tooLarge.status, 431)
  let line: Line | undefined
  for (let i = 0; i < 200 && line === undefined; i++) {
    line = gw.lines.find((l) => l.msg === 'request' && l.status === 431)
    if (line === undefined) await sleep(10)
  }
  t.match(line, { requestId: tooLarge.requestId, ip: '127.0.0.1', route: '-', status: 431, error: 'HPE_HEADER_OVERFLOW' }, 'one access line, with the id the client got')
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(metrics, /gateway_requests_total\{route="-",method="-",status_class="4xx"\} 1/)
})
