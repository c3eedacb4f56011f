// `workers: N`: a worker that replaces a crashed one serves the config the primary last accepted,
// the same as its siblings, not the file as edited since the last reload (src/workers.ts
// acceptedConfig). Real processes: bin/gateway in workers mode, a worker ended with SIGKILL.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import type { GatewayProcess } from './helpers/gateway.js'
import { answering, bodies, config, replaceOne, twoWorkers, until } from './helpers/workers.js'

/** The replacement's own access lines: it took requests too. */
const servedBy = (gw: GatewayProcess, pid: number): number => gw.logs.filter(l => l.msg === 'request' && l.pid === pid).length

t.test('an edited file that is invalid, not reloaded: a crashed worker\'s replacement starts with the accepted config and serves', async t => {
  const a = await answering(t, 'from a')
  const r = await twoWorkers(t, config(a))
  const before = await (await fetch(`${r.adminUrl}/config`)).json() as { hash: string, generation: number, file: string }

  // a path not in normal form: a worker reading this file cannot start
  writeFileSync(r.gw.file, config(a).replace('pathPrefix: /,', 'pathPrefix: "/a/../b/",'))
  const replacement = await replaceOne(r)
  const readyz = await (await fetch(`${r.adminUrl}/readyz`)).json() as { workers: number, ready: number }
  t.match(readyz, { status: 'ready', workers: 2, ready: 2 }, 'both workers ready: the replacement did not exit')
  t.same(await bodies(r.gw.url, 40), new Array(40).fill('200 from a'), 'every request answered with the accepted config')
  await until('the replacement\'s access lines', () => servedBy(r.gw, replacement) > 0, 10_000)
  t.ok(servedBy(r.gw, replacement) > 0, 'the replacement served some of them')
  t.equal(r.gw.logs.filter(l => l.msg === 'worker exited; starting a new one').length, 1, 'one exit: the one the test caused')
  t.notOk(r.gw.logs.some(l => l.pid === replacement && l.level === 'error'), 'the replacement logged no config error')

  const after = await (await fetch(`${r.adminUrl}/config`)).json() as { hash: string, generation: number, file: string }
  t.same({ hash: after.hash, generation: after.generation, file: after.file }, { hash: before.hash, generation: before.generation, file: r.gw.file }, '/config still shows the accepted file, under its real name')
})

t.test('an edited file that is valid, not reloaded: every answer after a worker is replaced is still the accepted config\'s; a SIGHUP then applies the file', async t => {
  const a = await answering(t, 'from a')
  const b = await answering(t, 'from b')
  const r = await twoWorkers(t, config(a))

  writeFileSync(r.gw.file, config(b))
  const replacement = await replaceOne(r)
  t.same(await bodies(r.gw.url, 40), new Array(40).fill('200 from a'), 'the replacement serves the accepted upstream, like its sibling')
  await until('the replacement\'s access lines', () => servedBy(r.gw, replacement) > 0, 10_000)
  t.ok(servedBy(r.gw, replacement) > 0, 'the replacement served some of them')

  // the replacement takes the primary's reloads: the edit applies everywhere once reloaded
  r.gw.child.kill('SIGHUP')
  await until('both workers reloaded', () => r.gw.logs.filter(l => l.msg === 'configuration reloaded').length >= 2)
  t.equal(r.gw.logs.filter(l => l.msg === 'configuration reloaded' && l.pid === replacement).length, 1, 'the replacement reloaded too')
  await until('the primary\'s verdict', async () => ((await (await fetch(`${r.adminUrl}/config`)).json()) as { generation: number }).generation === 2)
  t.same(await bodies(r.gw.url, 40), new Array(40).fill('200 from b'), 'every worker serves the reloaded file')
})

t.test('a worker that replaces a crashed one after a reload counts on from its siblings\' generation', async t => {
  const a = await answering(t, 'from a')
  const b = await answering(t, 'from b')
  const r = await twoWorkers(t, config(a))
  writeFileSync(r.gw.file, config(b))
  r.gw.child.kill('SIGHUP')
  await until('both workers reloaded', () => r.gw.logs.filter(l => l.msg === 'configuration reloaded').length >= 2)
  t.same(r.gw.logs.filter(l => l.msg === 'configuration reloaded').map(l => l.generation), [2, 2], 'both workers at generation 2')
  await until('the primary\'s verdict', async () => ((await (await fetch(`${r.adminUrl}/config`)).json()) as { generation: number }).generation === 2)

  const replacement = await replaceOne(r)
  const started = r.gw.logs.find(l => l.msg === 'gateway started' && l.pid === replacement)
  t.equal(started?.generation, 2, 'the replacement starts at generation 2, as its sibling serves (it started at 1)')

  // and the next reload is generation 3 everywhere
  r.gw.child.kill('SIGHUP')
  await until('both workers reloaded again', () => r.gw.logs.filter(l => l.msg === 'configuration reloaded').length >= 4)
  t.same(r.gw.logs.filter(l => l.msg === 'configuration reloaded').slice(2).map(l => l.generation), [3, 3], 'both workers at generation 3')
})

t.test('${VAR} in the file: each worker, a crashed one\'s replacement too, takes its value from the primary\'s environment', async t => {
  const a = await answering(t, 'from a')
  const r = await twoWorkers(t, config('"${BACKEND_FOR_TEST}"'), { BACKEND_FOR_TEST: a })
  t.same([...new Set(await bodies(r.gw.url, 20))], ['200 from a'], 'both workers forward to the variable\'s backend')
  const replacement = await replaceOne(r)
  t.same([...new Set(await bodies(r.gw.url, 40))], ['200 from a'], 'so does the replacement')
  // its access lines come in its log's next batch (at most 100 ms later)
  await until('the replacement\'s access lines', () => servedBy(r.gw, replacement) > 0, 10_000).catch(() => {})
  t.ok(servedBy(r.gw, replacement) > 0, 'which took some of them')
})
