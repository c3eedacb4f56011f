// The access log is written in batches (issue 13): a line waits at most the flush interval at low
// traffic, and no line of a request the client got an answer for is lost when the gateway is
// stopped with SIGTERM under load (the buffer is flushed at drain and at exit).
import t from 'tap'
import { request } from 'undici'
import { spawn } from 'node:child_process'
import { childEnv, spawnGateway, writeConfig } from './helpers/gateway.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'

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


// A stdout pipe is inherited blocking (as under Docker, systemd or a shell pipe): with a reader
// that stalls, a write blocked a thread for good and SIGTERM never ended the process.
t.test('a stdout pipe nobody reads: SIGTERM still ends the gateway, and the lines it could not write are counted on stderr', async t => {
  const up = await startUpstream(t)
  // stdout is a pipe this test never reads, so the gateway listens where it is told
  const port = Number(new URL(await refusingUrl()).port)
  const file = writeConfig(t, config(up.url).replace('listen: 127.0.0.1:0', `listen: 127.0.0.1:${port}`))
  const child = spawn(process.execPath, ['bin/gateway', 'start', '-c', file], { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv() })
  child.stdout.pause()
  let stderr = ''
  child.stderr.on('data', (c: Buffer) => { stderr += c.toString() })
  const exited = new Promise<number | null>(resolve => child.once('exit', code => resolve(code)))
  t.teardown(() => { child.kill('SIGKILL') })
  for (let i = 0; i < 300; i++) {
    try {
      await (await request(`http://127.0.0.1:${port}/up`)).body.text()
      break
    } catch { await new Promise(resolve => setTimeout(resolve, 50)) }
  }
  // about 2,000 access lines: several times what the pipe and node's read buffer hold
  for (let i = 0; i < 2000; i++) {
    const res = await request(`http://127.0.0.1:${port}/fill/${i}`)
    await res.body.text()
  }
  const stopped = Date.now()
  child.kill('SIGTERM')
  const code = await Promise.race([exited, new Promise(resolve => setTimeout(() => resolve('still running'), 20_000))])
  t.equal(code, 0, 'the gateway exited')
  t.ok(Date.now() - stopped < 20_000, `within ${Date.now() - stopped} ms`)
  t.match(stderr, /log: \d+ lines dropped at exit/, 'the lines the pipe did not take are counted')
})
