// The access log is written in batches (issue 13): a line waits at most the flush interval at low
// traffic, and no line of a request the client got an answer for is lost when the gateway is
// stopped with SIGTERM under load (the buffer is flushed at drain and at exit).
import t from 'tap'
import { request } from 'undici'
import { spawnGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

const config = (target: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
server: { shutdownTimeout: 5s }
upstreams:
  backend: { targets: [${target}] }
routes:
  - name: all
    pathPrefix: /
    upstream: backend
`

t.test('a lone request is logged within the flush interval, not held until the buffer fills', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, config(up.url))
  const res = await request(`${gw.url}/lone`)
  await res.body.text()
  const id = res.headers['x-request-id']
  // the flush timer is 100 ms; 5 s is the margin of a loaded machine, far below "never"
  const line = await gw.waitForLog(l => l.msg === 'request' && l.requestId === id, 5000)
  t.equal(line.status, 200)
  t.equal(line.path, '/lone')
})

t.test('SIGTERM under load: every answered request has its access line', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, config(up.url))
  const answered = new Set<string>()
  let stopping = false
  let sent = 0
  const worker = async (): Promise<void> => {
    while (!stopping || sent < 50) {
      sent++
      try {
        const res = await request(`${gw.url}/load/${sent}`)
        await res.body.text()
        if (res.statusCode === 200) answered.add(String(res.headers['x-request-id']))
      } catch {
        return // the gateway closed: this worker is done
      }
    }
  }
  const workers = Array.from({ length: 20 }, worker)
  // let load build up until the gateway has answered a good number of requests
  while (answered.size < 300) await new Promise(resolve => setTimeout(resolve, 20))
  stopping = true
  gw.child.kill('SIGTERM')
  await Promise.all(workers)
  t.equal(await gw.exited, 0, 'the gateway drained and exited 0')
  const logged = new Set(gw.logs.filter(l => l.msg === 'request').map(l => String(l.requestId)))
  const missing = [...answered].filter(id => !logged.has(id))
  t.ok(answered.size >= 300, `${answered.size} requests answered`)
  t.same(missing, [], `every one of the ${answered.size} answered requests has its access line`)
})

