// What a client reads off a limited (and an allowed) response: Retry-After, RateLimit and
// RateLimit-Policy (draft-ietf-httpapi-ratelimit-headers) for each algorithm, legacy
// X-RateLimit-* headers, shadow mode, a status override, and leaky-bucket delay mode.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startHttpServer, startUpstream } from './helpers/upstream.js'
import { eventually, limitedShapeProblem, metric, send, statusCounts, type Reply } from './helpers/ratelimit.js'
import { awayFromWindowEdge } from './helpers/window-edge.js'

const redis = await startRedis(t)

function config (upstream: string, routeLimits: string, top = ''): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s, onError: deny }
${top}
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: r
    pathPrefix: /
    upstream: backend
    limits:
${routeLimits}
`
}

/** `"r.api";r=2;t=4` -> { name, r, t } */
function parseRateLimit (value: string | string[] | undefined): { name: string, r: number, t: number } | null {
  const m = /^"([^"]+)";r=(\d+);t=(\d+)$/.exec(String(value))
  return m === null ? null : { name: m[1] as string, r: Number(m[2]), t: Number(m[3]) }
}

type Range = readonly [number, number]
interface Expectation {
  /** `t` of the three allowed responses (seconds until the budget is whole again). */
  readonly allowedT: readonly Range[]
  readonly retryAfter: Range
  readonly rejectedT: Range
}

// limit 3 per 10 s (burst 3): one unit is 3.33 s of refill for the bucket algorithms.
const EXPECTED: Record<string, Expectation> = {
  gcra: { allowedT: [[3, 4], [6, 7], [9, 10]], retryAfter: [3, 4], rejectedT: [9, 10] },
  'token-bucket': { allowedT: [[3, 4], [6, 7], [9, 10]], retryAfter: [3, 4], rejectedT: [9, 10] },
  'leaky-bucket': { allowedT: [[3, 4], [6, 7], [9, 10]], retryAfter: [3, 4], rejectedT: [9, 10] },
  // every admission is in the window for a whole window
  'sliding-window-log': { allowedT: [[10, 10], [10, 10], [10, 10]], retryAfter: [9, 10], rejectedT: [9, 10] },
  // to the end of the aligned 10 s window
  'fixed-window': { allowedT: [[1, 10], [1, 10], [1, 10]], retryAfter: [1, 10], rejectedT: [1, 10] },
  // this window's count weighs on the next one: until the end of the next window
  'sliding-window': { allowedT: [[10, 20], [10, 20], [10, 20]], retryAfter: [1, 20], rejectedT: [10, 20] }
}

const within = (v: number, [lo, hi]: Range): boolean => v >= lo && v <= hi

for (const [algorithm, expected] of Object.entries(EXPECTED)) {
  t.test(`${algorithm}: RateLimit, RateLimit-Policy and Retry-After match limit 3 per 10 s`, async t => {
    await redis.client().flushall()
    const up = await startUpstream(t)
    const burst = ['gcra', 'token-bucket', 'leaky-bucket'].includes(algorithm) ? ', burst: 3' : ''
    const gw = await startGateway(t, config(up.url, `      api: { algorithm: ${algorithm}, limit: 3, window: 10s${burst} }`))
    // the four requests must not straddle an aligned window boundary
    await awayFromWindowEdge(10_000, 1000)
    const replies: Reply[] = []
    for (let i = 0; i < 4; i++) replies.push(await send(`${gw.url}/x`))
    t.same(replies.map(r => r.status), [200, 200, 200, 429])
    for (const r of replies) t.equal(r.headers['ratelimit-policy'], '"r.api";q=3;w=10', 'policy: quota 3, window 10 s')
    const parsed = replies.map(r => parseRateLimit(r.headers.ratelimit))
    t.same(parsed.map(p => p?.name), ['r.api', 'r.api', 'r.api', 'r.api'])
    t.same(parsed.map(p => p?.r), [2, 1, 0, 0], 'remaining counts down to 0')
    parsed.slice(0, 3).forEach((p, i) => t.ok(within(p?.t ?? -1, expected.allowedT[i] as Range), `allowed #${i + 1}: t=${p?.t} in ${String(expected.allowedT[i])}`))
    const limited = replies[3] as Reply
    t.equal(limitedShapeProblem(limited, { dimension: 'api', limit: 'r.api' }), null, 'a well-formed 429 (Retry-After = ceil(retryAfterMs / 1000))')
    const retryAfter = Number(limited.headers['retry-after'])
    t.ok(within(retryAfter, expected.retryAfter), `Retry-After ${retryAfter} in ${String(expected.retryAfter)}`)
    t.ok(within(parsed[3]?.t ?? -1, expected.rejectedT), `rejected: t=${parsed[3]?.t} in ${String(expected.rejectedT)}`)
    t.equal(limited.headers['x-ratelimit-limit'], undefined, 'no legacy headers unless asked')
    t.equal(up.requests, 3)
  })
}

t.test('the headers describe the tightest limit; legacyHeaders adds X-RateLimit-*', async t => {
  await redis.client().flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, '      api: { algorithm: sliding-window-log, limit: 3, window: 1m }',
    'legacyHeaders: true\nlimits:\n  ip: { algorithm: sliding-window-log, limit: 100, window: 1m }'))
  const replies: Reply[] = []
  for (let i = 0; i < 4; i++) replies.push(await send(`${gw.url}/x`))
  t.same(replies.map(r => r.status), [200, 200, 200, 429])
  t.same(replies.map(r => r.headers.ratelimit), ['"r.api";r=2;t=60', '"r.api";r=1;t=60', '"r.api";r=0;t=60', '"r.api";r=0;t=60'], 'the rejected reply: 0 left until the oldest admission leaves the 60 s window')
  t.same(replies.map(r => r.headers['ratelimit-policy']), Array(4).fill('"r.api";q=3;w=60'), 'api (3 left at most) is tighter than ip (100)')
  t.same(replies.map(r => r.headers['x-ratelimit-limit']), ['3', '3', '3', '3'])
  t.same(replies.map(r => r.headers['x-ratelimit-remaining']), ['2', '1', '0', '0'])
  replies.forEach((r, i) => t.equal(r.headers['x-ratelimit-reset'], String(parseRateLimit(r.headers.ratelimit)?.t), `legacy reset = RateLimit t (#${i + 1})`))
  // the ip budget was consumed by the 3 admissions only, not by the rejected 4th
  const ipKey = (await redis.client().keys('gw:\\*.ip.*'))[0] as string
  t.equal(await redis.client().zcard(ipKey), 3)
})

t.test('shadow mode never rejects but counts what it would have rejected', async t => {
  await redis.client().flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `      api: { algorithm: fixed-window, limit: 1000, window: 1h }
      user: { algorithm: sliding-window-log, limit: 2, window: 1h, mode: shadow }`, 'identity: { header: x-user-id }'))
  // The API counter is read as such below, so it stays a fixed window; being aligned on the epoch,
  // it would start afresh if the run crossed the top of the hour: not that close to it.
  await awayFromWindowEdge(3_600_000, 30_000)
  const replies: Reply[] = []
  for (let i = 0; i < 6; i++) replies.push(await send(`${gw.url}/x`, { headers: { 'x-user-id': 'sam' } }))
  t.same(statusCounts(replies), { 200: 6 }, 'nothing rejected')
  t.ok(replies.every(r => parseRateLimit(r.headers.ratelimit)?.name === 'r.api'), 'the headers describe the enforced limit only')
  const labels = { route: 'r', dimension: 'user' }
  await eventually('shadow decisions counted', async () =>
    await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { ...labels, result: 'shadow' }) === 4)
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { ...labels, result: 'allowed' }), 2)
  t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { ...labels, result: 'rejected' }), 0)
  t.equal(up.requests, 6)
  // the enforced API limit still counted all six
  const apiKey = (await redis.client().keys('gw:r.api.*'))[0] as string
  t.equal(await redis.client().hget(apiKey, 'c'), '6')
})

t.test('status: 503 replaces 429 on a limited response', async t => {
  await redis.client().flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, '      api: { algorithm: token-bucket, limit: 1, window: 1h, status: 503 }'))
  t.equal((await send(`${gw.url}/x`)).status, 200)
  const limited = await send(`${gw.url}/x`)
  t.equal(limitedShapeProblem(limited, { status: 503, dimension: 'api', limit: 'r.api' }), null, '503 with the rate_limited body and Retry-After')
  const cached = await send(`${gw.url}/x`)
  t.equal(cached.status, 503, 'the deny cache answers with the same status')
})

t.test('leaky-bucket onLimit: delay holds requests until their slot; beyond maxDelay they get 429', async t => {
  await redis.client().flushall()
  const arrivals: number[] = []
  const up = await startHttpServer(t, (_req, res) => {
    arrivals.push(Date.now())
    res.end('ok')
  })
  // 5 per second: one slot every 200 ms; at most 1 s of waiting, so slots 0..1000 ms: 6 requests
  const gw = await startGateway(t, config(up.url, '      api: { algorithm: leaky-bucket, limit: 5, window: 1s, burst: 10, onLimit: delay, maxDelay: 1s }'))
  const sentAt = Date.now()
  const replies = await Promise.all(Array.from({ length: 10 }, async () => {
    const r = await send(`${gw.url}/x`)
    return { r, ms: Date.now() - sentAt }
  }))
  // 6 when all 10 are decided within one slot (slots 0..1000 ms); one more per 200 ms that a
  // slow machine spends accepting them. Without maxDelay all 10 would fit in the burst.
  const admitted = replies.filter(x => x.r.status === 200).length
  t.ok(admitted >= 6 && admitted <= 8, `${admitted} admitted (6 slots in 1 s of delay)`)
  t.equal(replies.filter(x => x.r.status === 429).length, 10 - admitted, 'the rest get 429')
  t.ok(replies.filter(x => x.r.status === 429).every(x => limitedShapeProblem(x.r, { dimension: 'api', limit: 'r.api' }) === null))
  // A request held for maxDelay cannot be answered before 1 s after it was sent; load only adds.
  const rejectedMs = replies.filter(x => x.r.status === 429).map(x => x.ms)
  t.ok(rejectedMs.every(ms => ms < 1000), `those beyond maxDelay are rejected at once, not held (${rejectedMs.join(', ')} ms)`)
  // Virtual scheduling: the k-th admitted request's slot is at least k * 200 ms after the first
  // decision, which came after sentAt, and a timer never fires early. These are lower bounds
  // that a loaded machine cannot break; 5 ms covers rounding of Redis TIME to ms.
  arrivals.sort((a, b) => a - b)
  const early = arrivals.map((at, k) => ({ k, ms: at - sentAt })).filter(x => x.ms < x.k * 200 - 5)
  t.same(early, [], `the k-th upstream arrival no sooner than k slots of 200 ms: ${arrivals.map(at => at - sentAt).join(', ')} ms`)
  const heldMs = replies.filter(x => x.r.status === 200).map(x => x.ms).sort((a, b) => a - b)
  t.ok(heldMs.every((ms, k) => ms >= k * 200 - 5), `admitted replies held for their slots: ${heldMs.join(', ')} ms`)
  // upper bound: the last slot is 1 s away; 2 s more of slack for a loaded machine
  t.ok((heldMs[heldMs.length - 1] as number) < 3000, 'no admitted request held far beyond maxDelay')
})

t.test('the gateway\'s RateLimit headers replace an upstream\'s of the same name, whatever its case', async t => {
  const up = await startHttpServer(t, (_req, res) => {
    res.setHeader('RateLimit-Policy', '"upstream";q=1;w=1')
    res.setHeader('ratelimit', '"upstream";r=0;t=1')
    res.setHeader('x-upstream', 'kept')
    res.end('ok')
  })
  const gw = await startGateway(t, config(up.url, '      api: { algorithm: fixed-window, limit: 5, window: 1h }'))
  const res = await send(`${gw.url}/x`)
  t.equal(res.status, 200)
  t.equal(res.headers['x-upstream'], 'kept', 'the upstream\'s other headers pass')
  t.match(res.headers['ratelimit-policy'], /^"r\.api";q=5;w=3600$/, 'one RateLimit-Policy, the gateway\'s')
  t.match(res.headers.ratelimit, /^"r\.api";r=4;t=\d+$/, 'one RateLimit, the gateway\'s')
})
