// `workers: N` reloads: the primary reads and checks the file on each SIGHUP and hands an accepted
// text to every worker with its generation (src/workers.ts followPrimaryReloads); no worker reads
// the file on a signal of its own. Real processes: bin/gateway in workers mode.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { gateway } from './helpers/cli.js'
import { answering, bodies, config, twoWorkers, until } from './helpers/workers.js'
import { startRedis } from './helpers/redis.js'

t.test('a burst of SIGHUPs: every worker ends at the primary\'s generation and serves the last file; a SIGHUP to a worker alone changes nothing', async t => {
  const a = await answering(t, 'from a')
  const b = await answering(t, 'from b')
  const r = await twoWorkers(t, config(a))
  const primaryConfig = async (): Promise<{ generation: number, reloadPending: boolean }> => await (await fetch(`${r.adminUrl}/config`)).json() as { generation: number, reloadPending: boolean }
  // each worker's generation: the one it started with, then its last reload's
  const workerGenerations = (): number[] => r.workerPids().map(pid => {
    const lines = r.gw.logs.filter(l => l.pid === pid && (l.msg === 'gateway started' || l.msg === 'configuration reloaded'))
    return lines[lines.length - 1]?.generation as number
  })

  // edits and signals faster than a worker reloads: a worker reading the file on each of its
  // own signals folded those that came during its reload, and ended generations behind
  // (400 more routes make each reload take a while)
  const more = Array.from({ length: 400 }, (_, i) => `  - { name: r${i}, pathPrefix: /r${i}/, upstream: b }\n`).join('')
  for (let i = 0; i < 8; i++) {
    writeFileSync(r.gw.file, config(i % 2 === 0 ? a : b) + more)
    r.gw.child.kill('SIGHUP')
    await new Promise(resolve => setTimeout(resolve, 30))
  }
  // signals that reach the primary while one waits are merged by the kernel: the count is
  // whatever it decided, once nothing has changed for a second
  let generation = 0
  let settled = 0
  await until('the primary decided every SIGHUP', async () => {
    const now = await primaryConfig()
    if (now.reloadPending || now.generation !== generation) {
      generation = now.generation
      settled = Date.now()
      return false
    }
    return Date.now() - settled >= 1000
  })
  t.ok(generation >= 2, `the primary accepted the burst (generation ${generation})`)
  await until('both workers at the primary\'s generation', () => workerGenerations().every(g => g === generation), 15_000).catch(() => {})
  t.same(workerGenerations(), [generation, generation], 'each worker serves the primary\'s generation')
  t.same(await bodies(r.gw.url, 40), new Array(40).fill('200 from b'), 'every worker serves the last file')

  // a SIGHUP that reaches one worker (a signal to the process group, or to its pid by mistake)
  // does not reload it apart from its sibling
  writeFileSync(r.gw.file, config(a))
  const worker = r.workerPids()[0] as number
  process.kill(worker, 'SIGHUP')
  await r.gw.waitForLog(l => l.pid === worker && String(l.msg).startsWith('SIGHUP ignored'))
  t.same(await bodies(r.gw.url, 40), new Array(40).fill('200 from b'), 'both workers still serve the file the primary accepted')
  t.same(workerGenerations(), [generation, generation], 'and keep its generation')
  t.equal((await primaryConfig()).generation, generation)
})

t.test('a file the primary rejects reaches no worker: one located error from the primary, the workers keep serving', async t => {
  const a = await answering(t, 'from a')
  const r = await twoWorkers(t, config(a))
  writeFileSync(r.gw.file, config(a).replace('pathPrefix: /', 'pathPrefix: 7'))
  r.gw.child.kill('SIGHUP')
  const rejected = await r.gw.waitForLog(l => l.msg === 'reload rejected; the running configuration keeps serving')
  t.equal(rejected.pid, r.gw.child.pid, 'logged by the primary')
  t.match(JSON.stringify(rejected.problems), /gateway\.yaml:\d+:\d+ routes\[0\]\.pathPrefix/, 'with the located problem')
  await until('/config has the verdict', async () => !((await (await fetch(`${r.adminUrl}/config`)).json()) as { reloadPending: boolean }).reloadPending)
  t.same(await bodies(r.gw.url, 20), new Array(20).fill('200 from a'), 'both workers serve the accepted config')
  t.equal(r.gw.logs.filter(l => l.msg === 'reload rejected; the running configuration keeps serving').length, 1, 'no worker read the file')
})

t.test('a reload to workers: 1 without redis: is rejected while two workers run: each would enforce every limit alone', async t => {
  const redis = await startRedis(t)
  const a = await answering(t, 'from a')
  const limited = `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
redis: { url: "${redis.url}" }
upstreams: { b: { targets: [${a}] } }
routes:
  - { name: all, pathPrefix: /, upstream: b, limits: { ip: { algorithm: fixed-window, limit: 4, window: 1h } } }
`
  const r = await twoWorkers(t, limited)
  // "workers" needs a restart, so this file would leave two workers each holding the whole budget
  writeFileSync(r.gw.file, limited.replace('workers: 2', 'workers: 1').replace(/^redis: .*\n/m, ''))
  r.gw.child.kill('SIGHUP')
  const rejected = await r.gw.waitForLog(l => l.msg === 'reload rejected; the running configuration keeps serving')
  t.match(JSON.stringify(rejected.problems), /gateway\.yaml:3:\d+ workers: this gateway runs 2 workers until a restart/, 'located at workers, saying why')
  await until('/config has the verdict', async () => !((await (await fetch(`${r.adminUrl}/config`)).json()) as { reloadPending: boolean }).reloadPending)
  const got = (await bodies(r.gw.url, 10)).map(b => b.split(' ')[0])
  t.same(got.filter(s => s === '200').length, 4, `the shared budget of 4 holds across both workers (${got.join(' ')})`)
  t.same(got.filter(s => s === '429').length, 6)
})

t.test('gateway reload returns once every worker serves the new file, not when the primary has checked it', async t => {
  const a = await answering(t, 'from a')
  const b = await answering(t, 'from b')
  const r = await twoWorkers(t, config(a))
  // routes enough that a worker takes a while to compile the file after the primary's check:
  // the CLI reported "reloaded" while the workers still served the file before
  const more = Array.from({ length: 2000 }, (_, i) => `  - { name: r${i}, pathPrefix: /r${i}/, upstream: b }\n`).join('')
  writeFileSync(r.gw.file, config(b) + more)
  const run = await gateway(['reload', '-c', r.gw.file, '--pid-file', r.gw.pidFile, '--admin', r.adminUrl.slice('http://'.length), '--timeout', '60'])
  t.equal(run.code, 0, run.stderr)
  t.match(run.stdout, /reloaded: generation 1 -> 2/)
  t.same(await bodies(r.gw.url, 20), new Array(20).fill('200 from b'), 'as the CLI exits, both workers serve the new file')
})

t.test('a worker draining on a signal of its own does not hold gateway reload; its replacement serves the new file', async t => {
  const a = await answering(t, 'from a')
  const b = await answering(t, 'from b')
  // an upstream that holds its requests, so a signalled worker stays up draining them
  const held: Array<() => void> = []
  const slow = createServer((_req, res) => { held.push(() => res.end('slow')) })
  await new Promise<void>(resolve => slow.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { for (const release of held) release(); slow.closeAllConnections(); slow.close() })
  const slowUrl = `http://127.0.0.1:${(slow.address() as AddressInfo).port}`
  const yaml = (fast: string): string => config(fast).replace('upstreams: { b: { targets: [', `upstreams: { s: { targets: [${slowUrl}] }, b: { targets: [`)
    .replace('routes:\n', 'routes:\n  - { name: slow, pathPrefix: /slow, upstream: s }\n')
  const r = await twoWorkers(t, yaml(a))
  // requests on new connections reach both workers (the primary hands them round-robin)
  const slowRequests = Array.from({ length: 4 }, async () => await fetch(`${r.gw.url}/slow`, { headers: { connection: 'close' } }).then(res => res.text(), () => ''))
  await until('four requests held upstream', () => held.length === 4)
  const victim = r.workerPids()[0] as number
  process.kill(victim, 'SIGTERM')
  await r.gw.waitForLog(l => l.pid === victim && l.msg === 'shutting down')
  writeFileSync(r.gw.file, yaml(b))
  const run = await gateway(['reload', '-c', r.gw.file, '--pid-file', r.gw.pidFile, '--admin', r.adminUrl.slice('http://'.length), '--timeout', '20'])
  t.equal(run.code, 0, run.stderr)
  t.match(run.stdout, /reloaded: generation 1 -> 2/)
  const alive = (pid: number): boolean => { try { process.kill(pid, 0); return true } catch { return false } }
  t.ok(alive(victim), 'the signalled worker was still draining when the CLI returned (it waited for no answer of it)')
  for (const release of held.splice(0)) release()
  t.same(await Promise.all(slowRequests), ['slow', 'slow', 'slow', 'slow'], 'the drained requests were answered')
  await r.gw.waitForLog(l => l.msg === 'worker exited; starting a new one' && l.worker === victim)
  await until('the replacement started', () => r.workerPids().length === 3)
  await until('/readyz ready again', async () => (await fetch(`${r.adminUrl}/readyz`)).status === 200)
  t.same(await bodies(r.gw.url, 20), new Array(20).fill('200 from b'), 'the replacement serves the file the primary accepted')
})

t.test('a worker that does not answer: gateway reload names it after --timeout, 10 s by default (exit 4); once it answers it serves the accepted file', async t => {
  const a = await answering(t, 'from a')
  const b = await answering(t, 'from b')
  const r = await twoWorkers(t, config(a))
  const [victim] = r.workerPids()
  if (victim === undefined) throw new Error('no worker')
  process.kill(victim, 'SIGSTOP')
  t.teardown(() => { try { process.kill(victim, 'SIGCONT') } catch { /* gone */ } })
  writeFileSync(r.gw.file, config(b))
  // without --timeout: its default, 10 s (README, Command line)
  const run = await gateway(['reload', '-c', r.gw.file, '--pid-file', r.gw.pidFile, '--admin', r.adminUrl.slice('http://'.length)])
  t.equal(run.code, 4, 'no verdict')
  t.equal(run.stderr, `gateway reload: generation 2 was accepted, but worker ${victim} has not applied it within 10 s (still compiling, or not answering: see /readyz); the others serve it\n`)
  const during = await (await fetch(`${r.adminUrl}/config`)).json() as { reloadPending: boolean, workersApplying: number[] }
  t.same([during.reloadPending, during.workersApplying], [true, [victim]], '/config says which worker is behind')
  process.kill(victim, 'SIGCONT')
  await until('the worker applied it', async () => !((await (await fetch(`${r.adminUrl}/config`)).json()) as { reloadPending: boolean }).reloadPending)
  t.same(await bodies(r.gw.url, 20), new Array(20).fill('200 from b'), 'both workers serve the accepted file')
})
