// Regression: a 429 body carried retryAfterMs like 8437.218541 (the local level and the deny
// cache measure waits on performance.now()). Clients get whole milliseconds.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

t.test('retryAfterMs is an integer on every rejection path', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
local: { limit: 3, window: 10s }
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - name: store
    path: /store
    upstream: backend
    limits:
      ip: { algorithm: gcra, limit: 1, window: 7s }
  - name: local
    path: /local
    upstream: backend
`)
  const bodies: Array<{ dimension: string, retryAfterMs: number }> = []
  // /store: the 2nd is rejected by the store, the 3rd by the deny cache; then /local hits the local level
  for (const path of ['/store', '/store', '/store', '/local']) {
    const res = await fetch(gw.url + path)
    if (res.status === 429) bodies.push(await res.json() as { dimension: string, retryAfterMs: number })
  }
  t.same(bodies.map(b => b.dimension), ['ip', 'ip', 'local'])
  for (const b of bodies) {
    t.ok(Number.isInteger(b.retryAfterMs), `${b.dimension}: ${b.retryAfterMs} is an integer`)
    t.ok(b.retryAfterMs > 0 && b.retryAfterMs <= 10_000, `${b.dimension}: ${b.retryAfterMs} within the window`)
  }
})
