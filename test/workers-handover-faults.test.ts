// The primary's side of a hand-over that goes wrong in workers mode (src/workers.ts): a worker
// that cannot apply a file the primary accepted, and a hand-over a starting worker never saw. The
// fault is made at the IPC boundary by test/fixtures/process/handover-fault.mjs (loaded into
// bin/gateway with --import); the primary, the workers' compile and `gateway reload` are real.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { gateway } from './helpers/cli.js'
import { spawnGateway } from './helpers/gateway.js'
import { answering, bodies, config, twoWorkers, until } from './helpers/workers.js'

const fixture = fileURLToPath(new URL('./fixtures/process/handover-fault.mjs', import.meta.url))

interface ConfigView {
  generation: number
  reloadPending: boolean
  workersApplying: number[]
  lastReload: { ok: boolean, generation: number, workersFailed?: Array<{ pid: number, problems: string[] }> } | null
}
const configView = async (adminUrl: string): Promise<ConfigView> => await (await fetch(`${adminUrl}/config`)).json() as ConfigView

t.test('a worker that cannot apply an accepted file: gateway reload exits 1 naming it, /config says so, it serves the file before; the next reload clears it', async t => {
  const a = await answering(t, 'from a')
  const b = await answering(t, 'from b')
  const c = await answering(t, 'from c')
  const r = await twoWorkers(t, config(a), { NODE_OPTIONS: `--import ${fixture}`, GW_TEST_HANDOVER_FAULT: 'refuse-2' })
  const refuser = (await r.gw.waitForLog(l => l.msg === 'test fixture: worker 1')).pid as number
  const reload = async (): Promise<{ code: number, stdout: string, stderr: string }> =>
    await gateway(['reload', '-c', r.gw.file, '--pid-file', r.gw.pidFile, '--admin', r.adminUrl.slice('http://'.length), '--timeout', '20'])

  writeFileSync(r.gw.file, config(b))
  const refused = await reload()
  t.equal(refused.code, 1, 'exit 1: not every worker serves the file')
  t.match(refused.stderr, new RegExp(`^gateway reload: generation 2 was accepted, but 1 worker\\(s\\) could not apply it and serve the config before it:\\nworker ${refuser}: .*gateway\\.yaml`), refused.stderr)
  const after = await configView(r.adminUrl)
  t.same([after.generation, after.lastReload?.ok, after.reloadPending, after.workersApplying], [2, true, false, []], 'generation 2 is the primary\'s verdict, and no worker is still applying it')
  t.same(after.lastReload?.workersFailed?.map(f => f.pid), [refuser], '/config names the worker that refused it')
  t.match(after.lastReload?.workersFailed?.[0]?.problems.join('\n'), /gateway\.yaml/, 'with its located problems')
  t.same([...new Set(await bodies(r.gw.url, 40))].sort(), ['200 from a', '200 from b'], 'the worker that refused serves the file before, the other the new one')

  writeFileSync(r.gw.file, config(c))
  const next = await reload()
  t.equal(next.code, 0, next.stderr)
  t.match(next.stdout, /reloaded: generation 2 -> 3/)
  t.equal((await configView(r.adminUrl)).lastReload?.workersFailed, undefined, 'a generation every worker applied names no failed worker')
  t.same([...new Set(await bodies(r.gw.url, 40))], ['200 from c'], 'both workers serve the newest file')
})

t.test('a hand-over a starting worker never saw is given again when it reports an older generation: it ends serving the accepted file', async t => {
  const a = await answering(t, 'from a')
  const b = await answering(t, 'from b')
  const release = join(t.testdir({}), 'release')
  t.teardown(() => { try { writeFileSync(release, '') } catch { /* its directory is gone: nothing waits on it */ } })
  // worker 2 starts; worker 1 holds its start until released
  const gw = await spawnGateway(t, config(a), [], { env: { NODE_OPTIONS: `--import ${fixture}`, GW_TEST_HANDOVER_FAULT: 'lose-2-while-starting', GW_TEST_RELEASE_FILE: release } })
  const adminUrl = `http://127.0.0.1:${(await gw.waitForLog(l => l.msg === 'gateway primary started')).adminPort as number}`
  const held = (await gw.waitForLog(l => l.msg === 'test fixture: worker holding its start')).pid as number
  t.equal((await gw.waitForLog(l => l.msg === 'test fixture: worker holding its start')).generation, 1, 'it started with generation 1')

  writeFileSync(gw.file, config(b))
  gw.child.kill('SIGHUP')
  await gw.waitForLog(l => l.msg === 'configuration reloaded' && l.generation === 2 && l.pid !== held)
  t.equal((await configView(adminUrl)).generation, 2, 'the primary accepted generation 2 while worker 1 was starting')
  writeFileSync(release, '')
  await gw.waitForLog(l => l.msg === 'test fixture: hand-over lost' && l.pid === held)

  await until('both workers ready', async () => (await fetch(`${adminUrl}/readyz`)).status === 200)
  const reloaded = await gw.waitForLog(l => l.msg === 'configuration reloaded' && l.pid === held, 15_000).catch(() => null)
  t.equal(reloaded?.generation, 2, 'the worker that lost the hand-over applied generation 2 once it reported serving 1')
  await until('no worker applying', async () => !(await configView(adminUrl)).reloadPending, 15_000).catch(() => {})
  const view = await configView(adminUrl)
  t.same([view.reloadPending, view.workersApplying], [false, []], '/config: no worker behind')
  t.same([...new Set(await bodies(gw.url, 40))], ['200 from b'], 'both workers serve the accepted file')
})

t.test('before any worker has started, the primary\'s admin answers 503: /routes GW_ERR_NOT_READY, /limits not_ready, /readyz not_ready', async t => {
  const a = await answering(t, 'from a')
  const release = join(t.testdir({}), 'release')
  t.teardown(() => { try { writeFileSync(release, '') } catch { /* its directory is gone: nothing waits on it */ } })
  const gw = await spawnGateway(t, config(a), [], { waitFor: 'gateway primary started', env: { NODE_OPTIONS: `--import ${fixture}`, GW_TEST_HANDOVER_FAULT: 'hold-every-start', GW_TEST_RELEASE_FILE: release } })
  const adminUrl = gw.adminUrl
  await until('both workers holding their start', () => gw.logs.filter(l => l.msg === 'test fixture: worker holding its start').length === 2)

  const routes = await fetch(`${adminUrl}/routes`)
  t.same([routes.status, await routes.json()], [503, { error: 'GW_ERR_NOT_READY', message: 'no worker has reported yet' }], '/routes')
  const limits = await fetch(`${adminUrl}/limits?route=all&ip=192.0.2.1`)
  t.same([limits.status, await limits.json()], [503, { error: 'not_ready', message: 'no worker is ready yet (workers: 2)' }], '/limits')
  const ready = await fetch(`${adminUrl}/readyz`)
  t.same([ready.status, ((await ready.json()) as { status: string, ready: number }).ready], [503, 0], '/readyz: no worker ready')

  writeFileSync(release, '')
  await until('both workers ready', async () => (await fetch(`${adminUrl}/readyz`)).status === 200)
  await until('a worker reported its routes', async () => (await fetch(`${adminUrl}/routes`)).status === 200)
  const port = (await gw.waitForLog(l => l.msg === 'gateway started')).port as number
  t.same([...new Set(await bodies(`http://127.0.0.1:${port}`, 10))], ['200 from a'], 'then both serve')
})
