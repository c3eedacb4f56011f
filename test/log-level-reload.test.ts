// `--log-level` on the command line wins over the file's `log.level`, at start and on each
// reload (README: Reload), in a single process and in `workers: N` mode, where each worker gets
// the primary's arguments.
import t, { type Test } from 'tap'
import { writeFileSync } from 'node:fs'
import { spawnGateway, type GatewayProcess } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { eventually } from './helpers/ratelimit.js'

const config = (upstream: string, level: string, extra = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: ${level} }
upstreams: { b: { targets: ["${upstream}"] } }
routes:
  - { name: all, pathPrefix: /, upstream: b }
${extra}`

const until = async (what: string, check: () => Promise<boolean> | boolean, timeoutMs = 30_000): Promise<void> =>
  await eventually(what, async () => await check(), timeoutMs)

const generation = async (adminUrl: string): Promise<number> =>
  ((await (await fetch(`${adminUrl}/config`)).json()) as { generation: number }).generation

/** Sends a request with a marker path and waits for its access line (an info line). */
async function accessLineFor (t: Test, gw: GatewayProcess, path: string): Promise<void> {
  t.equal((await fetch(`${gw.url}${path}`, { headers: { connection: 'close' } })).status, 200)
  // the sink flushes every 100 ms: 10 s is a wide margin on a loaded machine
  await until(`the access line of ${path}`, () => gw.logs.some(l => l.msg === 'request' && l.path === path), 10_000)
}

t.test('single process: --log-level info keeps access lines through a reload of a file saying error', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, config(up.url, 'warn'), ['--log-level', 'info'])
  await accessLineFor(t, gw, '/before')
  t.pass('the command line wins at start (the file says warn)')

  writeFileSync(gw.file, config(up.url, 'error'))
  gw.child.kill('SIGHUP')
  await until('generation 2', async () => await generation(gw.adminUrl) === 2)
  await accessLineFor(t, gw, '/after')
  t.pass('and after the reload: the access line of a request is still written')
})

t.test('workers: --log-level info keeps each worker\'s access lines through a reload of a file saying error', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, config(up.url, 'warn', 'workers: 2\n'), ['--log-level', 'info'])
  const primary = await gw.waitForLog(l => l.msg === 'gateway primary started')
  const adminUrl = `http://127.0.0.1:${primary.adminPort as number}`
  await until('both workers ready', async () => (await fetch(`${adminUrl}/readyz`)).status === 200)

  writeFileSync(gw.file, config(up.url, 'error', 'workers: 2\n'))
  gw.child.kill('SIGHUP')
  await until('the primary\'s verdict', async () => await generation(adminUrl) === 2)
  // a worker's own reload line is at info: both written means both kept the command line's level
  await until('both workers reloaded', () => gw.logs.filter(l => l.msg === 'configuration reloaded').length === 2)
  const pids = new Set<unknown>()
  for (let i = 0; i < 40; i++) {
    await accessLineFor(t, gw, `/after-${i}`)
    pids.add(gw.logs.find(l => l.msg === 'request' && l.path === `/after-${i}`)?.pid)
  }
  t.equal(pids.size, 2, 'access lines from both workers after the reload')
})
