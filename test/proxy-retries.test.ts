// upstreams.X.retries: how many times a request whose connection failed before an answer is sent
// again (default 1; 0 never; at most 5), under the same rules as the one retry: a refused
// connection carried nothing, a reset one for an idempotent method with a body held whole, and no other.
// Targets are chosen by smooth weighted round robin, first target first, so the order of attempts
// below is the balancer's, not chance. Each failed attempt counts in gateway_upstream_errors_total.
import t from 'tap'
import { request } from 'undici'
import { readFileSync, writeFileSync } from 'node:fs'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { startGateway } from './helpers/gateway.js'
import { startBlackhole, startHttpServer } from './helpers/upstream.js'
import { gateway } from './helpers/cli.js'
import { metric } from './helpers/ratelimit.js'
import { continueTolerantConnector } from '../src/proxy/interim-responses.js'
import { tempDir, type Teardown } from './helpers/teardown.js'

// nothing listens on these: a connection to them is refused
const DEAD = ['http://127.0.0.1:9', 'http://127.0.0.1:10']

async function target (t: Teardown, answer: (req: IncomingMessage, res: ServerResponse, nth: number) => void): Promise<{ url: string, seen: number }> {
  const up = { url: '', seen: 0 }
  const server = await startHttpServer(t, (req, res) => { answer(req, res, ++up.seen) })
  up.url = server.url
  return up
}

const config = (targets: string[], retries: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${targets.join(', ')}], consecutiveFailures: 1000${retries} }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

async function send (url: string, method = 'GET'): Promise<[number, string]> {
  const res = await request(url + '/r', { method: method as 'GET' })
  const text = await res.body.text()
  return [res.statusCode, text.startsWith('{') ? (JSON.parse(text) as { error: string }).error : text]
}

async function errorsCounted (adminUrl: string, kind: string): Promise<number> {
  return await metric(adminUrl, 'gateway_upstream_errors_total', { kind })
}

t.test('refused connections: retries: 2 reaches the third target where the default 1 stops at the second', async t => {
  const good = await target(t, (_req, res) => res.end('good'))
  const one = await startGateway(t, config([...DEAD, good.url], ''))
  t.same(await send(one.url), [502, 'GW_ERR_UPSTREAM_UNAVAILABLE'], 'default: the first target, then one more, both refused')
  const two = await startGateway(t, config([...DEAD, good.url], ', retries: 2'))
  t.same(await send(two.url), [200, 'good'], 'retries: 2: the third attempt answers')
  t.equal(await errorsCounted(two.adminUrl, 'refused'), 2, 'each refused attempt counted')
  t.match(two.lines.find(l => l.msg === 'request'), { status: 200, retriedAfter: 'refused', target: good.url })
})

t.test('retries: 0 sends a request once: a refused connection is the client\'s 502, though another target answers', async t => {
  const good = await target(t, (_req, res) => res.end('good'))
  const gw = await startGateway(t, config([DEAD[0] as string, good.url], ', retries: 0'))
  t.same(await send(gw.url), [502, 'GW_ERR_UPSTREAM_UNAVAILABLE'])
  t.same(await send(gw.url), [200, 'good'], 'the refused target was ejected: the next request goes to the other')
  t.equal(good.seen, 1)
})

t.test('resets: a lone target is asked again up to retries times, never a POST', async t => {
  // closes the connection of its first two requests, answers from the third on
  const flaky = (): (req: IncomingMessage, res: ServerResponse, nth: number) => void => (req, res, nth) => {
    if (nth <= 2) req.socket.destroy()
    else res.end('third time')
  }
  const a = await target(t, flaky())
  const gwA = await startGateway(t, config([a.url], ', retries: 2'))
  t.same(await send(gwA.url), [200, 'third time'], 'retries: 2: sent three times')
  t.equal(a.seen, 3)
  t.equal(await errorsCounted(gwA.adminUrl, 'reset'), 2, 'both resets counted')
  const b = await target(t, flaky())
  const gwB = await startGateway(t, config([b.url], ''))
  t.same(await send(gwB.url), [502, 'GW_ERR_UPSTREAM_UNAVAILABLE'], 'the default: sent twice')
  t.equal(b.seen, 2)
  const c = await target(t, flaky())
  const gwC = await startGateway(t, config([c.url], ', retries: 5'))
  t.same(await send(gwC.url, 'POST'), [502, 'GW_ERR_UPSTREAM_UNAVAILABLE'], 'a POST the upstream may have begun is never sent again')
  t.equal(c.seen, 1)
})

t.test('connect timeouts are kept to the millisecond: three attempts of 100 ms at targets that never accept', async t => {
  const blackholes = await Promise.all([0, 1, 2].map(async () => await startBlackhole(t)))
  const gw = await startGateway(t, config(blackholes, ', retries: 2, timeouts: { connect: 100ms }'))
  const started = performance.now()
  t.same(await send(gw.url), [504, 'GW_ERR_UPSTREAM_TIMEOUT'])
  const waited = performance.now() - started
  t.equal(await errorsCounted(gw.adminUrl, 'connect_timeout'), 3, 'each attempt timed out connecting')
  t.ok(waited >= 3 * 100 - 5, `three whole waits (${Math.round(waited)} ms)`)
  // undici's own connect timeout ticks every 499 ms: three of its waits take 1.5 s at the very least (3 s here)
  t.ok(waited < 1450, `each wait was 100 ms, not undici's half-second tick or more (${Math.round(waited)} ms for three)`)
})

/** Sockets of this machine still connecting (SYN-SENT) to 127.0.0.1:port, from /proc/net/tcp. */
function connectingTo (port: number): number {
  const remote = `0100007F:${port.toString(16).toUpperCase().padStart(4, '0')}`
  return readFileSync('/proc/net/tcp', 'latin1').split('\n').filter(line => {
    const f = line.trim().split(/\s+/)
    return f[2] === remote && f[3] === '02'
  }).length
}

t.test('a connect timeout ends its socket at the deadline: none is left half-open while the next connect begins', async t => {
  const blackhole = new URL(await startBlackhole(t))
  const port = Number(blackhole.port)
  const before = connectingTo(port)
  const started = performance.now()
  const err = await new Promise<Error | null>(resolve => {
    continueTolerantConnector(100)({ hostname: '127.0.0.1', host: blackhole.host, protocol: 'http:', port: blackhole.port }, (...args) => { resolve(args[0]) })
  })
  t.equal((err as { code?: string } | null)?.code, 'UND_ERR_CONNECT_TIMEOUT')
  t.ok(performance.now() - started < 1000, 'at its deadline, not at undici\'s tick')
  t.equal(connectingTo(port), before, 'its socket no longer connecting as the failure is reported')
})

t.test('retries out of range is a located error; a reload changes it', async t => {
  const file = `${tempDir(t, 'proxy-retries')}/gateway.yaml`
  writeFileSync(file, config(['http://127.0.0.1:9'], ', retries: 6'))
  const run = await gateway(['validate', '-c', file])
  t.equal(run.code, 1)
  t.match(run.stderr, /gateway\.yaml:4:\d+ upstreams\.backend\.retries: .*5/)
  const flaky = await target(t, (req, res, nth) => { if (nth === 1) req.socket.destroy(); else res.end('again') })
  const gw = await startGateway(t, config([flaky.url], ', retries: 0'))
  writeFileSync(gw.configFile, config([flaky.url], ', retries: 1'))
  t.equal((await gw.reload()).ok, true)
  t.same(await send(gw.url), [200, 'again'], 'retries: 1 after the reload')
})
