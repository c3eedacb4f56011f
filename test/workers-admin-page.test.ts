// The admin page of the workers primary (`workers: 2`, real bin/gateway processes): its health
// panel shows the reloads and the readiness as the primary knows them, not as a worker last
// reported them.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { Client } from 'undici'
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

t.test('a target one worker ejected shows ejected on the page and /readyz, whichever worker reported last', async t => {
  const upstream = await answering(t, 'ok')
  // two ports nothing listens on: a refused connection ejects the target on the worker that saw it
  const closed = async (): Promise<number> => {
    const s = createServer()
    await new Promise<void>(resolve => s.listen(0, '127.0.0.1', resolve))
    const port = (s.address() as AddressInfo).port
    await new Promise<void>(resolve => s.close(() => resolve()))
    return port
  }
  const [portOne, portTwo] = [await closed(), await closed()]
  const r = await twoWorkers(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
upstreams:
  ok: { targets: [${upstream}] }
  one: { targets: ["http://127.0.0.1:${portOne}"], ejectFor: 10m }
  two: { targets: ["http://127.0.0.1:${portTwo}"], ejectFor: 10m }
routes:
  - { name: one, pathPrefix: /one/, upstream: one }
  - { name: two, pathPrefix: /two/, upstream: two }
  - { name: all, pathPrefix: /, upstream: ok }
`)
  // one connection is one worker's: find a connection on each worker (by the access log's pid)
  const servedBy = async (client: Client, path: string): Promise<number> => {
    const from = r.gw.logs.length
    const res = await client.request({ path, method: 'GET' })
    await res.body.dump()
    let pid = 0
    await until(`the access line of ${path}`, () => {
      pid = r.gw.logs.slice(from).find(l => l.msg === 'request' && l.path === path)?.pid as number ?? 0
      return pid !== 0
    })
    return pid
  }
  const clients: Client[] = []
  t.teardown(async () => { for (const c of clients) await c.destroy() })
  const onWorker = new Map<number, Client>()
  for (let i = 0; i < 20 && onWorker.size < 2; i++) {
    const c = new Client(r.gw.url, { pipelining: 1 })
    clients.push(c)
    const pid = await servedBy(c, `/probe-${i}`)
    if (!onWorker.has(pid)) onWorker.set(pid, c)
  }
  t.equal(onWorker.size, 2, 'a connection on each worker')
  const [a, b] = [...onWorker.values()] as [Client, Client]
  t.equal((await a.request({ path: '/one/x', method: 'GET' })).statusCode, 502, 'upstream one refused on the first worker')
  t.equal((await b.request({ path: '/two/x', method: 'GET' })).statusCode, 502, 'upstream two refused on the second')

  type Targets = Record<string, Array<{ healthy: boolean }>>
  const ejected = (upstreams: Targets | undefined): string[] =>
    Object.entries(upstreams ?? {}).filter(([, targets]) => targets.some(x => !x.healthy)).map(([name]) => name).sort()
  // both workers report once a second: wait for a report of each after the ejections
  await new Promise(resolve => setTimeout(resolve, 2500))
  const health = await pageHealth(r.adminUrl) as Health & { upstreams?: Targets }
  t.same(ejected(health.upstreams), ['one', 'two'], 'the page shows both ejections (it showed one worker\'s view)')
  const readyz = await (await fetch(`${r.adminUrl}/readyz`)).json() as { upstreams?: Targets }
  t.same(ejected(readyz.upstreams), ['one', 'two'], '/readyz lists them too')
})
