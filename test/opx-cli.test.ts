// The CLI as an operator runs it (bin/gateway, real processes): reload waits for the running
// gateway's verdict, help exists per command, failures are one line with an exit code per kind.
// The first reload cases are in test/opx-cli-reload.test.ts.
import t from 'tap'
import { writeFileSync, readFileSync, utimesSync } from 'node:fs'
import { spawn } from 'node:child_process'
import { spawnGateway, childEnv, writeConfig } from './helpers/gateway.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'
import { gateway, oneRoute } from './helpers/cli.js'

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
  for (const cmd of ['start', 'validate', 'schema', 'reload', 'explain', 'limits']) t.match(global.stdout, new RegExp(`\\n  ${cmd}\\b`))
  const perCommand = await gateway(['reload', '--help'])
  t.equal(perCommand.code, 0)
  t.match(perCommand.stdout, /^Usage: gateway reload --pid-file FILE/)
  t.equal((await gateway(['help', 'reload'])).stdout, perCommand.stdout)
  // limits parses its own options: `gateway help limits` answered exit 2, no command "limits"
  const limits = await gateway(['help', 'limits'])
  t.equal(limits.code, 0, limits.stderr)
  t.equal(limits.stdout, (await gateway(['limits', '--help'])).stdout)
  t.match(limits.stdout, /^Usage: gateway limits get\|reset/)
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
