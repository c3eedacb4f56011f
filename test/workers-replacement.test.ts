// `workers: N`: a worker that replaces a crashed one starts with what its primary accepted and
// serves as its siblings do, after reloads that changed files or settings waiting for a restart
// (src/workers.ts acceptedConfig, ConfigGiven). Real processes: bin/gateway in workers mode.
import t from 'tap'
import { rmSync, writeFileSync } from 'node:fs'
import { request as httpsRequest } from 'node:https'
import type { TLSSocket } from 'node:tls'
import { connect, createServer as createNetServer, type AddressInfo } from 'node:net'
import { join } from 'node:path'
import { answering, bodies, config, replaceOne, twoWorkers, until } from './helpers/workers.js'
import { spawnGateway } from './helpers/gateway.js'
import { selfSignedCertificate, writeSelfSigned } from './helpers/tls.js'
import { restartPauseMs } from '../src/workers.js'

t.test('a worker that replaces a crashed one starts with the key file and TLS files its primary checked, not with ones broken since', async t => {
  const a = await answering(t, 'from a')
  const { dir, cert, key } = selfSignedCertificate(t, 'gw-workers-files', 'gw')
  const keys = join(dir, 'keys.yaml')
  writeFileSync(keys, 'k-alice-0123456789: alice\n')
  const r = await twoWorkers(t, config(a) + `tls: { cert: ${cert}, key: ${key} }\nidentity: { required: true, apiKeys: { header: x-api-key, file: ${keys} } }\n`)
  const keyed = async (n: number): Promise<string[]> => await httpsBodies(r.gw.url, n, { 'x-api-key': 'k-alice-0123456789' })
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

t.test('a certificate renewed on disk is served by every worker after a SIGHUP, a replacement started since included', async t => {
  const a = await answering(t, 'from a')
  const { cert, key } = selfSignedCertificate(t, 'gw-workers-renew', 'first.test')
  const r = await twoWorkers(t, config(a) + `tls: { cert: ${cert}, key: ${key} }\n`)
  t.same([...new Set(await servedNames(r.gw.url, 10))], ['first.test'])
  // the same files overwritten, as a renewal does; the config itself does not change
  writeSelfSigned(cert, key, 'second.test')
  r.gw.child.kill('SIGHUP')
  await until('both workers reloaded', () => new Set(r.gw.logs.filter(l => l.msg === 'configuration reloaded' && l.generation === 2).map(l => l.pid)).size === 2)
  t.same([...new Set(await servedNames(r.gw.url, 40))], ['second.test'], 'every connection, on either worker, gets the renewed certificate')
  // gone from disk since: a replacement starts with what its primary read at the SIGHUP
  rmSync(cert)
  rmSync(key)
  await replaceOne(r)
  t.same([...new Set(await servedNames(r.gw.url, 40))], ['second.test'], 'the replacement serves the renewed certificate too')
})

t.test('after a reload that turns TLS off (a restart-needed setting), a crashed worker\'s replacement serves TLS with its siblings\' certificate', async t => {
  const a = await answering(t, 'from a')
  const { cert, key } = selfSignedCertificate(t, 'gw-workers-tls-off', 'gw')
  const r = await twoWorkers(t, config(a) + `tls: { cert: ${cert}, key: ${key} }\n`)
  t.same(await httpsBodies(r.gw.url, 10), new Array(10).fill('200 from a'))
  writeFileSync(r.gw.file, config(a))
  r.gw.child.kill('SIGHUP')
  await r.gw.waitForLog(l => l.msg === 'configuration reloaded' && l.generation === 2)
  // and the files are gone from disk: the replacement cannot read them
  rmSync(cert)
  rmSync(key)
  await replaceOne(r)
  t.same(await httpsBodies(r.gw.url, 40), new Array(40).fill('200 from a'), 'every connection is TLS, the replacement\'s too (it served plain HTTP)')
})

t.test('after a reload that turns TLS on, a crashed worker\'s replacement serves plain HTTP as its siblings do', async t => {
  const a = await answering(t, 'from a')
  const { cert, key } = selfSignedCertificate(t, 'gw-workers-tls-on', 'gw')
  const r = await twoWorkers(t, config(a))
  writeFileSync(r.gw.file, config(a) + `tls: { cert: ${cert}, key: ${key} }\n`)
  r.gw.child.kill('SIGHUP')
  await r.gw.waitForLog(l => l.msg === 'configuration reloaded' && l.generation === 2)
  await replaceOne(r)
  t.same(await bodies(r.gw.url, 40), new Array(40).fill('200 from a'), 'every connection is plain HTTP, the replacement\'s too')
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

t.test('workers that cannot bind the listen address exit 1 and are started again after a growing pause, and serve once it is free', async t => {
  const a = await answering(t, 'from a')
  // another process holds the address (an old gateway still draining, say)
  const holder = createNetServer()
  await new Promise<void>(resolve => holder.listen(0, '127.0.0.1', resolve))
  const port = (holder.address() as AddressInfo).port
  t.teardown(() => { holder.close() })
  const gw = await spawnGateway(t, config(a).replace('listen: 127.0.0.1:0', `listen: 127.0.0.1:${port}`), [], { waitFor: 'gateway primary started' })
  const adminUrl = `http://127.0.0.1:${gw.logs.find(l => l.msg === 'gateway primary started')?.adminPort as number}`
  const exits = (): Array<Record<string, unknown>> => gw.logs.filter(l => l.msg === 'worker exited; starting a new one')
  await until('four failed starts', () => exits().length >= 4, 60_000)
  t.match(exits().slice(0, 4), new Array(4).fill({ code: 1, signal: null }), 'each exits 1 (a disconnect made it 0)')
  t.same(exits().slice(0, 4).map(l => l.restartInMs), [200, 400, 800, 1600], 'started again after a growing pause')
  t.same([5, 6, 7, 50].map(restartPauseMs), [3200, 5000, 5000, 5000], 'and the pause stops growing at 5 s')
  t.match(gw.stderr(), `bind EADDRINUSE 127.0.0.1:${port}`)
  t.equal((await fetch(`${adminUrl}/readyz`)).status, 503, 'not ready meanwhile')

  await new Promise(resolve => holder.close(resolve))
  await until('both workers ready once the address is free', async () => (await fetch(`${adminUrl}/readyz`)).status === 200, 60_000)
  t.same(await bodies(`http://127.0.0.1:${port}`, 10), new Array(10).fill('200 from a'))
  // a worker that started ends the row: a crash now is replaced after the shortest pause
  const victim = gw.logs.find(l => l.msg === 'gateway started')?.pid as number
  process.kill(victim, 'SIGKILL')
  const crash = await gw.waitForLog(l => l.msg === 'worker exited; starting a new one' && l.worker === victim)
  t.equal(crash.restartInMs, 200, 'the pause starts again from its shortest (it went on growing to 5 s)')
})

/** `n` HTTPS requests, each on its own connection (spread over the workers): each answer and the certificate name (CN) it came with. */
async function httpsAnswers (httpUrl: string, n: number, headers: Record<string, string> = {}): Promise<Array<{ answer: string, cn: string }>> {
  const url = httpUrl.replace('http:', 'https:')
  return await Promise.all(Array.from({ length: n }, async () => await new Promise<{ answer: string, cn: string }>((resolve, reject) => {
    const req = httpsRequest(`${url}/x`, { rejectUnauthorized: false, agent: false, headers }, res => {
      const cn = String((res.socket as TLSSocket).getPeerCertificate().subject.CN)
      let body = ''
      res.on('data', (c: Buffer) => { body += c.toString() })
      res.on('end', () => resolve({ answer: `${res.statusCode ?? 0} ${body}`, cn }))
    })
    req.on('error', reject)
    req.end()
  })))
}

/** "status body" of `n` HTTPS requests, each on its own connection. */
async function httpsBodies (httpUrl: string, n: number, headers: Record<string, string> = {}): Promise<string[]> {
  return (await httpsAnswers(httpUrl, n, headers)).map(a => a.answer)
}

/** The certificate names (CN) the gateway shows `n` TLS connections, each a new one. */
async function servedNames (httpUrl: string, n: number): Promise<string[]> {
  return (await httpsAnswers(httpUrl, n)).map(a => a.cn)
}
