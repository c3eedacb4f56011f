// npm run demo: the echo backend and the gateway on the shipped gateway.yaml, then curl lines
// that do what their comments say when pasted in the order printed.
// DEMO_PORT, DEMO_ADMIN_PORT and DEMO_BACKEND_PORT move the demo off 8080, 9901 and 3000.
import { spawn } from 'node:child_process'
import { createServer } from 'node:net'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const port = Number(process.env.DEMO_PORT ?? 8080)
const adminPort = Number(process.env.DEMO_ADMIN_PORT ?? 9901)
const backendPort = Number(process.env.DEMO_BACKEND_PORT ?? 3000)

/** Resolves with an error message when 127.0.0.1:p cannot be bound, else null. */
function portTaken (p) {
  return new Promise(resolve => {
    const probe = createServer()
    probe.once('error', err => resolve(err.code === 'EADDRINUSE' ? `127.0.0.1:${p} is already in use` : `127.0.0.1:${p}: ${err.message}`))
    probe.listen(p, '127.0.0.1', () => probe.close(() => resolve(null)))
  })
}

// Checked before anything starts: a taken port is one line, not a stack trace and a half-started demo.
for (const [p, what, env] of [[backendPort, 'echo backend', 'DEMO_BACKEND_PORT'], [port, 'gateway', 'DEMO_PORT'], [adminPort, 'admin listener', 'DEMO_ADMIN_PORT']]) {
  const problem = await portTaken(p)
  if (problem !== null) {
    console.error(`demo: ${problem} (needed by the ${what}; set ${env} to use another port)`)
    process.exit(1)
  }
}

// The shipped config as is, on other ports only when asked to.
let config = 'gateway.yaml'
let tmp = null
if (port !== 8080 || adminPort !== 9901 || backendPort !== 3000) {
  tmp = mkdtempSync(join(tmpdir(), 'gateway-demo-'))
  config = join(tmp, 'gateway.yaml')
  writeFileSync(config, readFileSync(join(root, 'gateway.yaml'), 'utf8')
    .replace('127.0.0.1:8080', `127.0.0.1:${port}`)
    .replace('127.0.0.1:9901', `127.0.0.1:${adminPort}`)
    .replace('http://127.0.0.1:3000', `http://127.0.0.1:${backendPort}`))
}

const children = []
let ready = false
let stopping = false
const stop = (code) => {
  if (stopping) return
  stopping = true
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM')
  if (tmp !== null) rmSync(tmp, { recursive: true, force: true })
  // the children drain on SIGTERM; the demo leaves once they are gone
  let left = children.filter(c => c.exitCode === null && c.signalCode === null).length
  if (left === 0) process.exit(code)
  for (const c of children) c.once('exit', () => { if (--left === 0) process.exit(code) })
}
const run = (args, name, env = {}) => {
  const child = spawn(process.execPath, args, { cwd: root, stdio: ['ignore', 'inherit', 'inherit'], env: { ...process.env, ...env } })
  child.once('exit', (code, signal) => {
    if (stopping) return
    // one side gone (a port taken meanwhile, a crash): the other is stopped too, nothing lingers
    console.error(`demo: the ${name} exited (${signal ?? `code ${code}`})${ready ? '' : ' before the demo was ready'}; stopping`)
    stop(1)
  })
  children.push(child)
}
process.on('SIGINT', () => stop(0))
process.on('SIGTERM', () => stop(0))

run(['examples/echo-backend.js'], 'echo backend', { PORT: String(backendPort) })
run(['bin/gateway', 'start', '-c', config, '--log-level', 'warn'], 'gateway')

for (let i = 0; i < 100 && !ready && !stopping; i++) {
  try {
    ready = (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).ok
  } catch { /* not up yet */ }
  if (!ready) await new Promise(resolve => setTimeout(resolve, 100))
}
if (!ready) {
  if (!stopping) console.error(`demo: the gateway was not ready on 127.0.0.1:${adminPort} within 10 s; stopping`)
  stop(1)
} else {
  const gw = `http://127.0.0.1:${port}`
  console.log(`
Gateway on ${gw} (admin http://127.0.0.1:${adminPort}), echo backend on :${backendPort}. Run these in order:

  curl -i ${gw}/api/echo
      # 200, proxied, with RateLimit headers (the gateway-wide ip limit: 100 per minute)
  for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code} ' ${gw}/api/hello; done; echo
      # 200 200 200 429 (the hello route allows 3 per 10 s per IP)
  curl -s --path-as-is ${gw}/nope/../api/echo
      # 200: the path is normalized before routing, the backend echoes "url": "/api/echo"
  curl -s http://127.0.0.1:${adminPort}/metrics | grep '^gateway_requests_total'
      # Prometheus: the requests above, by route and status class

Ctrl-C stops both.`)
}
