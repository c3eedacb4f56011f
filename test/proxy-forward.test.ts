// forwardRequest through the front door: a real client, a node:http server calling forwardRequest
// the way the gateway server does, and a real upstream.
import t from 'tap'
import http, { type IncomingHttpHeaders } from 'node:http'
import { once } from 'node:events'
import { Readable } from 'node:stream'
import { forwardRequest, type ForwardPlan, type ForwardResult } from '../src/proxy/forward.js'
import { testPool as poolOf, testPlan as planOf } from './helpers/proxy-plan.js'
import { refusingUrl, startHttpServer, startUpstream, type EchoBody, HOP_BY_HOP_PROBE } from './helpers/upstream.js'
import type { Teardown } from './helpers/teardown.js'

interface Front { url: string, results: ForwardResult[], nextResult: () => Promise<ForwardResult> }

// What the gateway server does: keep or make a request id, then hand over to forwardRequest.
async function startFront (t: Teardown, plan: ForwardPlan, extra?: readonly (readonly [string, string])[], clientIp?: string): Promise<Front> {
  const results: ForwardResult[] = []
  const waiting: ((result: ForwardResult) => void)[] = []
  let read = 0
  const { url } = await startHttpServer(t, (req, res) => {
    const incoming = req.headers['x-request-id']
    forwardRequest(req, res, plan, {
      requestId: typeof incoming === 'string' ? incoming : 'generated-id',
      clientIp: clientIp ?? req.socket.remoteAddress ?? '',
      proto: 'http',
      // this front stands for the pipeline behind a trusted proxy: its chain and request id are kept
      trustedPeer: true,
      path: req.url ?? '/',
      ...(extra !== undefined ? { extraResponseHeaders: extra } : {})
    }, (result) => {
      results.push(result)
      const resolve = waiting.shift()
      if (resolve !== undefined) {
        read++
        resolve(result)
      }
    })
  })
  return {
    url,
    results,
    nextResult: async () => read < results.length ? results[read++] as ForwardResult : await new Promise((resolve) => waiting.push(resolve))
  }
}

interface Answer { status: number, headers: IncomingHttpHeaders, rawHeaders: string[], body: string }

// node:http as the client: it sends any header (hop-by-hop ones included) and shows raw response headers.
async function send (url: string, path: string, options: { method?: string, headers?: http.OutgoingHttpHeaders, body?: string | Readable } = {}): Promise<Answer> {
  const req = http.request(url + path, { method: options.method ?? 'GET', headers: options.headers, agent: false })
  if (options.body instanceof Readable) options.body.pipe(req)
  else req.end(options.body)
  const [res] = await once(req, 'response') as [http.IncomingMessage]
  const chunks: Buffer[] = []
  for await (const chunk of res) chunks.push(chunk as Buffer)
  return { status: res.statusCode ?? 0, headers: res.headers, rawHeaders: res.rawHeaders, body: Buffer.concat(chunks).toString() }
}

function echoed (answer: Answer): EchoBody {
  return JSON.parse(answer.body) as EchoBody
}

t.test('forwards method, path, query and body, and sets the forwarded headers', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url])))
  const answer = await send(front.url, '/items/7?q=a%20b&sort=-x&q=2', {
    method: 'POST',
    headers: { host: 'api.example.com', 'content-type': 'text/plain', 'x-forwarded-for': '203.0.113.9', 'x-request-id': 'abc-123' },
    body: 'hello upstream'
  })
  t.equal(answer.status, 200)
  t.equal(answer.headers['x-request-id'], 'abc-123', 'request id echoed to the client')
  const seen = echoed(answer)
  t.equal(seen.method, 'POST')
  t.equal(seen.url, '/items/7?q=a%20b&sort=-x&q=2', 'query passed untouched')
  t.equal(seen.body, 'hello upstream')
  t.equal(seen.headers.host, 'api.example.com', 'Host passed through unchanged')
  t.equal(seen.headers['x-forwarded-for'], '203.0.113.9, 127.0.0.1', 'client IP appended to X-Forwarded-For')
  t.equal(seen.headers['x-forwarded-proto'], 'http')
  t.equal(seen.headers['x-forwarded-host'], 'api.example.com')
  t.equal(seen.headers['x-request-id'], 'abc-123', 'request id sent upstream')
  t.equal(seen.headers['content-type'], 'text/plain')
  const result = await front.nextResult()
  t.match(result, { status: 200, target: upstream.url, bytesIn: 14, errorCode: null, errorKind: null, error: null })
  t.equal(result.bytesOut, Buffer.byteLength(answer.body), 'bytesOut: the response body bytes the client received')
  t.equal(Number(answer.headers['content-length']), result.bytesOut, 'and the length the upstream declared')
})

t.test('X-Forwarded-For gets the client without a chain, the peer appended to one', async (t) => {
  const upstream = await startUpstream(t)
  // As resolved by the identify stage when 127.0.0.1 is a trusted proxy that sent the chain.
  const front = await startFront(t, planOf(poolOf(t, [upstream.url])), undefined, '198.51.100.20')
  const chained = echoed(await send(front.url, '/', { headers: { 'x-forwarded-for': '198.51.100.20' } }))
  t.equal(chained.headers['x-forwarded-for'], '198.51.100.20, 127.0.0.1', 'the trusted peer is appended, not the client again')
  const direct = echoed(await send(front.url, '/'))
  t.equal(direct.headers['x-forwarded-for'], '198.51.100.20', 'no chain: the client address alone')
})

t.test('the gateway request id replaces the one an upstream answers with', async (t) => {
  const { url } = await startHttpServer(t, (_req, res) => {
    res.writeHead(200, { 'x-request-id': 'upstream-id', 'content-length': 2 })
    res.end('ok')
  })
  const front = await startFront(t, planOf(poolOf(t, [url])))
  const answer = await send(front.url, '/')
  t.equal(answer.headers['x-request-id'], 'generated-id')
  t.equal(answer.rawHeaders.filter((name) => name.toLowerCase() === 'x-request-id').length, 1)
})

t.test('hop-by-hop request headers are not forwarded, including those Connection names', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url])))
  const answer = await send(front.url, '/echo', {
    method: 'POST',
    body: Readable.from(['chunked ', 'body']),
    headers: HOP_BY_HOP_PROBE.headers
  })
  const seen = echoed(answer).headers
  for (const name of HOP_BY_HOP_PROBE.dropped) t.equal(seen[name], undefined, `${name} removed`)
  t.equal(seen.connection, 'keep-alive', 'only the gateway-to-upstream connection header')
  t.equal(seen['x-end-to-end'], 'kept')
  t.equal(echoed(answer).body, 'chunked body')
})

t.test('hop-by-hop response headers are not forwarded, including those Connection names', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url])))
  // Connection: close, so the only Connection/Keep-Alive the client can see would be relayed ones.
  const answer = await send(front.url, '/hop-by-hop', { headers: { connection: 'close' } })
  t.equal(answer.status, 200)
  t.equal(answer.body, 'hop-by-hop')
  for (const name of ['x-secret', 'keep-alive', 'proxy-connection', 'trailer', 'upgrade']) t.equal(answer.headers[name], undefined, `${name} removed`)
  t.equal(answer.headers.connection, 'close', "the front connection's own header, not the upstream's")
  t.equal(answer.headers['x-kept'], 'yes')
})

t.test('route header rules and the limiter headers are applied', async (t) => {
  const upstream = await startUpstream(t)
  const plan = planOf(poolOf(t, [upstream.url]), {
    requestHeaders: { set: [['x-route', 'orders'], ['user-agent', 'gateway']], remove: ['cookie'] },
    responseHeaders: { set: [['cache-control', 'no-store']], remove: ['content-type'] }
  })
  const front = await startFront(t, plan, [['RateLimit-Policy', '10;w=1'], ['RateLimit', 'limit=10, remaining=9, reset=1']])
  const answer = await send(front.url, '/', { headers: { cookie: 'session=1', 'user-agent': 'curl' } })
  const seen = echoed(answer).headers
  t.equal(seen['x-route'], 'orders')
  t.equal(seen['user-agent'], 'gateway', 'set replaces the client value')
  t.equal(seen.cookie, undefined)
  t.equal(answer.headers['cache-control'], 'no-store')
  t.equal(answer.headers['content-type'], undefined)
  t.equal(answer.headers['ratelimit-policy'], '10;w=1')
  t.equal(answer.headers.ratelimit, 'limit=10, remaining=9, reset=1')
})

// The relay lower-cases and looks up a response field's name by its length first (a dropped name
// of another length cannot match): every case below must still be dropped or replaced.
t.test('removed, hop-by-hop and replaced response fields go whatever their case and length, the rest are relayed as written', async (t) => {
  const long = 'X-Internal-' + 'Diagnostic-'.repeat(6) + 'Trace'
  const { url } = await startHttpServer(t, (_req, res) => {
    res.setHeader(long, 'secret')
    res.setHeader(long + '-Kept', 'kept')
    res.setHeader('X-SERVER-TIMING-DB', 'dropped')
    res.setHeader('KEEP-ALIVE', 'timeout=5')
    res.setHeader('X-Request-ID', 'upstream-id')
    res.setHeader('RATELIMIT', 'upstream-limit')
    res.setHeader('Ratelimit-Policy-X', 'kept too')
    res.setHeader('Content-Length', '2')
    res.end('ok')
  })
  const plan = planOf(poolOf(t, [url]), {
    responseHeaders: { set: [], remove: [long.toLowerCase(), 'x-server-timing-db'] }
  })
  const front = await startFront(t, plan, [['ratelimit', 'limit=10, remaining=9, reset=1']])
  const answer = await send(front.url, '/', { headers: { 'x-request-id': 'gateway-id' } })
  t.equal(answer.status, 200)
  t.equal(answer.body, 'ok')
  t.ok(long.length > 64, 'a name longer than the length table')
  t.equal(answer.headers[long.toLowerCase()], undefined, 'a removed name longer than 64 characters')
  t.equal(answer.headers[long.toLowerCase() + '-kept'], 'kept', 'a longer name that is not removed')
  t.equal(answer.headers['x-server-timing-db'], undefined, 'a removed name in upper case')
  t.equal(answer.headers['keep-alive'], undefined, 'a hop-by-hop name in upper case')
  t.equal(answer.headers['x-request-id'], 'gateway-id', "the gateway's request id, not the upstream's")
  t.equal(answer.headers.ratelimit, 'limit=10, remaining=9, reset=1', "the limiter's field replaces the upstream's")
  t.equal(answer.headers['ratelimit-policy-x'], 'kept too')
  t.ok(answer.rawHeaders.includes(long + '-Kept'), 'a relayed name keeps its case')
})

t.test('strips the route prefix and prepends the target path, leaving the query alone', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url + '/v2/']), { stripPrefix: '/api' }))
  t.equal(echoed(await send(front.url, '/api/users/1?x=%2F&y')).url, '/v2/users/1?x=%2F&y')
  t.equal(echoed(await send(front.url, '/api?x=1')).url, '/v2/?x=1')
  t.equal(echoed(await send(front.url, '/apiary')).url, '/v2/apiary', 'only whole segments are stripped')
})

t.test('header bytes outside ASCII pass through unchanged', async (t) => {
  const utf8 = Buffer.from('attachment; filename="résumé.pdf"')
  const { url } = await startHttpServer(t, (_req, res) => {
    // node:http writes header strings as latin1, so this sends the UTF-8 bytes as they are.
    res.writeHead(200, { 'x-file': utf8.toString('latin1'), 'content-length': 0 })
    res.end()
  })
  const front = await startFront(t, planOf(poolOf(t, [url])))
  const answer = await send(front.url, '/')
  t.equal(answer.status, 200)
  t.same(Buffer.from(answer.headers['x-file'] as string, 'latin1'), utf8)
})

t.test('502 GW_ERR_UPSTREAM_UNAVAILABLE when the upstream refuses', async (t) => {
  const front = await startFront(t, planOf(poolOf(t, [await refusingUrl()])))
  const answer = await send(front.url, '/', { headers: { 'x-request-id': 'r-1' } })
  t.equal(answer.status, 502)
  t.equal(answer.headers['content-type'], 'application/json; charset=utf-8')
  t.match(JSON.parse(answer.body), { error: 'GW_ERR_UPSTREAM_UNAVAILABLE', requestId: 'r-1' })
  const result = await front.nextResult()
  t.match(result, { status: 502, errorCode: 'GW_ERR_UPSTREAM_UNAVAILABLE', errorKind: 'refused' })
  t.match((result.error?.cause as { code?: string }).code, 'ECONNREFUSED', 'undici error kept as cause')
})

t.test('502 when the upstream resets the connection', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url])))
  const answer = await send(front.url, '/reset')
  t.equal(answer.status, 502)
  t.match(JSON.parse(answer.body), { error: 'GW_ERR_UPSTREAM_UNAVAILABLE', requestId: 'generated-id' })
  t.match(await front.nextResult(), { status: 502, errorKind: 'reset' })
})

t.test('504 GW_ERR_UPSTREAM_TIMEOUT when the upstream does not answer in time', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url]), { responseTimeoutMs: 300 }))
  const aborted = upstream.nextAbort()
  const started = Date.now()
  const answer = await send(front.url, '/hang')
  t.equal(answer.status, 504)
  t.match(JSON.parse(answer.body), { error: 'GW_ERR_UPSTREAM_TIMEOUT' })
  t.ok(Date.now() - started < 3000, 'the route timeout applies, not the upstream default')
  t.match(await front.nextResult(), { status: 504, errorKind: 'response_timeout' })
  t.equal(await aborted, '/hang', 'the timed-out upstream request is closed')
})

t.test('a response body that stalls is cut: the client sees an incomplete response', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url]), { responseTimeoutMs: 400 }))
  const req = http.get(front.url + '/drip?chunks=5&intervalMs=1500', { agent: false })
  const [res] = await once(req, 'response') as [http.IncomingMessage]
  t.equal(res.statusCode, 200)
  res.resume()
  const [err] = await once(res, 'error') as [Error]
  t.match(err.message, /aborted/)
  t.match(await front.nextResult(), { status: 504, sentStatus: 200, errorKind: 'response_timeout', errorCode: 'GW_ERR_UPSTREAM_TIMEOUT' })
})

t.test('413 GW_ERR_BODY_TOO_LARGE from Content-Length, before anything reaches the upstream', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url]), { maxBodySize: 1024 }))
  const answer = await send(front.url, '/upload', { method: 'POST', body: 'x'.repeat(2048) })
  t.equal(answer.status, 413)
  t.match(JSON.parse(answer.body), { error: 'GW_ERR_BODY_TOO_LARGE' })
  t.equal(upstream.requests, 0)
  t.match(await front.nextResult(), { status: 413, errorKind: 'body_too_large' })
  const fits = await send(front.url, '/upload', { method: 'POST', body: 'x'.repeat(1024) })
  t.same(JSON.parse(fits.body), { bytes: 1024 }, 'a body at the limit passes')
})

t.test('413 for a chunked body that grows past the limit; the upstream request is aborted', async (t) => {
  const upstream = await startUpstream(t)
  // bufferBodies 0: the body streams, so the upstream is reading it when the limit is crossed
  const front = await startFront(t, planOf(poolOf(t, [upstream.url]), { maxBodySize: 256 * 1024, bufferBodies: 0 }))
  const aborted = upstream.nextAbort()
  let sent = 0
  // A chunked body of 64 KiB pieces, slow enough that the upstream has started reading it.
  const body = new Readable({
    read () {
      sent += 65536
      if (sent > 4 * 1024 * 1024) this.push(null)
      else setTimeout(() => this.push(Buffer.alloc(65536, 'y')), 5)
    }
  })
  const answer = await send(front.url, '/upload', { method: 'POST', body })
  t.equal(answer.status, 413)
  t.match(JSON.parse(answer.body), { error: 'GW_ERR_BODY_TOO_LARGE' })
  t.equal(await aborted, '/upload')
  const result = await front.nextResult()
  t.match(result, { status: 413, errorKind: 'body_too_large' })
  t.ok(result.bytesIn > 256 * 1024 && result.bytesIn <= 256 * 1024 + 65536, `counted ${result.bytesIn} bytes`)
  body.destroy()
})

t.test('a client that goes away aborts the upstream request', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url])))
  const req = http.get(front.url + '/hang', { agent: false })
  req.on('error', () => {})
  while (upstream.requests === 0) await new Promise((resolve) => setTimeout(resolve, 10))
  const aborted = upstream.nextAbort()
  req.destroy()
  t.equal(await aborted, '/hang')
  t.match(await front.nextResult(), { status: 499, errorKind: 'client_abort', errorCode: null })
})

t.test('a client that goes away mid-download aborts the upstream response', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url])))
  const req = http.get(front.url + '/drip?chunks=100&intervalMs=20', { agent: false })
  req.on('error', () => {})
  const [res] = await once(req, 'response') as [http.IncomingMessage]
  await once(res, 'data')
  const aborted = upstream.nextAbort()
  req.destroy()
  t.equal(await aborted, '/drip?chunks=100&intervalMs=20')
  const result = await front.nextResult()
  t.match(result, { status: 200, errorKind: 'client_abort' })
})

t.test('a client that goes away mid-upload aborts the upstream request', async (t) => {
  const upstream = await startUpstream(t)
  // a streamed body (a buffered one would not have reached the upstream yet)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url]), { bufferBodies: 0 }))
  const req = http.request(front.url + '/upload', { method: 'POST', agent: false })
  req.on('error', () => {})
  req.write(Buffer.alloc(65536))
  while (upstream.requests === 0) await new Promise((resolve) => setTimeout(resolve, 10))
  const aborted = upstream.nextAbort()
  req.destroy()
  t.equal(await aborted, '/upload')
  t.match(await front.nextResult(), { status: 499, errorKind: 'client_abort' })
})

t.test('done is called exactly once per request, whatever happened', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url]), { responseTimeoutMs: 300 }))
  const paths = ['/', '/hang', '/reset', '/status?code=404', '/download?bytes=100000', '/hop-by-hop']
  const answers = await Promise.all(paths.map(async (path) => await send(front.url, path)))
  t.same(answers.map((a) => a.status), [200, 504, 502, 404, 200, 200])
  await new Promise((resolve) => setTimeout(resolve, 200))
  t.equal(front.results.length, paths.length)
})

t.test('HEAD and 204/304 responses carry no body', async (t) => {
  const upstream = await startUpstream(t)
  const front = await startFront(t, planOf(poolOf(t, [upstream.url])))
  const head = await send(front.url, '/download?bytes=5000', { method: 'HEAD' })
  t.equal(head.status, 200)
  t.equal(head.headers['content-length'], '5000')
  t.equal(head.body, '')
  const noContent = await send(front.url, '/status?code=204')
  t.equal(noContent.status, 204)
  t.equal(noContent.body, '')
})

t.test('a client that left before forwarding starts sends nothing upstream', async (t) => {
  const upstream = await startUpstream(t)
  const plan = planOf(poolOf(t, [upstream.url]))
  const results: ForwardResult[] = []
  // An earlier stage holding the request (as a limiter delay does) while the client goes away.
  const { url } = await startHttpServer(t, (req, res) => {
    setTimeout(() => forwardRequest(req, res, plan, { requestId: 'late', clientIp: '127.0.0.1', proto: 'http', path: '/' }, (r) => results.push(r)), 200)
  })
  const req = http.get(url + '/', { agent: false })
  req.on('error', () => {})
  setTimeout(() => req.destroy(), 50)
  await new Promise((resolve) => setTimeout(resolve, 400))
  t.equal(upstream.requests, 0)
  t.match(results, [{ status: 499, errorKind: 'client_abort', target: null }])
})
