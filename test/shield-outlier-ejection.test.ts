// Issue 15 item 14: a target that accepts connections but stops answering (SIGSTOP: the kernel
// still completes the handshake) is ejected after `consecutiveFailures` response timeouts in a
// row, and /readyz and /metrics say so.
import t from 'tap'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { parseResponses, rawExchange } from './helpers/raw-http.js'
import type { Teardown } from './helpers/teardown.js'

/** A real HTTP server in its own process, so it can be stopped with SIGSTOP. */
async function startStoppableUpstream (t: Teardown): Promise<{ url: string, stop: () => void }> {
  const script = `
    const server = require('node:http').createServer((req, res) => res.end('{"name":"stoppable"}'))
    server.listen(0, '127.0.0.1', () => require('node:fs').writeSync(1, server.address().port + '\\n'))`
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] })
  t.teardown(() => child.kill('SIGKILL'))
  const [line] = await once(child.stdout, 'data') as [Buffer]
  return { url: `http://127.0.0.1:${Number(line.toString().trim())}`, stop: () => child.kill('SIGSTOP') }
}

t.test('a stopped target is ejected after consecutive response timeouts; /readyz and /metrics show it', async t => {
  const good = await startUpstream(t, 'good')
  const stoppable = await startStoppableUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend:
    targets: [${stoppable.url}, ${good.url}]
    timeouts: { response: 300ms }
    consecutiveFailures: 3
    ejectFor: 1m
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  t.equal((await fetch(`${gw.url}/warm`)).status, 200, 'both targets answer before the stop')
  stoppable.stop()
  const statuses: number[] = []
  for (let i = 0; i < 12; i++) {
    const res = await fetch(`${gw.url}/r/${i}`)
    await res.arrayBuffer()
    statuses.push(res.status)
  }
  t.equal(statuses.filter(s => s === 504).length, 3, `exactly consecutiveFailures timeouts, then ejected (${statuses.join(' ')})`)
  t.same(statuses.slice(-6), [200, 200, 200, 200, 200, 200], 'every later request goes to the healthy target')

  const ready = await (await fetch(`${gw.adminUrl}/readyz`)).json() as { upstreams: Record<string, Array<{ url: string, healthy: boolean, ejectedForMs: number }>> }
  const targets = ready.upstreams.backend ?? []
  t.equal(targets.find(x => x.url === stoppable.url)?.healthy, false, '/readyz shows the stopped target ejected')
  t.ok((targets.find(x => x.url === stoppable.url)?.ejectedForMs ?? 0) > 30_000, 'for about ejectFor')
  t.equal(targets.find(x => x.url === good.url)?.healthy, true)

  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(metrics, `gateway_upstream_ejections_total{upstream="backend",target="${stoppable.url}",reason="consecutive_failures"} 1`)
  t.match(metrics, `gateway_upstream_target_healthy{upstream="backend",target="${stoppable.url}"} 0`)
  t.match(metrics, `gateway_upstream_target_healthy{upstream="backend",target="${good.url}"} 1`)
  t.ok(gw.lines.some(l => l.msg === 'upstream target ejected' && l.reason === 'consecutive_failures'), 'the ejection is logged')
})

t.test('a response resets the run: failures that are not consecutive never eject', async t => {
  const good = await startUpstream(t, 'good')
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${good.url}], consecutiveFailures: 2, ejectFor: 1m }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // /reset fails (a reset), /echo succeeds: reset, ok, reset, ok ... never two in a row. The
  // resets are POSTs: a GET is sent again after a reset (test/proxy-retry-reset.test.ts), and its
  // second reset would be the second in a row.
  const reset = async (): Promise<number> => (await fetch(`${gw.url}/reset`, { method: 'POST' })).status
  for (let i = 0; i < 4; i++) {
    t.equal(await reset(), 502)
    t.equal((await fetch(`${gw.url}/echo`)).status, 200)
  }
  t.equal(await reset(), 502)
  t.equal(await reset(), 502, 'two resets in a row')
  t.equal((await fetch(`${gw.url}/echo`)).status, 503, 'then the only target is ejected: 503 at once')
})

t.test('an upstream that refuses large bodies early (413, then close) is not ejected by a client\'s uploads', async t => {
  const { createServer } = await import('node:http')
  const server = createServer((req, res) => {
    if (req.method === 'GET') return res.end('ok')
    res.writeHead(413, { connection: 'close' })
    res.end('too big')
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => { server.closeAllConnections(); server.close() })
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [http://127.0.0.1:${(server.address() as import('node:net').AddressInfo).port}], consecutiveFailures: 2 }
routes:
  - { name: r, pathPrefix: /, upstream: backend }
`)
  const { request } = await import('node:http')
  // 8 MB, streamed (above bufferBodies): the upstream closes while the body is still being sent
  const post = async (): Promise<string> => await new Promise(resolve => {
    const req = request(`${gw.url}/upload`, { method: 'POST', agent: false, headers: { 'content-length': 8 * 1024 * 1024 } })
    req.on('response', res => { res.resume(); res.on('end', () => resolve(String(res.statusCode))) })
    req.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? 'error'))
    const chunk = Buffer.alloc(64 * 1024, 97)
    let sent = 0
    const pump = (): void => {
      while (sent < 8 * 1024 * 1024) {
        sent += chunk.length
        if (!req.write(chunk)) { req.once('drain', pump); return }
      }
      req.end()
    }
    pump()
  })
  for (let i = 0; i < 4; i++) await post()
  const get = await fetch(`${gw.url}/`)
  t.equal(get.status, 200, 'the target still takes traffic (four uploads refused by it used to eject it: 503)')
  t.notOk(gw.lines.some(l => l.msg === 'upstream target ejected'), 'no ejection logged')
})

t.test('WebSocket upgrades count toward ejection too: a target that accepts and never answers them is ejected', async t => {
  const held: import('node:net').Socket[] = []
  const silent = (await import('node:net')).createServer(socket => { held.push(socket) })
  await new Promise<void>(resolve => silent.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { for (const s of held) s.destroy(); silent.close() })
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend:
    targets: [http://127.0.0.1:${(silent.address() as import('node:net').AddressInfo).port}]
    timeouts: { response: 300ms }
    consecutiveFailures: 2
    ejectFor: 1m
routes:
  - { name: events, pathPrefix: /, websocket: true, upstream: backend }
`)
  const statuses: number[] = []
  for (let i = 0; i < 3; i++) {
    const text = await rawExchange(gw.port, 'GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n')
    statuses.push(parseResponses(text)[0]?.status ?? 0)
  }
  t.same(statuses, [504, 504, 503], 'two response timeouts, then the target is out')
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(metrics, /gateway_upstream_ejections_total\{upstream="backend",target="[^"]+",reason="consecutive_failures"\} 1/)
})
