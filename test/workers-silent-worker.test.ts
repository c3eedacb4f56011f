// workers: N (real bin/gateway): a worker whose event loop stops (SIGSTOP here; a blocked loop
// alike) sends no live frame, and the connections the primary hands it wait unanswered. The
// primary's /readyz says not ready while it is silent, names it, and says ready again once it
// answers; both turns are logged.
import t from 'tap'
import { answering, config, twoWorkers, until } from './helpers/workers.js'
import { WORKER_SILENT_MS } from '../src/workers.js'
import { metricIn } from './helpers/ratelimit.js'

interface Readyz { status: string, ready: number, notAnswering?: Array<{ pid: number, silentMs: number }> }

t.test('a stopped worker: /readyz 503 naming it, ready again once it answers', async t => {
  const up = await answering(t, 'ok')
  const r = await twoWorkers(t, config(up))
  const readyz = async (): Promise<{ status: number, body: Readyz }> => {
    const res = await fetch(`${r.adminUrl}/readyz`)
    return { status: res.status, body: await res.json() as Readyz }
  }
  t.match(await readyz(), { status: 200, body: { status: 'ready', ready: 2 } })
  const [victim] = r.workerPids()
  if (victim === undefined) throw new Error('no worker')
  const stoppedAt = Date.now()
  process.kill(victim, 'SIGSTOP')
  t.teardown(() => { try { process.kill(victim, 'SIGCONT') } catch { // already gone
  } })
  await until('/readyz turns 503', async () => (await readyz()).status === 503, 20_000)
  t.ok(Date.now() - stoppedAt >= WORKER_SILENT_MS - 1100, 'not before the worker was silent for WORKER_SILENT_MS (one frame a second)')
  const during = await readyz()
  t.match(during.body, { status: 'not_ready', ready: 1, notAnswering: [{ pid: victim }] }, 'names the silent worker')
  t.ok((during.body.notAnswering?.[0]?.silentMs ?? 0) >= WORKER_SILENT_MS)
  await r.gw.waitForLog(l => l.msg === String(l.msg) && String(l.msg).startsWith('worker not answering') && l.worker === victim && l.level === 40)
  t.pass('warned of')
  process.kill(victim, 'SIGCONT')
  await until('/readyz ready again', async () => (await readyz()).status === 200, 20_000)
  t.match(await readyz(), { status: 200, body: { status: 'ready', ready: 2 } })
  t.notOk('notAnswering' in (await readyz()).body)
  await r.gw.waitForLog(l => l.msg === 'worker answering again' && l.worker === victim)
  t.pass('its return logged')
})

t.test('/metrics with a stopped worker: answered after the 3 s it waits for a worker, summed over the one that answered, its counters kept in the sum', async t => {
  const up = await answering(t, 'ok')
  const r = await twoWorkers(t, config(up))
  const metrics = async (): Promise<{ ms: number, text: string }> => {
    const started = Date.now()
    const res = await fetch(`${r.adminUrl}/metrics`)
    const text = await res.text()
    t.equal(res.status, 200)
    return { ms: Date.now() - started, text }
  }
  // requests on new connections, which the primary hands to both workers
  const pids = new Set<number>()
  await until('both workers answered requests', async () => {
    const res = await fetch(`${r.gw.url}/x`, { headers: { connection: 'close' } })
    await res.text()
    for (const l of r.gw.logs) if (l.msg === 'request') pids.add(l.pid as number)
    return pids.size === 2
  })
  const before = await metrics()
  t.equal(metricIn(before.text, 'gateway_workers_scraped'), 2)
  const counted = metricIn(before.text, 'gateway_requests_total')
  t.ok(counted >= 2, `${counted} requests counted`)
  const [victim] = r.workerPids()
  if (victim === undefined) throw new Error('no worker')
  process.kill(victim, 'SIGSTOP')
  t.teardown(() => { try { process.kill(victim, 'SIGCONT') } catch { // already gone
  } })
  const during = await metrics()
  t.ok(during.ms < 6000, `answered in ${during.ms} ms (the 3 s wait for the stopped worker, then the other's answer)`)
  t.equal(metricIn(during.text, 'gateway_workers_scraped'), 1, 'one worker answered')
  t.ok(metricIn(during.text, 'gateway_requests_total') >= counted, 'the stopped worker\'s requests stay in the sum: no counter goes down')
  process.kill(victim, 'SIGCONT')
  await until('both answer again', async () => metricIn((await metrics()).text, 'gateway_workers_scraped') === 2)
})
