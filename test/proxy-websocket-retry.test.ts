// A WebSocket upgrade whose connection to a target is never made (refused, a name that does not
// resolve) goes to another target, as an HTTP request does: retries, retryOn: connect-failure and
// retryBackoff apply to it. Nothing of the handshake was sent, so it is always safe to repeat.
import t from 'tap'
import { once } from 'node:events'
import { randomBytes } from 'node:crypto'
import { connect } from 'node:net'
import type { IncomingMessage } from 'node:http'
import { performance } from 'node:perf_hooks'
import { WebSocket } from 'ws'
import { startGateway } from './helpers/gateway.js'
import { refusingUrl, startBlackhole, startUpstream } from './helpers/upstream.js'
import { metric } from './helpers/ratelimit.js'
import { until } from './helpers/workers.js'
import type { Teardown } from './helpers/teardown.js'

/** A gateway whose websocket route goes to `targets` (the first weighted to be picked first), with `settings` on its upstream. */
type Gateway = Awaited<ReturnType<typeof startGateway>>

async function gatewayTo (t: Teardown, targets: string, settings = ''): Promise<Gateway & { ws: string }> {
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${targets}], consecutiveFailures: 1000${settings === '' ? '' : `, ${settings}`} }
routes:
  - { name: live, pathPrefix: /, websocket: true, upstream: backend }
`)
  return Object.assign(gw, { ws: gw.url.replace(/^http/, 'ws') })
}

/** Opens a WebSocket and echoes one message through it; the handshake's status otherwise. */
async function echo (url: string): Promise<{ status: number, echoed: string | null }> {
  const ws = new WebSocket(url)
  const refused = once(ws, 'unexpected-response').then(([, res]) => {
    (res as IncomingMessage).resume()
    return (res as IncomingMessage).statusCode ?? 0
  })
  ws.on('error', () => {})
  const opened = once(ws, 'open').then(() => 101)
  const status = await Promise.race([refused, opened])
  if (status !== 101) return { status, echoed: null }
  ws.send('ping')
  const [data] = await once(ws, 'message') as [Buffer]
  ws.close()
  return { status, echoed: data.toString() }
}

const lines = (gw: Gateway): Array<Record<string, unknown>> => gw.lines.filter(l => l.msg === 'request')

t.test('a refused connection: the upgrade goes to another target and opens', async t => {
  const up = await startUpstream(t)
  const refusing = await refusingUrl()
  // the refusing target is ejected for 1 ms: it is picked first for every upgrade
  const gw = await gatewayTo(t, `{ url: ${refusing}, weight: 1000 }, ${up.url}`, 'ejectFor: 1ms')
  for (let i = 0; i < 3; i++) t.same(await echo(`${gw.ws}/chat${i}`), { status: 101, echoed: 'ping' }, 'opened through the second target')
  t.equal(up.upgrades.length, 3, 'each handshake reached the target that answers, once')
  t.match(lines(gw), Array(3).fill({ status: 101, retriedAfter: 'refused', target: up.url }), 'logged as a retry after the refusal, with the target that answered')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_total', { upstream: 'backend', reason: 'refused' }), 3, 'each retry counted')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'backend', kind: 'refused' }), 3, 'each refusal still the upstream\'s failure')
})

t.test('a name that does not resolve: retried on another target', async t => {
  const up = await startUpstream(t)
  const gw = await gatewayTo(t, `{ url: "http://gateway-test-no-such-host.invalid:80", weight: 1000 }, ${up.url}`, 'ejectFor: 1ms')
  t.same(await echo(`${gw.ws}/chat`), { status: 101, echoed: 'ping' })
  t.match(lines(gw), [{ status: 101, retriedAfter: 'dns', target: up.url }])
})

t.test('a connection not made within timeouts.connect: retried on another target', async t => {
  const up = await startUpstream(t)
  const gw = await gatewayTo(t, `{ url: ${await startBlackhole(t)}, weight: 1000 }, ${up.url}`, 'ejectFor: 1ms, timeouts: { connect: 300ms }')
  t.same(await echo(`${gw.ws}/chat`), { status: 101, echoed: 'ping' })
  t.match(lines(gw), [{ status: 101, retriedAfter: 'connect_timeout', target: up.url }])
})

t.test('retries: 0, or a retryOn without connect-failure: the client gets the 502', async t => {
  const up = await startUpstream(t)
  const refusing = await refusingUrl()
  for (const settings of ['ejectFor: 1ms, retries: 0', 'ejectFor: 1ms, retryOn: [reset]']) {
    const gw = await gatewayTo(t, `{ url: ${refusing}, weight: 1000 }, ${up.url}`, settings)
    t.same(await echo(`${gw.ws}/chat`), { status: 502, echoed: null }, settings)
    t.match(lines(gw), [{ status: 502, error: 'refused' }])
    t.notOk('retriedAfter' in (lines(gw)[0] ?? {}), 'not retried')
  }
  t.equal(up.upgrades.length, 0, 'nothing reached the other target')
})

t.test('every target refusing: tried once more, then the 502', async t => {
  const [a, b, c] = [await refusingUrl(), await refusingUrl(), await refusingUrl()]
  const gw = await gatewayTo(t, `${a}, ${b}, ${c}`, 'retries: 2')
  t.same(await echo(`${gw.ws}/chat`), { status: 502, echoed: null })
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_errors_total', { upstream: 'backend', kind: 'refused' }), 3, 'three targets tried, each once')
  t.match(lines(gw), [{ status: 502, error: 'refused', retriedAfter: 'refused' }])
})

t.test('retryBackoff: the retry of an upgrade waits too', async t => {
  const up = await startUpstream(t)
  const arrived: number[] = []
  up.server.on('upgrade', () => arrived.push(performance.now()))
  const gw = await gatewayTo(t, `{ url: ${await refusingUrl()}, weight: 1000 }, ${up.url}`, 'ejectFor: 1ms, retryBackoff: { base: 300ms, max: 300ms }')
  const waits: number[] = []
  for (let i = 0; i < 6; i++) {
    const began = performance.now()
    t.same(await echo(`${gw.ws}/chat${i}`), { status: 101, echoed: 'ping' })
    waits.push((arrived[i] as number) - began)
  }
  // 6 draws from [0, 300): sent at once, each took 1-3 ms here
  t.ok(waits.filter(w => w >= 30).length >= 2, `the retries waited: ${waits.map(Math.round).join(' ')}`)
})

t.test('a client that leaves while its upgrade\'s retry backs off ends it: no handshake is sent', async t => {
  const up = await startUpstream(t)
  const gw = await gatewayTo(t, `{ url: ${await refusingUrl()}, weight: 1000 }, ${up.url}`, 'ejectFor: 1ms, retryBackoff: { base: 2s, max: 2s }')
  for (let attempt = 1; attempt <= 3; attempt++) {
    const before = up.upgrades.length
    const client = connect(gw.port, '127.0.0.1')
    client.on('error', () => {})
    t.teardown(() => client.destroy())
    client.write(`GET /leaving${attempt} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
      `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`)
    // the refusal takes a few ms; the retry then waits up to 2 s
    await new Promise(resolve => setTimeout(resolve, 100))
    const sent = up.upgrades.length
    // a reset: node reads nothing from a socket handed over for an upgrade, so a plain close (FIN)
    // is seen only once the tunnel reads (the README says so)
    client.resetAndDestroy()
    await until('the client\'s line', () => lines(gw).length === attempt)
    // a draw below 100 ms sent the retry before the client left (1 in 20), or the machine was too
    // slow to refuse within 100 ms: neither tells anything
    if (sent > before || lines(gw)[attempt - 1]?.retriedAfter === undefined) continue
    t.match(lines(gw)[attempt - 1], { status: 499, retriedAfter: 'refused' }, 'logged 499, after the refusal')
    // past the whole window: a retry not cancelled would have reached the target by now
    await new Promise(resolve => setTimeout(resolve, 2300))
    t.equal(up.upgrades.length, before, 'no handshake sent for a client that left')
    return
  }
  t.fail('no client left while its retry backed off, in 3 tries (odds below 1 in 8000)')
})

t.test('a client that leaves while its upgrade\'s connection is being made ends the attempt: no retry, no handshake', async t => {
  const up = await startUpstream(t)
  // connecting to the first target hangs; timeouts.connect would send the upgrade on after 2 s
  const gw = await gatewayTo(t, `{ url: ${await startBlackhole(t)}, weight: 1000 }, ${up.url}`, 'ejectFor: 1ms, timeouts: { connect: 2s }')
  const client = connect(gw.port, '127.0.0.1')
  client.on('error', () => {})
  t.teardown(() => client.destroy())
  client.write('GET /leaving HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
    `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`)
  await new Promise(resolve => setTimeout(resolve, 300))
  const left = performance.now()
  client.resetAndDestroy()
  await until('the client\'s line', () => lines(gw).length === 1)
  t.ok(performance.now() - left < 1500, 'logged as the client left, not at the connect timeout')
  t.match(lines(gw), [{ status: 499, error: 'client_abort' }])
  t.notOk('retriedAfter' in (lines(gw)[0] ?? {}), 'nothing retried')
  // past the connect timeout: an attempt not ended would have timed out and gone to the second target
  await new Promise(resolve => setTimeout(resolve, 2500))
  t.equal(up.upgrades.length, 0, 'no handshake sent for a client that left')
  t.equal(lines(gw).length, 1, 'one line')
})

t.test('at the shutdown\'s deadline an upgrade whose retry backs off is answered 503 shutting down', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { shutdownTimeout: 300ms }
upstreams:
  backend: { targets: [{ url: ${await refusingUrl()}, weight: 1000 }, ${up.url}], ejectFor: 1ms, retryBackoff: { base: 20s, max: 20s } }
routes:
  - { name: live, pathPrefix: /, websocket: true, upstream: backend }
`)
  const answer = echo(`${gw.url.replace(/^http/, 'ws')}/chat`)
  // the refusal takes a few ms; the retry then waits up to 20 s
  await new Promise(resolve => setTimeout(resolve, 100))
  const began = performance.now()
  await gw.close()
  // a wait of up to 20 s: within 300 ms with odds of 1 in 67
  const got = await answer
  t.ok(got.status === 503 || got.status === 101, `answered: ${got.status}`)
  if (got.status === 503) {
    t.ok(performance.now() - began < 5000, 'at the deadline, not after the back-off')
    t.match(gw.lines.filter(l => l.msg === 'request'), [{ status: 503, error: 'shutting_down', retriedAfter: 'refused' }])
  }
  t.equal(up.upgrades.length, got.status === 101 ? 1 : 0, 'a handshake sent when the retry went first, and never otherwise')
})
