// Active health checks (README "Target choice and retries"): each target of an upstream with a
// `healthCheck` is probed every interval; unhealthyAfter failed probes in a row take it out of
// rotation, healthyAfter passed ones bring it back. Observed as a user would: which real upstream
// answers the requests, what the upstreams received, the log lines, /metrics and /readyz. Times
// are short, but every assertion is on what the servers decided, polled with a deadline.
import t from 'tap'
import http from 'node:http'
import { once } from 'node:events'
import { spawn } from 'node:child_process'
import { createServer as createHttpsServer } from 'node:https'
import { readFileSync } from 'node:fs'
import { writeFileSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import { startGateway, spawnGateway } from './helpers/gateway.js'
import { refusingUrl } from './helpers/upstream.js'
import { metric, sleep } from './helpers/ratelimit.js'
import type { Teardown } from './helpers/teardown.js'
import { localhostCertificate } from './helpers/tls.js'
import { countProbe, initialActiveHealth, probe, probeDelay, statusPasses } from '../src/proxy/health-check.js'
import { UpstreamPool, UpstreamTarget } from '../src/proxy/upstream-pool.js'
import { TEST_UPSTREAM } from './helpers/proxy-plan.js'

/** What a target answers one probe: 200, 503, nothing at all, or 200 with a body that never ends. */
type ProbeAnswer = 'pass' | 'fail' | 'hang' | 'endless'

interface CheckedUpstream {
  readonly name: string
  readonly url: string
  /** Every probe received (told apart by the gateway's User-Agent), in order. */
  readonly probes: Array<{ at: number, path: string, host: string, answer: ProbeAnswer, closedAt: number | null }>
  /** Every other request received: the client requests the gateway forwarded here. */
  readonly requests: Array<{ at: number, url: string }>
  /** The answers the next probes get, in order; `then` for every probe after them. */
  script: (answers: ProbeAnswer[], then: ProbeAnswer) => void
  /** Answer 503 to every client request too (a backend whose database is down). */
  everything503: boolean
  /** Reset the connection of every client request (what passive health ejects for). */
  resetRequests: boolean
  /** Closes the listener and its connections: connections are refused from then on. */
  close: () => Promise<void>
  /** Answers the client requests held so far (to a path ending in /hold). */
  releaseHeld: () => void
}

const PROBE_AGENT = 'edge-gateway-health-check'

async function startChecked (t: Teardown, name: string): Promise<CheckedUpstream> {
  let queued: ProbeAnswer[] = []
  let then: ProbeAnswer = 'pass'
  const probes: CheckedUpstream['probes'] = []
  const requests: CheckedUpstream['requests'] = []
  const held: http.ServerResponse[] = []
  const up: CheckedUpstream = {
    name,
    url: '',
    probes,
    requests,
    script (answers, after) {
      queued = [...answers]
      then = after
    },
    everything503: false,
    resetRequests: false,
    releaseHeld: () => { for (const res of held.splice(0)) res.end(JSON.stringify({ name })) },
    close: async () => {
      server.closeAllConnections()
      await new Promise<void>(resolve => server.close(() => resolve()))
    }
  }
  const server = http.createServer((req, res) => {
    if (req.headers['user-agent'] === PROBE_AGENT) {
      const answer = queued.shift() ?? then
      const entry = { at: Date.now(), path: req.url ?? '', host: req.headers.host ?? '', answer, closedAt: null as number | null }
      probes.push(entry)
      req.socket.once('close', () => { entry.closedAt = Date.now() })
      if (answer === 'hang') return
      if (answer === 'endless') {
        res.writeHead(200, { 'content-type': 'application/octet-stream' })
        const chunk = Buffer.alloc(16 * 1024, 'x')
        const more = (): void => { while (!res.destroyed && res.write(chunk)); }
        res.on('drain', more)
        more()
        return
      }
      res.writeHead(answer === 'pass' ? 200 : 503, { 'content-type': 'text/plain' }).end(answer === 'pass' ? 'ok' : 'database down')
      return
    }
    requests.push({ at: Date.now(), url: req.url ?? '' })
    // held until the test ends: keeps a runtime draining across a reload
    if (req.url?.endsWith('/hold') === true) {
      held.push(res)
      return
    }
    if (up.resetRequests) {
      req.socket.destroy()
      return
    }
    res.writeHead(up.everything503 ? 503 : 200, { 'content-type': 'application/json' }).end(JSON.stringify({ name }))
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(async () => {
    server.closeAllConnections()
    await new Promise<void>(resolve => server.close(() => resolve()))
  })
  return Object.assign(up, { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` })
}

/** Polls `check` every 20 ms until it holds; fails the test after `ms` (generous: a loaded 2-core machine). */
async function until (what: string, check: () => boolean | Promise<boolean>, ms = 15_000): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`)
    await sleep(20)
  }
}

/** Which upstream answered a request through the gateway, or its status when it was not a 200. */
async function whoAnswers (url: string): Promise<string> {
  const res = await fetch(url)
  const text = await res.text()
  return res.status === 200 ? (JSON.parse(text) as { name: string }).name : String(res.status)
}

function gatewayYaml (upstreams: string, routes = ''): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
${upstreams}
routes:
${routes}  - { name: all, pathPrefix: /, upstream: backend }
`
}

type Lines = ReadonlyArray<Record<string, unknown>>
const transitions = (lines: Lines, target: string, msg: string): Lines => lines.filter(l => l.msg === msg && l.target === target)

t.test('the rules of a run, one probe at a time (pure)', async t => {
  const config = { unhealthyAfter: 2, healthyAfter: 3 }
  const state = initialActiveHealth()
  t.same([countProbe(state, 'status 503', config), countProbe(state, null, config)], [null, null], 'one failure, then a pass: still healthy')
  t.same([countProbe(state, 'timeout', config), countProbe(state, 'timeout', config)], [null, 'down'], 'unhealthyAfter failures in a row: down')
  t.equal(state.lastFailure, 'timeout')
  t.same([countProbe(state, null, config), countProbe(state, null, config), countProbe(state, 'status 500', config)], [null, null, null], 'two passes, then a failure: still down')
  t.same([countProbe(state, null, config), countProbe(state, null, config), countProbe(state, null, config)], [null, null, 'up'], 'healthyAfter passes in a row: up')
  t.same([countProbe(state, null, config)], [null], 'a pass while healthy changes nothing')

  t.ok(statusPasses(204, [[200, 399]]))
  t.ok(statusPasses(399, [[200, 399]]))
  t.notOk(statusPasses(400, [[200, 399]]))
  t.notOk(statusPasses(199, [[200, 399]]))
  t.ok(statusPasses(404, [[200, 200], [404, 404]]))

  t.equal(probeDelay(1000, true, () => 0), 0, 'the first probe of a target may go at once')
  t.equal(probeDelay(1000, true, () => 0.999), 100, 'and waits at most a tenth of the interval')
  t.same([probeDelay(1000, false, () => 0), probeDelay(1000, false, () => 1)], [900, 1100], 'later ones: the interval give or take 10%')
  // the schema takes an interval up to 596h; 10% over it would overflow node's timer, which then fires after 1 ms
  const longest = 596 * 3_600_000
  t.equal(probeDelay(longest, false, () => 0.999), 2_147_483_647, 'never past the longest timer')
  t.equal(probeDelay(longest, false, () => 0), Math.round(longest * 0.9), 'below it, the interval less 10%')
})

t.test('a probe\'s default Host is the target\'s host:port without a port its scheme implies (http://b:80 is probed with Host: b)', async t => {
  const hosts: string[] = []
  const server = http.createServer((req, res) => { hosts.push(req.headers.host ?? ''); res.end() })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => server.close())
  const { port } = server.address() as AddressInfo
  const check = { path: '/healthz', intervalMs: 1000, timeoutMs: 2000, unhealthyAfter: 1, healthyAfter: 1, host: null, expectStatus: [[200, 399]] as Array<[number, number]> }
  const signal = new AbortController().signal
  for (const url of ['http://localhost:80/base', 'http://localhost:8080', 'https://api.test:443', 'https://api.test:8443', 'http://[::1]:80']) {
    const target = new UpstreamTarget({ url, weight: 1 }, { ...TEST_UPSTREAM, targets: [] })
    t.teardown(() => target.dispatcher.destroy())
    // the probe is sent as the target's, but to the test's listener over plain HTTP: only its Host is looked at
    t.equal(await probe({ ...target, secure: false, hostname: '127.0.0.1', port }, check, signal), null)
  }
  t.same(hosts, ['localhost', 'localhost:8080', 'api.test', 'api.test:8443', '[::1]'])
})

t.test('a failing check takes a target out after unhealthyAfter probes and back after healthyAfter; probes are not client requests', async t => {
  const a = await startChecked(t, 'a')
  const b = await startChecked(t, 'b')
  // b fails one probe less than unhealthyAfter, then passes: it must never leave
  b.script(['fail'], 'pass')
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}, ${b.url}]
    healthCheck: { path: /healthz?deep=1, interval: 300ms, timeout: 250ms, unhealthyAfter: 2, healthyAfter: 3 }`))
  await until('b answered 4 probes', () => b.probes.length >= 4)
  t.same(transitions(gw.lines, b.url, 'upstream target unhealthy'), [], 'one failed probe (unhealthyAfter - 1) leaves it in rotation')
  t.equal(b.probes[0]?.path, '/healthz?deep=1', 'the probe GETs the configured path, query included')
  t.equal(b.probes[0]?.host, new URL(b.url).host, 'with the target\'s authority as Host')

  b.script([], 'fail')
  await until('b logged unhealthy', () => transitions(gw.lines, b.url, 'upstream target unhealthy').length === 1)
  const down = transitions(gw.lines, b.url, 'upstream target unhealthy')[0] as Record<string, unknown>
  t.match(down, { level: 40, upstream: 'backend', target: b.url, reason: 'status 503' }, 'logged once at warn, with the reason')
  const answered: string[] = []
  for (let i = 0; i < 10; i++) answered.push(await whoAnswers(`${gw.url}/r${i}`))
  t.same(answered, Array(10).fill('a'), 'every request goes to the target still in rotation')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_target_healthy', { upstream: 'backend', target: b.url }), 0, 'the gauge says b takes no traffic')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_target_healthy', { upstream: 'backend', target: a.url }), 1)
  const ready = await (await fetch(`${gw.adminUrl}/readyz`)).json() as { upstreams: { backend: Array<Record<string, unknown>> } }
  t.match(ready.upstreams.backend.find(x => x.url === b.url), { healthy: false, ejectedForMs: 0, check: { healthy: false, lastFailure: 'status 503' } }, '/readyz says why b is out: its checks, not passive health')
  t.ok(await metric(gw.adminUrl, 'gateway_health_checks_total', { upstream: 'backend', target: b.url, result: 'fail' }) >= 2, 'failed probes are counted')
  t.ok(await metric(gw.adminUrl, 'gateway_health_checks_total', { upstream: 'backend', target: a.url, result: 'pass' }) >= 1, 'passed ones too')

  // back only after healthyAfter passes in a row: two passes and a failure are not enough
  const passesFrom = b.probes.length
  b.script(['pass', 'pass', 'fail'], 'pass')
  await until('b logged healthy again', () => transitions(gw.lines, b.url, 'upstream target healthy again').length === 1)
  const up = transitions(gw.lines, b.url, 'upstream target healthy again')[0] as Record<string, unknown>
  t.equal(up.level, 30, 'logged at info')
  await until('b answered the six probes of the script', () => b.probes.length >= passesFrom + 6)
  const sequence = b.probes.slice(passesFrom).map(p => p.answer)
  t.same(sequence.slice(0, 6), ['pass', 'pass', 'fail', 'pass', 'pass', 'pass'], 'the upstream answered the script')
  const thirdPassAfterFailure = b.probes[passesFrom + 5] as { at: number }
  t.ok(Date.parse(up.time as string) >= thirdPassAfterFailure.at - 5, 'back no earlier than the third pass in a row')
  await until('a request reaches b again', async () => (await whoAnswers(`${gw.url}/again`)) === 'b')
  t.equal(transitions(gw.lines, b.url, 'upstream target unhealthy').length, 1, 'the way down was logged once')

  const accessLogged = gw.lines.filter(l => l.msg === 'request' && String(l.path ?? l.url ?? '').startsWith('/healthz'))
  t.same(accessLogged, [], 'no probe is access-logged as a client request')
  t.notOk(a.requests.some(r => r.url.startsWith('/healthz')) || b.requests.some(r => r.url.startsWith('/healthz')), 'every /healthz the upstreams saw came from the health checks')
})

t.test('the first probe of a target goes within a tenth of interval of start-up, not a whole interval later', async t => {
  const a = await startChecked(t, 'a')
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}]
    healthCheck: { path: /healthz, interval: 30s, timeout: 2s }`))
  const live = Date.now()
  // within 3 s at most (a tenth of 30 s); a first probe held for an interval would come after 27 s
  await until('the first probe', () => a.probes.length >= 1, 20_000)
  const after = (a.probes[0] as { at: number }).at - live
  t.ok(after < 15_000, `the first probe came ${after} ms after start-up`)
  await until('the first probe counted as a pass', async () => await metric(gw.adminUrl, 'gateway_health_checks_total', { upstream: 'backend', target: a.url, result: 'pass' }) === 1)
  t.equal(a.probes.length, 1, 'one probe in all: the next waits an interval')
})

t.test('a target that answers 503 to everything is taken out (passive health never would: it answers HTTP)', async t => {
  const a = await startChecked(t, 'a')
  const b = await startChecked(t, 'b')
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}, ${b.url}]
    healthCheck: { path: /healthz, interval: 300ms, timeout: 250ms, unhealthyAfter: 2 }`))
  await until('b probed once', () => b.probes.length >= 1)
  b.everything503 = true
  b.script([], 'fail')
  await until('b out', () => transitions(gw.lines, b.url, 'upstream target unhealthy').length === 1)
  const statuses: string[] = []
  for (let i = 0; i < 10; i++) statuses.push(await whoAnswers(`${gw.url}/r${i}`))
  t.same(statuses, Array(10).fill('a'), 'no client sees the 503s any more')
})

t.test('a probe with no answer within timeout fails as "timeout", and its connection is closed', async t => {
  const a = await startChecked(t, 'a')
  a.script([], 'hang')
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}]
    healthCheck: { path: /healthz, interval: 300ms, timeout: 100ms, unhealthyAfter: 1 }`))
  await until('a out', () => transitions(gw.lines, a.url, 'upstream target unhealthy').length === 1)
  t.match(transitions(gw.lines, a.url, 'upstream target unhealthy')[0], { reason: 'timeout' })
  await until('the hanging probe\'s connection closed', () => a.probes[0]?.closedAt !== null)
  const first = a.probes[0] as { at: number, closedAt: number }
  t.ok(first.closedAt - first.at < 2000, `closed about timeout after it was sent (${first.closedAt - first.at} ms)`)
})

t.test('a probe reads at most 64 KiB of the body: a 200 with an endless body passes, and its connection is closed; host sets the Host', async t => {
  const a = await startChecked(t, 'a')
  a.script([], 'endless')
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}]
    healthCheck: { path: /healthz, interval: 3s, timeout: 2s, unhealthyAfter: 1, host: status.internal }`))
  // a probe that waited for the end of the body would time out after 2 s
  const decided = async (): Promise<boolean> => transitions(gw.lines, a.url, 'upstream target unhealthy').length > 0 ||
    await metric(gw.adminUrl, 'gateway_health_checks_total', { upstream: 'backend', target: a.url, result: 'pass' }) >= 1
  await until('the first probe decided', decided)
  t.same(transitions(gw.lines, a.url, 'upstream target unhealthy'), [], 'the status decides: it passes')
  await until('the first probe\'s connection closed', () => a.probes[0]?.closedAt !== null)
  t.equal(a.probes[0]?.host, 'status.internal')
})

t.test('every target out: the answer of every target ejected (503 GW_ERR_NO_HEALTHY_UPSTREAM), until a check passes again', async t => {
  const a = await startChecked(t, 'a')
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}]
    healthCheck: { path: /healthz, interval: 300ms, timeout: 250ms, unhealthyAfter: 2, healthyAfter: 1 }`))
  t.equal(await whoAnswers(`${gw.url}/first`), 'a', 'a target starts healthy: the gateway serves before any probe')
  a.script([], 'fail')
  await until('a out', () => transitions(gw.lines, a.url, 'upstream target unhealthy').length === 1)
  const res = await fetch(`${gw.url}/r`)
  t.equal(res.status, 503)
  t.match(await res.json(), { error: 'GW_ERR_NO_HEALTHY_UPSTREAM' })
  const before = a.requests.length
  a.script([], 'pass')
  await until('a back', async () => (await whoAnswers(`${gw.url}/back`)) === 'a')
  t.equal(a.requests.length, before + 1, 'while out no request reached it')
})

t.test('a target whose listener closed fails its checks as "connect refused"', async t => {
  const a = await startChecked(t, 'a')
  const gone = await refusingUrl()
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}, ${gone}]
    healthCheck: { path: /healthz, interval: 300ms, timeout: 250ms, unhealthyAfter: 2 }`))
  await until('the refusing target out', () => transitions(gw.lines, gone, 'upstream target unhealthy').length === 1)
  t.match(transitions(gw.lines, gone, 'upstream target unhealthy')[0], { reason: 'connect refused' })
  t.same([await whoAnswers(`${gw.url}/1`), await whoAnswers(`${gw.url}/2`)], ['a', 'a'])
})

/**
 * Targets a and b, b ejected by passive health (for `ejectFor`: it resets client requests while
 * its probes pass), then held out by its checks too (its probes fail).
 */
async function ejectedThenChecksFail (t: Teardown, ejectFor: string): Promise<{ b: CheckedUpstream, gw: Awaited<ReturnType<typeof startGateway>> }> {
  const a = await startChecked(t, 'a')
  const b = await startChecked(t, 'b')
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}, ${b.url}]
    ejectFor: ${ejectFor}
    consecutiveFailures: 1
    healthCheck: { path: /healthz, interval: 300ms, timeout: 250ms, unhealthyAfter: 2, healthyAfter: 1 }`))
  b.resetRequests = true
  await until('b passively ejected', async () => {
    await whoAnswers(`${gw.url}/p`)
    return gw.lines.some(l => l.msg === 'upstream target ejected' && l.target === b.url)
  })
  b.script([], 'fail')
  await until('b out by its checks', () => transitions(gw.lines, b.url, 'upstream target unhealthy').length === 1)
  return { b, gw }
}

t.test('active and passive health each hold a target out: back from its checks, a target still passively ejected takes no traffic', async t => {
  // passive first: b resets client requests (its probes still pass) and is ejected for 1m; then
  // its checks fail (and pass again below)
  const { b, gw } = await ejectedThenChecksFail(t, '1m')
  b.resetRequests = false
  b.script([], 'pass')
  await until('b healthy again by its checks', () => transitions(gw.lines, b.url, 'upstream target healthy again').length === 1)
  const before = b.requests.length
  const answered: string[] = []
  for (let i = 0; i < 6; i++) answered.push(await whoAnswers(`${gw.url}/r${i}`))
  t.same(answered, Array(6).fill('a'), 'the passive ejection (1m) still keeps b out')
  t.equal(b.requests.length, before)
  const ready = await (await fetch(`${gw.adminUrl}/readyz`)).json() as { upstreams: { backend: Array<Record<string, unknown>> } }
  const view = ready.upstreams.backend.find(x => x.url === b.url) as { healthy: boolean, ejectedForMs: number, check: { healthy: boolean } }
  t.match(view, { healthy: false, check: { healthy: true } }, '/readyz: checks pass, the target is still out')
  t.ok(view.ejectedForMs > 30_000, `because of its passive ejection (${view.ejectedForMs} ms left)`)
})

t.test('a passive ejection that ends while the checks hold a target out does not bring it back', async t => {
  const { b, gw } = await ejectedThenChecksFail(t, '300ms')
  b.resetRequests = false
  await sleep(600)
  const before = b.requests.length
  const answered: string[] = []
  for (let i = 0; i < 6; i++) answered.push(await whoAnswers(`${gw.url}/r${i}`))
  t.same(answered, Array(6).fill('a'), 'the ejection (300ms) is over; the failing checks still keep b out')
  t.equal(b.requests.length, before)
})

t.test('the pool: a connect failure of a request dispatched before its checks took the target out does not shorten their hold', async t => {
  const b = await startChecked(t, 'b')
  b.script([], 'fail')
  const pool = new UpstreamPool({
    name: 'backend',
    targets: [{ url: b.url, weight: 1 }],
    connectTimeoutMs: 1000,
    responseTimeoutMs: 1000,
    ejectMs: 100,
    maxConnectionsPerTarget: 10,
    keepAliveTimeoutMs: 1000,
    healthCheck: { path: '/healthz', intervalMs: 100, timeoutMs: 50, unhealthyAfter: 1, healthyAfter: 1, host: null, expectStatus: [[200, 399]] }
  })
  t.teardown(() => pool.close())
  pool.startHealthChecks(null)
  await until('b out by its checks', () => pool.pick() === null)
  // what forward does when that request's connection is refused
  pool.eject(pool.targets[0] as UpstreamPool['targets'][number])
  await sleep(300)
  t.equal(pool.pick(), null, 'still out once the 100 ms ejection is over: its checks still fail')
  t.match(pool.health()[0], { healthy: false, ejectedForMs: 0, check: { healthy: false, lastFailure: 'status 503' } })
  b.script([], 'pass')
  await until('b back', () => pool.pick() !== null)
  pool.stopHealthChecks()
  await sleep(50) // a probe written just before the stop may still arrive
  const probes = b.probes.length
  await sleep(400)
  t.equal(b.probes.length, probes, 'stopHealthChecks: no probe after it')
})

t.test('a target taken out and brought back by its checks starts its run of consecutiveFailures again', async t => {
  const a = await startChecked(t, 'a')
  const b = await startChecked(t, 'b')
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}, ${b.url}]
    retries: 0
    ejectFor: 1m
    consecutiveFailures: 3
    healthCheck: { path: /healthz, interval: 300ms, timeout: 250ms, unhealthyAfter: 1, healthyAfter: 1 }`))
  const readyB = async (): Promise<Record<string, unknown>> => {
    const ready = await (await fetch(`${gw.adminUrl}/readyz`)).json() as { upstreams: { backend: Array<Record<string, unknown>> } }
    return ready.upstreams.backend.find(x => x.url === b.url) as Record<string, unknown>
  }
  /** Requests until b has reset `n` more of them (a answers the others). */
  const resetsOfB = async (n: number): Promise<void> => {
    const goal = b.requests.length + n
    for (let i = 0; b.requests.length < goal; i++) {
      if (i > 50) throw new Error('b got no request')
      await whoAnswers(`${gw.url}/r${i}`)
    }
  }
  b.resetRequests = true
  await resetsOfB(2)
  t.match(await readyB(), { healthy: true, consecutiveFailures: 2 }, 'two resets: one short of an ejection')
  b.script([], 'fail')
  await until('b out by its checks', () => transitions(gw.lines, b.url, 'upstream target unhealthy').length === 1)
  b.script([], 'pass')
  await until('b back by its checks', () => transitions(gw.lines, b.url, 'upstream target healthy again').length === 1)
  // back, one more reset must not eject it: its run of three starts again
  await resetsOfB(1)
  t.match(await readyB(), { healthy: true, ejectedForMs: 0, consecutiveFailures: 1 }, 'one reset since it came back counts one')
  t.notOk(gw.lines.some(l => l.msg === 'upstream target ejected' && l.target === b.url), 'not ejected')
  await resetsOfB(2)
  await until('b ejected at the third reset since it came back', () => gw.lines.some(l => l.msg === 'upstream target ejected' && l.target === b.url))
})

t.test('a probe is not a request of the pool: it gets through while maxConnections are all taken', async t => {
  let release: () => void = () => {}
  const held = new Promise<void>(resolve => { release = resolve })
  const probes: number[] = []
  const server = http.createServer((req, res) => {
    if (req.headers['user-agent'] === PROBE_AGENT) {
      probes.push(Date.now())
      res.end('ok')
      return
    }
    void held.then(() => res.end('{"name":"slow"}'))
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(async () => { release(); server.closeAllConnections(); await new Promise<void>(resolve => server.close(() => resolve())) })
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${url}]
    maxConnections: 1
    healthCheck: { path: /healthz, interval: 300ms, timeout: 250ms, unhealthyAfter: 2 }`))
  const slow = fetch(`${gw.url}/slow`)
  await until('the one connection is taken', () => (gw.runtime?.pools.get('backend')?.targets[0]?.inFlight ?? 0) === 1)
  const from = probes.length
  await until('3 probes arrive while the connection is taken', () => probes.length >= from + 3)
  release()
  t.equal((await slow).status, 200)
  t.same(gw.lines.filter(l => l.msg === 'upstream target unhealthy'), [], 'and they pass')
})

t.test('reload: a persisting target keeps what its checks decided, a changed healthCheck takes effect, a removed upstream is no longer probed', async t => {
  const a = await startChecked(t, 'a')
  const b = await startChecked(t, 'b')
  const other = await startChecked(t, 'other')
  b.script([], 'fail')
  const check = (path: string, unhealthyAfter: number): string => `{ path: ${path}, interval: 300ms, timeout: 250ms, unhealthyAfter: ${unhealthyAfter}, healthyAfter: 1 }`
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}, ${b.url}]
    healthCheck: ${check('/healthz', 1)}
  other:
    targets: [${other.url}]
    healthCheck: ${check('/healthz', 1)}`, '  - { name: other, pathPrefix: /other/, upstream: other }\n'))
  await until('b out', () => transitions(gw.lines, b.url, 'upstream target unhealthy').length === 1)
  await until('other probed', () => other.probes.length >= 1)
  // a request in flight on the old runtime keeps it (and its pools) draining after the reload
  const heldRequest = fetch(`${gw.url}/other/hold`)
  await until('the held request reached other', () => other.requests.some(r => r.url === '/other/hold'))

  // a new path and unhealthyAfter 5: a b that started afresh would take traffic for 4 intervals
  writeFileSync(gw.runtime!.file, gatewayYaml(`  backend:
    targets: [${a.url}, ${b.url}]
    healthCheck: ${check('/ready', 5)}`))
  t.match(await gw.reload(), { ok: true, generation: 2 })
  const otherProbes = other.probes.length
  const bRequests = b.requests.length
  const answered: string[] = []
  const until600 = Date.now() + 600
  while (Date.now() < until600) answered.push(await whoAnswers(`${gw.url}/r`))
  t.ok(answered.length > 0 && answered.every(name => name === 'a'), `b stays out across the reload (${answered.length} requests, all to a)`)
  t.equal(b.requests.length, bRequests)
  await until('b probed on the new path', () => b.probes.some(p => p.path === '/ready'))
  const lastOld = b.probes.filter(p => p.path === '/healthz').length
  await sleep(600)
  t.equal(b.probes.filter(p => p.path === '/healthz').length, lastOld, 'the old path is probed no more')
  t.equal(other.probes.length, otherProbes, 'the removed upstream\'s target receives no probe after the reload, though its pool still drains a request')
  t.equal(transitions(gw.lines, b.url, 'upstream target unhealthy').length, 1, 'no second "unhealthy": the state carried over')
  b.script([], 'pass')
  await until('b back after the reload', () => transitions(gw.lines, b.url, 'upstream target healthy again').length === 1)
  other.releaseHeld()
  t.equal((await heldRequest).status, 200, 'the request held across the reload is answered by the upstream the reload removed')
})

t.test('without healthCheck no probe ever reaches an upstream', async t => {
  const a = await startChecked(t, 'a')
  const gw = await startGateway(t, gatewayYaml(`  backend: { targets: [${a.url}] }`))
  t.equal(await whoAnswers(`${gw.url}/x`), 'a')
  await sleep(500)
  t.same(a.probes, [])
  t.same(a.requests.map(r => r.url), ['/x'])
  t.notMatch(await (await fetch(`${gw.adminUrl}/metrics`)).text(), /^gateway_health_checks_total\{/m, 'nothing counted')
})

t.test('shutdown does not wait for a probe in flight: it is aborted', async t => {
  const a = await startChecked(t, 'a')
  a.script([], 'hang')
  const gw = await startGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}]
    healthCheck: { path: /healthz, interval: 20s, timeout: 15s }`))
  await until('a probe is in flight', () => a.probes.length === 1)
  const started = Date.now()
  await gw.close()
  t.ok(Date.now() - started < 5000, `closed in ${Date.now() - started} ms, not after the probe's 15 s timeout`)
  await until('the probe\'s connection is closed', () => a.probes[0]?.closedAt !== null)
  await sleep(300)
  t.equal(a.probes.length, 1, 'and no probe after it')
})

t.test('an https target is probed as forwarding connects to it: its own name as TLS server name, its certificate checked', async t => {
  const { cert, key } = localhostCertificate(t, 'gw-https-check')
  const probes: Array<{ servername: string, host: string }> = []
  const upstream = createHttpsServer({ cert: readFileSync(cert), key: readFileSync(key) }, (req, res) => {
    probes.push({ servername: String((req.socket as unknown as { servername?: string }).servername), host: req.headers.host ?? '' })
    res.end('ok')
  })
  upstream.listen(0, '127.0.0.1')
  await once(upstream, 'listening')
  t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
  const port = (upstream.address() as AddressInfo).port
  // by name: trusted through NODE_EXTRA_CA_CERTS; by address: the certificate (localhost only) does not match
  const gw = await spawnGateway(t, gatewayYaml(`  backend:
    targets: [https://localhost:${port}]
    healthCheck: { path: /healthz, interval: 500ms, timeout: 450ms, unhealthyAfter: 2, host: public.example.com }
  byAddress:
    targets: [https://127.0.0.1:${port}]
    healthCheck: { path: /healthz, interval: 500ms, timeout: 450ms, unhealthyAfter: 1 }`), [], { env: { NODE_EXTRA_CA_CERTS: cert } })
  const refused = await gw.waitForLog(l => l.msg === 'upstream target unhealthy')
  t.match(refused, { upstream: 'byAddress', target: `https://127.0.0.1:${port}`, reason: /^connect failed: ERR_TLS_CERT_ALTNAME_INVALID/ }, 'a certificate that does not name the target fails the check')
  await until('3 probes by name', () => probes.length >= 3)
  t.same([...new Set(probes.map(p => p.servername))], ['localhost'], 'the server name sent is the target\'s, not the probe\'s Host')
  t.same([...new Set(probes.map(p => p.host))], ['public.example.com'])
  t.notOk(gw.logs.some(l => l.msg === 'upstream target unhealthy' && l.upstream === 'backend'), 'the target named in its certificate passes')
})

t.test('probes never hold the process open: a process that only probes exits by itself', async t => {
  const a = await startChecked(t, 'a')
  const script = `
    import { UpstreamPool } from './dist/proxy/upstream-pool.js'
    const pool = new UpstreamPool({ name: 'b', targets: [{ url: '${a.url}', weight: 1 }], connectTimeoutMs: 1000, responseTimeoutMs: 1000, ejectMs: 1000, maxConnectionsPerTarget: 1, keepAliveTimeoutMs: 1000,
      healthCheck: { path: '/healthz', intervalMs: 200, timeoutMs: 100, unhealthyAfter: 1, healthyAfter: 1, host: null, expectStatus: [[200, 399]] } })
    pool.startHealthChecks(null)`
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: 'inherit' })
  t.teardown(() => { if (child.exitCode === null) child.kill('SIGKILL') })
  const exited = once(child, 'exit')
  const deadline = sleep(5000).then(() => 'still running')
  t.same(await Promise.race([exited, deadline]), [0, null], 'exited 0 with its checks running')
})

t.test('bin/gateway exits on SIGTERM with a probe in flight', async t => {
  const a = await startChecked(t, 'a')
  a.script([], 'hang')
  const gw = await spawnGateway(t, gatewayYaml(`  backend:
    targets: [${a.url}]
    healthCheck: { path: /healthz, interval: 20s, timeout: 15s }`))
  await until('a probe is in flight', () => a.probes.length === 1)
  const started = Date.now()
  gw.child.kill('SIGTERM')
  t.equal(await gw.exited, 0)
  t.ok(Date.now() - started < 8000, `exited in ${Date.now() - started} ms`)
})
