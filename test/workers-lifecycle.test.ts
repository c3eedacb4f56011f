// `workers: N` from the operator's side: a signal sent to the whole process group (systemd's
// KillMode=control-group, Ctrl-C, kill -TERM -PGID) drains like one sent to the primary; a file the
// workers would refuse, or a taken admin port, fails the start with exit 1 instead of leaving
// workers behind; a worker that cannot start (a file the config names broke) exits, and is
// replaced once the file is fixed; the
// primary's /metrics sums the workers that answer, at once, whatever one restarting does.
import t from 'tap'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { existsSync, writeFileSync } from 'node:fs'
import { spawn } from 'node:child_process'
import { join } from 'node:path'
import { childEnv, spawnGateway, writeConfig, type GatewayProcess } from './helpers/gateway.js'
import { tempDir, type Teardown } from './helpers/teardown.js'

async function slowUpstream (t: Teardown): Promise<{ url: string, arrived: () => number }> {
  let arrived = 0
  const server: Server = createServer((req, res) => {
    if (req.url === '/slow') {
      arrived++
      setTimeout(() => res.end('slow ok'), 1500).unref()
    } else res.end('ok')
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { server.closeAllConnections(); server.close() })
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, arrived: () => arrived }
}

const config = (upstream: string, extra = '', admin = '127.0.0.1:0'): string => `listen: 127.0.0.1:0
admin: ${admin}
workers: 2
upstreams: { b: { targets: [${upstream}] } }
routes:
  - { name: all, pathPrefix: /, upstream: b }
${extra}`

async function readyPrimary (gw: GatewayProcess): Promise<string> {
  const primary = await gw.waitForLog(l => l.msg === 'gateway primary started')
  const adminUrl = `http://127.0.0.1:${primary.adminPort as number}`
  for (let i = 0; i < 150; i++) {
    if ((await fetch(`${adminUrl}/readyz`)).status === 200) break
    await new Promise(resolve => setTimeout(resolve, 100))
  }
  return adminUrl
}

for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  t.test(`${signal} to the whole process group: every worker drains its requests in flight, then all exit 0`, async t => {
    const up = await slowUpstream(t)
    const gw = await spawnGateway(t, config(up.url), [], { group: true })
    const adminUrl = await readyPrimary(gw)
    t.equal((await fetch(`${adminUrl}/readyz`)).status, 200)
    const slow = Array.from({ length: 4 }, async () => {
      const r = await fetch(`${gw.url}/slow`, { headers: { connection: 'close' } })
      return `${r.status} ${await r.text()}`
    })
    for (let i = 0; i < 300 && up.arrived() < 4; i++) await new Promise(resolve => setTimeout(resolve, 10))
    t.equal(up.arrived(), 4, 'four slow requests in flight')
    process.kill(-(gw.child.pid as number), signal) // the primary and both workers, as systemd does
    t.same(await Promise.all(slow), new Array(4).fill('200 slow ok'), 'each finished during the drain')
    t.equal(await gw.exited, 0)
    t.equal(gw.logs.filter(l => l.msg === 'gateway stopped').length, 2, 'both workers drained and stopped')
  })
}

t.test('a second SIGTERM to the primary during its drain does not cut it: the requests in flight finish, all exit 0', async t => {
  const up = await slowUpstream(t)
  const gw = await spawnGateway(t, config(up.url))
  await readyPrimary(gw)
  const slow = Array.from({ length: 4 }, async () => {
    const r = await fetch(`${gw.url}/slow`, { headers: { connection: 'close' } })
    return `${r.status} ${await r.text()}`
  })
  for (let i = 0; i < 300 && up.arrived() < 4; i++) await new Promise(resolve => setTimeout(resolve, 10))
  t.equal(up.arrived(), 4, 'four slow requests in flight')
  gw.child.kill('SIGTERM')
  await gw.waitForLog(l => l.msg === 'shutting down workers')
  gw.child.kill('SIGTERM') // a second docker stop, an impatient operator
  t.same(await Promise.all(slow), new Array(4).fill('200 slow ok'), 'each finished during the drain')
  t.equal(await gw.exited, 0)
  t.equal(gw.logs.filter(l => l.msg === 'gateway stopped').length, 2, 'both workers drained and stopped')
})

t.test('a file the workers would refuse, or a taken admin port, fails the start with exit 1 and no worker', async t => {
  const bad = writeConfig(t, config('http://127.0.0.1:1').replace('pathPrefix: /,', 'pathPrefix: "/a/../b/",'))
  const run = async (file: string): Promise<{ code: number | null, stderr: string }> => {
    const child = spawn(process.execPath, ['bin/gateway', 'start', '-c', file, '--pid-file', `${file}.pid`], { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv() })
    t.teardown(() => { if (child.exitCode === null) child.kill('SIGKILL') })
    let stderr = ''
    child.stderr.on('data', (c: Buffer) => { stderr += c.toString() })
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000)
    const code = await new Promise<number | null>(resolve => child.once('exit', resolve))
    clearTimeout(timer)
    return { code, stderr }
  }
  const refused = await run(bad)
  t.equal(refused.code, 1, 'exit 1 (it used to run on, one failed worker after another)')
  t.match(refused.stderr, 'routes[0].pathPrefix: path "/a/../b/" is not in normal form')
  t.equal(refused.stderr.split('not in normal form').length - 1, 1, 'the located error once, not once per worker')
  // the admin port taken by another process
  const taken = createServer()
  await new Promise<void>(resolve => taken.listen(0, '127.0.0.1', resolve))
  t.teardown(() => taken.close())
  const port = (taken.address() as AddressInfo).port
  const busy = writeConfig(t, config('http://127.0.0.1:1', '', `127.0.0.1:${port}`))
  const failed = await run(busy)
  t.equal(failed.code, 1, 'exit 1: no worker was forked to keep the primary alive')
  t.match(failed.stderr, 'EADDRINUSE')
  t.notOk(existsSync(`${busy}.pid`), 'the pid file is removed')
})

t.test('a crashed worker is replaced with the key file its primary checked; /metrics answers at once while one restarts', async t => {
  const up = await slowUpstream(t)
  const keyFile = join(tempDir(t, 'workers-keys'), 'keys.yaml')
  writeFileSync(keyFile, 'k-1: alice\n')
  const withKeys = config(up.url, `identity:\n  apiKeys: { header: x-api-key, file: ${keyFile} }\n  required: false\n`)
  const gw = await spawnGateway(t, withKeys)
  const adminUrl = await readyPrimary(gw)
  const workerPids = (): number[] => [...new Set(gw.logs.filter(l => l.msg === 'gateway started').map(l => l.pid as number))]
  for (let i = 0; i < 100 && workerPids().length < 2; i++) await new Promise(resolve => setTimeout(resolve, 100))
  for (let i = 0; i < 10; i++) await fetch(`${gw.url}/x`, { headers: { connection: 'close' } })
  const healthy = await (await fetch(`${adminUrl}/metrics`)).text()
  t.match(healthy, /^gateway_config_generation 1$/m, 'a state gauge is the workers\' max, not their sum (2)')
  t.match(healthy, /^gateway_workers_scraped 2$/m)
  t.match(healthy, /^gateway_upstream_target_healthy\{upstream="b",target="[^"]+"\} 1$/m, 'healthy on both: 1, not 2')

  // the key file on disk is now one a worker would refuse, and a worker crashes
  writeFileSync(keyFile, '[1, 2]\n')
  const victim = workerPids()[0] as number
  process.kill(victim, 'SIGKILL')
  await gw.waitForLog(l => l.msg === 'worker exited; starting a new one' && l.worker === victim)
  const asked = Date.now()
  const during = await fetch(`${adminUrl}/metrics`)
  t.equal(during.status, 200, 'the scrape is answered while a worker is missing')
  t.ok(Date.now() - asked < 2500, 'without waiting for it')
  t.match(await during.text(), /^gateway_workers_scraped 1$/m, 'and says how many workers it sums')
  t.equal((await fetch(`${gw.url}/x`)).status, 200, 'the other worker serves meanwhile')
  // the replacement starts with the key file as the primary read it for its check (it read the
  // disk's, exited, and was tried again until the file was fixed): the pair is ready again
  let readyAgain = false
  for (let i = 0; i < 300 && !readyAgain; i++) {
    readyAgain = (await fetch(`${adminUrl}/readyz`)).status === 200
    if (!readyAgain) await new Promise(resolve => setTimeout(resolve, 100))
  }
  t.ok(readyAgain, '/readyz is 200 again')
  t.equal(gw.logs.filter(l => l.msg === 'worker exited; starting a new one').length, 1, 'the replacement started at the first try')
})
