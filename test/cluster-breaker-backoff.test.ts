// A dead Redis Cluster master that is not failed over: its breaker probes it back with a growing
// pause (0.25 s doubling to 1 s), each probe costing one request up to redis.timeout. The slot
// map is refreshed every 200 ms while the breaker is open, and ioredis reports every refresh,
// changed or not; the gateway used to probe on each, five request-paid probes a second for as
// long as the master stayed dead. A real 3+3 Cluster, a gateway in this process.
import t from 'tap'
import { startReplicatedCluster } from './helpers/redis.js'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

t.test('a dead master is probed with the breaker\'s back-off, not on every slot-map refresh', async t => {
  // a node timeout far beyond the test: the dead master keeps its slots, no replica takes over
  const servers = await startReplicatedCluster(t, 60_000)
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
redis: { cluster: [${servers.urls.join(', ')}], timeout: 100ms, onError: local }
identity: { header: x-user-id }
limits:
  user: { algorithm: fixed-window, limit: 100000, window: 1h }
upstreams: { b: { targets: [${up.url}] } }
routes:
  - { name: api, pathPrefix: /, upstream: b }
`)
  const send = async (user: string): Promise<number> => (await fetch(`${gw.url}/x`, { headers: { 'x-user-id': user } })).status
  // 30 users: about a third of their keys live on each master
  const warm: number[] = []
  for (let u = 0; u < 30; u++) warm.push(await send(`u${u}`))
  t.same(warm, new Array(30).fill(200))
  const [victim] = await servers.masters()
  await servers.kill(victim as number)
  const from = gw.lines.length
  // 3.5 s of traffic from every user, about 100 requests a second
  const until = Date.now() + 3500
  let sent = 0
  let admitted = 0
  for (let i = 0; Date.now() < until; i++) {
    sent++
    if (await send(`u${i % 30}`) === 200) admitted++
    await sleep(10)
  }
  t.equal(admitted, sent, `every request admitted, on Redis or by the fallback (${admitted} of ${sent})`)
  const probes = gw.lines.slice(from).filter((l) => l.breaker === 'half-open' && String(l.reason).startsWith(`127.0.0.1:${victim}:`))
  const opened = gw.lines.slice(from).filter((l) => l.breaker === 'open' && String(l.reason).startsWith(`127.0.0.1:${victim}:`))
  t.ok(opened.length >= 1, 'the dead master\'s breaker opened')
  // pauses of 0.25, 0.5, 1, 1 s after the first opening: at most 5 probes in 3.5 s, plus one of
  // margin; a probe on each refresh (every 200 ms) makes about 15
  t.ok(probes.length <= 6, `request-paid probes of the dead master in 3.5 s: ${probes.length} (at most 6)`)
  t.ok(probes.length >= 2, `the breaker still probes the dead master (${probes.length} probes)`)
})
