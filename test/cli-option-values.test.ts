// Option values the CLI did not check. `gateway reload --admin junk`: a typo in the option signalled
// the gateway, then waited on "http://jun:NaN" and reported exit 4, the outcome unknown; `gateway
// limits` called it unreachable. `--log-level junk` was blamed on the config file; `explain --ip junk` explained a client "unknown".
import t from 'tap'
import { spawn, spawnSync } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { resolve } from 'node:path'

t.test('gateway reload with an --admin that is not HOST:PORT is a usage error, and nothing is signalled', async t => {
  const dir = await mkdtemp(resolve(tmpdir(), 'gw-reload-admin-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const file = resolve(dir, 'gateway.yaml')
  await writeFile(file, 'upstreams:\n  b: { targets: [http://127.0.0.1:1] }\nroutes:\n  - { name: a, pathPrefix: /, upstream: b }\n')
  // a process SIGHUP would end (Node's default action) stands for the gateway in the pid file
  const target = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' })
  t.teardown(() => { target.kill('SIGKILL') })
  const pidFile = resolve(dir, 'gateway.pid')
  await writeFile(pidFile, `${String(target.pid)}\n`)
  for (const admin of ['junk', '[::1]:99999']) {
    const r = spawnSync(process.execPath, ['bin/gateway', 'reload', '-c', file, '--pid-file', pidFile, '--admin', admin], { encoding: 'utf8' })
    t.equal(r.status, 2, r.stderr)
    t.equal(r.stderr, `gateway reload: --admin expects HOST:PORT, got "${admin}"\n`)
  }
  // a SIGHUP sent would have ended it by now (its exit is seen once the event loop turns)
  await new Promise(resolve => setTimeout(resolve, 500))
  t.equal(target.exitCode, null, 'not signalled')
  t.equal(target.signalCode, null, 'not signalled')
})

t.test('gateway limits with an --admin that is not HOST:PORT is a usage error, not "http://jun:NaN unreachable"', async t => {
  const r = spawnSync(process.execPath, ['bin/gateway', 'limits', 'get', '--route', 'a', '--admin', 'junk'], { encoding: 'utf8' })
  t.equal(r.status, 2, r.stderr)
  t.equal(r.stderr, 'gateway limits: --admin expects HOST:PORT, got "junk"\n')
})

t.test('gateway start --log-level junk is a usage error, not the config file blamed for pino\'s refusal', async t => {
  const r = spawnSync(process.execPath, ['bin/gateway', 'start', '-c', 'gateway.yaml', '--log-level', 'junk'], { encoding: 'utf8', timeout: 10_000 })
  t.equal(r.status, 2, r.stderr)
  t.equal(r.stderr, 'gateway: --log-level expects one of fatal, error, warn, info, debug, trace, silent, got "junk"\n')
})

t.test('gateway explain: an --ip that is no address or a --header without a colon is a usage error, not explained', async t => {
  // the repository's gateway.yaml: the file loads, so what used to pass is the option's value
  for (const [args, message] of [
    [['--ip', 'junk'], 'gateway explain: --ip expects an IP address, got "junk"\n'],
    [['--header', 'x-api-key=k-123'], 'gateway explain: --header expects NAME:VALUE, got "x-api-key=k-123"\n']
  ] as const) {
    const r = spawnSync(process.execPath, ['bin/gateway', 'explain', '-c', 'gateway.yaml', 'GET', '/', ...args], { encoding: 'utf8', timeout: 10_000 })
    t.equal(r.status, 2, r.stdout)
    t.equal(r.stderr, message)
    t.equal(r.stdout, '', 'no explanation of another request (client "unknown", or anonymous)')
  }
})
