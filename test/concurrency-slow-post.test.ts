// Issue 10, the attack that motivated it: one client opens many slow POSTs, each within every rate
// limit, and ties up the upstream connections so that well-behaved clients hang. Bodies stream
// here (server.bufferBodies: 0), so each admitted slow POST holds an upstream connection; a
// per-IP concurrency cap admits only a few of them and the rest of the pool serves everyone else.
import t from 'tap'
import net from 'node:net'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { metric } from './helpers/ratelimit.js'
import type { Teardown } from './helpers/teardown.js'

interface Attacker {
  readonly socket: net.Socket
  readonly received: () => string
}

function attacker (t: Teardown, port: number, ip: string): Promise<Attacker> {
  return new Promise((resolve, reject) => {
    let data = ''
    const socket = net.connect(port, '127.0.0.1', () => {
      socket.write(`POST /upload HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: ${ip}\r\nContent-Length: 1000000\r\n\r\n`)
      resolve({ socket, received: () => data })
    })
    socket.on('data', (c: Buffer) => { data += c.toString('latin1') })
    socket.on('error', reject)
    t.teardown(() => socket.destroy())
  })
}

t.test('30 slow POSTs from one IP no longer starve other clients with `concurrency: { ip: 4 }`', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
trustedProxies: [127.0.0.1]
server: { bufferBodies: 0, clientBodyTimeout: 60s }
concurrency: { ip: 4 }
upstreams:
  backend: { targets: [${upstream.url}], maxConnections: 8 }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // Without the cap the 30 would take all 8 upstream connections and every other client would wait.
  const attackers: Attacker[] = []
  for (let i = 0; i < 30; i++) attackers.push(await attacker(t, gw.port, '203.0.113.9'))
  const trickle = setInterval(() => { for (const a of attackers) if (!a.socket.destroyed) a.socket.write('x') }, 100)
  t.teardown(() => clearInterval(trickle))
  await new Promise(resolve => setTimeout(resolve, 700))

  // Well-behaved clients (other addresses) are answered at once: a 3 s bound, far above what one takes.
  for (let i = 0; i < 10; i++) {
    const res = await fetch(`${gw.url}/echo/${i}`, { headers: { 'x-forwarded-for': `198.51.100.${i + 1}` }, signal: AbortSignal.timeout(3000) })
    await res.arrayBuffer()
    t.equal(res.status, 200, `GET ${i} answered during the attack`)
  }
  const refused = attackers.filter(a => /^HTTP\/1\.1 429 /.test(a.received()))
  t.equal(refused.length, 26, '26 of the 30 slow POSTs were refused at once')
  t.ok(refused.every(a => a.received().includes('"error":"GW_ERR_CONCURRENCY_LIMITED"') && /\r\nretry-after: 1\r\n/i.test(a.received())), 'with GW_ERR_CONCURRENCY_LIMITED and Retry-After: 1')
  t.equal(await metric(gw.adminUrl, 'gateway_concurrency_rejected_total', { route: 'all', dimension: 'ip' }), 26, 'counted by route and dimension')
  t.equal(await metric(gw.adminUrl, 'gateway_inflight', { route: 'all' }), 4, 'gateway_inflight{route}: the 4 admitted uploads')
  clearInterval(trickle)
})
