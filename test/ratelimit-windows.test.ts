// Budgets over time through HTTP, with Redis and with the in-process store: a window that passes
// gives the whole budget back, and sliding-window stays within its documented error
// (src/limit/algorithms/sliding-window.ts).
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { atWindowOffset, burst, count, inNextWindow, sleep, statusCounts, type Reply } from './helpers/ratelimit.js'

const redis = await startRedis(t)

function config (upstream: string, store: 'redis' | 'memory', route: string, limit: string): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${store === 'redis' ? `redis: { url: ${redis.url}, timeout: 2s, onError: deny }` : ''}
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: ${route}
    pathPrefix: /
    upstream: backend
    limits:
      api: ${limit}
`
}

/**
 * A burst of `n` that began and ended within one epoch-aligned window of `windowMs`, so that one
 * window decided all of it: taken from the start of the next window, and again in a later one
 * while a loaded machine stretches it over a boundary (under the whole suite a burst of 100 begun
 * 100 ms into a 6 s window ended in the next one, which admitted 32 more). The gateway's clock
 * is this process's (in process) or the same host's (Redis TIME), and every decision falls between
 * the burst's first send and its last answer. `admitted`: the 200s of every burst made, the
 * stretched ones included, which all reached the upstream.
 */
async function burstInOneWindow (n: number, url: string, windowMs: number): Promise<{ replies: Reply[], admitted: number }> {
  let admitted = 0
  for (let attempt = 1; ; attempt++) {
    await inNextWindow(windowMs, 0)
    const started = Date.now()
    const replies = await burst(n, url)
    admitted += count(replies, 200)
    if (Math.floor(started / windowMs) === Math.floor(Date.now() / windowMs) || attempt === 4) return { replies, admitted }
  }
}

for (const store of ['redis', 'memory'] as const) {
  t.test(`sliding-window-log (${store}): after the window passes, the budget is whole again`, async t => {
    const up = await startUpstream(t)
    // 6 s leaves a loaded 2-core machine several seconds for a burst of 100 (about 0.3 s idle)
    const gw = await startGateway(t, config(up.url, store, `swl-window-${store}`, '{ algorithm: sliding-window-log, limit: 50, window: 6s }'))
    const started = Date.now()
    const first = await burst(100, `${gw.url}/x`)
    const tookMs = Date.now() - started
    t.ok(tookMs < 5000, `the first burst fits in the 6 s window (took ${tookMs} ms)`)
    t.same(statusCounts(first), { 200: 50, 429: 50 })
    const blocked = await burst(5, `${gw.url}/x`)
    t.equal(count(blocked, 429), 5, 'still inside the window: rejected')
    // every admission happened before the burst ended: all have left the window 6 s later
    await sleep(started + tookMs + 6000 + 500 - Date.now())
    const second = await burst(100, `${gw.url}/x`)
    t.same(statusCounts(second), { 200: 50, 429: 50 }, 'a new window admits exactly 50 again')
    t.equal(up.requests, 100)
  })

  t.test(`fixed-window (${store}): the next aligned window admits the full limit again`, async t => {
    const up = await startUpstream(t)
    // 6 s: a burst of 100 (about 0.3 s idle) took more than the 1.9 s a 2 s window left on a
    // loaded 2-core machine, and its last requests were admitted by the next window (52 of 50)
    const gw = await startGateway(t, config(up.url, store, `fw-window-${store}`, '{ algorithm: fixed-window, limit: 50, window: 6s }'))
    const first = await burstInOneWindow(100, `${gw.url}/x`, 6000)
    t.same(statusCounts(first.replies), { 200: 50, 429: 50 })
    const retryAfter = Number(first.replies.find(r => r.status === 429)?.headers['retry-after'])
    t.ok(retryAfter >= 1 && retryAfter <= 6, `Retry-After ${retryAfter} points at the end of the 6 s window`)
    const second = await burstInOneWindow(100, `${gw.url}/x`, 6000)
    t.same(statusCounts(second.replies), { 200: 50, 429: 50 })
    t.equal(up.requests, first.admitted + second.admitted, 'every admitted request reached the upstream, no refused one did')
  })

  t.test(`sliding-window (${store}): half-way into the next window about half the limit is admitted, within the documented bound`, async t => {
    const up = await startUpstream(t)
    const limit = 100
    // 6 s: the second burst (150 requests, about 0.3 s idle) has 3 s to stay inside one window
    const windowMs = 6000
    const gw = await startGateway(t, config(up.url, store, `sw-bound-${store}`, `{ algorithm: sliding-window, limit: ${limit}, window: 6s }`))
    // window k: a fresh key (previous = 0) is exact
    await atWindowOffset(windowMs, 100)
    const first = await burst(150, `${gw.url}/x`)
    t.equal(count(first, 200), limit, 'a fresh window admits exactly the limit')
    // window k+1, half-way: estimate = previous * (W - e) / W + current <= limit, so current
    // <= limit * e / W (src/limit/algorithms/sliding-window.ts). e is bracketed by the burst.
    await inNextWindow(windowMs, windowMs / 2)
    const e0 = Date.now() % windowMs
    const second = await burst(150, `${gw.url}/x`)
    const e1 = Date.now() % windowMs
    t.ok(e1 > e0, `the burst stayed inside one window (${e0}..${e1} ms)`)
    const admitted = count(second, 200)
    const low = Math.floor(limit * e0 / windowMs) - 1
    const high = Math.ceil(limit * e1 / windowMs) + 1
    t.ok(admitted >= low && admitted <= high, `admitted ${admitted}, expected ${low}..${high} (limit * elapsed / window)`)
    // over the two windows the exact sliding count never passed limit + previous * e / W
    t.ok(admitted <= limit, 'no over-admission: the previous window\'s requests all came at its start')
    t.equal(up.requests, limit + admitted)
  })
}
