// A SIGTERM that comes while the gateway is still starting (a Redis that accepts the connection
// and never answers holds the start 2 s) had no handler yet. Outside a container that killed the
// process at once; as PID 1, the Dockerfile's exec form, the kernel dropped it: `docker stop`
// waited for its SIGKILL and the gateway, once started, served on. It is now held, like a SIGHUP
// during the start, and the gateway stops once started: drained, exit 0.
import t from 'tap'
import { spawn } from 'node:child_process'
import { createServer, type Socket } from 'node:net'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { childEnv } from './helpers/gateway.js'
import { tempDir } from './helpers/teardown.js'

t.test('SIGTERM during the start stops the gateway once started, exit 0', async t => {
  const sockets: Socket[] = []
  let connected: () => void = () => {}
  const firstConnection = new Promise<void>(resolve => { connected = resolve })
  const silent = createServer(socket => {
    sockets.push(socket)
    connected()
  })
  await new Promise<void>(resolve => silent.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    for (const s of sockets) s.destroy()
    silent.close()
  })
  const port = (silent.address() as { port: number }).port
  const dir = tempDir(t, 'stop-starting')
  const config = join(dir, 'gateway.yaml')
  writeFileSync(config, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: "redis://127.0.0.1:${port}" }
upstreams:
  b: { targets: ["http://127.0.0.1:9"] }
routes:
  - { name: r, pathPrefix: /, upstream: b }
`)
  const child = spawn(process.execPath, ['bin/gateway', 'start', '-c', config], { env: childEnv(), stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  child.stdout.on('data', (d: Buffer) => { out += d.toString() })
  child.stderr.on('data', (d: Buffer) => { out += d.toString() })
  const exited = new Promise<[number | null, NodeJS.Signals | null]>(resolve => child.once('exit', (code, signal) => resolve([code, signal])))
  const killer = setTimeout(() => child.kill('SIGKILL'), 20_000)
  t.teardown(() => {
    clearTimeout(killer)
    child.kill('SIGKILL')
  })
  // the gateway connects to Redis inside its start: the signal lands while it waits for an answer
  await firstConnection
  t.notMatch(out, /gateway started/, 'the signal comes before the start is done')
  child.kill('SIGTERM')
  t.same(await exited, [0, null], 'exit 0, not ended by the signal (nor by the test\'s SIGKILL)')
  t.match(out, /gateway started[\s\S]*"signal":"SIGTERM","msg":"shutting down"[\s\S]*gateway stopped/)
})
