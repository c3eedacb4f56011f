// upstreams.X.retryBackoff (and a route's): Envoy's fully jittered exponential back-off. A retry
// first waits a random time from [0, (2^n - 1) x base) before the nth retry, never more than max,
// holding no connection meanwhile. Absent, a retry is sent at once (every other retry test).
// Waits are read from the upstreams' clock (when each attempt arrived), with margins for a loaded
// machine; the random draws make each bound hold for every request, not on average.
import t from 'tap'
import { request } from 'undici'
import { performance } from 'node:perf_hooks'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { startGateway } from './helpers/gateway.js'
import { recordingTarget, refusingUrl, startHttpServer } from './helpers/upstream.js'
import { metric } from './helpers/ratelimit.js'
import { until } from './helpers/workers.js'
import type { Teardown } from './helpers/teardown.js'
import { retryAfterDelayMs, retryAfterMs, retryDelayMs } from '../src/proxy/retry-policy.js'
import { ConfigError, parseConfigText } from '../src/config/load.js'

/** A target that answers 503 to everything and notes when each request came, on the upstream's clock. */
async function busyTarget (t: Teardown): Promise<{ url: string, seen: string[], at: number[] }> {
  const at: number[] = []
  const up = await recordingTarget(t, (_req: IncomingMessage, res: ServerResponse) => {
    at.push(performance.now())
    res.writeHead(503, { 'content-type': 'text/plain' })
    res.end('busy')
  })
  return { ...up, at }
}

/**
 * A target that answers 503 to the first attempt of each path `flaky` names (every path by
 * default) and 200 `ok` to the rest; `answered` holds the paths answered 503.
 */
async function firstAttemptBusy (t: Teardown, flaky: (path: string) => boolean = () => true): Promise<{ url: string, seen: string[], answered: Set<string> }> {
  const answered = new Set<string>()
  const up = await recordingTarget(t, (req, res) => {
    const path = req.url ?? ''
    if (flaky(path) && !answered.has(path)) {
      answered.add(path)
      res.writeHead(503)
      res.end('busy')
      return
    }
    res.end('ok')
  })
  return { ...up, answered }
}

const oneUpstream = (targets: string, settings: string, server = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${server}upstreams:
  backend: { targets: [${targets}], ${settings.includes('consecutiveFailures') ? '' : 'consecutiveFailures: 1000, '}${settings} }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

async function get (url: string): Promise<number> {
  const res = await request(url)
  await res.body.dump()
  return res.statusCode
}

t.test('the windows: (2^n - 1) x base before the nth retry, never past max, the whole window used', async t => {
  const backoff = { baseMs: 25, maxMs: 250, retryAfterMs: null }
  t.same([1, 2, 3, 4, 5].map(n => retryDelayMs(backoff, n, 0.9999)), [24, 74, 174, 249, 249], 'the top of each window (Envoy: 25, 75, 175 ms, capped at 250)')
  t.same([1, 2, 3].map(n => retryDelayMs(backoff, n, 0)), [0, 0, 0], 'full jitter: a retry may go at once')
  t.equal(retryDelayMs(backoff, 2, 0.5), 37, 'half of the second window')
})

t.test('Retry-After as a wait: seconds or an IMF-fixdate, from it up to half again more, never past 60 s', async t => {
  const now = Date.parse('Mon, 30 Nov 2026 21:00:00 GMT')
  t.equal(retryAfterMs('3', now), 3000, 'delta-seconds')
  t.equal(retryAfterMs(' 0 ', now), 0, 'no wait, spaces around')
  t.equal(retryAfterMs('Mon, 30 Nov 2026 21:00:02 GMT', now), 2000, 'an HTTP date two seconds ahead')
  t.equal(retryAfterMs('Mon, 30 Nov 2026 20:59:00 GMT', now), 0, 'a date past: at once')
  // V8's Date.parse reads each of these as some day: none is a Retry-After
  for (const junk of ['5.5', '-1', 'soon', '2026-11-30T21:00:02Z', 'Monday, 30-Nov-26 21:00:02 GMT', 'Mon Nov 30 21:00:02 2026', '', '12345678901']) {
    t.equal(retryAfterMs(junk, now), null, `not a Retry-After: ${JSON.stringify(junk)}`)
  }
  t.same([retryAfterDelayMs(1000, 0), retryAfterDelayMs(1000, 0.5), retryAfterDelayMs(1000, 0.9999)], [1000, 1250, 1499], 'from the wait asked up to half again more')
  t.equal(retryAfterDelayMs(50_000, 0.9999), 60_000, 'never past 60 s')
  t.equal(retryAfterDelayMs(0, 0.9), 0, 'Retry-After: 0 is at once')
})

/** A target that answers the first attempt of each path 503 with `retryAfter`, the rest 200, and notes when each attempt came. */
async function askingTarget (t: Teardown, retryAfter: string): Promise<{ url: string, at: Map<string, number[]> }> {
  const at = new Map<string, number[]>()
  const up = await recordingTarget(t, (req, res) => {
    const times = at.get(req.url ?? '') ?? []
    at.set(req.url ?? '', times)
    times.push(performance.now())
    if (times.length > 1) {
      res.end('ok')
      return
    }
    res.writeHead(503, { 'retry-after': retryAfter })
    res.end('busy')
  })
  return { url: up.url, at }
}

/** Three requests at once: the retry budget's minConcurrent (3) lets each retry. */
const together = async (url: string): Promise<number[]> => await Promise.all([0, 1, 2].map(async i => await get(`${url}/r${i}`)))

/** The wait between each path's first attempt and its retry, on the target's clock. */
const retryWaits = (at: Map<string, number[]>): number[] => [...at.values()].map(times => (times[1] as number) - (times[0] as number))

t.test('retryAfter: a dropped answer\'s Retry-After within it decides its retry\'s wait', async t => {
  const up = await askingTarget(t, '1')
  const gw = await startGateway(t, oneUpstream(up.url, 'retryOn: [503], retryBackoff: { base: 10ms, retryAfter: 2s }'))
  const answers = await together(gw.url)
  t.same(answers, [200, 200, 200], 'each answered by its retry')
  const waits = retryWaits(up.at)
  // the jittered windows alone (base 10 ms) would send each retry within 10 ms; a loaded machine
  // adds to a wait, never takes from it
  t.ok(waits.every(w => w >= 990 && w < 1500 + 500), `each retry waited the second asked, up to half again: ${waits.map(Math.round).join(' ')}`)
  t.same(gw.lines.filter(l => l.msg === 'request').map(l => l.retriedAfter), Array(3).fill('status_503'), 'logged as a retry after the 503')
})

t.test('retryAfter reads the Retry-After the upstream sent, before the route\'s header rules remove it', async t => {
  const up = await askingTarget(t, '1')
  const gw = await startGateway(t, oneUpstream(up.url, 'retryOn: [503], retryBackoff: { base: 10ms, retryAfter: 2s }')
    .replace('{ name: all, pathPrefix: /, upstream: backend }', '{ name: all, pathPrefix: /, upstream: backend, headers: { response: { remove: [retry-after] } } }'))
  const answers = await together(gw.url)
  t.same(answers, [200, 200, 200], 'each answered by its retry')
  const waits = retryWaits(up.at)
  t.ok(waits.every(w => w >= 990 && w < 1500 + 500), `each retry waited the second asked: ${waits.map(Math.round).join(' ')}`)
})

t.test('a Retry-After asking longer than retryAfter, one that does not parse, or any without retryAfter: the jittered wait', async t => {
  const cases = [
    { asked: '30', backoff: '{ base: 10ms, retryAfter: 2s }' },
    { asked: 'in a while', backoff: '{ base: 10ms, retryAfter: 2s }' },
    { asked: '1', backoff: '{ base: 10ms }' }
  ]
  for (const { asked, backoff } of cases) {
    const up = await askingTarget(t, asked)
    const gw = await startGateway(t, oneUpstream(up.url, `retryOn: [503], retryBackoff: ${backoff}`))
    t.same(await together(gw.url), [200, 200, 200], 'each answered by its retry')
    const waits = retryWaits(up.at)
    t.ok(waits.every(w => w < 10 + 500), `Retry-After: ${asked} with ${backoff}: sent within the 10 ms window (and the machine's lag): ${waits.map(Math.round).join(' ')}`)
  }
})

t.test('Retry-After: 0 leaves the jittered wait: it lengthens a wait, never shortens it', async t => {
  const up = await askingTarget(t, '0')
  // the first retry's window: [0, 3 s)
  const gw = await startGateway(t, oneUpstream(up.url, 'retryOn: [503], retryBackoff: { base: 3s, max: 3s, retryAfter: 2s }'))
  for (const round of ['a', 'b']) {
    t.same(await Promise.all([0, 1, 2].map(async i => await get(`${gw.url}/${round}${i}`))), [200, 200, 200], 'each answered by its retry')
  }
  const waits = retryWaits(up.at)
  // six draws from [0, 3 s): all under 500 ms about one time in 50,000; "at once" sent all six
  // within a few ms here, under 100 ms on a loaded machine (a target overloaded that says 0 got
  // every retry it turned away at once)
  t.ok(waits.some(w => w >= 500), `the jittered wait kept: ${waits.map(Math.round).join(' ')}`)
  t.ok(waits.every(w => w < 3000 + 500), 'within its window')
})

t.test('each retry waits within its window, the windows grow, and max bounds them (a route\'s retryBackoff)', async t => {
  // base 50ms, max 100ms, 5 retries: windows of 50, 100 (150 capped), 100 (350), 100 (750) and 100 (1550) ms
  const up = await busyTarget(t)
  // the route's back-off, over its upstream's (which would send every retry within 1 ms)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${up.url}], consecutiveFailures: 1000, retries: 5, retryOn: [503], retryBackoff: { base: 1ms, max: 1ms } }
routes:
  - { name: all, pathPrefix: /, upstream: backend, retryBackoff: { base: 50ms, max: 100ms } }
`)
  const requests = 12
  for (let i = 0; i < requests; i++) t.equal(await get(`${gw.url}/r${i}`), 503, 'the last attempt\'s answer')
  t.equal(up.at.length, requests * 6, 'every request sent 6 times')
  const waits: number[][] = [[], [], [], [], []]
  for (let r = 0; r < requests; r++) {
    for (let n = 1; n <= 5; n++) waits[n - 1]?.push((up.at[r * 6 + n] as number) - (up.at[r * 6 + n - 1] as number))
  }
  const [first, ...later] = waits as [number[], ...number[][]]
  const shown = (w: number[]): string => w.map(Math.round).join(' ')
  // a loaded machine adds to a wait, never takes from it: the upper bounds carry 500 ms for it
  t.ok(first.every(w => w < 50 + 500), `the first retries within 50 ms (and the machine's lag): ${shown(first)}`)
  // uncapped, 12 draws from the fifth window (1550 ms) all stay below 600 ms with odds of 1 in 80 000
  t.ok(later.flat().every(w => w < 100 + 500), `no retry past max, 100 ms: ${shown(later.flat())}`)
  // 48 later waits drawn from [0, 100): each is 75 ms or more with odds of 1 in 4
  t.ok(later.flat().filter(w => w >= 75).length >= 2, 'the later windows are wider than the first (50 ms)')
  // 60 waits drawn from windows of 50-100 ms: sent at once, each took 1-3 ms here
  t.ok(waits.flat().filter(w => w >= 20).length >= 12, `a retry waits: ${shown(waits.flat())}`)
  // a fixed wait of the window's top would be 50 ms or more every time
  t.ok(first.some(w => w < 40), 'full jitter: not a fixed wait')
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_total', { reason: 'status_503' }), requests * 5, 'each retry counted once')
})

t.test('a route\'s retryBackoff: false sends its retries at once, over its upstream\'s', async t => {
  const a = await busyTarget(t)
  const bAt: number[] = []
  const b = await recordingTarget(t, (_req, res) => { bAt.push(performance.now()); res.end('b') })
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [{ url: ${a.url}, weight: 1000 }, ${b.url}], consecutiveFailures: 1000, retryOn: [503], retryBackoff: { base: 2s, max: 2s } }
routes:
  - { name: now, pathPrefix: /, upstream: backend, retryBackoff: false }
`)
  for (let i = 0; i < 5; i++) t.equal(await get(`${gw.url}/r${i}`), 200, 'answered by b')
  const waits = bAt.map((at, i) => at - (a.at[i] as number))
  // the upstream's 2 s windows: 5 draws all below 200 ms with odds of 1 in 100 000
  t.ok(waits.every(w => w < 200), `sent at once: ${waits.map(Math.round).join(' ')}`)
})

t.test('a retry after a refused connection waits too: every retry, whatever sent it', async t => {
  // the refusing target is ejected for 1 ms: it takes every first attempt
  const refusing = await refusingUrl()
  const bAt: number[] = []
  const b = await recordingTarget(t, (_req, res) => { bAt.push(performance.now()); res.end('b') })
  const gw = await startGateway(t, oneUpstream(`{ url: ${refusing}, weight: 1000 }, ${b.url}`, 'ejectFor: 1ms, retryBackoff: { base: 300ms, max: 300ms }'))
  const waits: number[] = []
  for (let i = 0; i < 8; i++) {
    const began = performance.now()
    t.equal(await get(`${gw.url}/r${i}`), 200, 'answered by b')
    waits.push((bAt[i] as number) - began)
  }
  t.same(gw.lines.filter(l => l.msg === 'request').map(l => l.retriedAfter), Array(8).fill('refused'), 'each sent again after its refused connection')
  // 8 draws from [0, 300): sent at once, each took 1-3 ms here
  t.ok(waits.filter(w => w >= 30).length >= 3, `the retries waited: ${waits.map(Math.round).join(' ')}`)
})

t.test('a retry backing off keeps its place in the retry budget', async t => {
  // one budgeted retry at a time; every path's first attempt is answered 503, its retry 200
  const up = await firstAttemptBusy(t)
  const answered = up.answered
  const gw = await startGateway(t, oneUpstream(up.url, 'retryOn: [503], retryBudget: { percent: 0, minConcurrent: 1 }, retryBackoff: { base: 2s, max: 2s }'))
  // the wait is drawn from [0, 2s): a try whose retry went before the second request is done again
  for (let attempt = 1; attempt <= 5; attempt++) {
    const backingOff = request(`${gw.url}/first${attempt}`).then(async res => res.statusCode)
    await until('the first attempt answered', () => answered.has(`/first${attempt}`))
    const second = await request(`${gw.url}/second${attempt}`)
    const text = await second.body.text()
    const retried = up.seen.filter(s => s === `GET /first${attempt}`).length > 1
    t.equal(await backingOff, 200, 'the retry that backed off is answered')
    if (retried && up.seen.indexOf(`GET /second${attempt}`) > up.seen.lastIndexOf(`GET /first${attempt}`)) continue
    t.same([second.statusCode, text], [503, 'busy'], 'over the budget: the second request gets its 503 as it came')
    t.equal(await metric(gw.adminUrl, 'gateway_upstream_retries_over_budget_total', { upstream: 'backend' }), 1, 'counted over budget')
    return
  }
  t.fail('every retry went before the second request (odds below 1 in 10^10)')
})

t.test('every connection taken when the wait ends: the gateway\'s 503, not the dropped answer', async t => {
  const answered = new Set<string>()
  const slow: Array<() => void> = []
  const up = await recordingTarget(t, (req, res) => {
    const path = req.url ?? ''
    if (path.startsWith('/slow')) {
      slow.push(() => res.end('slow'))
      return
    }
    if (!answered.has(path)) {
      answered.add(path)
      res.writeHead(503, { 'retry-after': '7' })
      res.end('busy')
      return
    }
    res.end('ok')
  })
  // one connection and no room to wait: a request that finds it taken gets 503 at once
  const gw = await startGateway(t, oneUpstream(up.url, 'maxConnections: 1, maxPending: 0, retryOn: [503], retryBackoff: { base: 2s, max: 2s }'))
  for (let attempt = 1; attempt <= 5; attempt++) {
    const before = slow.length
    const flaky = request(`${gw.url}/flaky${attempt}`).then(async res => ({ status: res.statusCode, retryAfter: res.headers['retry-after'], body: await res.body.text() }))
    await until('the first attempt answered', () => answered.has(`/flaky${attempt}`))
    // the slow request takes the connection while the retry waits, and holds it past the wait
    const slowDone = request(`${gw.url}/slow${attempt}`).then(async res => await res.body.text())
    await until('the slow request at the upstream, or the retry before it', () => slow.length > before || up.seen.filter(s => s === `GET /flaky${attempt}`).length > 1)
    if (slow.length === before) {
      // the retry went first (a wait of a few ms): the slow one was refused
      await flaky
      await slowDone
      continue
    }
    const got = await flaky
    slow[before]?.()
    t.equal(await slowDone, 'slow')
    t.equal(got.status, 503)
    t.match(JSON.parse(got.body), { error: 'GW_ERR_UPSTREAM_BUSY' }, 'no connection and no room to wait when the wait ended')
    t.not(got.retryAfter, '7', 'the dropped answer\'s Retry-After is lost with it')
    return
  }
  t.fail('every retry went before the slow request (odds below 1 in 10^10)')
})

t.test('bursts of retries backing off, some clients leaving at any point: nothing leaks, every other request answered', async t => {
  // each path's first attempt is answered 503; /hold/* is held until released
  const answered = new Set<string>()
  const held: ServerResponse[] = []
  const up = await recordingTarget(t, (req, res) => {
    const path = req.url ?? ''
    if (path.startsWith('/hold')) {
      held.push(res)
      return
    }
    if (!answered.has(path)) {
      answered.add(path)
      res.writeHead(503)
      res.end('busy')
      return
    }
    res.end('ok')
  })
  // 4 connections per target for 40 requests at once: most retries wait in the queue after their back-off
  const gw = await startGateway(t, oneUpstream(`${up.url}, ${up.url.replace('127.0.0.1', 'localhost')}`, 'maxConnections: 4, timeouts: { queue: 3s }, retryOn: [503], retryBudget: { percent: 100, minConcurrent: 100 }, retryBackoff: { base: 20ms, max: 60ms }'))
  for (const burst of [1, 2]) {
    const leaving = new Set([3, 7, 11, 19, 23, 31, 37])
    const answers = await Promise.all(Array.from({ length: 40 }, async (_, i) => {
      const ac = new AbortController()
      if (leaving.has(i)) setTimeout(() => { ac.abort() }, 2 + i)
      try {
        const res = await request(`${gw.url}/b${burst}/${i}`, { signal: ac.signal })
        return `${res.statusCode} ${await res.body.text()}`
      } catch {
        return 'left'
      }
    }))
    const stayed = answers.filter((_, i) => !leaving.has(i))
    t.same(stayed, Array(33).fill('200 ok'), `burst ${burst}: every client that stayed got the retry's answer`)
  }
  t.equal(await metric(gw.adminUrl, 'gateway_upstream_pending', { upstream: 'backend' }), 0, 'nobody left waiting')
  // 8 requests held at once take all 4 connections of both targets: a leaked one would leave one waiting
  const holding = Promise.all(Array.from({ length: 8 }, async (_, i) => await get(`${gw.url}/hold/${i}`)))
  await until('8 requests held at the upstream at once', () => held.length === 8, 5000)
  for (const res of held) res.end('held')
  t.same(await holding, Array(8).fill(200), 'every connection was free again')
})

t.test('a retry backing off holds no connection: another request takes it', async t => {
  // one connection to the target: the request backing off would hold it, and the next one wait
  const up = await firstAttemptBusy(t, path => path.startsWith('/flaky'))
  const answered = up.answered
  const gw = await startGateway(t, oneUpstream(up.url, 'maxConnections: 1, maxPending: 0, retryOn: [503], retryBackoff: { base: 2s, max: 2s }'))
  // the wait is drawn from [0, 2s): a try whose retry went before /next is done again
  for (let attempt = 1; attempt <= 5; attempt++) {
    const flaky = get(`${gw.url}/flaky${attempt}`)
    await until('the first attempt answered', () => answered.has(`/flaky${attempt}`))
    // with maxPending 0 a request finding the connection taken gets 503 at once
    const next = await get(`${gw.url}/next${attempt}`)
    const retried = up.seen.indexOf(`GET /flaky${attempt}`, up.seen.indexOf(`GET /flaky${attempt}`) + 1)
    t.equal(await flaky, 200, 'the retry answered')
    if (retried !== -1 && retried < up.seen.indexOf(`GET /next${attempt}`)) continue
    t.equal(next, 200, 'the connection was free while the retry backed off')
    return
  }
  t.fail('every retry went before the next request (odds below 1 in 10^10)')
})

t.test('a client that leaves while its retry backs off ends it: nothing more is sent', async t => {
  const a = await busyTarget(t)
  const b = await recordingTarget(t, (_req, res) => { res.end('b') })
  // one connection per target: a retry sent for a request that left would hold b's for good
  const gw = await startGateway(t, oneUpstream(`{ url: ${a.url}, weight: 1000 }, ${b.url}`, 'maxConnections: 1, retryOn: [503], retryBackoff: { base: 1s, max: 1s }'))
  // the wait is drawn from [0, 1s): a try whose retry went before the client left is done again
  for (let attempt = 1; attempt <= 5; attempt++) {
    const path = `/leave${attempt}`
    const ac = new AbortController()
    const pending = request(gw.url + path, { signal: ac.signal }).then(async res => { await res.body.dump() }, () => {})
    await until('the first attempt answered', () => a.seen.includes(`GET ${path}`))
    await new Promise(resolve => setTimeout(resolve, 100))
    ac.abort()
    await pending
    await until('the request logged', () => gw.lines.some(l => l.msg === 'request' && l.path === path))
    const line = gw.lines.find(l => l.msg === 'request' && l.path === path) as Record<string, unknown>
    // a target on the line: the retry was sent (to b) before the client's close was handled
    if (line.target !== null && line.target !== undefined) continue
    t.match(line, { status: 499, retriedAfter: 'status_503' }, 'ended as the client left, backing off: its retry decided, no target')
    // past the longest wait the retry could have drawn
    await new Promise(resolve => setTimeout(resolve, 1200))
    t.notOk(b.seen.includes(`GET ${path}`), 'the retry was never sent')
    // a retry sent for the request that left is aborted before a byte goes out, but kept b's only connection
    t.equal(await get(`${gw.url}/after`), 200, 'b\'s connection is free: the next retry is answered there')
    return
  }
  t.fail('every retry went within 100 ms (odds of 1 in 100 000)')
})

t.test('a target ejected while a retry backs off: the client gets the gateway\'s 503, not the dropped answer', async t => {
  // one target; the first request's 503 is dropped for a retry. While that retry waits the target
  // goes away: the next request's connection is refused, which ejects it.
  for (let attempt = 1; attempt <= 5; attempt++) {
    const seen: string[] = []
    const { server, url } = await startHttpServer(t, (req, res) => {
      seen.push(req.url ?? '')
      res.writeHead(503)
      res.end('busy')
    })
    const gw = await startGateway(t, oneUpstream(url, 'retryOn: [503], retryBackoff: { base: 2s, max: 2s }'))
    const first = request(`${gw.url}/get`).then(async res => ({ status: res.statusCode, body: await res.body.text() }))
    // >= 1: a retry drawn near 0 s may follow before the next poll; the check below retries then
    await until('the first attempt answered', () => seen.length >= 1)
    server.close()
    server.closeAllConnections()
    const refused = await request(`${gw.url}/refused`, { method: 'POST', body: 'x' })
    await refused.body.dump()
    // the wait is drawn from [0, 2s): a try whose retry went before the target left is done again
    if (seen.length > 1 || refused.statusCode !== 502) {
      await first
      continue
    }
    const got = await first
    // a wait that ended after the target left but before the refusal ejected it: its retry was
    // refused too (502). Done again; a retry that ignored the ejection is refused every time, and
    // the five tries end in the t.fail below (CI met this window once under load)
    if (got.status === 502 && (JSON.parse(got.body) as { error?: string }).error === 'GW_ERR_UPSTREAM_UNAVAILABLE') continue
    t.equal(got.status, 503)
    t.match(JSON.parse(got.body), { error: 'GW_ERR_NO_HEALTHY_UPSTREAM' }, 'no target left in rotation when the wait ended')
    t.same(seen, ['/get'], 'the retry reached no target')
    return
  }
  t.fail('every retry went before the target was ejected (odds below 1 in 10^10)')
})

t.test('at the shutdown\'s deadline a request backing off is answered 503 shutting down', async t => {
  const up = await busyTarget(t)
  const gw = await startGateway(t, oneUpstream(up.url, 'retries: 5, retryOn: [503], retryBackoff: { base: 20s, max: 20s }', 'server: { shutdownTimeout: 300ms }\n'))
  const answer = request(`${gw.url}/slow`).then(async res => ({ status: res.statusCode, body: await res.body.json() as { error?: string } }))
  await until('the first attempt answered', () => up.seen.length >= 1)
  const began = performance.now()
  await gw.close()
  const got = await answer
  // five waits of up to 20 s each: all of them within 300 ms has odds below 1 in 10^8
  t.match(got, { status: 503, body: { error: 'GW_ERR_SHUTTING_DOWN' } }, 'answered, not cut')
  t.ok(performance.now() - began < 5000, 'at the deadline, not after the back-off')
})

t.test('retryBackoff as loaded: max defaults to 10 times base; a route\'s is its own; bad values are located', async t => {
  const config = (backoff: string, route = ''): string => `upstreams:
  backend: { targets: [http://127.0.0.1:1], retryBackoff: ${backoff} }
routes:
  - { name: a, pathPrefix: /a, upstream: backend${route} }
`
  const loaded = parseConfigText(config('{ base: 25ms }', ', retryBackoff: { base: 1s, max: 2s }'), 'gw.yaml', {}).config
  t.same(loaded.upstreams.backend?.retryBackoff, { base: '25ms', max: '250ms' }, 'Envoy\'s default max')
  t.same(loaded.routes[0]?.retryBackoff, { base: '1s', max: '2s' })
  const ofRoute = (backoff: string): unknown => parseConfigText(config('{ base: 25ms }', `, retryBackoff: ${backoff}`), 'gw.yaml', {}).config.routes[0]?.retryBackoff
  t.same(ofRoute('{ base: 100ms }'), { base: '100ms', max: '1s' }, 'a route\'s max is 10 times its own base, as /config shows')
  t.equal(ofRoute('false'), false, 'false: at once')
  t.same(parseConfigText(config('{ base: 10s }'), 'gw.yaml', {}).config.upstreams.backend?.retryBackoff, { base: '10s', max: '60s' }, '10 times base, at most 60s')
  const problems = (backoff: string): string => {
    try {
      parseConfigText(config(backoff), 'gw.yaml', {})
    } catch (err) {
      if (err instanceof ConfigError) return err.message
      throw err
    }
    return 'accepted'
  }
  t.throws(() => ofRoute('true'), /routes\[0\]\.retryBackoff/, 'true means nothing: an object or false')
  t.match(problems('{ base: 100ms, max: 50ms }'), /^gw\.yaml:2:\d+ upstreams\.backend\.retryBackoff\.max: must be at least base \(100ms\)/)
  t.match(problems('{ base: 0ms }'), /upstreams\.backend\.retryBackoff\.base: must be more than 0/)
  t.match(problems('{ base: 25ms, max: 61s }'), /upstreams\.backend\.retryBackoff\.max: at most 60s/)
  t.match(problems('{ max: 1s }'), /upstreams\.backend\.retryBackoff\.base/)
  t.equal(problems('{ base: 60s, max: 60s }'), 'accepted')
  t.same(ofRoute('{ base: 100ms, retryAfter: 5s }'), { base: '100ms', max: '1s', retryAfter: '5s' }, 'retryAfter as written, on /config')
  t.match(problems('{ base: 25ms, retryAfter: 2m }'), /upstreams\.backend\.retryBackoff\.retryAfter: at most 60s/)
  t.match(problems('{ base: 25ms, retryAfter: 0s }'), /upstreams\.backend\.retryBackoff\.retryAfter: must be more than 0/)
})
