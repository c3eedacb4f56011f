// Exactness through HTTP: 200 concurrent clients against a limit of 50 get exactly 50 answers
// from the upstream, for every exact algorithm, with Redis and with the in-process store; two
// gateway processes on one Redis share one budget. (Windows passing: ratelimit-windows.test.ts.)
import t from 'tap'
import { startGateway, spawnGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { burst, count, limitedShapeProblem, metric, statusCounts } from './helpers/ratelimit.js'
import { awayFromWindowEdge } from './helpers/window-edge.js'

const EXACT = ['gcra', 'token-bucket', 'leaky-bucket', 'sliding-window-log', 'fixed-window'] as const
const BUCKETS = new Set<string>(['gcra', 'token-bucket', 'leaky-bucket'])

const redis = await startRedis(t)

// Redis calls get a generous bound and fail closed: under this burst on a shared 2-core machine a
// 50 ms timeout could hand decisions to the fallback, which would hide (not cause) a miscount.
const redisBlock = `redis: { url: ${redis.url}, timeout: 2s, onError: deny }`

function config (upstream: string, store: 'redis' | 'memory', route: string, limit: string): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
${store === 'redis' ? redisBlock : ''}
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

for (const store of ['redis', 'memory'] as const) {
  for (const algorithm of [...EXACT, 'sliding-window'] as const) {
    t.test(`${algorithm} (${store}): 200 concurrent requests against a limit of 50 admit exactly 50`, async t => {
      const up = await startUpstream(t)
      const route = `exact-${algorithm}-${store}`
      const burstOpt = BUCKETS.has(algorithm) ? ', burst: 50' : ''
      const gw = await startGateway(t, config(up.url, store, route, `{ algorithm: ${algorithm}, limit: 50, window: 1h${burstOpt} }`))
      // A fixed or sliding window aligned to the epoch must not roll over mid-burst: stay clear of
      // the hour boundary (at most a 30 s wait, rarely any).
      await awayFromWindowEdge(3_600_000, 30_000)
      const replies = await burst(200, `${gw.url}/x`)
      t.same(statusCounts(replies), { 200: 50, 429: 150 }, 'the gateway answered 50 x 200 and 150 x 429')
      t.equal(up.requests, 50, 'the upstream saw exactly 50 requests')
      const bad = replies.filter(r => r.status === 429).map(r => limitedShapeProblem(r, { dimension: 'api', limit: `${route}.api` })).filter(p => p !== null)
      t.same(bad, [], 'every 429 is a well-formed rate_limited answer')
      const level = store === 'redis' ? 'redis' : 'memory'
      t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { route, level, result: 'allowed' }), 50, `50 admissions decided at level ${level}`)
      if (store === 'redis') t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { level: 'fallback' }), 0, 'nothing decided by the fallback')
      // the deny cache may answer some rejections locally; all of them are counted as rejected
      t.equal(await metric(gw.adminUrl, 'gateway_ratelimit_decisions_total', { route, result: 'rejected' }), 150)
    })
  }
}

t.test('two gateway processes on one Redis share one budget', async t => {
  const up = await startUpstream(t)
  const yaml = config(up.url, 'redis', 'shared', '{ algorithm: gcra, limit: 50, window: 1h, burst: 50 }')
  const [a, b] = await Promise.all([spawnGateway(t, yaml), spawnGateway(t, yaml)])
  // A spends 30 first: B can then only get what is left of the one budget
  const early = await burst(30, `${a.url}/x`)
  t.equal(count(early, 200), 30)
  const replies = await Promise.all([burst(100, `${a.url}/x`), burst(100, `${b.url}/x`)])
  const admitted = count(replies[0], 200) + count(replies[1], 200)
  t.equal(admitted, 20, `the two concurrent bursts share the 20 left (${count(replies[0], 200)} + ${count(replies[1], 200)})`)
  t.equal(count(replies[0], 429) + count(replies[1], 429), 180)
  t.equal(up.requests, 50, 'the upstream saw exactly 50 requests in all')
  const more = await Promise.all([burst(5, `${a.url}/x`), burst(5, `${b.url}/x`)])
  t.equal(count(more[0], 429) + count(more[1], 429), 10, 'the shared budget is spent for both')
})
