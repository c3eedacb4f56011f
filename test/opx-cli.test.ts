// The CLI as an operator runs it (bin/gateway, real processes): reload waits for the running
// gateway's verdict, help exists per command, failures are one line with an exit code per kind.
import t from 'tap'
import { writeFileSync, readFileSync, utimesSync } from 'node:fs'
import { spawn } from 'node:child_process'
import net from 'node:net'
import { once } from 'node:events'
import { spawnGateway, childEnv, writeConfig } from './helpers/gateway.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'
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

t.test('reload: missing pid file and dead process are exit 3, one line, no stack trace', async t => {
  const file = writeConfig(t, oneRoute('http://127.0.0.1:1', 'a'))
  const missing = await gateway(['reload', '-c', file, '--pid-file', file + '.nope'])
  t.equal(missing.code, 3)
  t.equal(missing.stderr.trim().split('\n').length, 1, missing.stderr)
  t.match(missing.stderr, /pid file .* not found/)
  const stale = file.replace(/gateway\.yaml$/, 'stale.pid')
  writeFileSync(stale, '2147483646\n')
  const dead = await gateway(['reload', '-c', file, '--pid-file', stale])
  t.equal(dead.code, 3)
  t.match(dead.stderr, /no process 2147483646/)
  t.notMatch(missing.stderr + dead.stderr, /\n\s+at /, 'no stack frames')
})

// A pid file left by a gateway killed with SIGKILL names an id the kernel may give to another
// process: SIGHUP would end it (sleep's default action for SIGHUP is to terminate).
t.test('reload: a stale pid file naming another live process signals nothing, exit 3', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'first'))
  const bystander = spawn('sleep', ['60'], { stdio: 'ignore' })
  t.teardown(() => { bystander.kill('SIGKILL') })
  const exited = new Promise<NodeJS.Signals | null>(resolve => bystander.once('exit', (_code, signal) => resolve(signal)))
  const stale = gw.file.replace(/gateway\.yaml$/, 'other.pid')
  // written after the bystander started: /proc cannot tell, the admin listener's pid does
  writeFileSync(stale, `${bystander.pid}\n`)
  const byAdmin = await gateway(['reload', '-c', gw.file, '--pid-file', stale, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(byAdmin.code, 3, byAdmin.stderr)
  t.match(byAdmin.stderr, new RegExp(`names process ${bystander.pid}, but the gateway answering on .* is process ${readFileSync(gw.pidFile, 'utf8').trim()}`))
  // the admin listener unreachable: the pid file is older than the process holding its id
  writeFileSync(gw.file.replace(/gateway\.yaml$/, 'closed.yaml'), oneRoute(up.url, 'first').replace('admin: 127.0.0.1:0', `admin: ${await refusingUrl().then(u => u.slice('http://'.length))}`))
  const old = new Date(Date.now() - 3600_000)
  utimesSync(stale, old, old)
  const byProc = await gateway(['reload', '-c', gw.file.replace(/gateway\.yaml$/, 'closed.yaml'), '--pid-file', stale])
  t.equal(byProc.code, 3, byProc.stderr)
  t.match(byProc.stderr, new RegExp(`process ${bystander.pid} started after .*other\\.pid was written`))
  t.equal(byAdmin.stderr.trim().split('\n').length + byProc.stderr.trim().split('\n').length, 2, 'one line each')
  t.equal(await Promise.race([exited, new Promise(resolve => setTimeout(() => resolve('alive'), 300))]), 'alive', 'the process holding the id was not signalled')
  // the gateway's own pid file still works
  const ok = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(ok.code, 0, ok.stderr)
})

t.test('unreadable or missing config: one located line, exit 1', async t => {
  const file = writeConfig(t, oneRoute('http://127.0.0.1:1', 'a'))
  const r = await gateway(['validate', '-c', file + '.missing'])
  t.equal(r.code, 1)
  t.equal(r.stderr.trim().split('\n').length, 1)
  t.match(r.stderr, /file not found/)
  const dir = await gateway(['start', '-c', file.replace(/\/gateway\.yaml$/, '')])
  t.equal(dir.code, 1)
  t.notMatch(dir.stderr, /\n\s+at /)
})

t.test('help: global, per command, and `gateway help COMMAND`; unknown option is exit 2', async t => {
  const global = await gateway(['help'])
  t.equal(global.code, 0)
  for (const cmd of ['start', 'validate', 'schema', 'reload', 'explain']) t.match(global.stdout, new RegExp(`\\n  ${cmd}\\b`))
  const perCommand = await gateway(['reload', '--help'])
  t.equal(perCommand.code, 0)
  t.match(perCommand.stdout, /^Usage: gateway reload --pid-file FILE/)
  t.equal((await gateway(['help', 'reload'])).stdout, perCommand.stdout)
  const unknown = await gateway(['validate', '--bogus'])
  t.equal(unknown.code, 2)
  t.notMatch(unknown.stderr, /\n\s+at /)
})

t.test('config: a bare port and listen equal to admin are located errors', async t => {
  const file = writeConfig(t, 'listen: 8080\nadmin: 127.0.0.1:9901\nupstreams:\n  b: { targets: ["http://127.0.0.1:1"] }\nroutes:\n  - { name: a, pathPrefix: /, upstream: b }\n')
  const bare = await gateway(['validate', '-c', file])
  t.equal(bare.code, 1)
  t.match(bare.stderr, /gateway\.yaml:1:9 listen: expected "host:port" as a string, e\.g\. "0\.0\.0\.0:8080"/)
  writeFileSync(file, readFileSync(file, 'utf8').replace('listen: 8080', 'listen: 0.0.0.0:9901'))
  const clash = await gateway(['validate', '-c', file])
  t.equal(clash.code, 1)
  t.match(clash.stderr, /gateway\.yaml:2:8 admin: "127\.0\.0\.1:9901" is also the listen address/)
})

t.test('reload with workers: the primary gives the verdict, and never shows a file the workers rejected as the config in force', async t => {
  const up = await startUpstream(t)
  const withWorkers = (route: string, prefix = '/'): string => oneRoute(up.url, route).replace('pathPrefix: /,', `pathPrefix: ${prefix},`) + 'workers: 2\n'
  const gw = await spawnGateway(t, withWorkers('first'))
  const primary = await gw.waitForLog(l => l.msg === 'gateway primary started')
  const admin = `127.0.0.1:${primary.adminPort as number}`
  const view = async (): Promise<{ generation: number, lastReload: { ok: boolean } | null, config: { routes: Array<{ name: string }> } }> =>
    await (await fetch(`http://${admin}/config`)).json() as { generation: number, lastReload: { ok: boolean } | null, config: { routes: Array<{ name: string }> } }
  for (let i = 0; i < 100 && (await fetch(`http://${admin}/readyz`)).status !== 200; i++) await new Promise(resolve => setTimeout(resolve, 100))

  // workers: 3 needs a restart: accepted, and said so
  writeFileSync(gw.file, withWorkers('second').replace('workers: 2', 'workers: 3'))
  const good = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', admin])
  t.equal(good.code, 0, good.stderr)
  t.match(good.stdout, /reloaded: generation 1 -> 2/)
  t.match(good.stderr, /^gateway reload: workers: these changes need a restart/)
  t.match(await view(), { generation: 2, lastReload: { ok: true, restartNeeded: ['workers'] }, config: { routes: [{ name: 'second' }] } })

  // valid for the schema, refused when compiled (a path not in normal form), by every worker
  writeFileSync(gw.file, withWorkers('third', '/a//b/'))
  process.kill(Number(readFileSync(gw.pidFile, 'utf8')), 'SIGHUP')
  let after = await view()
  for (let i = 0; i < 100 && after.lastReload?.ok !== false; i++) {
    await new Promise(resolve => setTimeout(resolve, 100))
    after = await view()
  }
  t.match(after, { generation: 2, lastReload: { ok: false, problems: [/routes\[0\]\.pathPrefix: path "\/a\/\/b\/" is not in normal form/] }, config: { routes: [{ name: 'second' }] } }, 'the primary shows the config in force, and why the file was rejected')
  t.equal((await fetch(`${gw.url}/x`)).status, 200, 'the workers serve on')
})

t.test('a SIGHUP while the gateway is still starting reloads it once started, instead of ending it', async t => {
  const up = await startUpstream(t)
  // Redis refusing connections: the start waits (up to 2 s) for it, logging each refusal at debug
  const redis = (await refusingUrl()).replace('http://', 'redis://')
  const file = writeConfig(t, oneRoute(up.url, 'first') + `redis: { url: "${redis}" }\n`)
  const child = spawn(process.execPath, ['bin/gateway', 'start', '-c', file, '--log-level', 'debug'], { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv() })
  const exited = new Promise<number | null>(resolve => child.once('exit', code => resolve(code)))
  t.teardown(() => { child.kill('SIGKILL') })
  const lines: Array<Record<string, unknown>> = []
  let buf = ''
  let signalled = false
  child.stdout?.on('data', (chunk: Buffer) => {
    buf += chunk.toString()
    let nl
    while ((nl = buf.indexOf('\n')) !== -1) {
      const line = JSON.parse(buf.slice(0, nl)) as Record<string, unknown>
      buf = buf.slice(nl + 1)
      lines.push(line)
      // the start is under way (its Redis client exists) and not done
      if (!signalled && line.msg === 'redis client error' && !lines.some(l => l.msg === 'gateway started')) {
        signalled = true
        child.kill('SIGHUP')
      }
    }
  })
  const reloaded = new Promise<void>((resolve) => {
    const poll = setInterval(() => { if (lines.some(l => l.msg === 'configuration reloaded')) { clearInterval(poll); resolve() } }, 20)
    void exited.then(() => { clearInterval(poll); resolve() })
  })
  await reloaded
  t.ok(signalled, 'SIGHUP sent during the start')
  t.same([child.exitCode, child.signalCode], [null, null], 'still running (Node\'s default for SIGHUP ends the process)')
  const msgs = lines.map(l => l.msg)
  t.ok(msgs.indexOf('gateway started') >= 0 && msgs.indexOf('gateway started') < msgs.indexOf('configuration reloaded'), 'started, then reloaded')
  child.kill('SIGTERM')
  t.equal(await exited, 0)
})
