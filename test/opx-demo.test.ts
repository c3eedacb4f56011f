// `npm run demo` as a new user meets it: every printed line, pasted in the order printed, does what
// its comment says; a taken port stops the demo with one line and leaves nothing running.
import t from 'tap'
import { spawn, execFile, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import net from 'node:net'
import { childEnv } from './helpers/gateway.js'
import type { Teardown } from './helpers/teardown.js'

async function freePort (): Promise<number> {
  const server = net.createServer()
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const port = (server.address() as net.AddressInfo).port
  await new Promise<void>(resolve => server.close(() => resolve()))
  return port
}

async function refuses (port: number): Promise<boolean> {
  const socket = net.connect(port, '127.0.0.1')
  try {
    await once(socket, 'connect')
    return false
  } catch {
    return true
  } finally {
    socket.destroy()
  }
}

interface Demo { child: ChildProcess, stdout: () => string, stderr: () => string, exited: Promise<number | null> }

function startDemo (t: Teardown, env: Record<string, string>): Demo {
  const child = spawn(process.execPath, ['examples/demo.js'], { env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  child.stdout?.on('data', (c: Buffer) => { out += c.toString() })
  child.stderr?.on('data', (c: Buffer) => { err += c.toString() })
  const exited = new Promise<number | null>(resolve => child.once('exit', code => resolve(code)))
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGINT')
      await exited
    }
  })
  return { child, stdout: () => out, stderr: () => err, exited }
}

function sh (command: string): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile('sh', ['-c', command], { env: childEnv() }, (err, stdout) => err === null ? resolve(stdout) : reject(err))
  })
}

t.test('the printed lines, run in order, print what their comments say; Ctrl-C stops both processes', async t => {
  const ports = { DEMO_PORT: String(await freePort()), DEMO_ADMIN_PORT: String(await freePort()), DEMO_BACKEND_PORT: String(await freePort()) }
  const demo = startDemo(t, ports)
  for (let i = 0; i < 200 && !demo.stdout().includes('Ctrl-C stops both.'); i++) await new Promise(resolve => setTimeout(resolve, 50))
  t.match(demo.stdout(), /Ctrl-C stops both\./, demo.stderr())
  // a command is a line of two spaces then curl/for; its comment is the next line
  const lines = demo.stdout().split('\n')
  const commands: Array<{ command: string, comment: string }> = []
  lines.forEach((line, i) => {
    if (/^ {2}(curl|for) /.test(line)) commands.push({ command: line.trim(), comment: (lines[i + 1] ?? '').trim() })
  })
  t.equal(commands.length, 4, 'four commands printed')
  const [echo, burst, normalized, metrics] = commands as [typeof commands[0], typeof commands[0], typeof commands[0], typeof commands[0]]

  t.match(echo.comment, /^# 200, proxied, with RateLimit headers/)
  const echoOut = await sh(echo.command)
  t.match(echoOut, /^HTTP\/1\.1 200 /)
  t.match(echoOut, /^ratelimit: /m)
  t.match(echoOut, /^ratelimit-policy: /m)

  t.match(burst.comment, /^# 200 200 200 429 /)
  t.equal((await sh(burst.command)).trim(), '200 200 200 429', 'the second line prints what its comment says, after the first')

  t.match(normalized.command, /--path-as-is .*\/nope\/\.\.\/api\/echo$/)
  t.match(normalized.comment, /"url": "\/api\/echo"/)
  const echoed = JSON.parse(await sh(normalized.command)) as { url: string }
  t.equal(echoed.url, '/api/echo')

  const scraped = await sh(metrics.command)
  t.match(scraped, /^gateway_requests_total\{route="hello",method="GET",status_class="4xx"\} 1$/m)
  t.match(scraped, /^gateway_requests_total\{route="api",method="GET",status_class="2xx"\} 2$/m)
  // the refusal's Retry-After: four at once, of which gcra (3 per 10 s, burst 3) admits 3 at most
  // however long since the burst
  const four = await Promise.all(Array.from({ length: 4 }, async () => {
    const res = await fetch(`http://127.0.0.1:${ports.DEMO_PORT}/api/hello`)
    await res.arrayBuffer()
    return res
  }))
  const refused = four.filter(r => r.status === 429)
  t.ok(refused.length >= 1, `at least one of four at once refused (${four.map(r => r.status).join(' ')})`)
  t.ok(refused.every(r => /^[1-9]\d*$/.test(r.headers.get('retry-after') ?? '')), 'each with Retry-After in whole seconds')

  demo.child.kill('SIGINT')
  t.equal(await demo.exited, 0)
  t.ok(await refuses(Number(ports.DEMO_PORT)), 'the gateway is gone')
  t.ok(await refuses(Number(ports.DEMO_BACKEND_PORT)), 'the backend is gone')
})

t.test('a port already taken: one clear line, exit 1, nothing left running', async t => {
  const blocker = net.createServer()
  blocker.listen(0, '127.0.0.1')
  await once(blocker, 'listening')
  t.teardown(() => blocker.close())
  const taken = (blocker.address() as net.AddressInfo).port
  const backendPort = await freePort()
  const demo = startDemo(t, { DEMO_PORT: String(taken), DEMO_ADMIN_PORT: String(await freePort()), DEMO_BACKEND_PORT: String(backendPort) })
  t.equal(await demo.exited, 1)
  t.same(demo.stderr().trim().split('\n'), [`demo: 127.0.0.1:${taken} is already in use (needed by the gateway; set DEMO_PORT to use another port)`])
  t.notMatch(demo.stdout(), /Run these/, 'no curl lines for a demo that is not running')
  t.ok(await refuses(backendPort), 'no backend left behind')
})

t.test('the gateway failing after the backend started stops the backend too', async t => {
  // listen and admin on one port: free when checked, refused by the gateway's config check
  const same = String(await freePort())
  const backendPort = await freePort()
  const demo = startDemo(t, { DEMO_PORT: same, DEMO_ADMIN_PORT: same, DEMO_BACKEND_PORT: String(backendPort) })
  t.equal(await demo.exited, 1)
  // stopped by the gateway's exit, not by the 10 s readiness wait running out (what the demo
  // says, not a wall clock: starting two node processes on a loaded CI machine took 8 s)
  t.match(demo.stderr(), /demo: the gateway exited \(code 1\) before the demo was ready; stopping/)
  t.notMatch(demo.stderr(), /not ready .* within 10 s/)
  t.match(demo.stdout(), /echo backend on /, 'the backend had started')
  t.ok(await refuses(backendPort), 'and was stopped')
})
