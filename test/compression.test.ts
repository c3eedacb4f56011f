// compression: forwarded responses compressed (gzip, Brotli) for the clients that accept it, as
// they stream, with the head a cache and a client need (Vary, no Content-Length, a weak ETag), and
// left alone where compressing would be wrong (a HEAD, a 206, a body already encoded, no-transform).
import t from 'tap'
import http from 'node:http'
import { writeFileSync } from 'node:fs'
import { once } from 'node:events'
import net from 'node:net'
import { randomBytes } from 'node:crypto'
import { brotliCompressSync, brotliDecompressSync, createGunzip, gunzipSync, gzipSync } from 'node:zlib'
import { startGateway } from './helpers/gateway.js'
import { rawExchange } from './helpers/raw-http.js'
import type { Teardown } from './helpers/teardown.js'

const JSON_BODY = JSON.stringify({ items: Array.from({ length: 400 }, (_, i) => ({ id: i, name: `item ${i}`, tags: ['a', 'b'] })) })

interface Origin { url: string, release: () => void, aborted: Promise<void> }

/** The upstream: a JSON document, a small one, an image, an encoded one, a stream held until released, a large body. */
async function startOrigin (t: Teardown): Promise<Origin> {
  let release = (): void => {}
  let abortedResolve = (): void => {}
  const aborted = new Promise<void>(resolve => { abortedResolve = resolve })
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0]
    switch (path) {
      case '/json':
      case '/api/json':
        if (req.headers['if-none-match'] !== undefined) {
          // compared weakly, as RFC 9110 §13.1.2 has If-None-Match compared: W/"v1" matches "v1"
          res.writeHead(304, { etag: '"v1"', vary: 'Origin' })
          return res.end()
        }
        res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(JSON_BODY), etag: '"v1"', 'accept-ranges': 'bytes', vary: 'Origin' })
        return res.end(JSON_BODY)
      case '/problem':
        res.writeHead(404, { 'content-type': 'application/problem+json' })
        return res.end(JSON_BODY)
      case '/slow':
        setTimeout(() => {
          res.writeHead(200, { 'content-type': 'text/plain' })
          res.end('slow '.repeat(1000))
        }, 1500)
        return
      case '/head-then-reset':
        // a head and the first bytes, then the connection reset: the body is never whole
        res.writeHead(200, { 'content-type': 'text/plain', 'content-length': 1000000 })
        res.write('partial '.repeat(256), () => { res.socket?.destroy() })
        return
      case '/digest':
        res.writeHead(200, { 'content-type': 'application/json', 'content-digest': 'sha-256=:RK/0qy18MlBSVnWgjwz6lZEWjP/lF5HF9bvEF8FabDg=:' })
        return res.end(JSON_BODY)
      // the digest fields other than Content-Digest, by the query's name (/digests?field=repr-digest)
      case '/digests': {
        const field = new URL(req.url ?? '/', 'http://x').searchParams.get('field') ?? 'digest'
        res.writeHead(200, { 'content-type': 'application/json', [field]: field === 'content-md5' ? 'Q2hlY2sgSW50ZWdyaXR5IQ==' : field === 'digest' ? 'sha-256=RK/0qy18MlBSVnWgjwz6lZEWjP/lF5HF9bvEF8FabDg=' : 'sha-256=:RK/0qy18MlBSVnWgjwz6lZEWjP/lF5HF9bvEF8FabDg=:' })
        return res.end(JSON_BODY)
      }
      case '/reset-content':
        res.writeHead(205, { 'content-type': 'text/plain' })
        return res.end()
      case '/ndjson':
        // a line per write, as a generator or a JSON encoder streams: a chunk each, for undici
        res.writeHead(200, { 'content-type': 'application/x-ndjson' })
        for (let i = 0; i < 5000; i++) res.write(`{"id":${i},"name":"item ${i}","tags":["a","b"]}\n`)
        return res.end()
      case '/small':
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': 2 })
        return res.end('{}')
      case '/png':
        res.writeHead(200, { 'content-type': 'image/png' })
        return res.end(Buffer.alloc(4096, 1))
      case '/encoded':
        res.writeHead(200, { 'content-type': 'text/plain', 'content-encoding': 'gzip' })
        return res.end(gzipSync('already encoded by the upstream'))
      case '/no-transform':
        res.writeHead(200, { 'content-type': 'text/plain', 'cache-control': 'public, no-transform' })
        return res.end('x'.repeat(4096))
      case '/partial':
        res.writeHead(206, { 'content-type': 'text/plain', 'content-range': 'bytes 0-4095/8192' })
        return res.end('x'.repeat(4096))
      case '/stream':
        res.writeHead(200, { 'content-type': 'text/plain' })
        res.write('first part\n')
        release = () => { res.end('second part\n') }
        res.on('close', () => { if (!res.writableFinished) abortedResolve() })
        return
      case '/large': {
        res.writeHead(200, { 'content-type': 'text/plain' })
        let sent = 0
        const line = Buffer.from('0123456789abcdefghijklmnopqrstuvwxyz\n'.repeat(1000))
        const more = (): void => {
          while (sent < 200) {
            sent++
            if (!res.write(line)) return void res.once('drain', more)
          }
          res.end()
        }
        return more()
      }
      case '/random': {
        // base64 of random bytes, a 64 KiB chunk over and over: gzip's 32 KiB window finds no
        // repeat, so the compressed stream is three quarters of it and fills the client's buffers
        res.writeHead(200, { 'content-type': 'text/plain' })
        const chunk = Buffer.from(randomBytes(48 * 1024).toString('base64'))
        const more = (): void => { while (res.write(chunk)); res.once('drain', more) }
        res.on('close', () => { if (!res.writableFinished) abortedResolve() })
        return more()
      }
      default:
        res.writeHead(200, { 'content-type': 'text/html' })
        return res.end('<p>' + 'hello '.repeat(500) + '</p>')
    }
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => { server.closeAllConnections(); server.close() })
  const { port } = server.address() as { port: number }
  return { url: `http://127.0.0.1:${port}`, release: () => release(), aborted }
}

const yaml = (up: string, compression: string, routeCompression = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${compression}
upstreams:
  backend: { targets: [${up}] }
routes:
  - { name: plain, pathPrefix: /api/, upstream: backend${routeCompression} }
  - { name: rest, pathPrefix: /, upstream: backend }
`

interface Got { status: number, headers: http.IncomingHttpHeaders, body: Buffer }

async function get (port: number, path: string, acceptEncoding?: string, method = 'GET'): Promise<Got> {
  return await getWith(port, path, acceptEncoding === undefined ? {} : { 'accept-encoding': acceptEncoding }, method)
}

async function getWith (port: number, path: string, headers: Record<string, string>, method = 'GET'): Promise<Got> {
  const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
    http.request({ port, host: '127.0.0.1', path, method, headers }, resolve).on('error', reject).end()
  })
  const chunks: Buffer[] = []
  for await (const chunk of res) chunks.push(chunk as Buffer)
  return { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }
}

/** Every encoder of the tests so far is closed (gateway_compression_encoders_open, which maxConcurrent counts against). */
async function encodersOpen (adminUrl: string): Promise<string> {
  let open = ''
  for (let i = 0; i < 100 && open !== '0'; i++) {
    open = /^gateway_compression_encoders_open (\d+)$/m.exec(await (await fetch(`${adminUrl}/metrics`)).text())?.[1] ?? 'none'
    if (open !== '0') await new Promise(resolve => setTimeout(resolve, 20))
  }
  return open
}

t.test('a JSON answer is compressed with the coding the client prefers, Brotli among equals', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'compression: {}'))
  const gz = await get(gw.port, '/json', 'gzip, deflate')
  t.equal(gz.status, 200)
  t.equal(gz.headers['content-encoding'], 'gzip')
  t.equal(gunzipSync(gz.body).toString(), JSON_BODY, 'the body is the upstream\'s, gzipped')
  t.ok(gz.body.length < JSON_BODY.length / 4, `${gz.body.length} bytes for ${JSON_BODY.length}`)
  t.equal(gz.headers['content-length'], undefined, 'the upstream\'s length is not the compressed one')
  t.equal(gz.headers['accept-ranges'], undefined, 'ranges of the compressed bytes are not offered')
  t.equal(gz.headers.etag, 'W/"v1"', 'a strong ETag becomes weak: the bytes differ')
  t.equal(gz.headers.vary, 'Origin, Accept-Encoding', 'the upstream\'s Vary is kept, Accept-Encoding added')
  const br = await get(gw.port, '/json', 'gzip, deflate, br, zstd')
  t.equal(br.headers['content-encoding'], 'br', 'Brotli, the first of encodings, when both are accepted equally')
  t.equal(brotliDecompressSync(br.body).toString(), JSON_BODY)
  const weighted = await get(gw.port, '/json', 'br;q=0.5, gzip;q=0.9')
  t.equal(weighted.headers['content-encoding'], 'gzip', 'the client\'s weights come first')
  const refused = await get(gw.port, '/json', 'gzip;q=0, br;q=0')
  t.equal(refused.headers['content-encoding'], undefined, 'q=0 refuses a coding')
  const xgzip = await get(gw.port, '/json', 'x-gzip')
  t.same([xgzip.headers['content-encoding'], gunzipSync(xgzip.body).toString() === JSON_BODY], ['gzip', true], 'x-gzip is gzip')
  const star = await get(gw.port, '/json', '*')
  t.equal(star.headers['content-encoding'], 'br', '* takes any coding')
  const none = await get(gw.port, '/json')
  t.same([none.headers['content-encoding'], none.headers['content-length'], none.headers.etag, none.headers.vary, none.body.toString() === JSON_BODY],
    [undefined, String(Buffer.byteLength(JSON_BODY)), '"v1"', 'Origin, Accept-Encoding', true], 'no Accept-Encoding: as the upstream sent it, with Vary for the caches')
  const problem = await get(gw.port, '/problem', 'gzip')
  t.same([problem.status, problem.headers['content-encoding'], gunzipSync(problem.body).toString() === JSON_BODY], [404, 'gzip', true], 'an error answer of a listed type (application/*+json) too')
  const html = await get(gw.port, '/page', 'gzip')
  t.equal(html.headers['content-encoding'], 'gzip', 'text/html, chunked (no Content-Length)')
  // the access line names the coding of a compressed answer (bytesOut stays the upstream's)
  let logged: Array<Record<string, unknown>> = []
  for (let i = 0; i < 100 && logged.length < 7; i++) {
    logged = gw.lines.filter(l => l.msg === 'request' && l.path === '/json')
    if (logged.length < 7) await new Promise(resolve => setTimeout(resolve, 20))
  }
  const length = Buffer.byteLength(JSON_BODY)
  t.same(logged.map(l => [l.encoding, l.bytesOut]), [['gzip', length], ['br', length], ['gzip', length], [undefined, length], ['gzip', length], ['br', length], [undefined, length]],
    'encoding on the compressed answers only')
})

t.test('what is not compressed: small, an image, already encoded, no-transform, a 206, a HEAD', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'compression: {}'))
  for (const path of ['/small', '/png', '/encoded', '/no-transform', '/partial', '/digest', '/reset-content']) {
    const got = await get(gw.port, path, 'gzip, br')
    t.equal(got.headers['content-encoding'], path === '/encoded' ? 'gzip' : undefined, `${path}: as the upstream sent it`)
    t.equal(got.headers.vary, undefined, `${path}: no Vary (no client would get it compressed)`)
  }
  for (const field of ['repr-digest', 'digest', 'content-md5']) {
    const got = await get(gw.port, `/digests?field=${field}`, 'gzip, br')
    t.same([got.headers['content-encoding'], got.body.toString() === JSON_BODY], [undefined, true], `${field}: a digest of the content, which compression would break`)
  }
  const head = await get(gw.port, '/json', 'gzip', 'HEAD')
  t.same([head.status, head.headers['content-encoding'], head.headers['content-length']], [200, undefined, String(Buffer.byteLength(JSON_BODY))], 'a HEAD: the head as the upstream sent it')
})

t.test('the gateway\'s own answers are not compressed: an error, a respond route', async t => {
  const origin = await startOrigin(t)
  // minSize 1: the size alone would let any JSON answer be compressed
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
compression: { minSize: 1 }
upstreams:
  backend: { targets: [${origin.url}] }
routes:
  - { name: api, pathPrefix: /api/, upstream: backend }
  - { name: notice, path: /notice, respond: { status: 200, contentType: application/json, body: '${JSON_BODY.slice(0, 2000).replace(/'/g, "''")}' } }
`)
  const forwarded = await get(gw.port, '/api/json', 'gzip')
  t.equal(forwarded.headers['content-encoding'], 'gzip', 'the upstream\'s answer on the same gateway is compressed')
  const missing = await get(gw.port, '/nowhere', 'gzip, br')
  t.same([missing.status, missing.headers['content-encoding'], missing.headers['content-type']], [404, undefined, 'application/json; charset=utf-8'], 'a 404 of the gateway\'s')
  t.equal((JSON.parse(missing.body.toString()) as { error: string }).error, 'GW_ERR_NOT_FOUND', 'read as sent')
  const notice = await get(gw.port, '/notice', 'gzip, br')
  t.same([notice.status, notice.headers['content-encoding'], notice.body.length], [200, undefined, 2000], 'a respond route\'s answer')
})

t.test('a 304 names the Vary its 200 had, and the weak ETag when it revalidates a compressed answer', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'compression: {}'))
  const first = await get(gw.port, '/json', 'gzip')
  t.equal(first.headers.etag, 'W/"v1"')
  const again = await getWith(gw.port, '/json', { 'accept-encoding': 'gzip', 'if-none-match': first.headers.etag as string })
  t.same([again.status, again.headers.etag, again.headers.vary], [304, 'W/"v1"', 'Origin, Accept-Encoding'], 'what the stored answer has: a cache may freshen it (RFC 9111 §4.3.4)')
  const plain = await getWith(gw.port, '/json', {})
  t.same([plain.status, plain.headers.etag, plain.headers.vary], [200, '"v1"', 'Origin, Accept-Encoding'], 'the uncompressed answer varies by coding too')
  const identity = await getWith(gw.port, '/json', { 'if-none-match': '"v1"' })
  t.same([identity.status, identity.headers.etag, identity.headers.vary], [304, '"v1"', 'Origin, Accept-Encoding'], 'a client holding the uncompressed answer: its strong ETag, and the Vary its 200 had (RFC 9110 §15.4.5)')
})

t.test('an upstream that writes a line at a time is compressed as a whole, not line by line', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'compression: {}'))
  const whole = Array.from({ length: 5000 }, (_, i) => `{"id":${i},"name":"item ${i}","tags":["a","b"]}\n`).join('')
  for (const coding of ['gzip', 'br']) {
    const got = await get(gw.port, '/ndjson', coding)
    const text = (coding === 'gzip' ? gunzipSync(got.body) : brotliDecompressSync(got.body)).toString()
    t.equal(text === whole, true, `${coding}: the ${whole.length} bytes whole`)
    const once = coding === 'gzip' ? gzipSync(whole, { level: 5 }).length : brotliCompressSync(whole).length
    t.ok(got.body.length < 2 * once + 1024, `${coding}: ${got.body.length} bytes, against ${once} compressed in one go (a flush per line made it several times that)`)
  }
})

t.test('a stream is compressed as it comes: what the upstream sent reaches the client before the end', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'compression: { minSize: 0, encodings: [gzip] }'))
  const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
    http.request({ port: gw.port, host: '127.0.0.1', path: '/stream', headers: { 'accept-encoding': 'gzip' } }, resolve).on('error', reject).end()
  })
  t.equal(res.headers['content-encoding'], 'gzip')
  const text = res.pipe(createGunzip())
  text.setEncoding('utf8')
  const iterator = text[Symbol.asyncIterator]()
  const first = await iterator.next()
  t.equal(first.value, 'first part\n', 'the first part, decompressible while the upstream still holds the rest')
  t.match(await (await fetch(`${gw.adminUrl}/metrics`)).text(), /^gateway_compression_encoders_open 1$/m, 'the answer being compressed is counted in gateway_compression_encoders_open')
  origin.release()
  const rest = await iterator.next()
  t.equal(rest.value, 'second part\n')
  t.equal((await iterator.next()).done, true)
  t.equal(await encodersOpen(gw.adminUrl), '0', 'and no longer once it ended')
})

t.test('a large body goes through whole, with backpressure, and a client that leaves mid-body ends the upstream request', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'compression: {}'))
  const large = await get(gw.port, '/large', 'br')
  const expected = '0123456789abcdefghijklmnopqrstuvwxyz\n'.repeat(1000 * 200)
  t.equal(brotliDecompressSync(large.body).toString() === expected, true, `${expected.length} bytes whole`)
  let line: Record<string, unknown> | undefined
  for (let i = 0; i < 100 && line === undefined; i++) {
    line = gw.lines.find(l => l.path === '/large')
    if (line === undefined) await new Promise(resolve => setTimeout(resolve, 20))
  }
  t.match(line, { status: 200, bytesOut: expected.length }, 'logged with the upstream\'s bytes')
  // a client that leaves while the stream is held
  const req = http.request({ port: gw.port, host: '127.0.0.1', path: '/stream', headers: { 'accept-encoding': 'gzip' } })
  req.end()
  const res = await new Promise<http.IncomingMessage>(resolve => req.once('response', resolve))
  await once(res, 'data')
  req.destroy()
  await origin.aborted
  t.pass('the upstream request is ended')
  const ok = await get(gw.port, '/json', 'gzip')
  t.equal(gunzipSync(ok.body).toString(), JSON_BODY, 'and the gateway serves on')
  t.equal(await encodersOpen(gw.adminUrl), '0', 'no encoder is left open')
})

t.test('a client that stops reading a compressed answer is cut after server.sendTimeout', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'server: { sendTimeout: 300ms }\ncompression: { encodings: [gzip] }'))
  const socket = net.connect(gw.port, '127.0.0.1')
  socket.on('error', () => {})
  t.teardown(() => socket.destroy())
  socket.write('GET /random HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n')
  socket.pause() // reads nothing: the kernel buffers fill, then the encoder's, then the upstream waits
  await origin.aborted
  let line: Record<string, unknown> | undefined
  for (let i = 0; i < 100 && line === undefined; i++) {
    line = gw.lines.find(l => l.path === '/random')
    if (line === undefined) await new Promise(resolve => setTimeout(resolve, 20))
  }
  t.match(line, { status: 200, error: 'send_timeout' }, 'cut as a slow reader, the upstream request ended')
  t.equal(await encodersOpen(gw.adminUrl), '0', 'no encoder is left open')
})

t.test('maxConcurrent: past it answers go out as they came, until an encoder is free again', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'compression: { maxConcurrent: 1, minSize: 0 }'))
  const held = await new Promise<http.IncomingMessage>((resolve, reject) => {
    http.request({ port: gw.port, host: '127.0.0.1', path: '/stream', headers: { 'accept-encoding': 'gzip' } }, resolve).on('error', reject).end()
  })
  t.equal(held.headers['content-encoding'], 'gzip', 'the held stream has the one encoder')
  const meanwhile = await get(gw.port, '/json', 'gzip')
  t.same([meanwhile.headers['content-encoding'], meanwhile.headers.vary, meanwhile.body.toString() === JSON_BODY], [undefined, 'Origin, Accept-Encoding', true], 'the next answer goes out uncompressed, with its Vary')
  origin.release()
  held.resume()
  await once(held, 'end')
  let after: string | undefined
  for (let i = 0; i < 50 && after !== 'gzip'; i++) {
    after = (await get(gw.port, '/json', 'gzip')).headers['content-encoding'] as string | undefined
    if (after !== 'gzip') await new Promise(resolve => setTimeout(resolve, 20))
  }
  t.equal(after, 'gzip', 'compressed again once the stream ended')
})

t.test('an answer pipelined behind a slow one is not cut while it waits for its turn, compressed or not', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'server: { sendTimeout: 300ms }\ncompression: {}', ', compression: false'))
  for (const prefix of ['', '/api']) {
    const socket = net.connect(gw.port, '127.0.0.1')
    t.teardown(() => socket.destroy())
    socket.setEncoding('latin1')
    let text = ''
    socket.on('data', (chunk: string) => { text += chunk })
    socket.write(`GET ${prefix}/slow HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\nGET ${prefix}/json HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n`)
    await once(socket, 'end')
    t.equal(text.match(/HTTP\/1\.1 200/g)?.length, 2, `${prefix === '' ? 'compressed' : 'uncompressed'}: both answers, the second 1.2 s past its sendTimeout of waiting for its turn`)
  }
})

t.test('an upstream that fails after its head and first bytes leaves the client that head, compressed too', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'compression: { encodings: [gzip] }'))
  for (let i = 0; i < 3; i++) {
    const text = await rawExchange(gw.port, 'GET /head-then-reset HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n')
    t.match(text, /^HTTP\/1\.1 200 OK\r\n[^]*content-encoding: gzip/i, `try ${i + 1}: the head went out before the cut`)
  }
  t.equal(await encodersOpen(gw.adminUrl), '0', 'no encoder is left open')
})

t.test('per route: off, on with the gateway\'s settings, its own keys; a reload turns it on', async t => {
  const origin = await startOrigin(t)
  const gw = await startGateway(t, yaml(origin.url, 'compression: { encodings: [gzip] }', ', compression: false'))
  t.equal((await get(gw.port, '/api/json', 'gzip')).headers['content-encoding'], undefined, 'compression: false')
  t.equal((await get(gw.port, '/json', 'gzip, br')).headers['content-encoding'], 'gzip', 'the other route: the gateway-wide encodings')
  writeFileSync(gw.configFile, yaml(origin.url, 'compression: { encodings: [gzip] }', ', compression: { encodings: [br, gzip], minSize: 100kb }'))
  t.equal((await gw.reload()).ok, true)
  t.equal((await get(gw.port, '/api/json', 'gzip, br')).headers['content-encoding'], undefined, 'its own minSize: the 20 kB document is below 100kb')
  writeFileSync(gw.configFile, yaml(origin.url, '', ', compression: true'))
  t.equal((await gw.reload()).ok, true)
  t.equal((await get(gw.port, '/api/json', 'gzip, br')).headers['content-encoding'], 'br', 'true without compression: the defaults')
  t.equal((await get(gw.port, '/json', 'gzip, br')).headers['content-encoding'], undefined, 'the route without it: off')
})

t.test('a bad compression setting is a located error', async t => {
  const origin = await startOrigin(t)
  await t.rejects(startGateway(t, yaml(origin.url, 'compression: { types: [json] }')), /compression\.types\[0\]: "json" is no media type/)
  await t.rejects(startGateway(t, yaml(origin.url, 'compression: { encodings: [zstd] }')), /compression\.encodings\[0\]/)
  await t.rejects(startGateway(t, yaml(origin.url, 'compression: { brotliQuality: 12 }')), /compression\.brotliQuality/)
})
