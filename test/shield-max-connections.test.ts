// server.maxConnections: client connections open at once. A flood of connections that send
// nothing (each held until headersTimeout) took every file descriptor the process had: the
// upstream connection a request needed failed, and the gateway answered no one while they lasted.
// With the cap, a connection beyond it is closed as it arrives and counted; the connections the
// gateway holds are served, and the descriptors an upstream connection needs stay free.
import t from 'tap'
import net from 'node:net'
import { writeFileSync } from 'node:fs'
import { startGateway, spawnGateway, type GatewayProcess } from './helpers/gateway.js'
import { startUpstream, type Upstream } from './helpers/upstream.js'
import { rawConnection, parseResponses } from './helpers/raw-http.js'
import { twoWorkers } from './helpers/workers.js'
import { flood } from './helpers/flood.js'
import type { Teardown } from './helpers/teardown.js'

const yaml = (up: string, cap: number): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { maxConnections: ${cap} }
upstreams:
  backend: { targets: [${up}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`

async function metrics (adminUrl: string): Promise<{ dropped: number, open: number }> {
  const text = await (await fetch(`${adminUrl}/metrics`)).text()
  const value = (name: string): number => Number(new RegExp(`^${name} (\\d+)`, 'm').exec(text)?.[1] ?? NaN)
  return { dropped: value('gateway_connections_dropped_total'), open: value('gateway_connections_open') }
}

/** Until the gateway counts `n` client connections open (an admin request may find no descriptor meanwhile). */
async function untilOpenConnections (adminUrl: string, n: number): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const open = await metrics(adminUrl).then(m => m.open, () => NaN)
    if (open === n) return
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  throw new Error(`the gateway never counted ${n} open connections`)
}

/**
 * bin/gateway limited to 256 open files, with a connection the test holds (served by a route the
 * gateway answers, so no upstream connection is open, nor closed on a timer to free a descriptor)
 * and an upstream, `fresh`, that no connection has been opened to yet.
 */
async function limitedToFiles (t: Teardown, extra: { server?: string, fresh?: string } = {}): Promise<{ gw: GatewayProcess, fresh: Upstream, held: ReturnType<typeof rawConnection> }> {
  const fresh = await startUpstream(t, 'fresh')
  const gw = await spawnGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${extra.server ?? ''}
upstreams:
  fresh: { targets: [${fresh.url}]${extra.fresh ?? ''} }
routes:
  - { name: warm, pathPrefix: /warm/, respond: { status: 200, body: warm } }
  - { name: fresh, pathPrefix: /fresh/, upstream: fresh }
`, [], { openFiles: 256 })
  const held = rawConnection(gw.port)
  held.send('GET /warm/a HTTP/1.1\r\nHost: a\r\n\r\n')
  await held.untilText(/^HTTP\/1\.1 200/)
  return { gw, fresh, held }
}

t.test('connections beyond the cap are closed as they arrive and counted; those held are served', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, 20))
  const held = rawConnection(gw.port)
  held.send('GET /first HTTP/1.1\r\nHost: a\r\n\r\n')
  await held.untilText(/"url":"\/first"/)
  const f = await flood(t, gw.port, 40)
  t.equal(f.closed(), 21, 'the held connection and 19 of the flood fill the 20; the other 21 are closed')
  t.same(await metrics(gw.adminUrl), { dropped: 21, open: 20 })
  held.send('GET /second HTTP/1.1\r\nHost: a\r\n\r\n')
  const replies = parseResponses(await held.untilText(/(HTTP\/1\.1 200[^]*){2}/))
  t.same(replies.map(r => r.status), [200, 200], 'a connection the gateway holds is served through the flood')
  const warned = gw.lines.filter(l => typeof l.msg === 'string' && l.msg.startsWith('connection closed as it arrived'))
  t.equal(warned.length, 1, 'said once for the 21 (at most every 10 s)')
  t.match(warned[0], { level: 40, maxConnections: 20, peer: '127.0.0.1' })
  const refused = await fetch(gw.url + '/third', { signal: AbortSignal.timeout(3000) }).then(r => r.status, () => 'no answer')
  t.equal(refused, 'no answer', 'a new connection gets none while 20 are open')
  for (const s of f.sockets) s.destroy()
  let after: number | string = 0
  for (let i = 0; i < 50 && after !== 200; i++) {
    after = await fetch(gw.url + '/fourth').then(r => r.status, () => 'no answer')
    if (after !== 200) await new Promise(resolve => setTimeout(resolve, 50))
  }
  t.equal(after, 200, 'served again once the flood has gone')
  writeFileSync(gw.configFile, yaml(up.url, 100))
  t.equal((await gw.reload()).ok, true)
  const dropped = (await metrics(gw.adminUrl)).dropped
  const again = await flood(t, gw.port, 40)
  t.equal(again.closed(), 0, 'a reload raises the cap for the connections that come next')
  t.equal((await metrics(gw.adminUrl)).dropped, dropped)
  writeFileSync(gw.configFile, yaml(up.url, 5))
  t.equal((await gw.reload()).ok, true)
  const late = await flood(t, gw.port, 3)
  t.same([late.closed(), (await metrics(gw.adminUrl)).dropped], [3, dropped + 3], 'and lowers it: with 41 open, each new one is closed (the open ones stay)')
  t.equal(again.closed(), 0)
})

t.test('by default the cap is half the open-file limit: a flood leaves the descriptors an upstream connection needs', async t => {
  const { gw, fresh, held } = await limitedToFiles(t)
  // 300 connections: more than the process has descriptors for
  const f = await flood(t, gw.port, 300)
  // the first request to this upstream: a connection, a descriptor, opened in the middle of the flood
  held.send('GET /fresh/b HTTP/1.1\r\nHost: a\r\n\r\n')
  const replies = parseResponses(await held.untilText(/(HTTP\/1\.1 \d{3}[^]*){2}/))
  t.equal(replies[1]?.status, 200, 'forwarded on a new upstream connection')
  t.same(fresh.log, ['/fresh/b'])
  t.equal(300 + 1 - f.closed(), 128, 'the gateway holds 128 connections (half of 256), the held one among them')
  const warned = await gw.waitForLog(l => l.msg !== undefined && String(l.msg).startsWith('connection closed as it arrived'), 5000)
  t.equal(warned.maxConnections, 128)
  t.match(await metrics(gw.adminUrl), { dropped: f.closed(), open: 128 })
  const shown = await (await fetch(gw.adminUrl + '/config')).json() as { config: { server: { maxConnections: unknown } } }
  t.equal(shown.config.server.maxConnections, 128, '/config shows the cap in force, not null')
})

t.test('workers: 2 (bin/gateway): the cap is each worker\'s; the primary\'s /metrics sums the drops', async t => {
  const up = await startUpstream(t)
  const r = await twoWorkers(t, yaml(up.url, 5).replace('admin: 127.0.0.1:0\n', 'admin: 127.0.0.1:0\nworkers: 2\n'))
  const f = await flood(t, r.gw.port, 20)
  const held = 20 - f.closed()
  // the primary hands connections to the workers in turn: each holds its 5, or fewer if it was given fewer
  t.ok(held > 5 && held <= 10, `${held} held: more than one worker's 5, at most both workers' 10`)
  t.same(await metrics(r.adminUrl), { dropped: 20 - held, open: held })
})

t.test('with proxyProtocol: a connection waiting for its header is held and counted; one dropped is no header refusal', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, 3) + 'proxyProtocol: { from: [127.0.0.1], timeout: 1s }\n')
  const f = await flood(t, gw.port, 5)
  t.equal(f.closed(), 2, 'three wait for their header, the other two are dropped at once')
  t.match(await metrics(gw.adminUrl), { dropped: 2, open: 3 })
  let text = ''
  for (let i = 0; i < 100 && !/gateway_proxy_protocol_refused_total\{reason="timeout"\} 3/.test(text); i++) {
    await new Promise(resolve => setTimeout(resolve, 50))
    text = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  }
  t.match(text, /gateway_proxy_protocol_refused_total\{reason="timeout"\} 3\n/, 'the three held are refused when their header is late; the two dropped are not among them')
  t.notMatch(text, /reason="missing"|reason="malformed"/)
  const c = rawConnection(gw.port)
  c.send('PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\nGET /a HTTP/1.1\r\nHost: a\r\n\r\n')
  t.match(await c.untilText(/HTTP\/1\.1 \d{3}/), /^HTTP\/1\.1 200/, 'room again once they closed')
})

t.test('a connection whose h2c offer was declined is counted once', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, 2))
  const offered = rawConnection(gw.port)
  // node hands a declined upgrade's connection to the server again: one connection, not two
  offered.send('GET /h2c HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n')
  t.match(await offered.untilText(/"url":"\/h2c"/), /^HTTP\/1\.1 200/, 'served over HTTP/1.1')
  t.match(await metrics(gw.adminUrl), { open: 1, dropped: 0 })
  const second = rawConnection(gw.port)
  second.send('GET /second HTTP/1.1\r\nHost: a\r\n\r\n')
  t.match(await second.untilText(/"url":"\/second"/), /^HTTP\/1\.1 200/, 'the second of two is held')
  t.match(await metrics(gw.adminUrl), { open: 2, dropped: 0 })
})

t.test('out of descriptors all the same (a cap above the limit): 503 GW_ERR_OUT_OF_FILES, and the target is not blamed, by requests nor by its health checks', async t => {
  // probes every second; one failure would take the target out, and only 20 passes (20 s) bring it
  // back. The timeout is generous: a probe slowed by the flood's load is no failure this test is about
  const check = ', healthCheck: { path: /health, interval: 1s, timeout: 900ms, unhealthyAfter: 1, healthyAfter: 20 }'
  const { gw, fresh, held } = await limitedToFiles(t, { server: 'server: { maxConnections: 1000 }', fresh: ', consecutiveFailures: 2' + check })
  const f = await flood(t, gw.port, 300)
  // at least two probes find no descriptor while the flood lasts: no verdict, not failures
  await new Promise(resolve => setTimeout(resolve, 2500))
  // three attempts at a connection the process has no descriptor for (consecutiveFailures: 2)
  for (let i = 1; i <= 3; i++) held.send(`GET /fresh/${i} HTTP/1.1\r\nHost: a\r\n\r\n`)
  const replies = parseResponses(await held.untilText(/(HTTP\/1\.1 \d{3}[^]*){4}/)).slice(1)
  t.same(replies.map(r => [r.status, r.json?.error]), [[503, 'GW_ERR_OUT_OF_FILES'], [503, 'GW_ERR_OUT_OF_FILES'], [503, 'GW_ERR_OUT_OF_FILES']])
  const line = await gw.waitForLog(l => l.path === '/fresh/1', 5000)
  t.match(line, { status: 503, error: 'out_of_files' }, 'logged as the gateway\'s shortage')
  t.notOk('retriedAfter' in line, 'not retried: no other target would fare better')
  for (const s of f.sockets) s.destroy()
  // descriptors are free once the gateway has seen the flood's connections close (on a loaded
  // machine that takes more than a moment): only the held one stays open
  await untilOpenConnections(gw.adminUrl, 1)
  held.send('GET /fresh/after HTTP/1.1\r\nHost: a\r\n\r\n')
  const after = parseResponses(await held.untilText(/(HTTP\/1\.1 \d{3}[^]*){5}/))[4]
  t.equal(after?.status, 200, 'the target was neither ejected nor failed: served as soon as descriptors are free')
  t.same(fresh.log.filter(url => url !== '/health'), ['/fresh/after'])
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.notMatch(text, /gateway_upstream_errors_total\{upstream="fresh"/, 'no upstream error counted')
  t.notMatch(text, /gateway_upstream_ejections_total\{upstream="fresh"/)
})

t.test('an accept that fails is warned of, and the listener serves on (it ended the process without a listener)', async t => {
  // ENFILE or ENOBUFS on accept cannot be brought about here without starving the whole machine:
  // the listener's 'error' is emitted as node emits it for a failed accept (net.js onconnection)
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, 100))
  const listener = (gw as unknown as { server: net.Server }).server
  listener.emit('error', Object.assign(new Error('accept ENFILE'), { code: 'ENFILE', syscall: 'accept' }))
  t.equal((await fetch(gw.url + '/after')).status, 200, 'served on')
  t.match(gw.lines.find(l => typeof l.msg === 'string' && l.msg.startsWith('a listener failed to accept')), { level: 40, code: 'ENFILE' })
})
