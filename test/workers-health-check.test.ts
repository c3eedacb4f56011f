// README (Workers, Target choice and retries): with `workers: N` each worker probes its own
// targets and takes them out on its own verdict; the primary sends no probe, and its /readyz and
// /metrics show a target out (with why) as the workers report it.
import t from 'tap'
import { createServer } from 'node:http'
import { readFileSync, readdirSync, readlinkSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import { twoWorkers, until } from './helpers/workers.js'
import { metric } from './helpers/ratelimit.js'

t.test('two workers: each probes and takes a failing target out; the primary shows why', async t => {
  let probes = 0
  // the process each probe came from: the owner of its connection's other end, while it is open
  const prober: Array<number | null> = []
  let candidates: number[] = []
  const server = createServer((req, res) => {
    if (req.headers['user-agent'] === 'edge-gateway-health-check') {
      probes++
      prober.push(socketOwner(req.socket.remotePort ?? 0, candidates))
      res.statusCode = 503
    }
    res.end('b')
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { server.closeAllConnections(); server.close() })
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  // a timeout of 450 ms: the default, half an interval of 100 ms, failed probes as "timeout" on a
  // loaded machine (CI), where this test asserts the 503 the target answers
  const r = await twoWorkers(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
upstreams:
  b:
    targets: [${url}]
    healthCheck: { path: /healthz, interval: 500ms, timeout: 450ms, unhealthyAfter: 1 }
routes:
  - { name: all, pathPrefix: /, upstream: b }
`)
  const primary = r.gw.logs.find(l => l.msg === 'gateway primary started')?.pid as number
  candidates = [primary, ...r.workerPids()]
  const before = prober.length
  await until('both workers took it out', () => new Set(r.gw.logs.filter(l => l.msg === 'upstream target unhealthy').map(l => l.pid)).size === 2)
  t.equal(r.gw.logs.filter(l => l.msg === 'upstream target unhealthy').length, 2, 'logged once by each worker')
  // the workers report their health to the primary once a second: polled
  const readyB = async (): Promise<Array<Record<string, unknown>>> =>
    ((await (await fetch(`${r.adminUrl}/readyz`)).json()) as { upstreams: { b?: Array<Record<string, unknown>> } }).upstreams.b ?? []
  await until('the primary\'s /readyz shows the check', async () => (await readyB()).some(x => x.check !== undefined && (x.check as { healthy: boolean }).healthy === false))
  t.match(await readyB(), [{ url, healthy: false, check: { healthy: false, lastFailure: 'status 503' } }], 'the primary\'s /readyz says why the target is out')
  t.equal(await metric(r.adminUrl, 'gateway_upstream_target_healthy', { upstream: 'b', target: url }), 0)
  t.ok(await metric(r.adminUrl, 'gateway_health_checks_total', { upstream: 'b', target: url, result: 'fail' }) >= 2, 'the probes of both workers summed')
  t.ok(probes >= 2)
  // the probes sent once every process was known: from two processes at least (both workers)
  await until('probes from two processes', () => new Set(prober.slice(before)).size >= 2)
  const seen = prober.slice(before)
  t.ok(seen.length >= 2 && seen.every(pid => pid !== null), `the process of every probe found: ${seen.join(' ')}`)
  t.same([...new Set(seen)].sort(), [...r.workerPids()].sort(), 'every probe from a worker, from both of them')
  t.notOk(seen.includes(primary), 'none from the primary')
})

/** Which of `pids` holds the TCP socket whose local port is `port` (Linux: /proc/net/tcp and each process's fds). */
function socketOwner (port: number, pids: readonly number[]): number | null {
  const inodes = new Set<string>()
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    for (const line of readFileSync(table, 'utf8').split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/)
      if (fields.length > 9 && parseInt(fields[1]?.split(':')[1] ?? '', 16) === port) inodes.add(fields[9] as string)
    }
  }
  for (const pid of pids) {
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      // a descriptor closed since it was listed
      const link = ((): string => { try { return readlinkSync(`/proc/${pid}/fd/${fd}`) } catch { return '' } })()
      if (inodes.has(/^socket:\[(\d+)\]$/.exec(link)?.[1] ?? '')) return pid
    }
  }
  return null
}
