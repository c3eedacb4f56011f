// `workers: N` reloads: the primary reads and checks the file on each SIGHUP and hands an accepted
// text to every worker with its generation (src/workers.ts followPrimaryReloads); no worker reads
// the file on a signal of its own. Real processes: bin/gateway in workers mode.
import t from 'tap'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
import { request as httpsRequest } from 'node:https'
import { connect, createServer as createNetServer, type AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { answering, bodies, config, replaceOne, twoWorkers, until } from './helpers/workers.js'

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

t.test('a worker that replaces a crashed one starts with the key file and TLS files its primary checked, not with ones broken since', async t => {
  const a = await answering(t, 'from a')
  const dir = mkdtempSync(join(tmpdir(), 'gw-workers-files-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const cert = join(dir, 'cert.pem')
  const key = join(dir, 'key.pem')
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', key, '-out', cert, '-days', '1', '-subj', '/CN=gw'], { stdio: 'ignore' })
  const keys = join(dir, 'keys.yaml')
  writeFileSync(keys, 'k-alice-0123456789: alice\n')
  const r = await twoWorkers(t, config(a) + `tls: { cert: ${cert}, key: ${key} }\nidentity: { required: true, apiKeys: { header: x-api-key, file: ${keys} } }\n`)
  const url = r.gw.url.replace('http:', 'https:')
  const keyed = async (n: number): Promise<string[]> => await Promise.all(Array.from({ length: n }, async () => await new Promise<string>((resolve, reject) => {
    const req = httpsRequest(`${url}/x`, { rejectUnauthorized: false, agent: false, headers: { 'x-api-key': 'k-alice-0123456789' } }, res => {
      let body = ''
      res.on('data', (c: Buffer) => { body += c.toString() })
      res.on('end', () => resolve(`${res.statusCode ?? 0} ${body}`))
    })
    req.on('error', reject)
    req.end()
  })))
  t.same(await keyed(10), new Array(10).fill('200 from a'))

  // both files broken on disk, not reloaded; then a worker crashes
  writeFileSync(keys, 'k-alice-0123456789: [\n')
  writeFileSync(cert, 'not a certificate\n')
  await replaceOne(r)
  t.same(await keyed(40), new Array(40).fill('200 from a'), 'both workers serve the accepted key file and certificate')
  t.equal(r.gw.logs.filter(l => l.msg === 'worker exited; starting a new one').length, 1, 'the replacement started at the first try')

  // a SIGHUP reads the disk again: the primary refuses the broken files, the workers serve on
  r.gw.child.kill('SIGHUP')
  const rejected = await r.gw.waitForLog(l => l.msg === 'reload rejected; the running configuration keeps serving')
  t.match(rejected.problems, [/keys\.yaml:\d+:\d+/, /gateway\.yaml:\d+:\d+ tls: cert and key cannot be used together/], 'the files\' located problems')
  t.same(await keyed(10), new Array(10).fill('200 from a'))
})

t.test('after a reload that changes listen (a restart-needed setting), a crashed worker\'s replacement binds where its siblings do', async t => {
  const a = await answering(t, 'from a')
  const r = await twoWorkers(t, config(a))
  const port = Number(new URL(r.gw.url).port)
  const probe = createNetServer()
  await new Promise<void>(resolve => probe.listen(0, '127.0.0.1', resolve))
  const other = (probe.address() as AddressInfo).port
  await new Promise(resolve => probe.close(resolve))

  writeFileSync(r.gw.file, config(a).replace('listen: 127.0.0.1:0', `listen: 127.0.0.1:${other}`))
  r.gw.child.kill('SIGHUP')
  await r.gw.waitForLog(l => l.msg === 'configuration reloaded' && l.generation === 2)
  const replacement = await replaceOne(r)
  const started = r.gw.logs.find(l => l.msg === 'gateway started' && l.pid === replacement)
  t.equal(started?.port, port, 'the replacement listens on the address the gateway started with (it bound the reloaded one)')
  t.same(await bodies(r.gw.url, 20), new Array(20).fill('200 from a'))
  const refused = await new Promise<boolean>(resolve => {
    const socket = connect(other, '127.0.0.1', () => { socket.destroy(); resolve(false) })
    socket.on('error', () => resolve(true))
  })
  t.ok(refused, `nothing listens on 127.0.0.1:${other} until a restart`)
})
