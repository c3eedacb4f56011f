// README (Admin page): the Health panel shows "the last 20 reloads". The history rides in every
// /events update (one a second, to every subscriber): unbounded, each reload (a rejected one with up
// to 100 located errors) would stay in memory and in every frame for the life of the process.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

interface Reload { attempt: number, ok: boolean, generation: number, problems: string[] }

const config = (upstreamUrl: string, name: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstreamUrl}] }
routes:
  - { name: ${name}, pathPrefix: /, upstream: backend }
`

t.test('the admin page\'s health lists the last 20 reloads, newest last, however many there were', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'r0'))
  const file = gw.runtime!.file
  // 25 reloads: every fifth rejected, the others accepted
  for (let i = 1; i <= 25; i++) {
    writeFileSync(file, i % 5 === 0 ? 'listen: [' : config(up.url, `r${i}`))
    t.equal((await gw.reload()).ok, i % 5 !== 0, `reload ${i}`)
  }

  // the live feed: one update a second, each with the health panel
  const controller = new AbortController()
  t.teardown(() => controller.abort())
  const res = await fetch(`${gw.adminUrl}/events`, { signal: controller.signal })
  t.equal(res.status, 200)
  const reader = res.body!.getReader()
  const decoder = new TextDecoder()
  let buf = ''
  let reloads: Reload[] | undefined
  for (const deadline = Date.now() + 15_000; reloads === undefined && Date.now() < deadline;) {
    const { done, value } = await reader.read()
    if (done) break
    buf += decoder.decode(value, { stream: true })
    let end
    while ((end = buf.indexOf('\n\n')) !== -1) {
      const block = buf.slice(0, end)
      buf = buf.slice(end + 2)
      if (/^event: update$/m.exec(block) === null) continue
      const data = /^data: (.*)$/m.exec(block)?.[1]
      const health = data === undefined ? undefined : (JSON.parse(data) as { health?: { reloads?: Reload[] } }).health
      if (health?.reloads !== undefined) reloads = health.reloads
    }
  }
  controller.abort()
  if (reloads === undefined) throw new Error('no update with the health panel within 15 s')
  t.equal(reloads.length, 20, '20 listed of 25')
  const attempts = reloads.map(r => r.attempt)
  t.same(attempts, [...attempts].sort((a, b) => a - b), 'oldest first, newest last')
  t.same(reloads.map(r => r.ok), Array.from({ length: 20 }, (_, k) => (k + 6) % 5 !== 0), 'reloads 6 to 25: the first five dropped')
  t.equal(reloads.at(-1)?.ok, false, 'the newest, the 25th, is the rejected one')
  t.ok((reloads.at(-1)?.problems.length ?? 0) > 0, 'with its located errors')
})
