// The access log is written in batches (issue 13): a line waits at most the flush interval at low
// traffic, and no line of a request the client got an answer for is lost when the gateway is
// stopped with SIGTERM under load (the buffer is flushed at drain and at exit).
import t from 'tap'
import { request } from 'undici'
import { gatewayOnUnreadStdout, spawnGateway, writeConfig } from './helpers/gateway.js'
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

// A stdout pipe is inherited blocking (Docker's FIFO, a shell pipe): with a reader that stalls, a
// write blocked a thread-pool thread for good and SIGTERM never ended the process. README, Logs:
// the exit is bounded, and a line that could not be written is counted, not lost silently.
t.test('a stdout pipe nobody reads: SIGTERM still ends the gateway within a bound, and the lines it could not write are counted on stderr', async t => {
  const up = await startUpstream(t)
  const file = writeConfig(t, config(up.url))
  // the test reads the start-up line, then nothing until the gateway is gone
  const { child, port, exited, stderr, readPipe } = await gatewayOnUnreadStdout(t, file)
  // 600 lines of about 1.2 KB: ten times what the pipe holds
  const pad = 'p'.repeat(1000)
  let next = 0
  let answered = 0
  const client = async (): Promise<void> => {
    while (next < 600) {
      const res = await request(`http://127.0.0.1:${port}/fill/${next++}?pad=${pad}`)
      await res.body.text()
      if (res.statusCode === 200) answered++
    }
  }
  await Promise.all(Array.from({ length: 8 }, client))
  t.equal(answered, 600, 'every request is answered while nobody reads the log')
  const stopped = Date.now()
  child.kill('SIGTERM')
  // the drain gives the log 2 s and the exit 1 s more; 15 s is the margin of a loaded machine
  const code = await Promise.race([exited, new Promise(resolve => setTimeout(() => resolve('still running'), 15_000))])
  const exitMs = Date.now() - stopped
  t.equal(code, 0, `the gateway exited 0 (after ${exitMs} ms)`)
  // "within about 3 s": well before docker stop's SIGKILL at 10 s, which would lose the count too
  t.ok(exitMs < 8000, `exited ${exitMs} ms after SIGTERM (< 8000: before a SIGKILL at 10 s)`)
  const dropped = Number(/log: (\d+) lines dropped at exit/.exec(stderr())?.[1] ?? Number.NaN)
  t.ok(dropped > 0, `the lines the pipe did not take are said on stderr (${stderr().trim()})`)
  const lines = readPipe().split('\n').slice(0, -1)
  t.same(lines.filter(l => { try { JSON.parse(l); return false } catch { return true } }), [], 'every line that reached the pipe is whole')
  const logged = lines.filter(l => l.includes('"path":"/fill/')).length
  t.ok(logged + dropped >= 600, `each access line reached the pipe (${logged}) or is counted (${dropped})`)
})
