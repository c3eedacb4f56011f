// gateway reload as an operator runs it (bin/gateway, real processes): it waits for the running
// gateway's verdict, names a change that needs a restart, and never signals an invalid file.
// (Split from test/opx-cli.test.ts, which outgrew tap's 180 s per file on a loaded machine.)
import t from 'tap'
import { writeFileSync } from 'node:fs'
import net from 'node:net'
import { once } from 'node:events'
import { spawnGateway } from './helpers/gateway.js'
import { startHttpServer, startUpstream } from './helpers/upstream.js'
import { gateway, oneRoute } from './helpers/cli.js'

t.test('reload: a valid edit reports the new generation once the gateway has swapped', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'first'))
  writeFileSync(gw.file, oneRoute(up.url, 'second'))
  const r = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(r.code, 0, r.stderr)
  t.match(r.stdout, /reloaded: generation 1 -> 2/)
  t.equal(r.stderr, '', 'nothing needs a restart')
  // the verdict is the gateway's: by the time the CLI exits, /config serves the new file
  const live = await (await fetch(`${gw.adminUrl}/config`)).json() as { generation: number, config: { routes: Array<{ name: string }> } }
  t.equal(live.generation, 2)
  t.equal(live.config.routes[0]?.name, 'second')
})

t.test('reload: a change that needs a restart (listen) is accepted and named on stderr', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'first'))
  writeFileSync(gw.file, oneRoute(up.url, 'second').replace('listen: 127.0.0.1:0', 'listen: 127.0.0.1:1'))
  const r = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(r.code, 0, r.stderr)
  t.match(r.stdout, /reloaded: generation 1 -> 2/)
  t.equal(r.stderr, 'gateway reload: listen: these changes need a restart; the running gateway keeps its start\'s values\n')
  t.equal((await fetch(`${gw.url}/x`)).status, 200, 'still served on the address it started with')
  const lastReload = async (): Promise<{ ok: boolean, generation: number, restartNeeded: string[] }> =>
    ((await (await fetch(`${gw.adminUrl}/config`)).json()) as { lastReload: { ok: boolean, generation: number, restartNeeded: string[] } }).lastReload
  const first = await lastReload()
  t.same([first.ok, first.generation, first.restartNeeded], [true, 2, ['listen']], '/config names it too')

  // listen back as started, the admin address and workers changed: a single process names both
  writeFileSync(gw.file, oneRoute(up.url, 'third').replace('admin: 127.0.0.1:0', 'admin: 127.0.0.1:1') + 'workers: 2\n')
  const again = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(again.code, 0, again.stderr)
  t.match(again.stdout, /reloaded: generation 2 -> 3/)
  t.equal(again.stderr, 'gateway reload: admin, workers: these changes need a restart; the running gateway keeps its start\'s values\n')
  const second = await lastReload()
  t.same([second.ok, second.generation, second.restartNeeded], [true, 3, ['admin', 'workers']], '/config lastReload.restartNeeded: admin and workers, listen no longer')
  t.equal((await fetch(`${gw.url}/x`)).status, 200, 'still one process serving on its start\'s addresses')
  for (let i = 0; i < 5; i++) await (await fetch(`${gw.url}/x`, { headers: { connection: 'close' } })).text()
  await gw.waitForLog(() => gw.logs.filter(l => l.msg === 'request').length >= 6)
  t.same([...new Set(gw.logs.filter(l => l.msg === 'request').map(l => l.pid))], [gw.child.pid], 'every request answered by the process itself: no worker was forked')
})

t.test('reload: signalled while another reload runs, it reports the verdict of the reload that read its file', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'first'))
  const adminConfig = async (): Promise<{ generation: number, reloadPending: boolean }> => await (await fetch(`${gw.adminUrl}/config`)).json() as { generation: number, reloadPending: boolean }
  // Each reload below takes 2 s in the gateway: its Redis takes connections and never answers,
  // and the start of a store waits that long for it (the CLI's own check opens nothing).
  const silentRedis = async (): Promise<string> => {
    const silent = net.createServer(socket => { socket.on('error', () => {}) })
    silent.listen(0, '127.0.0.1')
    await once(silent, 'listening')
    t.teardown(() => { silent.close() })
    return `redis://127.0.0.1:${(silent.address() as net.AddressInfo).port}`
  }
  writeFileSync(gw.file, oneRoute(up.url, 'first') + `redis: { url: "${await silentRedis()}", timeout: 100ms }\n`)
  process.kill(gw.child.pid!, 'SIGHUP')
  for (let i = 0; i < 500 && !(await adminConfig()).reloadPending; i++) await new Promise(resolve => setTimeout(resolve, 10))
  t.equal((await adminConfig()).reloadPending, true, 'the first reload is running')
  // meanwhile the operator writes the next file and runs gateway reload: its SIGHUP queues a
  // second reload, whose verdict comes 2 s after the first one's
  writeFileSync(gw.file, oneRoute(up.url, 'second').replace('listen: 127.0.0.1:0', 'listen: 127.0.0.1:1') + `redis: { url: "${await silentRedis()}", timeout: 100ms }\n`)
  const r = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(r.code, 0, r.stderr)
  // "2 -> 3" when the CLI started so slowly that the first reload had ended before it looked
  t.match(r.stdout, /reloaded: generation [12] -> 3 /, 'the verdict of the reload that read the file it signalled, not of the one already running (1 -> 2)')
  t.match(r.stderr, /listen: these changes need a restart/, 'with that file\'s restart warning')
  t.same(await adminConfig().then(c => [c.generation, c.reloadPending]), [3, false])
})

t.test('reload: an invalid file is never signalled; located errors, exit 1', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'first'))
  writeFileSync(gw.file, oneRoute(up.url, 'first').replace('pathPrefix', 'pathprefix'))
  const r = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(r.code, 1)
  t.match(r.stderr, /not signalled/)
  t.match(r.stderr, /gateway\.yaml:7:\d+ routes\[0\]\.pathprefix: unknown key "pathprefix" \(did you mean pathPrefix\?\)/)
  const live = await (await fetch(`${gw.adminUrl}/config`)).json() as { generation: number, lastReload: unknown }
  t.equal(live.generation, 1)
  t.equal(live.lastReload, null, 'the gateway never saw a reload')
})

t.test('reload: a file the running gateway rejects (its environment differs) exits 1 with its errors', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'first'))
  // valid for the CLI (the variable is set in its environment), rejected by the gateway (not set there)
  writeFileSync(gw.file, oneRoute('${UPSTREAM_FOR_CLI_ONLY}', 'second'))
  const r = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`], { UPSTREAM_FOR_CLI_ONLY: up.url })
  t.equal(r.code, 1, r.stdout)
  t.match(r.stderr, /rejected .*generation 1 keeps serving/)
  t.match(r.stderr, /upstreams\.backend\.targets\[0\]: environment variable UPSTREAM_FOR_CLI_ONLY is not set/)
  const res = await fetch(`${gw.url}/x`)
  t.equal(res.status, 200, 'the old config keeps serving')
})

t.test('reload: an --admin that answers, but not the gateway\'s /config, is named as such, not "unreachable"', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'first'))
  const html = await startHttpServer(t, (_req, res) => {
    res.writeHead(502, { 'content-type': 'text/html' })
    res.end('<html>Bad Gateway</html>')
  })
  const stalled = await startHttpServer(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.write('{"generation":')
  })
  const proxied = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', html.url.slice('http://'.length)])
  t.equal(proxied.code, 4, proxied.stderr)
  t.match(proxied.stderr, new RegExp(`^gateway reload: sent SIGHUP to \\d+, but ${html.url}/config answered 502 Bad Gateway: the outcome is unknown\n$`))
  const stall = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', stalled.url.slice('http://'.length)])
  t.equal(stall.code, 4, stall.stderr)
  t.match(stall.stderr, new RegExp(`^gateway reload: sent SIGHUP to \\d+, but the admin listener ${stalled.url} did not answer /config within 2 s: the outcome is unknown\n$`))
})

t.test('reload: an admin address nothing listens on still signals, then exits 4 saying the outcome is unknown; usage and pid-file mistakes exit 2 and 3', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'first'))
  const closed = net.createServer()
  closed.listen(0, '127.0.0.1')
  await once(closed, 'listening')
  const port = (closed.address() as net.AddressInfo).port
  closed.close()
  await once(closed, 'close')
  writeFileSync(gw.file, oneRoute(up.url, 'second'))
  const r = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${port}`])
  t.equal(r.code, 4, 'no verdict')
  t.equal(r.stderr, `gateway reload: sent SIGHUP to ${gw.child.pid ?? '?'}, but the admin listener http://127.0.0.1:${port} is unreachable: the outcome is unknown (use --admin HOST:PORT)\n`)
  const reloaded = await gw.waitForLog(l => l.msg === 'configuration reloaded')
  t.equal(reloaded.generation, 2, 'the gateway got the signal and reloaded')

  const noPidFile = await gateway(['reload', '-c', gw.file])
  t.same([noPidFile.code, noPidFile.stderr], [2, 'gateway reload: --pid-file FILE is required (gateway reload --help)\n'])
  const badTimeout = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--timeout', 'junk'])
  t.same([badTimeout.code, badTimeout.stderr], [2, 'gateway reload: --timeout expects seconds, got "junk"\n'])
  const garbage = gw.pidFile.replace(/gateway\.pid$/, 'garbage.pid')
  writeFileSync(garbage, 'not a pid\n')
  const noPid = await gateway(['reload', '-c', gw.file, '--pid-file', garbage])
  t.same([noPid.code, noPid.stderr], [3, `gateway reload: ${garbage} holds no process id\n`])
})
