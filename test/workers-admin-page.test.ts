// The admin page of the workers primary (`workers: 2`, real bin/gateway processes): its health
// panel shows the reloads and the readiness as the primary knows them, not as a worker last
// reported them.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { answering, config, twoWorkers, until } from './helpers/workers.js'

interface Health { status: string, workersReady: number, reloads: Array<{ ok: boolean, problems: string[] }> }

/** The health of the first event of a new /events stream (its `history`, read at subscribe time). */
async function pageHealth (adminUrl: string): Promise<Health> {
  const controller = new AbortController()
  const res = await fetch(`${adminUrl}/events`, { signal: controller.signal })
  const reader = res.body!.getReader()
  const decoder = new TextDecoder()
  let buf = ''
  try {
    while (!buf.includes('\n\n')) {
      const { done, value } = await reader.read()
      if (done) break
      buf += decoder.decode(value, { stream: true })
    }
  } finally {
    controller.abort()
  }
  const data = /^data: (.*)$/m.exec(buf.slice(0, buf.indexOf('\n\n')))?.[1] ?? '{}'
  return (JSON.parse(data) as { health: Health }).health
}

t.test('the primary\'s page lists a rejected reload with its located error', async t => {
  const upstream = await answering(t, 'ok')
  const r = await twoWorkers(t, config(upstream))
  writeFileSync(r.gw.file, config(upstream).replace('upstream: b', 'upstream: nowhere'))
  r.gw.child.kill('SIGHUP')
  await r.gw.waitForLog(l => l.msg === 'reload rejected; the running configuration keeps serving')
  // the rejected file reached no worker: the page had only their (empty) histories
  const health = await pageHealth(r.adminUrl)
  t.equal(health.reloads.length, 1, 'one reload listed')
  t.equal(health.reloads[0]?.ok, false)
  t.match(health.reloads[0]?.problems.join('\n'), /gateway\.yaml:\d+:\d+ routes\[0\]\.upstream: unknown upstream "nowhere"/)
})

t.test('the primary\'s page is not "ready" while its workers are gone', async t => {
  const upstream = await answering(t, 'ok')
  const r = await twoWorkers(t, config(upstream))
  t.equal((await pageHealth(r.adminUrl)).status, 'ready')
  // both killed: the replacements take a pause and a start; /readyz is 503 meanwhile. Read the
  // page between two 503s, so it was read while no replacement was ready (tried again otherwise)
  let checked = false
  for (let attempt = 0; attempt < 3 && !checked; attempt++) {
    const exited = r.gw.logs.filter(l => l.msg === 'worker exited; starting a new one').length
    const pids = [...new Set(r.gw.logs.filter(l => l.msg === 'gateway started').map(l => l.pid as number))].slice(-2)
    for (const pid of pids) process.kill(pid, 'SIGKILL')
    await until('both exits seen', () => r.gw.logs.filter(l => l.msg === 'worker exited; starting a new one').length === exited + 2)
    const before = (await fetch(`${r.adminUrl}/readyz`)).status
    const health = await pageHealth(r.adminUrl)
    const after = (await fetch(`${r.adminUrl}/readyz`)).status
    if (before === 503 && after === 503) {
      checked = true
      t.not(health.status, 'ready', `the page's status badge follows /readyz (${health.status}, ${health.workersReady} of 2 ready)`)
    }
    await until('ready again', async () => (await fetch(`${r.adminUrl}/readyz`)).status === 200)
  }
  t.ok(checked, 'the page was read while /readyz said 503')
  t.equal((await pageHealth(r.adminUrl)).status, 'ready', 'and "ready" once the replacements are')
})
