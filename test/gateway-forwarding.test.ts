// Forwarding through a real gateway (in process) to real upstreams: forwarded headers, hop-by-hop
// removal, route header rules, upstream failures and their codes, retries, client aborts, body and
// header size limits, weighted round-robin.
import t from 'tap'
import http, { type IncomingHttpHeaders } from 'node:http'
import net from 'node:net'
import { Readable } from 'node:stream'
import { startGateway } from './helpers/gateway.js'
import { parseResponses, rawConnection } from './helpers/raw-http.js'
import { eventually, metric } from './helpers/ratelimit.js'
import type { Teardown } from './helpers/teardown.js'
import { refusingUrl, startBlackhole, startHttpServer, startUpstream, type EchoBody, HOP_BY_HOP_PROBE } from './helpers/upstream.js'

interface Reply { status: number, headers: IncomingHttpHeaders, rawHeaders: string[], body: string }

interface SendOptions {
  method?: string
  headers?: Record<string, string | string[]>
  body?: string | Readable
  /** default: a connection of its own */
  agent?: http.Agent
}

/** One request on its own connection (or `agent`'s); `path` goes on the request line as is. */
function send (base: string, path: string, options: SendOptions = {}): Promise<Reply> {
  const { port } = new URL(base)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method: options.method ?? 'GET', headers: options.headers ?? {}, agent: options.agent ?? false }, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, rawHeaders: res.rawHeaders, body: Buffer.concat(chunks).toString() }))
      res.on('error', reject)
    })
    req.on('error', reject)
    const body = options.body
    if (body instanceof Readable) body.pipe(req)
    else req.end(body)
  })
}

const json = <T = Record<string, unknown>>(reply: Reply): T => JSON.parse(reply.body) as T

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

async function until (check: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!check()) {
    if (Date.now() > deadline) throw new Error('condition not met in time')
    await sleep(10)
  }
}

const HEAD = `listen: 127.0.0.1:0
admin: 127.0.0.1:0
`

/** A gateway in this process with one route, every path to `upstream`; `settings` adds top-level keys. */
async function oneRoute (t: Teardown, upstream: string, settings = ''): Promise<Awaited<ReturnType<typeof startGateway>>> {
  return await startGateway(t, `${HEAD}${settings === '' ? '' : settings + '\n'}upstreams:
  backend: { targets: [${upstream}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
}

t.test('X-Forwarded-*, Host and X-Request-Id', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  const given = await send(gw.url, '/items?id=7', {
    headers: { host: 'shop.example.com:8443', 'x-forwarded-for': '198.51.100.7, 203.0.113.1', 'x-request-id': 'req-abc.123', 'x-forwarded-proto': 'https', 'x-forwarded-host': 'evil.example' }
  })
  t.equal(given.status, 200)
  const seen = json<EchoBody>(given)
  t.equal(seen.headers.host, 'shop.example.com:8443', 'Host passes through')
  t.equal(seen.headers['x-forwarded-for'], '127.0.0.1', 'a chain from a client that is not a trusted proxy is replaced by its address')
  t.equal(seen.headers['x-forwarded-proto'], 'http', 'X-Forwarded-Proto is set by the gateway, not the client')
  t.equal(seen.headers['x-forwarded-host'], 'shop.example.com:8443', 'X-Forwarded-Host is the Host the client sent')
  t.equal(seen.rawHeaders.filter((name) => name.toLowerCase() === 'x-forwarded-proto').length, 1, 'one X-Forwarded-Proto')
  t.not(seen.headers['x-request-id'], 'req-abc.123', 'a request id chosen by a client that is not a trusted proxy is replaced')
  t.equal(given.headers['x-request-id'], seen.headers['x-request-id'], 'the id sent upstream is the one echoed')

  const generated = await send(gw.url, '/items')
  const seen2 = json<EchoBody>(generated)
  t.equal(seen2.headers['x-forwarded-for'], '127.0.0.1')
  t.match(seen2.headers['x-request-id'], /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/, 'a request id is generated')
  t.equal(generated.headers['x-request-id'], seen2.headers['x-request-id'], 'the generated id is the one echoed')

  const forged = ['x-client-ip', 'cf-connecting-ip', 'fastly-client-ip', 'x-cluster-client-ip', 'x-forwarded-port', 'x-forwarded-prefix', 'x-forwarded-server', 'x-forwarded-scheme', 'x-forwarded-ssl', 'front-end-https', 'forwarded', 'x-real-ip', 'true-client-ip', 'x-original-url', 'x-rewrite-url']
  const forging = await send(gw.url, '/items', { headers: Object.fromEntries(forged.map((name) => [name, name === 'forwarded' ? 'for=6.6.6.6' : '6.6.6.6'])) })
  const seenForged = json<EchoBody>(forging)
  t.same(forged.filter((name) => seenForged.headers[name] !== undefined), [], 'no client-made address, scheme, port, prefix or URL reaches the upstream')

  const bogus = await send(gw.url, '/items', { headers: { 'x-request-id': 'x'.repeat(300) } })
  const seen3 = json<EchoBody>(bogus)
  t.not(seen3.headers['x-request-id'], 'x'.repeat(300), 'an unusable request id is replaced')
  t.equal(bogus.headers['x-request-id'], seen3.headers['x-request-id'])
})

t.test('behind a trusted proxy, X-Forwarded-For gets the peer appended, not the client again', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url, 'trustedProxies: [127.0.0.1]')
  const reply = await send(gw.url, '/x', { headers: { 'x-forwarded-for': '203.0.113.9', 'x-request-id': 'xff-trusted' } })
  // RFC 7239 §5.2 / de-facto XFF: each hop appends the address it received the request from
  t.equal(json<EchoBody>(reply).headers['x-forwarded-for'], '203.0.113.9, 127.0.0.1', 'the chain stays complete')
  const line = gw.lines.find((l) => l.msg === 'request' && l.requestId === 'xff-trusted')
  t.equal(line?.ip, '203.0.113.9', 'while the client IP used for limits and logs is the one the trusted proxy reported')
  // a trusted proxy's id is kept only when usable: at most 128 characters, no spaces (it goes into every log line)
  const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/
  for (const unusable of ['a'.repeat(129), 'two words']) {
    const replaced = await send(gw.url, '/x', { headers: { 'x-request-id': unusable } })
    t.match(json<EchoBody>(replaced).headers['x-request-id'], uuid, `an unusable id from a trusted proxy is replaced (${unusable.length} characters)`)
    t.equal(replaced.headers['x-request-id'], json<EchoBody>(replaced).headers['x-request-id'], 'and the replacement echoed')
  }
  const longest = 'b'.repeat(128)
  t.equal(json<EchoBody>(await send(gw.url, '/x', { headers: { 'x-request-id': longest } })).headers['x-request-id'], longest, '128 characters are kept')
  // a TLS-terminating balancer: its scheme, host and port are the client's, kept
  const behindTls = await send(gw.url, '/x', { headers: { host: 'gw.internal', 'x-forwarded-proto': 'https', 'x-forwarded-host': 'shop.example', 'x-forwarded-port': '443' } })
  const seen = json<EchoBody>(behindTls).headers
  t.same([seen['x-forwarded-proto'], seen['x-forwarded-host'], seen['x-forwarded-port']], ['https', 'shop.example', '443'])
  const plain = json<EchoBody>(await send(gw.url, '/x', { headers: { host: 'gw.internal', 'x-forwarded-proto': 'gopher' } })).headers
  t.same([plain['x-forwarded-proto'], plain['x-forwarded-host']], ['http', 'gw.internal'], 'set by the gateway when the proxy sent none or nonsense')
  // kept only as exactly http or https (README, Headers): another case or a chain is the gateway's own
  for (const sent of ['HTTPS', 'https, http']) {
    const seenNow = json<EchoBody>(await send(gw.url, '/x', { headers: { host: 'gw.internal', 'x-forwarded-proto': sent } })).headers
    t.equal(seenNow['x-forwarded-proto'], 'http', `a trusted X-Forwarded-Proto of ${JSON.stringify(sent)} is replaced`)
  }
})

t.test('hop-by-hop headers are removed in both directions, including those Connection names', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  const reply = await send(gw.url, '/echo', {
    method: 'POST',
    body: Readable.from(['chunked ', 'body']),
    headers: HOP_BY_HOP_PROBE.headers
  })
  t.equal(reply.status, 200)
  const seen = json<EchoBody>(reply)
  t.equal(seen.body, 'chunked body')
  for (const name of HOP_BY_HOP_PROBE.dropped) {
    t.equal(seen.headers[name], undefined, `request: ${name} not forwarded`)
  }
  t.notMatch(String(seen.headers.connection ?? ''), /x-secret/i, 'the client Connection header is not forwarded')
  t.equal(seen.headers['x-end-to-end'], 'kept')

  const back = await send(gw.url, '/hop-by-hop')
  t.equal(back.status, 200)
  t.equal(back.body, 'hop-by-hop')
  for (const name of ['x-secret', 'keep-alive', 'proxy-connection', 'trailer', 'upgrade']) {
    t.equal(back.headers[name], undefined, `response: ${name} not forwarded`)
  }
  t.notMatch(String(back.headers.connection ?? ''), /x-secret/i, 'the upstream Connection header is not forwarded')
  t.equal(back.headers['x-kept'], 'yes')
})

t.test('route header rules set and remove, on the request and on the response', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `${HEAD}upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - name: ruled
    pathPrefix: /
    upstream: backend
    headers:
      request: { set: { x-env: prod, X-Forwarded-Proto: https }, remove: [cookie, X-Debug] }
      response: { set: { cache-control: no-store }, remove: [x-kept, content-type] }
`)
  const reply = await send(gw.url, '/anything', { headers: { cookie: 'session=1', 'x-debug': '1', 'x-env': 'dev', 'x-other': 'o' } })
  t.equal(reply.status, 200)
  const seen = json<EchoBody>(reply)
  t.equal(seen.headers['x-env'], 'prod', 'set replaces the client value')
  t.equal(seen.rawHeaders.filter((name) => name.toLowerCase() === 'x-env').length, 1)
  t.equal(seen.headers.cookie, undefined, 'cookie removed')
  t.equal(seen.headers['x-debug'], undefined, 'removal is case-insensitive')
  t.equal(seen.headers['x-forwarded-proto'], 'https', 'a rule overrides the gateway X-Forwarded-Proto')
  t.equal(seen.headers['x-other'], 'o')
  t.equal(reply.headers['cache-control'], 'no-store')
  t.equal(reply.headers['content-type'], undefined, 'response header removed')

  const hop = await send(gw.url, '/hop-by-hop')
  t.equal(hop.headers['x-kept'], undefined, 'response header removed')
  t.equal(hop.headers['cache-control'], 'no-store')
})

t.test('a rule on Host replaces the client\'s (set) or sends the target\'s (remove); X-Forwarded-Host keeps the client\'s', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `${HEAD}upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: set, pathPrefix: /set/, upstream: backend, headers: { request: { set: { Host: api.internal } } } }
  - { name: removed, pathPrefix: /removed/, upstream: backend, headers: { request: { remove: [host] } } }
`)
  const set = await send(gw.url, '/set/x', { headers: { host: 'shop.example' } })
  t.equal(set.status, 200, 'one Host reaches the upstream (two made every request a 400)')
  const seenSet = json<EchoBody>(set)
  t.same(seenSet.rawHeaders.filter((name) => name.toLowerCase() === 'host').length, 1)
  t.equal(seenSet.headers.host, 'api.internal')
  t.equal(seenSet.headers['x-forwarded-host'], 'shop.example')
  const removed = await send(gw.url, '/removed/x', { headers: { host: 'shop.example' } })
  t.equal(removed.status, 200)
  t.equal(json<EchoBody>(removed).headers.host, new URL(upstream.url).host, 'the target\'s own host')
})

t.test('upstream failures: 502 refused, 504 timeout, 503 when every target is ejected', async (t) => {
  const upstream = await startUpstream(t)
  const refusing = await refusingUrl()
  const gw = await startGateway(t, `${HEAD}upstreams:
  down: { targets: [${refusing}], ejectFor: 1m }
  slow: { targets: [${upstream.url}], timeouts: { response: 300ms } }
routes:
  - { name: down, pathPrefix: /down, upstream: down }
  - { name: slow-route, pathPrefix: /hang-fast, upstream: slow, stripPrefix: /hang-fast, timeouts: { response: 200ms } }
  - { name: slow, pathPrefix: /, upstream: slow }
`)
  const refused = await send(gw.url, '/down/x', { headers: { 'x-request-id': 'refused-1' } })
  t.equal(refused.status, 502)
  t.match(refused.headers['content-type'], /^application\/json/)
  t.same(json(refused), { error: 'GW_ERR_UPSTREAM_UNAVAILABLE', message: 'the upstream refused or reset the connection', requestId: refused.headers['x-request-id'] })
  t.match(refused.headers['x-request-id'], /^[0-9a-f-]{36}$/, 'a generated id')

  const ejected = await send(gw.url, '/down/x', { headers: { 'x-request-id': 'ejected-1' } })
  t.equal(ejected.status, 503, 'the refusing target is ejected')
  t.same(json(ejected), { error: 'GW_ERR_NO_HEALTHY_UPSTREAM', message: 'no healthy upstream target', requestId: ejected.headers['x-request-id'] })

  let started = Date.now()
  const timedOut = await send(gw.url, '/hang', { headers: { 'x-request-id': 'timeout-1' } })
  t.equal(timedOut.status, 504)
  t.same(json(timedOut), { error: 'GW_ERR_UPSTREAM_TIMEOUT', message: 'the upstream did not answer in time', requestId: timedOut.headers['x-request-id'] })
  t.ok(Date.now() - started >= 250, 'after the upstream response timeout')

  started = Date.now()
  const routeTimeout = await send(gw.url, '/hang-fast/hang')
  t.equal(routeTimeout.status, 504, 'the route timeout overrides the upstream one')
  t.ok(Date.now() - started < 2000)

  const reset = await send(gw.url, '/reset')
  t.equal(reset.status, 502)
  t.equal(json(reset).error, 'GW_ERR_UPSTREAM_UNAVAILABLE', 'a reset is a 502 too')

  const fine = await send(gw.url, '/slow?ms=50')
  t.equal(fine.status, 200, 'a slow answer within the timeout passes')
})

t.test('an idempotent request is retried once on another target; a POST only when its body was buffered', async (t) => {
  const good = await startUpstream(t, 'good')
  const refusing = await refusingUrl()
  // Smooth round-robin with equal weights picks the first target first: the refusing one.
  const gw = await startGateway(t, `${HEAD}upstreams:
  for-get: { targets: [${refusing}, ${good.url}], ejectFor: 1m }
  for-post: { targets: [${refusing}, ${good.url}], ejectFor: 1m, maxConnections: 8 }
routes:
  - { name: get, pathPrefix: /get, upstream: for-get }
  - { name: post, pathPrefix: /post, upstream: for-post }
`)
  const got = await send(gw.url, '/get/1')
  t.equal(got.status, 200, 'the client never sees the refused attempt')
  t.equal(json<EchoBody>(got).name, 'good')
  t.same(good.log, ['/get/1'])

  // Issue 15 item 15: a refused connection carried nothing, and a buffered body can be sent again.
  const posted = await send(gw.url, '/post/1', { method: 'POST', body: 'once', headers: { 'content-type': 'text/plain' } })
  t.equal(posted.status, 200, 'a POST refused by one target is retried on the other')
  t.equal(json<EchoBody>(posted).body, 'once', 'with its whole body')
  t.same(good.log, ['/get/1', '/post/1'])

  // A streamed body (server.bufferBodies: 0) cannot be replayed: the refusal is answered.
  const streaming = await startGateway(t, `${HEAD}server: { bufferBodies: 0 }
upstreams:
  for-post: { targets: [${refusing}, ${good.url}], ejectFor: 1m, maxConnections: 8 }
routes:
  - { name: post, pathPrefix: /post, upstream: for-post }
`)
  const streamed = await send(streaming.url, '/post/2', { method: 'POST', body: 'streamed', headers: { 'content-type': 'text/plain' } })
  t.equal(streamed.status, 502, 'a streamed POST is not retried')
  t.equal(json(streamed).error, 'GW_ERR_UPSTREAM_UNAVAILABLE')
  t.same(good.log, ['/get/1', '/post/1'], 'the streamed POST never reached the other target')
  // a POST without a body has nothing to replay: it is retried even when bodies are streamed (a
  // gateway of its own: the first one has ejected the refusing target)
  const fresh = await startGateway(t, `${HEAD}server: { bufferBodies: 0 }
upstreams:
  for-post: { targets: [${refusing}, ${good.url}], ejectFor: 1m, maxConnections: 8 }
routes:
  - { name: post, pathPrefix: /post, upstream: for-post }
`)
  const bodiless = await send(fresh.url, '/post/3', { method: 'POST' })
  t.equal(bodiless.status, 200, 'a POST without a body refused by one target is retried on the other')
  t.same(good.log, ['/get/1', '/post/1', '/post/3'])

  const again = await send(streaming.url, '/post/3', { method: 'POST', body: 'twice' })
  t.equal(again.status, 200, 'the refusing target is ejected, the next POST goes to the healthy one')
  t.equal(json<EchoBody>(again).body, 'twice')
})

t.test('a client that goes away cancels the upstream request', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  const aborted = upstream.nextAbort(10_000)
  const req = http.request({ host: '127.0.0.1', port: gw.port, path: '/hang', agent: false })
  req.on('error', () => {})
  req.end()
  await until(() => upstream.log.includes('/hang'))
  req.destroy()
  t.equal(await aborted, '/hang', 'the upstream saw its request closed')

  // the same mid-download: a long drip is cut at the upstream too
  const abortedDrip = upstream.nextAbort(10_000)
  const drip = http.request({ host: '127.0.0.1', port: gw.port, path: '/drip?chunks=1000&intervalMs=20', agent: false })
  drip.on('error', () => {})
  drip.on('response', (res) => {
    res.once('data', () => drip.destroy())
  })
  drip.end()
  t.equal(await abortedDrip, '/drip?chunks=1000&intervalMs=20')
})

t.test('a client that resets a connection with pipelined requests leaves none counted in flight', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  for (let i = 0; i < 3; i++) {
    const c = net.connect(gw.port, '127.0.0.1')
    c.on('error', () => {})
    c.write('GET /slow?ms=300 HTTP/1.1\r\nHost: a\r\n\r\nGET /slow?ms=300 HTTP/1.1\r\nHost: a\r\n\r\n')
    await until(() => upstream.log.length >= 2 * (i + 1))
    c.resetAndDestroy()
  }
  // node never closed the second response, which never had the connection: it stayed in flight
  await eventually('nothing in flight', async () => await metric(gw.adminUrl, 'gateway_requests_in_flight') === 0, 5000)
  t.equal(await metric(gw.adminUrl, 'gateway_requests_in_flight'), 0)
  t.equal((await send(gw.url, '/after')).status, 200, 'the gateway serves on')
})

t.test('maxBodySize: 413 beyond it, by Content-Length or while a chunked body streams', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `${HEAD}upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: small, pathPrefix: /, upstream: backend, maxBodySize: 1kb }
`)
  const fits = await send(gw.url, '/upload', { method: 'POST', body: 'x'.repeat(1024) })
  t.equal(fits.status, 200)
  t.same(json(fits), { bytes: 1024 })

  const tooLarge = await send(gw.url, '/upload', { method: 'POST', body: 'x'.repeat(1025), headers: { 'x-request-id': 'big-1' } })
  t.equal(tooLarge.status, 413)
  t.same(json(tooLarge), { error: 'GW_ERR_BODY_TOO_LARGE', message: 'the request body exceeds the route limit', requestId: tooLarge.headers['x-request-id'] })
  t.same(upstream.log, ['/upload'], 'a declared oversize body never reaches the upstream')

  const chunks = Array.from({ length: 8 }, () => 'y'.repeat(512))
  const chunked = await send(gw.url, '/upload', { method: 'POST', body: Readable.from(chunks) })
  t.equal(chunked.status, 413, 'a chunked body is cut when it grows past the limit')
  t.equal(json(chunked).error, 'GW_ERR_BODY_TOO_LARGE')

  const smallChunked = await send(gw.url, '/upload', { method: 'POST', body: Readable.from(['a'.repeat(500), 'b'.repeat(500)]) })
  t.equal(smallChunked.status, 200)
  t.same(json(smallChunked), { bytes: 1000 })
})

t.test('an upstream that refuses an upload early (413 while the body streams, then a lingering close) has its answer relayed', async (t) => {
  // As nginx and Go's net/http refuse a body: the answer at once, then the body read and dropped
  // for a while before the connection closes. (An upstream that closes with the body unread makes
  // its kernel reset the connection, and the reset can discard the answer in flight: a 502
  // then, as behind any proxy.) The body streams to the upstream as it comes, past what the
  // gateway buffers for a retry, so the answer comes while the client is still sending.
  const refusals: number[] = []
  const upstream = net.createServer((socket) => {
    socket.on('error', () => {})
    socket.once('data', () => {
      refusals.push(Date.now())
      socket.end('HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncontent-length: 22\r\nconnection: close\r\n\r\n{"error":"too large"}\n')
      socket.resume()
      setTimeout(() => socket.destroy(), 3000).unref()
    })
  })
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, `${HEAD}upstreams:
  backend: { targets: [http://127.0.0.1:${(upstream.address() as net.AddressInfo).port}] }
routes:
  - { name: uploads, pathPrefix: /, upstream: backend }
`)
  for (const framing of ['content-length', 'chunked'] as const) {
    // 4 MB in 64 KB steps every 10 ms: still streaming when the answer comes
    const total = 4 * 1024 * 1024
    const { port } = new URL(gw.url)
    const reply = await new Promise<{ status: number, body: string, sentWhenAnswered: number }>((resolve, reject) => {
      let sent = 0
      const req = http.request({ host: '127.0.0.1', port, path: '/upload', method: 'PUT', agent: false, headers: framing === 'content-length' ? { 'content-length': String(total) } : {} }, (res) => {
        const sentWhenAnswered = sent
        clearInterval(timer)
        let body = ''
        res.on('data', (chunk: Buffer) => { body += chunk.toString() })
        res.on('end', () => { resolve({ status: res.statusCode ?? 0, body, sentWhenAnswered }); req.destroy() })
      })
      req.on('error', reject)
      const chunk = Buffer.alloc(64 * 1024, 97)
      const timer = setInterval(() => {
        if (sent >= total) {
          clearInterval(timer)
          req.end()
          return
        }
        sent += chunk.length
        req.write(chunk)
      }, 10)
    })
    t.equal(reply.status, 413, `${framing}: the upstream's status`)
    t.equal(reply.body, '{"error":"too large"}\n', `${framing}: and its body`)
    t.ok(reply.sentWhenAnswered < total, `${framing}: answered while the body was still being sent (${reply.sentWhenAnswered} of ${total} bytes)`)
  }
  t.equal(refusals.length, 2, 'one upstream request per upload')
})

t.test('headers larger than server.maxHeaderSize get 431 JSON', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url, 'server: { maxHeaderSize: 2048 }')
  const ok = await send(gw.url, '/x', { headers: { 'x-pad': 'p'.repeat(1000) } })
  t.equal(ok.status, 200)
  const big = await send(gw.url, '/x', { headers: { 'x-pad': 'p'.repeat(4000) } })
  t.equal(big.status, 431)
  t.match(big.headers['content-type'], /^application\/json/)
  const body = json(big)
  t.match(body, { error: 'GW_ERR_HEADERS_TOO_LARGE', message: String, requestId: String }, 'the usual error body, with a request id')
  t.equal(big.headers['x-request-id'], body.requestId)
  t.same(upstream.log, ['/x'], 'the oversized request never reached the upstream')
})

/** Writes `raw` on a fresh connection and answers everything the gateway sends back until it closes. */
async function rawExchange (port: number, raw: string, timeoutMs = 10_000): Promise<{ text: string, ms: number }> {
  const started = Date.now()
  const socket = net.connect(port, '127.0.0.1')
  socket.setTimeout(timeoutMs, () => socket.destroy())
  socket.write(raw)
  let text = ''
  socket.setEncoding('latin1')
  for await (const chunk of socket) text += chunk as string
  return { text, ms: Date.now() - started }
}

function parseRaw (text: string): { status: number, headers: Record<string, string>, body: string } {
  const end = text.indexOf('\r\n\r\n')
  const [statusLine, ...lines] = text.slice(0, end).split('\r\n')
  const headers: Record<string, string> = {}
  for (const line of lines) {
    const colon = line.indexOf(':')
    headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim()
  }
  return { status: Number((statusLine ?? '').split(' ')[1]), headers, body: text.slice(end + 4) }
}

t.test('a malformed request gets 400 JSON with a request id', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  const { text } = await rawExchange(gw.port, 'GET /x HTTP/1.1\r\nHost: a\r\nbad header line\r\n\r\n')
  const reply = parseRaw(text)
  t.equal(reply.status, 400)
  const body = JSON.parse(reply.body) as Record<string, unknown>
  t.match(body, { error: 'GW_ERR_BAD_REQUEST', message: String, requestId: String })
  t.equal(reply.headers['x-request-id'], body.requestId)
  t.equal(upstream.requests, 0)
})

t.test('a request line longer than server.maxHeaderSize gets 414 JSON; fields past it still get 431', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url, 'server: { maxHeaderSize: 4096 }')
  const longTarget = parseRaw((await rawExchange(gw.port, `GET /${'a'.repeat(6000)} HTTP/1.1\r\nHost: a\r\n\r\n`)).text)
  t.equal(longTarget.status, 414)
  t.match(JSON.parse(longTarget.body), { error: 'GW_ERR_URI_TOO_LONG', message: /target is too long/, requestId: String })
  // a short line and a field over the limit; and a line that fits with fields past the rest
  for (const raw of [`GET /x HTTP/1.1\r\nHost: a\r\nX-Big: ${'b'.repeat(6000)}\r\n\r\n`, `GET /${'a'.repeat(3000)} HTTP/1.1\r\nHost: a\r\nX-Big: ${'b'.repeat(3000)}\r\n\r\n`]) {
    const reply = parseRaw((await rawExchange(gw.port, raw)).text)
    t.equal(reply.status, 431)
    t.equal((JSON.parse(reply.body) as { error: string }).error, 'GW_ERR_HEADERS_TOO_LARGE')
  }
  // a field continued in a later read, that read starting with a word and a space: still 431
  const split = rawConnection(gw.port)
  split.send('GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: agent')
  await sleep(100)
  split.send(`FOO ${'b'.repeat(6000)}\r\n\r\n`)
  await split.closed
  t.equal(parseRaw(split.received()).status, 431, 'a long field split across reads')
  t.equal(upstream.requests, 0)
})

t.test('request smuggling shapes are refused before anything reaches the upstream', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  const attempts = [
    // CL.TE (RFC 9112 §6.3: a sender must not send both; a server ought to treat it as an error)
    'POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n',
    // two different Content-Length values
    'POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 40\r\n\r\nabcGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n',
    // a Transfer-Encoding that does not end with chunked
    'POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n'
  ]
  for (const raw of attempts) {
    const { text } = await rawExchange(gw.port, raw)
    t.equal(parseRaw(text).status, 400, raw.split('\r\n').slice(2, 4).join(' | '))
  }
  t.same(upstream.log, [], 'neither /a nor /smuggled reached the upstream')
})

t.test('a client that sends its headers too slowly gets 408 after server.headersTimeout', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url, 'server: { headersTimeout: 1s, requestTimeout: 2s }')
  // slowloris: a request line and one header, then nothing
  const { text, ms } = await rawExchange(gw.port, 'GET /x HTTP/1.1\r\nHost: a\r\n', 20_000)
  const reply = parseRaw(text)
  t.equal(reply.status, 408)
  t.match(JSON.parse(reply.body), { error: 'GW_ERR_BAD_REQUEST', requestId: String })
  t.ok(ms < 5000, `cut after ${ms} ms (headersTimeout 1 s)`)
  t.equal(upstream.requests, 0)
})

t.test('targets are picked by smooth weighted round-robin', async (t) => {
  const a = await startUpstream(t, 'a')
  const b = await startUpstream(t, 'b')
  const c = await startUpstream(t, 'c')
  const gw = await startGateway(t, `${HEAD}upstreams:
  backend:
    targets: [${a.url}, { url: ${b.url}, weight: 3 }, { url: ${c.url}, weight: 2 }]
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const order: string[] = []
  for (let i = 0; i < 60; i++) {
    const reply = await send(gw.url, `/r${i}`)
    t.equal(reply.status, 200)
    order.push(json<EchoBody>(reply).name)
  }
  t.same([a.requests, b.requests, c.requests], [10, 30, 20], 'requests split 1:3:2')
  // smooth: every window of 6 consecutive picks holds exactly the weights
  for (let i = 0; i + 6 <= order.length; i += 6) {
    const window = order.slice(i, i + 6)
    t.same(['a', 'b', 'c'].map((name) => window.filter((n) => n === name).length), [1, 3, 2], `picks ${i}..${i + 5}`)
  }
  t.not(order.slice(0, 6).join(''), 'abbbcc', 'interleaved, not in blocks')
})

t.test('an idempotent request is retried once, not more', async (t) => {
  const good = await startUpstream(t, 'good')
  const [r1, r2] = [await refusingUrl(), await refusingUrl()]
  const gw = await startGateway(t, `${HEAD}upstreams:
  backend: { targets: [${r1}, ${r2}, ${good.url}], ejectFor: 1m }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const first = await send(gw.url, '/a')
  t.equal(first.status, 502, 'two refusing targets in a row: one retry only, then 502')
  t.equal(json(first).error, 'GW_ERR_UPSTREAM_UNAVAILABLE')
  t.equal(good.requests, 0)
  const second = await send(gw.url, '/b')
  t.equal(second.status, 200, 'both refusing targets were ejected')
  t.same(good.log, ['/b'])
})

t.test('a connect timeout is a 504, ejects the target and is retried elsewhere for GET', async (t) => {
  const good = await startUpstream(t, 'good')
  const blackhole = await startBlackhole(t)
  const gw = await startGateway(t, `${HEAD}upstreams:
  alone: { targets: [${blackhole}], timeouts: { connect: 300ms } }
  paired: { targets: [${blackhole}, ${good.url}], timeouts: { connect: 300ms }, ejectFor: 1m }
routes:
  - { name: alone, pathPrefix: /alone/, upstream: alone }
  - { name: paired, pathPrefix: /, upstream: paired }
`)
  const started = Date.now()
  const alone = await send(gw.url, '/alone/x')
  t.equal(alone.status, 504)
  t.equal(json(alone).error, 'GW_ERR_UPSTREAM_TIMEOUT')
  t.ok(Date.now() - started < 3000, 'bounded by the connect timeout')
  const ejected = await send(gw.url, '/alone/x')
  t.equal(ejected.status, 503, 'the target that timed out is ejected')

  const paired = await send(gw.url, '/p')
  t.equal(paired.status, 200, 'retried on the other target')
  t.same(good.log, ['/p'])
})

t.test('an ejected target comes back after ejectFor', async (t) => {
  const other = await startUpstream(t, 'other')
  const url = await refusingUrl()
  const gw = await startGateway(t, `${HEAD}upstreams:
  backend: { targets: [${url}, ${other.url}], ejectFor: 1s }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  t.equal((await send(gw.url, '/1')).status, 200, 'refused, retried on the other target')
  // the refused address starts answering while it is ejected
  const revived = http.createServer((_req, res) => res.end('revived'))
  await new Promise<void>((resolve) => revived.listen(Number(new URL(url).port), new URL(url).hostname, resolve))
  t.teardown(() => { revived.closeAllConnections(); revived.close() })
  const during = await send(gw.url, '/2')
  t.equal(json<EchoBody>(during).name, 'other', 'still ejected')
  await sleep(1200)
  const bodies: string[] = []
  for (let i = 0; i < 4; i++) bodies.push((await send(gw.url, `/after${i}`)).body)
  t.equal(bodies.filter((b) => b === 'revived').length, 2, 'back in the rotation after ejectFor')
})

t.test('several Set-Cookie headers pass through separately', async (t) => {
  const { url } = await startHttpServer(t, (_req, res) => {
    res.writeHead(200, [['Set-Cookie', 'a=1; Path=/'], ['Set-Cookie', 'b=2, c; HttpOnly'], ['Content-Length', '2']].flat())
    res.end('ok')
  })
  const gw = await oneRoute(t, url)
  const reply = await send(gw.url, '/')
  t.same(reply.headers['set-cookie'], ['a=1; Path=/', 'b=2, c; HttpOnly'])
  t.equal(reply.body, 'ok')
})

t.test('HEAD gets the headers and no body', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  const reply = await send(gw.url, '/download?bytes=5000', { method: 'HEAD' })
  t.equal(reply.status, 200)
  t.equal(reply.headers['content-length'], '5000')
  t.equal(reply.body, '')
  const after = await send(gw.url, '/download?bytes=10')
  t.equal(after.body, 'x'.repeat(10), 'the pool connection is still usable')
})

/** GET `path` on a connection of its own: the response once its head came, or null after 5 s without one. */
async function headWithin5s (t: Teardown, base: string, path: string): Promise<http.IncomingMessage | null> {
  const req = http.get({ host: '127.0.0.1', port: new URL(base).port, path, agent: false })
  req.on('error', () => {})
  t.teardown(() => { req.destroy() })
  return await Promise.race([new Promise<http.IncomingMessage>((resolve) => req.once('response', resolve)), sleep(5000).then(() => null)])
}

t.test('a head whose body has not come yet reaches the client at once (an event stream, a long poll)', async (t) => {
  let sendBody = (): void => {}
  const { url } = await startHttpServer(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.flushHeaders()
    sendBody = () => { res.end('data: late\n\n') }
  })
  const gw = await oneRoute(t, url)
  // node:http keeps a head until the first body write: the client got nothing until the event came
  const res = await headWithin5s(t, gw.url, '/events')
  sendBody()
  if (res === null) {
    t.fail('no head within 5 s while the upstream held its body')
    return
  }
  t.equal(res.statusCode, 200)
  t.equal(res.headers['content-type'], 'text/event-stream')
  const chunks: Buffer[] = []
  for await (const chunk of res) chunks.push(chunk as Buffer)
  t.equal(Buffer.concat(chunks).toString(), 'data: late\n\n', 'the body follows the head')
})

t.test('an upstream that fails after its head leaves the client that head, then a cut connection', async (t) => {
  let fail = (): void => {}
  const { url } = await startHttpServer(t, (_req, res) => {
    res.writeHead(200, { 'content-length': '10' })
    res.flushHeaders()
    fail = () => { res.socket?.destroy() }
  })
  const gw = await oneRoute(t, url)
  const res = await headWithin5s(t, gw.url, '/')
  fail()
  if (res === null) {
    t.fail('no head within 5 s')
    return
  }
  t.equal(res.statusCode, 200, 'the upstream\'s status, sent before it failed')
  const complete = await new Promise<boolean>((resolve) => {
    res.on('error', () => {})
    res.resume()
    res.on('close', () => { resolve(res.complete) })
  })
  t.notOk(complete, 'the body is cut short: the client can tell')
})

t.test('Expect: 100-continue uploads go through', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await oneRoute(t, upstream.url)
  const reply = await new Promise<Reply>((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: gw.port, path: '/upload', method: 'POST', headers: { expect: '100-continue', 'content-length': '100000' }, agent: false }, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, rawHeaders: res.rawHeaders, body: Buffer.concat(chunks).toString() }))
    })
    req.on('error', reject)
    req.on('continue', () => req.end(Buffer.alloc(100000, 1)))
  })
  t.equal(reply.status, 200)
  t.same(json(reply), { bytes: 100000 })
})

t.test('upstream connections are kept alive and reused', async (t) => {
  const upstream = await startUpstream(t)
  let connections = 0
  upstream.server.on('connection', () => { connections++ })
  const gw = await oneRoute(t, upstream.url)
  for (let i = 0; i < 20; i++) t.equal((await send(gw.url, `/k${i}`)).status, 200)
  t.equal(connections, 1, 'twenty sequential requests over one upstream connection')
})

t.test('a client keep-alive connection survives upstream errors', async (t) => {
  const upstream = await startUpstream(t)
  const refusing = await refusingUrl()
  const gw = await startGateway(t, `${HEAD}upstreams:
  backend: { targets: [${upstream.url}] }
  dead: { targets: [${refusing}] }
routes:
  - { name: dead, pathPrefix: /dead/, upstream: dead }
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  t.teardown(() => agent.destroy())
  const call = (path: string, method = 'GET', body?: string): Promise<{ status: number, body: string }> => new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: gw.port, path, method, agent }, (res) => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (s: string) => { text += s })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }))
    })
    req.on('error', reject)
    req.end(body)
  })
  t.equal((await call('/a')).status, 200)
  t.equal((await call('/dead/x')).status, 502)
  t.equal((await call('/b')).status, 200, 'the next request on the same agent is answered')
  t.equal((await call('/dead/x', 'POST', 'p'.repeat(5000))).status, 503, 'the dead target is ejected now; the body is never read')
  const last = await call('/c', 'POST', 'after')
  t.equal(last.status, 200)
  t.equal((JSON.parse(last.body) as EchoBody).body, 'after', 'the unread body of the failed request was not taken for the next request')
})

t.test('maxConnections caps concurrent upstream connections per target; the rest queue', async (t) => {
  let active = 0
  let peak = 0
  const { url } = await startHttpServer(t, (_req, res) => {
    active++
    peak = Math.max(peak, active)
    setTimeout(() => {
      active--
      res.end('done')
    }, 300)
  })
  const gw = await startGateway(t, `${HEAD}upstreams:
  backend: { targets: [${url}], maxConnections: 2 }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const started = Date.now()
  const replies = await Promise.all(Array.from({ length: 6 }, (_, i) => send(gw.url, `/q${i}`)))
  t.same(replies.map((r) => r.status), Array(6).fill(200), 'every queued request is answered')
  t.equal(peak, 2, 'never more than two at once at the upstream')
  t.ok(Date.now() - started >= 850, 'three rounds of two')
})

/** A PUT of `total` bytes written `piece` bytes every `everyMs`; resolves with the answer's status, Connection and body. */
async function slowUpload (base: string, path: string, total: number, piece: number, everyMs: number, agent: http.Agent | false = false): Promise<{ status: number, connection: string | undefined, body: string }> {
  const { port } = new URL(base)
  return await new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method: 'PUT', agent, headers: { 'content-length': String(total) } }, (res) => {
      let body = ''
      res.on('data', (chunk: Buffer) => { body += chunk.toString() })
      res.on('end', () => { resolve({ status: res.statusCode ?? 0, connection: res.headers.connection, body }) })
    })
    req.on('error', reject)
    let sent = 0
    const timer = setInterval(() => {
      const n = Math.min(piece, total - sent)
      sent += n
      if (sent >= total) {
        clearInterval(timer)
        req.end(Buffer.alloc(n, 97))
      } else req.write(Buffer.alloc(n, 97))
    }, everyMs)
  })
}

t.test('a 103 Early Hints during an upload: the response deadline runs from the end of the request, as undici\'s does', async (t) => {
  const { url } = await startHttpServer(t, (req, res) => {
    res.writeEarlyHints({ link: '</a.css>; rel=preload' })
    let bytes = 0
    req.on('data', (chunk: Buffer) => { bytes += chunk.length })
    req.on('end', () => { res.end(JSON.stringify({ bytes })) })
  })
  const gw = await startGateway(t, `${HEAD}server: { bufferBodies: 0 }
upstreams:
  backend: { targets: [${url}], timeouts: { response: 1s } }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // 3000 bytes over 3 s: the 103 comes at once, the final answer when the body is in
  const reply = await slowUpload(gw.url, '/up', 3000, 100, 100)
  t.equal(reply.status, 200, 'not a 504 one second into the upload')
  t.same(JSON.parse(reply.body), { bytes: 3000 })
})

/** A gateway with one route to `upstream`, and a client agent of one kept-alive connection. */
async function keptAliveThrough (t: Teardown, upstream: string): Promise<{ gw: Awaited<ReturnType<typeof startGateway>>, agent: http.Agent }> {
  const gw = await oneRoute(t, upstream)
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  t.teardown(() => agent.destroy())
  return { gw, agent }
}

t.test('a 2xx that starts while the body still streams (a full-duplex echo) keeps its connection alive', async (t) => {
  const { url } = await startHttpServer(t, (req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream' })
    res.flushHeaders()
    req.pipe(res)
  })
  const { gw, agent } = await keptAliveThrough(t, url)
  // past bufferBodies (1 MiB): streamed, so the answer starts before the body has come
  const reply = await slowUpload(gw.url, '/echo', 2 * 1024 * 1024, 256 * 1024, 20, agent)
  t.equal(reply.status, 200)
  t.equal(reply.body.length, 2 * 1024 * 1024, 'the whole body echoed')
  t.equal(reply.connection, 'keep-alive', 'the connection is kept')
})

t.test('a 2xx that ends before the upload does: the rest of the body is dropped and the connection serves its next request', async (t) => {
  // answers at once, without reading the body (as an upstream that needs none of it does)
  const { url } = await startHttpServer(t, (req, res) => { res.end('abc') })
  const { gw, agent } = await keptAliveThrough(t, url)
  // past bufferBodies (1 MiB): streamed, and still arriving when the answer is whole
  const upload = await slowUpload(gw.url, '/early', 4 * 1024 * 1024, 256 * 1024, 5, agent)
  t.equal(`${upload.status} ${upload.body}`, '200 abc')
  // the body was left in a pipe undici had closed: the next request waited behind it until the
  // keep-alive timeout reset the connection
  const next = await send(gw.url, '/after', { agent })
  t.equal(next.status, 200, 'the next request on the connection is served')
  // read and dropped while it comes, for 10 s at most, as a lingering close: a client sending on
  // past maxBodySize and every timer of the settled request held the connection until
  // server.requestTimeout
  const socket = net.connect(gw.port, '127.0.0.1')
  socket.on('error', () => {})
  let text = ''
  let closedAt: number | null = null
  socket.setEncoding('latin1')
  socket.on('data', (chunk: string) => { text += chunk })
  socket.on('close', () => { closedAt = Date.now() })
  socket.write(`PUT /early HTTP/1.1\r\nHost: a\r\nContent-Length: ${64 * 1024 * 1024}\r\n\r\n`)
  socket.write(Buffer.alloc(2 * 1024 * 1024, 97))
  await until(() => text.includes('abc'))
  const answered = Date.now()
  for (let i = 0; i < 300 && closedAt === null; i++) {
    socket.write(Buffer.alloc(1024, 97))
    await sleep(50)
  }
  const after = closedAt === null ? null : (closedAt as number) - answered
  t.ok(after !== null && after >= 9000 && after < 14_000, `the gateway closed the connection while the client still sent, 10 s after the answer (${String(after)} ms)`)
  socket.destroy()
})

t.test('a body past maxBodySize while its connection is being made is answered at once; the connection stays counted till the attempt ends', async (t) => {
  // a TLS target whose handshake never ends: each request waits in its connection attempt
  const hanging = net.createServer((socket) => { socket.on('error', () => {}) })
  await new Promise<void>((resolve) => hanging.listen(0, '127.0.0.1', resolve))
  t.teardown(() => hanging.close())
  const gw = await startGateway(t, `${HEAD}server: { bufferBodies: 0 }
upstreams:
  slow: { targets: ["https://127.0.0.1:${(hanging.address() as net.AddressInfo).port}"], maxConnections: 1, timeouts: { connect: 6s, queue: 300ms } }
routes:
  - { name: all, pathPrefix: /, upstream: slow, maxBodySize: 16kb }
`)
  const { port } = new URL(gw.url)
  const large = rawExchange(Number(port), 'POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n10000\r\n' + 'x'.repeat(0x10000) + '\r\n0\r\n\r\n')
  await sleep(100)
  // answered at once before, its connection counted free: this request then queued inside undici,
  // behind the first, where no queue timeout reaches it, until the connection attempt failed
  const next = await send(gw.url, '/b')
  t.equal(next.status, 503, 'the next request waits for the connection, up to timeouts.queue')
  t.equal(json(next).error, 'GW_ERR_UPSTREAM_BUSY')
  const { text, ms } = await large
  const [first] = parseResponses(text)
  t.equal(first?.status, 413, 'the large body: 413')
  // it waited for the attempt's end (timeouts.connect, 6 s) before
  t.ok(ms < 3000, `answered while the attempt still ran (${ms} ms)`)
})
