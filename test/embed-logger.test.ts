// README (Logs): "A logger passed by an embedder (`Gateway.start({ logger })`) gets access lines
// through its own `info`". Every other test gives the gateway a logger of createLogger's, whose
// access lines take the hand-written fast path (src/log.ts createAccessLog): this one is an
// embedder's plain pino, whose lines go through pino itself.
import t from 'tap'
import { pino } from 'pino'
import { Gateway } from '../src/server.js'
import { jsonLineSink, writeConfig } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

t.test('an embedder\'s own pino logger gets an access line for every request, through its info, at its level', async t => {
  const up = await startUpstream(t)
  const { lines, sink } = jsonLineSink()
  // a field of the embedder's own on every line: only pino itself writes it
  const logger = pino({ level: 'info', base: { app: 'embedder' } }, sink)
  const gw = await Gateway.start({ configFile: writeConfig(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - { name: api, pathPrefix: /api/, upstream: backend }
`), logger })
  t.teardown(() => gw.close())
  const ok = await fetch(`${gw.url}/api/x?token=abc`)
  t.equal(ok.status, 200)
  const missing = await fetch(`${gw.url}/nowhere`)
  t.equal(missing.status, 404)
  const ids = [ok.headers.get('x-request-id'), missing.headers.get('x-request-id')]
  const deadline = Date.now() + 5000
  while (lines.filter(l => l.msg === 'request').length < 2 && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 20))
  const access = lines.filter(l => l.msg === 'request')
  t.match(access, [
    { app: 'embedder', level: 30, requestId: ids[0], status: 200, route: 'api', path: '/api/x?token=[redacted]' },
    { app: 'embedder', level: 30, requestId: ids[1], status: 404, route: '-' }
  ])
  t.equal(access.length, 2)
  // the embedder's level rules: at warn, no access line
  logger.level = 'warn'
  t.equal((await fetch(`${gw.url}/api/y`)).status, 200)
  await new Promise(resolve => setTimeout(resolve, 300))
  t.equal(lines.filter(l => l.msg === 'request').length, 2, 'no access line at warn')
})
