// npm run demo: the echo backend and the gateway on the shipped gateway.yaml, then a few curl lines.
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const children = []
const run = (args, name) => {
  const child = spawn(process.execPath, args, { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] })
  child.on('exit', code => { if (code !== 0 && code !== null) console.error(`${name} exited with ${code}`) })
  children.push(child)
}
run(['examples/echo-backend.js'], 'echo backend')
run(['bin/gateway', 'start', '-c', 'gateway.yaml', '--log-level', 'warn'], 'gateway')

const stop = () => { for (const c of children) c.kill('SIGTERM'); process.exit(0) }
process.on('SIGINT', stop)
process.on('SIGTERM', stop)

for (let i = 0; i < 50; i++) {
  try {
    const r = await fetch('http://127.0.0.1:9901/readyz')
    if (r.ok) break
  } catch { /* not up yet */ }
  await new Promise(resolve => setTimeout(resolve, 200))
}
console.log(`
Gateway on http://127.0.0.1:8080 (admin http://127.0.0.1:9901), echo backend on :3000. Try:

  curl -i http://127.0.0.1:8080/api/hello                 # 200, proxied, with RateLimit headers
  for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\\n' http://127.0.0.1:8080/api/hello; done
                                                          # 200 200 200 429 (3 per 10s per IP)
  curl -s http://127.0.0.1:8080/api/../nope               # 404 JSON: paths are normalized first
  curl -s http://127.0.0.1:9901/metrics | grep gateway_   # Prometheus metrics

Ctrl-C stops both.`)
