// The 429 of each kind of rejection, byte for byte as the client reads it off the socket. Since
// issue 13 item 5 a limit's answer is built once (src/limit/limiter.ts RejectTemplate) and written
// with one writeHead: the fields, their values and the body must stay the ones clients know, and a
// shared header list must never carry one request's values into another's answer.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { rawExchange } from './helpers/raw-http.js'

interface Answer {
  readonly status: number
  /** Every header line but Date, lowercase names, in the order sent. */
  readonly lines: string[]
  readonly body: string
}

async function get (port: number, path: string): Promise<Answer> {
  const text = await rawExchange(port, `GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`)
  const end = text.indexOf('\r\n\r\n')
  const [statusLine, ...lines] = text.slice(0, end).split('\r\n')
  return {
    status: Number((statusLine ?? '').split(' ')[1]),
    lines: lines.filter(l => !/^date:/i.test(l)).map(l => { const i = l.indexOf(':'); return l.slice(0, i).toLowerCase() + l.slice(i) }),
    body: text.slice(end + 4)
  }
}

/** The answer a client of the gateway has always received for a rate limit's 429. */
function expected (a: Answer, dimension: string, limit: string, rateLimitLines: string[]): { lines: string[], body: string } {
  const requestId = /^x-request-id: (.*)$/m.exec(a.lines.join('\n'))?.[1] ?? ''
  const retryAfterMs = Number(/"retryAfterMs":(\d+)/.exec(a.body)?.[1])
  const body = JSON.stringify({ error: 'rate_limited', message: 'rate limit exceeded', dimension, limit, retryAfterMs, requestId })
  const retryAfter = `retry-after: ${Math.ceil(retryAfterMs / 1000)}`
  return {
    lines: [
      'content-type: application/json; charset=utf-8',
      `content-length: ${Buffer.byteLength(body)}`,
      `x-request-id: ${requestId}`,
      ...rateLimitLines,
      retryAfter,
      'connection: close'
    ].sort(),
    body
  }
}

t.test('the 429 of the shared level, the deny cache and the local level: same fields, values and body as ever', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
legacyHeaders: true
local: { limit: 3, window: 1m }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    limits:
      ip: { algorithm: fixed-window, limit: 1, window: 1h }
`)
  t.equal((await get(gw.port, '/a')).status, 200, 'the first request passes every level')
  // (a route's limit is named after the route: api.ip)
  // second: the ip limit rejects it (and the deny cache keeps the key); third: the deny cache
  // rejects it; fourth: the local bucket (3 a minute) is empty
  const shared = await get(gw.port, '/b')
  const denied = await get(gw.port, '/c')
  const local = await get(gw.port, '/d')
  const local2 = await get(gw.port, '/e')
  for (const [name, a, dimension, limit] of [['shared level', shared, 'ip', 'api.ip'], ['deny cache', denied, 'ip', 'api.ip'], ['local level', local, 'local', 'local'], ['local level again', local2, 'local', 'local']] as const) {
    t.equal(a.status, 429, `${name}: 429`)
    const ratelimit = /^ratelimit: "[^"]+";r=0;t=(\d+)$/m.exec(a.lines.join('\n'))?.[1] ?? 'missing'
    const quota = limit === 'local' ? 3 : 1
    const window = limit === 'local' ? 60 : 3600
    const want = expected(a, dimension, limit, [
      `ratelimit-policy: "${limit}";q=${quota};w=${window}`,
      `ratelimit: "${limit}";r=0;t=${ratelimit}`,
      `x-ratelimit-limit: ${quota}`,
      'x-ratelimit-remaining: 0',
      `x-ratelimit-reset: ${ratelimit}`
    ])
    t.same([...a.lines].sort(), want.lines, `${name}: exactly these header fields`)
    t.equal(a.body, want.body, `${name}: the body, byte for byte`)
  }
  t.not(/x-request-id: (.*)/.exec(local.lines.join('\n'))?.[1], /x-request-id: (.*)/.exec(local2.lines.join('\n'))?.[1], 'each answer has its own request id')
  t.ok(Number(/"retryAfterMs":(\d+)/.exec(local.body)?.[1]) > 1000, 'the local wait is the bucket\'s (3 a minute: seconds, not ms)')
})
