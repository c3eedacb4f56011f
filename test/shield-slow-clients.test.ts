// Issue 15 item 1: slow clients must not hold upstream connections. The attack (connections that
// announce a body and send one byte at a time, clients that stop reading a large response) is run
// at a small scale, against an upstream pool of one or two connections, so it takes seconds.
import t from 'tap'
import net from 'node:net'
import tls from 'node:tls'
import { writeFileSync } from 'node:fs'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { localhostCertificate } from './helpers/tls.js'
import type { Teardown } from './helpers/teardown.js'

interface RawClient {
  readonly socket: net.Socket
  /** Everything the gateway wrote back, so far. */
  readonly received: () => string
  /** Resolves with the whole answer once the gateway closes the connection. */
  readonly closed: Promise<string>
}

/** A client sending `head` over plain TCP, or TLS (a self-signed certificate accepted) when `secure`. */
function rawClient (t: Teardown, port: number, head: string, secure = false): Promise<RawClient> {
  return new Promise((resolve, reject) => {
    const connected = (): void => {
      socket.write(head)
      resolve({ socket, received: () => data, closed })
    }
    const socket = secure
      ? tls.connect({ port, host: '127.0.0.1', rejectUnauthorized: false }, connected)
      : net.connect(port, '127.0.0.1', connected)
    let data = ''
    const closed = new Promise<string>(resolve => socket.once('close', () => resolve(data)))
    socket.on('data', (c: Buffer) => { data += c.toString('latin1') })
    socket.on('error', reject)
    t.teardown(() => socket.destroy())
  })
}

async function getWithin (url: string, ms: number): Promise<number> {
  const res = await fetch(url, { signal: AbortSignal.timeout(ms) })
  await res.arrayBuffer()
  return res.status
}

const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

t.test('slow POST bodies do not take upstream connections: other clients are served during the attack', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
upstreams:
  backend: { targets: [${upstream.url}], maxConnections: 2 }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // Three times the upstream pool: each attacker announces ~1 MB and trickles one byte every 100 ms.
  const attackers: RawClient[] = []
  for (let i = 0; i < 6; i++) {
    attackers.push(await rawClient(t, gw.port, 'POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n'))
  }
  const trickle = setInterval(() => { for (const a of attackers) a.socket.write('x') }, 100)
  t.teardown(() => clearInterval(trickle))
  await sleep(500)
  // Well-behaved clients get answers at once (a 5 s bound, far above what one takes).
  for (let i = 0; i < 10; i++) t.equal(await getWithin(`${gw.url}/echo/${i}`, 5000), 200, `GET ${i} answered during the attack`)
  t.notOk(upstream.log.includes('/upload'), 'no trickling body reached the upstream')
  clearInterval(trickle)
})

t.test('a body that stops arriving gets 408 after server.clientBodyTimeout and never reaches the upstream', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { clientBodyTimeout: 300ms }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const client = await rawClient(t, gw.port, 'POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789')
  const answer = await client.closed
  t.match(answer, /^HTTP\/1\.1 408 /, '408 Request Timeout')
  t.match(answer, /"error":"GW_ERR_CLIENT_TIMEOUT"/)
  t.notOk(upstream.log.includes('/upload'), 'the upstream never saw the request')
  t.ok(gw.lines.some(l => l.msg === 'request' && l.status === 408 && l.error === 'client_timeout'), 'logged as client_timeout')
})

t.test('a body trickling in forever is cut at server.requestTimeout, though each byte comes within clientBodyTimeout', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { headersTimeout: 500ms, requestTimeout: 1s, clientBodyTimeout: 60s }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const client = await rawClient(t, gw.port, 'POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n')
  const trickle = setInterval(() => { if (!client.socket.destroyed) client.socket.write('x') }, 100)
  t.teardown(() => clearInterval(trickle))
  // a bound far above the timeout (1 s, checked every 250 ms): without the cut, the body would
  // go on arriving for the whole 1000 s it announced
  const cut = await Promise.race([client.closed.then(() => true), sleep(15_000).then(() => false)])
  clearInterval(trickle)
  t.ok(cut, 'the gateway closed the connection')
  t.notOk(upstream.log.includes('/upload'), 'the upstream never saw the request')
  for (let i = 0; i < 100 && !gw.lines.some(l => l.msg === 'request'); i++) await sleep(50)
  await sleep(200)
  // one line for the one request, saying the gateway cut it: not a client abort (499) beside a
  // line for a 408 that was never sent
  const lines = gw.lines.filter(l => l.msg === 'request').map(l => [l.route, l.path, l.status, l.error])
  t.same(lines, [['all', '/upload', 408, 'client_timeout']], 'logged once, as the gateway\'s client_timeout')
})

t.test('a streamed body (beyond server.bufferBodiesTotal) that stops arriving is cut after clientBodyTimeout', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { clientBodyTimeout: 300ms, bufferBodiesTotal: 0 }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const client = await rawClient(t, gw.port, 'POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789')
  const aborted = await upstream.nextAbort(5000)
  t.equal(aborted, '/upload', 'the upstream request was aborted (its connection freed)')
  const answer = await client.closed
  t.match(answer, /^HTTP\/1\.1 408 /)
})

t.test('beyond server.bufferBodiesTotal bodies stream as before; within it they arrive whole', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { bufferBodiesTotal: 64 }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // 32 bytes fit the budget: buffered, then sent.
  const small = await fetch(`${gw.url}/upload`, { method: 'POST', body: 'a'.repeat(32) })
  t.same(await small.json(), { bytes: 32 })
  // 1000 bytes do not: after the first 100 the request goes upstream while the body still arrives.
  const client = await rawClient(t, gw.port, 'POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n' + 'b'.repeat(100))
  const deadline = Date.now() + 5000
  while (upstream.log.filter(u => u === '/upload').length < 2 && Date.now() < deadline) await sleep(20)
  t.equal(upstream.log.filter(u => u === '/upload').length, 2, 'the upstream saw the request before the body ended')
  client.socket.write('b'.repeat(900))
  const answer = await client.closed
  t.match(answer, /"bytes":1000/, 'the whole body arrived, streamed')
})

t.test('a client that stops reading is cut after server.sendTimeout and frees its upstream connection', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { sendTimeout: 300ms }
upstreams:
  backend: { targets: [${upstream.url}], maxConnections: 1 }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const reader = await rawClient(t, gw.port, 'GET /download?bytes=104857600 HTTP/1.1\r\nHost: x\r\n\r\n')
  reader.socket.pause() // reads nothing more: the kernel buffers fill, then the gateway's writes wait
  t.equal(await upstream.nextAbort(5000), '/download?bytes=104857600', 'the upstream download was aborted')
  t.equal(await getWithin(`${gw.url}/echo`, 5000), 200, 'the single upstream connection serves the next client')
  t.ok(gw.lines.some(l => l.msg === 'request' && l.error === 'send_timeout'), 'logged as send_timeout')
})

t.test('a client that stops reading while its body still arrives is cut after server.sendTimeout all the same', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { sendTimeout: 1s, bufferBodies: 0 }
upstreams:
  backend: { targets: [${upstream.url}], maxConnections: 1 }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // the upstream answers a large download at once, before the body has ended; the client never reads
  const client = await rawClient(t, gw.port, 'POST /download?bytes=104857600 HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello')
  client.socket.pause()
  await sleep(400) // the response is held up by now: the send timer runs (and ends after this)
  client.socket.write('world') // the body ends: this cleared the send timer, and nothing cut the client
  t.equal(await upstream.nextAbort(5000), '/download?bytes=104857600', 'the upstream download was aborted')
  t.equal(await getWithin(`${gw.url}/echo`, 5000), 200, 'the single upstream connection serves the next client')
  t.ok(gw.lines.some(l => l.msg === 'request' && l.error === 'send_timeout'), 'logged as send_timeout')
})

t.test('an upstream body that stalls longer than timeouts.idle is cut, though timeouts.response is long', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}], timeouts: { response: 30s, idle: 300ms } }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const started = Date.now()
  const res = await fetch(`${gw.url}/drip?chunks=5&intervalMs=2000`)
  t.equal(res.status, 200, 'headers came at once')
  await t.rejects(res.arrayBuffer(), 'the body is cut')
  t.ok(Date.now() - started < 1900, 'cut well before the next 2 s chunk')
  t.ok(gw.lines.some(l => l.msg === 'request' && l.error === 'response_timeout'), 'logged as response_timeout')
})

t.test('a reload that tightens the shield applies at once: timeouts, header size and count', async t => {
  const upstream = await startUpstream(t)
  const yaml = (tight: boolean): string => `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: ${tight
    ? '{ headersTimeout: 1s, requestTimeout: 2s, keepAliveTimeout: 500ms, maxHeaderSize: 1024, maxHeadersCount: 10 }'
    : '{ headersTimeout: 20s, requestTimeout: 30s, keepAliveTimeout: 20s, maxHeaderSize: 16384, maxHeadersCount: 100 }'}
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`
  const gw = await startGateway(t, yaml(false))
  // a slowloris head opened before the reload, and one after
  const before = await rawClient(t, gw.port, 'GET /x HTTP/1.1\r\nHost: x\r\n')
  writeFileSync(gw.configFile, yaml(true))
  t.match(await gw.reload(), { ok: true })
  const after = await rawClient(t, gw.port, 'GET /x HTTP/1.1\r\nHost: x\r\n')
  // a body trickling in (requestTimeout), and an idle keep-alive connection (keepAliveTimeout)
  const trickling = await rawClient(t, gw.port, 'POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n')
  const trickle = setInterval(() => { if (!trickling.socket.destroyed) trickling.socket.write('x') }, 200)
  t.teardown(() => clearInterval(trickle))
  const idle = await rawClient(t, gw.port, 'GET /x HTTP/1.1\r\nHost: x\r\n\r\n')
  const cut = await Promise.race([Promise.all([before.closed, after.closed, trickling.closed, idle.closed]), sleep(8000).then(() => null)])
  t.not(cut, null, 'all four cut under the new settings (the old ones, 20 s and more, stayed in force)')
  t.match(cut?.[1] ?? '', /^HTTP\/1\.1 408 /, 'the later slowloris got 408')
  t.match(cut?.[3] ?? '', /^HTTP\/1\.1 200 /, 'the idle connection was answered, then closed after 500 ms')
  const big = await fetch(`${gw.url}/x`, { headers: { 'x-big': 'a'.repeat(2048) } })
  t.equal(big.status, 431, 'a 2 KB header on a new connection is over the new 1 KB maxHeaderSize')
  const many = await fetch(`${gw.url}/x`, { headers: Object.fromEntries(Array.from({ length: 15 }, (_, i) => [`x-h${i}`, '1'])) })
  t.equal(many.status, 431, '15 fields on a new connection are over the new maxHeadersCount of 10')
})


t.test('a body that arrives after its 408 is not taken from server.bufferBodiesTotal: later bodies still get the whole budget', async t => {
  const upstream = await startUpstream(t)
  const { cert, key } = localhostCertificate(t, 'gw-body-budget')
  // TLS: node finishes a TLS write in the loop's check phase, so a chunk waiting in the kernel
  // when the 408 goes out is read (poll phase) after the request settled and before the 408's
  // 'finish' hands the body to the lingering close. Over plain TCP that 'finish' comes in the
  // same turn as the 408, and the chunk finds nobody listening.
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
tls: { cert: ${cert}, key: ${key} }
server: { clientBodyTimeout: 200ms, bufferBodiesTotal: 100 }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // Expect: 100-continue: the 100 comes as the gateway starts to read the body into memory
  const late = await rawClient(t, gw.port, 'POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n', true)
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no 100 Continue within 5 s')), 5000)
    // In the read of the 100 (an I/O callback): 80 bytes sent, then the gateway's loop (this
    // process's) held past clientBodyTimeout, as a loaded one is. Its next turn runs the body
    // timer (408) before it reads the 80 bytes, which then reach a request that has settled.
    const onData = (): void => {
      if (!late.received().includes('100 Continue')) return
      late.socket.off('data', onData)
      clearTimeout(timer)
      late.socket.write('a'.repeat(80))
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 400)
      resolve()
    }
    late.socket.on('data', onData)
  })
  t.match(await late.closed, /HTTP\/1\.1 408 /, 'the first request is answered 408')
  // 100 bytes are the whole budget: read into memory (the request is not sent upstream before
  // its body ends, so its 408 comes with no upstream call), not streamed to the upstream
  const whole = await rawClient(t, gw.port, 'POST /whole HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n' + 'b'.repeat(100), true)
  t.match(await whole.closed, /HTTP\/1\.1 408 /)
  const deadline = Date.now() + 5000
  while (!gw.lines.some(l => l.msg === 'request' && l.path === '/whole') && Date.now() < deadline) await sleep(20)
  const line = gw.lines.find(l => l.msg === 'request' && l.path === '/whole')
  t.match(line, { status: 408, error: 'client_timeout' })
  t.equal(line?.target, undefined, 'buffered: no upstream target was given the request')
  t.notOk(upstream.log.includes('/whole'), 'the upstream never saw it')
})
