// The admin listener's shield (src/admin/admin-shield.ts). Built with node's defaults, it took any
// number of connections: under a 256-file limit, idle connections to the admin port took the
// descriptors server.maxConnections keeps for upstream connections (a new public connection was
// reset, a held one got 503 GW_ERR_OUT_OF_FILES), and an idle or dripping admin connection lived
// 60 to 90 s whatever server.headersTimeout said. Now it holds adminMaxConnections at most and is
// timed as the public listener is; the page's /events stream still runs past requestTimeout.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { startGateway, spawnGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { flood } from './helpers/flood.js'
import { rawConnection, parseResponses } from './helpers/raw-http.js'
import { eventually } from './helpers/ratelimit.js'
import { adminMaxConnections } from '../src/admin/admin-shield.js'

/** The status of GET `url` on a new connection (not kept), tried until it is 200 (or 10 s pass). */
async function answeredAgain (url: string): Promise<number | string> {
  let status: number | string = 'no answer'
  for (let i = 0; i < 100 && status !== 200; i++) {
    status = await fetch(url, { headers: { connection: 'close' }, signal: AbortSignal.timeout(3000) }).then(async r => { await r.arrayBuffer(); return r.status }, () => 'no answer')
    if (status !== 200) await new Promise(resolve => setTimeout(resolve, 100))
  }
  return status
}

const limitedConfig = (fresh: string, extra = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${extra}
upstreams:
  fresh: { targets: [${fresh}] }
routes:
  - { name: warm, pathPrefix: /warm/, respond: { status: 200, body: warm } }
  - { name: fresh, pathPrefix: /fresh/, upstream: fresh }
`

t.test('bin/gateway under 256 files: an admin port flooded with idle connections leaves the descriptors a forwarded request needs', async t => {
  // `fresh` has had no connection: the request below opens one, a descriptor, in the middle of the flood
  const fresh = await startUpstream(t, 'fresh')
  const gw = await spawnGateway(t, limitedConfig(fresh.url), [], { openFiles: 256 })
  const held = rawConnection(gw.port)
  held.send('GET /warm/a HTTP/1.1\r\nHost: a\r\n\r\n')
  await held.untilText(/^HTTP\/1\.1 200/)
  // more than the process has descriptors for
  const f = await flood(t, gw.adminPort, 300)
  t.equal(300 - f.closed(), adminMaxConnections(128), 'the admin listener holds its cap (a quarter of the public 128), the rest are closed as they arrive')
  held.send('GET /fresh/b HTTP/1.1\r\nHost: a\r\n\r\n')
  const replies = parseResponses(await held.untilText(/(HTTP\/1\.1 \d{3}[^]*){2}/))
  t.equal(replies[1]?.status, 200, 'a held public connection is forwarded on a new upstream connection (it was 503 GW_ERR_OUT_OF_FILES)')
  const opened = await fetch(`${gw.url}/fresh/c`, { headers: { connection: 'close' }, signal: AbortSignal.timeout(5000) }).then(r => r.status, (err: Error) => `no answer: ${err.message}`)
  t.equal(opened, 200, 'a new public connection is accepted and forwarded (it was reset)')
  t.same(fresh.log, ['/fresh/b', '/fresh/c'])
  for (const s of f.sockets) s.destroy()
  t.equal(await answeredAgain(`${gw.adminUrl}/healthz`), 200, 'the admin listener answers once the flood has gone')
  const config = await (await fetch(`${gw.adminUrl}/config`, { headers: { connection: 'close' } })).json() as { generation: number }
  t.equal(config.generation, 1, 'and /config with it')
})

t.test('workers: 2 (bin/gateway) under 256 files: the primary\'s admin listener is capped, warns, and times idle connections out', async t => {
  const fresh = await startUpstream(t, 'fresh')
  // resolves on the worker's start line, which has the public port; the primary's has the admin port
  const gw = await spawnGateway(t, limitedConfig(fresh.url, 'workers: 2\nserver: { headersTimeout: 1s }'), [], { openFiles: 256 })
  const adminPort = (await gw.waitForLog(l => l.msg === 'gateway primary started')).adminPort as number
  const adminUrl = `http://127.0.0.1:${adminPort}`
  await eventually('both workers ready', async () => (await fetch(`${adminUrl}/readyz`)).status === 200, 30_000)
  const f = await flood(t, adminPort, 300)
  // the flood's held connections are closed by headersTimeout (1 s) meanwhile: at least the cap's overflow
  t.ok(f.closed() >= 300 - adminMaxConnections(128), `${f.closed()} of 300 closed: no more than the cap held`)
  const warned = await gw.waitForLog(l => typeof l.msg === 'string' && l.msg.startsWith('admin connection closed as it arrived'), 5000)
  t.match(warned, { level: 40, adminMaxConnections: adminMaxConnections(128), peer: '127.0.0.1' }, 'the primary warns of the connections closed over the cap')
  t.equal(gw.logs.filter(l => typeof l.msg === 'string' && l.msg.startsWith('admin connection closed as it arrived')).length, 1, 'once for the whole flood (at most every 10 s)')
  const opened = await fetch(`${gw.url}/fresh/a`, { headers: { connection: 'close' }, signal: AbortSignal.timeout(5000) }).then(r => r.status, (err: Error) => `no answer: ${err.message}`)
  t.equal(opened, 200, 'a public connection, accepted by the primary and handed to a worker, is forwarded')
  // every connection the primary held is closed by server.headersTimeout, not node's 60 s and more
  await eventually('the held admin connections closed by headersTimeout', async () => f.closed() === 300, 20_000)
  t.equal(await answeredAgain(`${adminUrl}/healthz`), 200, 'the primary\'s admin listener answers after the flood')
  const shown = await (await fetch(`${adminUrl}/config`)).json() as { config: { server: { maxConnections: unknown } } }
  t.equal(shown.config.server.maxConnections, 128, '/config shows the cap the workers took, half of 256 files (it said null)')
})

t.test('an in-process admin listener: over the cap closed as they arrive, a reload moves the cap', async t => {
  const up = await startUpstream(t)
  const yaml = (max: number): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { maxConnections: ${max} }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
  const gw = await startGateway(t, yaml(200))
  const cap = adminMaxConnections(200)
  t.equal(cap, 50, 'a quarter of server.maxConnections 200')
  const f = await flood(t, gw.adminPort, cap + 10)
  t.equal(f.closed(), 10, 'the 10 beyond the cap are closed as they arrive')
  t.equal(gw.lines.filter(l => typeof l.msg === 'string' && l.msg.startsWith('admin connection closed as it arrived')).length, 1, 'warned of, once for the 10')
  t.equal(await fetch(`${gw.url}/x`).then(r => r.status), 200, 'the public listener serves beside it')
  const refused = await fetch(`${gw.adminUrl}/healthz`, { headers: { connection: 'close' }, signal: AbortSignal.timeout(3000) }).then(r => r.status, () => 'no answer')
  t.equal(refused, 'no answer', 'a new admin connection gets none while the cap is held')
  for (const s of f.sockets) s.destroy()
  t.equal(await answeredAgain(`${gw.adminUrl}/healthz`), 200, 'answered once the flood has gone')
  writeFileSync(gw.configFile, yaml(10_000))
  t.equal((await gw.reload()).ok, true)
  const again = await flood(t, gw.adminPort, 70)
  t.equal(again.closed(), 70 - 64, 'a reload raising server.maxConnections raises the cap to its most, 64')
  for (const s of again.sockets) s.destroy()
  t.equal(await answeredAgain(`${gw.adminUrl}/healthz`), 200)
  // a quarter of 40 is 10: the admin listener keeps room for the page's streams whatever the public cap
  writeFileSync(gw.configFile, yaml(40))
  t.equal((await gw.reload()).ok, true)
  const floor = await flood(t, gw.adminPort, 40)
  t.equal(floor.closed(), 40 - 32, 'a small server.maxConnections leaves the admin listener its floor, 32')
})

t.test('idle and dripping admin connections are closed by server.headersTimeout, kept-alive ones by keepAliveTimeout; /events runs past requestTimeout', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { headersTimeout: 1s, requestTimeout: 2s, keepAliveTimeout: 500ms }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const t0 = Date.now()
  const closedAfter = (c: ReturnType<typeof rawConnection>): Promise<number> => c.closed.then(() => Date.now() - t0)
  const events = rawConnection(gw.adminPort)
  events.send('GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n')
  const idle = rawConnection(gw.adminPort)
  const drip = rawConnection(gw.adminPort)
  drip.send('GET /config HTTP/1.1\r\n')
  const dripping = setInterval(() => { drip.send('X-a: b\r\n') }, 200)
  t.teardown(() => { clearInterval(dripping) })
  const kept = rawConnection(gw.adminPort)
  kept.send('GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n')
  await kept.untilText(/"status": "ok"/)
  // node's defaults: 60 s (checked every 30 s) for the first two, 5 s for the kept-alive one
  const [idleMs, dripMs, keptMs] = await Promise.all([closedAfter(idle), closedAfter(drip), closedAfter(kept)])
  clearInterval(dripping)
  t.ok(idleMs < 15_000, `a connection that sent nothing closed after ${idleMs} ms (headersTimeout 1 s)`)
  t.match(idle.received(), /^HTTP\/1\.1 408/, 'with a 408, as the public listener answers it')
  t.ok(dripMs < 15_000, `a connection dripping a header line every 200 ms closed after ${dripMs} ms`)
  t.ok(keptMs < 4000, `a kept-alive connection closed after ${keptMs} ms (keepAliveTimeout 500 ms; node's default is 5 s)`)
  // the stream was received whole at once: requestTimeout (2 s) bounds the receiving of a request only
  const updates = (): number => events.received().split('event: update').length - 1
  const seen = updates()
  await eventually('an update on /events more than requestTimeout after it opened', async () => Date.now() - t0 > 3500 && updates() > seen, 15_000)
  t.match(events.received(), /^HTTP\/1\.1 200/)
  t.notMatch(events.received(), /HTTP\/1\.1 408/, 'never cut with a 408')
})
