// Expect: 100-continue is answered when the gateway starts to read the body (src/proxy/
// expect-continue.ts): an admitted upload gets its 100 and its connection stays open, and a request
// refused before its body (413 by Content-Length, a limit's 429) is answered without a 100, so its
// client never sends the body, and the connection is closed.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream, type EchoBody, type Upstream } from './helpers/upstream.js'
import { parseResponses, rawConnection } from './helpers/raw-http.js'
import type { Teardown } from './helpers/teardown.js'

const ALL = '  - { name: all, pathPrefix: /, upstream: backend }\n'

/** A gateway in front of `up`, with `routes` (YAML lines) and `head` before its upstreams. */
async function gatewayTo (t: Teardown, up: Upstream, routes = ALL, head = ''): Promise<Awaited<ReturnType<typeof startGateway>>> {
  return await startGateway(t, `listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\n${head}upstreams:\n  backend: { targets: [${up.url}] }\nroutes:\n${routes}`)
}

/** The final responses of a connection's bytes, the interim 100 Continue left out. */
const finals = (text: string): ReturnType<typeof parseResponses> => parseResponses(text.replaceAll('HTTP/1.1 100 Continue\r\n\r\n', ''))

/** `raw` on one connection to a gateway of its own with one route: the final answers, once it closed. */
async function servedOnce (t: Teardown, raw: string): Promise<ReturnType<typeof parseResponses>> {
  const gw = await gatewayTo(t, await startUpstream(t))
  const c = rawConnection(gw.port)
  c.send(raw)
  await c.closed
  return finals(c.received())
}

const upload = (path: string, length: number, extra = ''): string =>
  `PUT ${path} HTTP/1.1\r\nHost: a.test\r\nContent-Type: text/plain\r\nContent-Length: ${length}\r\nExpect: 100-continue\r\n${extra}\r\n`

t.test('an admitted upload gets 100 Continue, then its answer, and the connection stays open', async t => {
  const up = await startUpstream(t)
  const gw = await gatewayTo(t, up)
  const c = rawConnection(gw.port)
  c.send(upload('/first', 5))
  await c.untilText(/^HTTP\/1\.1 100 Continue\r\n\r\n/)
  t.equal(up.requests, 0, 'the 100 came before anything went upstream')
  c.send('hello')
  await c.untilText(/"body":"hello"/)
  // the same connection: keep-alive as for any request
  c.send('GET /second HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n')
  await c.closed
  const replies = finals(c.received())
  t.same(replies.map((r) => r.status), [200, 200])
  t.same(replies.map((r) => (r.json as unknown as EchoBody).url), ['/first', '/second'])
  t.not(replies[0]?.headers.connection, 'close')
})

t.test('refused before its body, by Content-Length, a limit, for want of credentials or of a route: no 100, the answer, the connection closed', async t => {
  const up = await startUpstream(t)
  const gw = await gatewayTo(t, up, `  - { name: small, pathPrefix: /small/, upstream: backend, maxBodySize: 1kb }
  - { name: private, pathPrefix: /private/, upstream: backend, auth: required }
  - name: limited
    pathPrefix: /limited/
    upstream: backend
    limits:
      user: { algorithm: fixed-window, limit: 1, window: 1h }
`, 'identity:\n  apiKeys: { header: x-api-key, keys: { good-key: alice } }\n')
  const tooLarge = rawConnection(gw.port)
  tooLarge.send(upload('/small/x', 10_000_000))
  await tooLarge.closed
  const [big] = parseResponses(tooLarge.received())
  t.equal(big?.status, 413, 'refused by its Content-Length')
  t.equal(big?.headers.connection, 'close')
  t.notMatch(tooLarge.received(), /100 Continue/, 'without a 100: the client never sent the body')

  const first = rawConnection(gw.port)
  first.send(upload('/limited/x', 2, 'X-Api-Key: good-key\r\n'))
  await first.untilText(/100 Continue/)
  first.send('ok')
  await first.untilText(/"body":"ok"/)
  const second = rawConnection(gw.port)
  second.send(upload('/limited/x', 2, 'X-Api-Key: good-key\r\n'))
  await second.closed
  const [limited] = parseResponses(second.received())
  t.equal(limited?.status, 429, 'over the limit')
  t.notMatch(second.received(), /100 Continue/)
  const anonymous = rawConnection(gw.port)
  anonymous.send(upload('/private/x', 2))
  await anonymous.closed
  t.equal(parseResponses(anonymous.received())[0]?.status, 401, 'no credentials')
  t.notMatch(anonymous.received(), /100 Continue/)
  const nowhere = rawConnection(gw.port)
  nowhere.send(upload('/nowhere', 2))
  await nowhere.closed
  t.equal(parseResponses(nowhere.received())[0]?.status, 404, 'no route')
  t.notMatch(nowhere.received(), /100 Continue/)
  t.equal(up.requests, 1, 'the admitted upload alone reached the upstream')
})

t.test('a bodyless request that asks for 100 Continue is served as any other, on a kept connection', async t => {
  const replies = await servedOnce(t, 'GET /a HTTP/1.1\r\nHost: a.test\r\nExpect: 100-continue\r\n\r\nGET /b HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n')
  t.same(replies.map((r) => r.status), [200, 200])
  t.same(replies.map((r) => (r.json as unknown as EchoBody).url), ['/a', '/b'])
})

t.test('an expectation other than 100-continue is ignored: the request is served, and Expect is not forwarded', async t => {
  const replies = await servedOnce(t, 'PUT /odd HTTP/1.1\r\nHost: a.test\r\nExpect: something-else\r\nContent-Length: 2\r\n\r\nhiGET /next HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n')
  t.same(replies.map((r) => r.status), [200, 200], 'no 417, and the connection kept')
  const echo = replies[0]?.json as unknown as EchoBody
  t.same([echo.url, echo.body, echo.headers.expect], ['/odd', 'hi', undefined])
})
