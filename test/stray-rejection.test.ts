// A promise rejected with no handler ended the gateway process (Node's default): every request in
// flight cut, a single process down until its supervisor restarted it. The gateway now logs it with
// GW_ERR_STRAY_REJECTION, counts it in gateway_stray_rejections_total and serves on. The rejection
// comes from test/fixtures/process/stray-rejection.mjs, loaded into bin/gateway with --import, on
// SIGUSR2.
import t from 'tap'
import { fileURLToPath } from 'node:url'
import { spawnGateway, startGateway } from './helpers/gateway.js'
import { answering, config, twoWorkers, until } from './helpers/workers.js'

const fixture = fileURLToPath(new URL('./fixtures/process/stray-rejection.mjs', import.meta.url))
const env = { NODE_OPTIONS: `--import ${fixture}` }

const strayCount = async (adminUrl: string): Promise<number> => {
  const text = await (await fetch(`${adminUrl}/metrics`)).text()
  const m = /^gateway_stray_rejections_total (\d+)$/m.exec(text)
  return m === null ? -1 : Number(m[1])
}

t.test('single process: logged, counted, and the gateway serves on', async t => {
  const upstream = await answering(t, 'up')
  const gw = await spawnGateway(t, config(upstream).replace('workers: 2\n', ''), [], { env })
  t.equal(await strayCount(gw.adminUrl), 0, 'the counter is exported at 0')
  gw.child.kill('SIGUSR2')
  const line = await gw.waitForLog(l => l.code === 'GW_ERR_STRAY_REJECTION')
  t.equal(line.level, 50, 'logged at error')
  t.match(line.err, { message: 'stray rejection from the test fixture', stack: /stray-rejection\.mjs/ }, 'with the reason and its stack')
  const res = await fetch(`${gw.url}/x`)
  t.same([res.status, await res.text()], [200, 'up'], 'the next request is served')
  t.equal(await strayCount(gw.adminUrl), 1, 'counted once')
  gw.child.kill('SIGUSR2')
  await until('the second one counted', async () => await strayCount(gw.adminUrl) === 2)
  t.equal(gw.child.exitCode, null, 'still running')
  gw.child.kill('SIGTERM')
  t.equal(await gw.exited, 0, 'and it stops with 0 on SIGTERM')
})

t.test('workers: 2: a worker and the primary serve on', async t => {
  const upstream = await answering(t, 'up')
  const r = await twoWorkers(t, config(upstream), env)
  const [worker] = r.workerPids()
  process.kill(worker as number, 'SIGUSR2')
  const fromWorker = await r.gw.waitForLog(l => l.code === 'GW_ERR_STRAY_REJECTION' && l.pid === worker)
  t.match(fromWorker.err, { message: 'stray rejection from the test fixture' })
  await until('the worker\'s count in the summed /metrics', async () => await strayCount(r.adminUrl) === 1)
  const primary = r.gw.child.pid as number
  r.gw.child.kill('SIGUSR2')
  await r.gw.waitForLog(l => l.code === 'GW_ERR_STRAY_REJECTION' && l.pid === primary)
  const answers = await Promise.all(Array.from({ length: 8 }, async () => {
    const res = await fetch(`${r.gw.url}/x`, { headers: { connection: 'close' } })
    return `${res.status} ${await res.text()}`
  }))
  t.same(new Set(answers), new Set(['200 up']), 'requests are served after both')
  t.same(r.gw.logs.filter(l => l.msg === 'worker exited; starting a new one'), [], 'no worker was replaced')
  t.same(r.workerPids(), [worker, r.workerPids()[1]], 'the same two workers')
  t.equal((await fetch(`${r.adminUrl}/readyz`)).status, 200, 'the primary answers')
})

t.test('a thrown exception still ends the process (Node\'s default), with its stack on stderr', async t => {
  const upstream = await answering(t, 'up')
  const gw = await spawnGateway(t, config(upstream).replace('workers: 2\n', ''), [], { env })
  gw.child.kill('SIGWINCH')
  t.not(await gw.exited, 0, 'exited with a failure code')
  t.match(gw.stderr(), /exception thrown by the test fixture/)
})

t.test('a gateway embedded with Gateway.start installs no process-wide handler: the embedder keeps its own policy', async t => {
  const before = process.listenerCount('unhandledRejection')
  const upstream = await answering(t, 'up')
  const gw = await startGateway(t, config(upstream).replace('workers: 2\n', ''))
  t.equal((await fetch(`${gw.url}/x`)).status, 200)
  t.equal(process.listenerCount('unhandledRejection'), before)
})
