// The admin page's data through the front door: the page and its assets under a strict CSP, the
// compiled routes, the live event stream counting what the gateway decided, its bounded
// subscribers, the reload history, and the workers primary summing its workers.
import t from 'tap'
import { request, Agent } from 'undici'
import { writeFileSync } from 'node:fs'
import net from 'node:net'
import { once } from 'node:events'
import { startGateway, spawnGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { startRedis } from './helpers/redis.js'
import { SpaceSaving, latencyBucket, bucketUpperMs } from '../src/admin/live-stats.js'
import { LiveFeed, type LiveUpdate } from '../src/admin/live-feed.js'
import type { Teardown } from './helpers/teardown.js'

// Token buckets, not fixed windows: a fixed window is aligned on the epoch, and a run across the
// top of the hour would see a fresh window where /events asserts 5 admitted and 7 refused.
const config = (upstreamUrl: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstreamUrl}] }
routes:
  - name: api
    pathPrefix: /api/
    upstream: backend
    limits:
      ip: { algorithm: token-bucket, limit: 5, window: 1h }
  - { name: rest, pathPrefix: /, upstream: backend, concurrency: { route: 50 } }
`

/** Reads an event stream; `events` fills as they arrive. */
async function subscribe (t: Teardown, url: string): Promise<{ status: number, events: Array<{ event: string, data: unknown }>, close: () => void, body: string }> {
  const controller = new AbortController()
  const res = await fetch(url, { signal: controller.signal })
  const events: Array<{ event: string, data: unknown }> = []
  const out = { status: res.status, events, close: () => controller.abort(), body: '' }
  t.teardown(() => controller.abort())
  if (res.status !== 200) {
    out.body = await res.text()
    return out
  }
  const reader = res.body!.getReader()
  const decoder = new TextDecoder()
  let buf = ''
  void (async () => {
    try {
      for (;;) {
        const { done, value } = await reader.read()
        if (done) return
        buf += decoder.decode(value, { stream: true })
        let end
        while ((end = buf.indexOf('\n\n')) !== -1) {
          const block = buf.slice(0, end)
          buf = buf.slice(end + 2)
          const event = /^event: (.*)$/m.exec(block)?.[1] ?? 'message'
          const data = /^data: (.*)$/m.exec(block)?.[1]
          if (data !== undefined) events.push({ event, data: JSON.parse(data) })
        }
      }
    } catch { /* aborted */ }
  })()
  return out
}

async function until<T> (what: string, probe: () => T | undefined, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = probe()
    if (v !== undefined) return v
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 50))
  }
}

const updates = (events: Array<{ event: string, data: unknown }>): LiveUpdate[] =>
  events.filter(e => e.event === 'update').map(e => e.data as LiveUpdate)

t.test('the page and its assets: a strict Content-Security-Policy, nothing from another origin', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  const page = await fetch(`${gw.adminUrl}/`)
  t.equal(page.status, 200)
  t.match(page.headers.get('content-type'), /^text\/html/)
  const csp = page.headers.get('content-security-policy') ?? ''
  t.match(csp, /default-src 'none'/)
  t.match(csp, /script-src 'self'(;|$)/, 'scripts from this listener only, never inline')
  t.match(csp, /connect-src 'self'/)
  t.equal(page.headers.get('x-content-type-options'), 'nosniff')
  const html = await page.text()
  t.notMatch(html, /(src|href)="(https?:)?\/\//, 'no asset from another origin')
  t.notMatch(html, /<script>|<style>|\sstyle="|\son[a-z]+="/, 'nothing inline for the CSP to refuse')
  for (const asset of ['/ui/app.js', '/ui/app.css']) {
    const res = await fetch(gw.adminUrl + asset)
    t.equal(res.status, 200, asset)
    t.equal(res.headers.get('content-security-policy'), csp)
    t.ok((await res.text()).length > 500)
  }
  t.equal(upstream.log.length, 0, 'the page is the admin listener\'s, never proxied')
})

t.test('/routes: every route as the compiled runtime sees it, with its limits and concurrency limits', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  const res = await fetch(`${gw.adminUrl}/routes`)
  t.equal(res.status, 200)
  const body = await res.json() as { generation: number, routes: Array<{ name: string, match: Record<string, unknown>, upstream: { name: string, targets: string[] }, limits: Array<Record<string, unknown>> }> }
  t.equal(body.generation, 1)
  t.same(body.routes.map(r => r.name), ['api', 'rest'])
  const api = body.routes[0]!
  t.same(api.match, { host: null, path: null, pathPrefix: '/api/', methods: null, websocket: false })
  t.same(api.upstream, { name: 'backend', targets: [upstream.url] })
  t.match(api.limits, [{ name: 'api.ip', dimension: 'ip', algorithm: 'token-bucket', limit: 5, windowMs: 3_600_000, cost: 1, shadow: false, onError: 'local', status: 429 }])
  t.match(body.routes[1]!.limits, [{ name: 'rest.concurrency.route', dimension: 'route', algorithm: 'lease', limit: 50, concurrency: true }], 'concurrency limits too')
  t.equal(body.routes[1]!.limits.length, 1)
})

t.test('/events: the history at once, then each second what the gateway counted and who it rejected', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  const stream = await subscribe(t, `${gw.adminUrl}/events`)
  t.equal(stream.status, 200)
  const history = await until('the history event', () => stream.events.find(e => e.event === 'history'))
  t.match(history.data, { history: Array, top: [], health: { status: 'ready', generation: 1, redis: { state: 'not_configured' } } })
  const statuses: number[] = []
  for (let i = 0; i < 12; i++) statuses.push((await request(`${gw.url}/api/x`)).statusCode)
  for (let i = 0; i < 3; i++) statuses.push((await request(`${gw.url}/other`)).statusCode)
  t.same(statuses, [200, 200, 200, 200, 200, 429, 429, 429, 429, 429, 429, 429, 200, 200, 200])
  // the requests may straddle a second: sum the updates until every request is accounted for
  const sums = await until('every request in the updates', () => {
    let api = 0; let rest = 0; let allowed = 0; let rejected = 0; let s4 = 0
    for (const u of updates(stream.events)) {
      api += u.routes.api?.rps ?? 0
      rest += u.routes.rest?.rps ?? 0
      s4 += u.routes.api?.s4 ?? 0
      allowed += u.decisions.api?.ip?.[0] ?? 0
      rejected += u.decisions.api?.ip?.[1] ?? 0
    }
    return api + rest === 15 ? { api, rest, allowed, rejected, s4 } : undefined
  })
  t.same(sums, { api: 12, rest: 3, allowed: 5, rejected: 7, s4: 7 })
  const last = updates(stream.events).at(-1)!
  t.same(last.top, [['ip 127.0.0.1', 7]], 'the rejected client, counted over the last minute')
  const withLatency = updates(stream.events).find(u => (u.routes.api?.rps ?? 0) > 0)!
  t.ok(withLatency.routes.api!.p50! > 0 && withLatency.routes.api!.p99! >= withLatency.routes.api!.p50!, 'p50 <= p99, both measured')
  t.match(last.health, { upstreams: { backend: [{ url: upstream.url, healthy: true }] }, reloads: [] })
})

t.test('/events: at most 16 subscribers; the next gets 503 GW_ERR_ADMIN_BUSY until one leaves', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  const open = []
  for (let i = 0; i < 16; i++) open.push(await subscribe(t, `${gw.adminUrl}/events`))
  t.same(open.map(s => s.status), Array(16).fill(200))
  const refused = await subscribe(t, `${gw.adminUrl}/events`)
  t.equal(refused.status, 503)
  t.match(JSON.parse(refused.body), { error: 'GW_ERR_ADMIN_BUSY' })
  open[0]!.close()
  let again = refused
  for (let i = 0; i < 100 && again.status !== 200; i++) {
    await new Promise(resolve => setTimeout(resolve, 50))
    again = await subscribe(t, `${gw.adminUrl}/events`)
  }
  t.equal(again.status, 200, 'a subscriber that left frees its place')
})

t.test('HEAD /events gets the stream\'s head at once and holds no place', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  // more than the 16 places: each subscribed HEAD held one and was never answered
  for (let i = 0; i < 20; i++) {
    const head = await fetch(`${gw.adminUrl}/events`, { method: 'HEAD', signal: AbortSignal.timeout(10_000) })
    t.equal(head.status, 200, `HEAD ${i}: answered`)
    t.equal(head.headers.get('content-type'), 'text/event-stream; charset=utf-8')
  }
  const streams = []
  for (let i = 0; i < 16; i++) streams.push(await subscribe(t, `${gw.adminUrl}/events`))
  t.same(streams.map(s => s.status), Array(16).fill(200), 'all 16 places are free for the page')
})

t.test('/events pipelined behind another stream is not subscribed: clients that leave free every place', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  const port = Number(new URL(gw.adminUrl).port)
  // more connections than places (16), each with a second stream pipelined behind the first
  for (let i = 0; i < 20; i++) {
    const socket = net.connect(port, '127.0.0.1')
    socket.write('GET /events HTTP/1.1\r\nHost: localhost\r\n\r\nGET /events HTTP/1.1\r\nHost: localhost\r\n\r\n')
    const [first] = await once(socket, 'data') as [Buffer]
    t.match(first.toString('latin1'), /^HTTP\/1\.1 200 /, `connection ${i}: its first stream is served`)
    socket.destroy()
    await once(socket, 'close')
  }
  // every place is free again once the closes are seen: 16 new subscribers are served
  let statuses: number[] = []
  for (let attempt = 0; attempt < 50; attempt++) {
    const streams = []
    for (let i = 0; i < 16; i++) streams.push(await subscribe(t, `${gw.adminUrl}/events`))
    statuses = streams.map(s => s.status)
    for (const s of streams) s.close()
    if (statuses.every(s => s === 200)) break
    await new Promise(resolve => setTimeout(resolve, 100))
  }
  t.same(statuses, Array(16).fill(200), 'all 16 places are free (the pipelined streams held 15 of them for good before)')
})

t.test('/events: a rejected reload shows in the health with its located errors; the old config serves', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url))
  const stream = await subscribe(t, `${gw.adminUrl}/events`)
  const file = gw.runtime!.file
  writeFileSync(file, config(upstream.url).replace('limit: 5,', 'limit: five,'))
  const result = await gw.reload()
  t.equal(result.ok, false)
  const reloads = await until('the reload in the health', () => {
    const r = (updates(stream.events).at(-1)?.health as { reloads?: Array<{ ok: boolean, problems: string[] }> } | undefined)?.reloads
    return r !== undefined && r.length > 0 ? r : undefined
  })
  t.equal(reloads.length, 1)
  t.equal(reloads[0]!.ok, false)
  t.match(reloads[0]!.problems.join('\n'), /gateway\.yaml:10:\d+ routes\[0\]\.limits\.ip\.limit/)
  t.equal((await request(`${gw.url}/other`)).statusCode, 200, 'the running configuration keeps serving')
})

t.test('workers: 2: the primary\'s page sums both workers', async t => {
  const upstream = await startUpstream(t)
  const redis = await startRedis(t)
  const gw = await spawnGateway(t, `workers: 2
redis: { url: ${redis.url} }
${config(upstream.url)}`)
  const primary = await gw.waitForLog(l => l.msg === 'gateway primary started', 30_000)
  const adminUrl = `http://127.0.0.1:${primary.adminPort as number}`
  for (let i = 0; i < 200 && (await fetch(`${adminUrl}/readyz`)).status !== 200; i++) await new Promise(resolve => setTimeout(resolve, 50))
  const stream = await subscribe(t, `${adminUrl}/events`)
  t.equal(stream.status, 200)
  // a new connection per request: node:cluster hands connections to the workers in turn
  const agent = new Agent({ pipelining: 0, keepAliveTimeout: 1 })
  t.teardown(() => agent.close())
  for (let i = 0; i < 40; i++) {
    const res = await request(`${gw.url}/other`, { dispatcher: agent, headers: { connection: 'close' } })
    await res.body.dump()
  }
  const total = await until('40 requests summed over the workers', () => {
    const n = updates(stream.events).reduce((sum, u) => sum + (u.routes.rest?.rps ?? 0), 0)
    return n >= 40 ? n : undefined
  }, 20_000)
  t.equal(total, 40)
  // each worker writes its access lines in batches (up to 100 ms later): wait for the 40
  const pids = await until('40 access lines', () => {
    const lines = gw.logs.filter(l => l.msg === 'request' && l.path === '/other')
    return lines.length >= 40 ? new Set(lines.map(l => l.pid)) : undefined
  })
  t.equal(pids.size, 2, 'both workers served requests')
  t.match(updates(stream.events).at(-1)!.health, { workers: 2, workersReady: 2, status: 'ready' })
  const routes = await (await fetch(`${adminUrl}/routes`)).json() as { routes: Array<{ name: string }> }
  t.same(routes.routes.map(r => r.name), ['api', 'rest'], 'the workers\' compiled routes')
})

t.test('top limited clients: bounded whatever the number of clients, heavy hitters kept', async t => {
  const sketch = new SpaceSaving(64)
  for (let i = 0; i < 100_000; i++) {
    sketch.add(`ip 10.0.${i >> 8 & 255}.${i & 255}-${i}`)
    if (i % 100 === 0) sketch.add('ip 203.0.113.9', 2)
  }
  t.equal(sketch.size, 64, 'never more than its capacity')
  const [first] = sketch.top(1)
  t.equal(first![0], 'ip 203.0.113.9')
  // overestimated by at most the smallest counter it displaced; never underestimated
  t.ok(first![1] >= 2000, `count ${first![1]} >= the 2000 it got`)
})

t.test('latency percentiles from the summed histograms', async t => {
  t.ok(bucketUpperMs(latencyBucket(3)) >= 3 && bucketUpperMs(latencyBucket(3)) < 3 * 1.25 + 1e-9, 'a bucket holds its value within 25%')
  const feed = new LiveFeed(() => null, () => ({}))
  const lat = (ms: number, n: number): [number, number] => [latencyBucket(ms), n]
  feed.ingest({ routes: { a: { n: 98, s4: 0, s5: 0, lat: [lat(2, 98)] } }, decisions: {}, rejected: [] })
  feed.ingest({ routes: { a: { n: 2, s4: 1, s5: 1, lat: [lat(400, 2)] } }, decisions: {}, rejected: [['ip x', 3]] })
  const u = feed.tick(1000)
  t.equal(u.routes.a!.rps, 100)
  t.ok(u.routes.a!.p50! >= 2 && u.routes.a!.p50! < 2.5, `p50 ${u.routes.a!.p50} ms`)
  t.ok(u.routes.a!.p99! >= 400 && u.routes.a!.p99! < 500, `p99 ${u.routes.a!.p99} ms`)
  t.same([u.routes.a!.s4, u.routes.a!.s5], [1, 1])
  t.same(u.top, [['ip x', 3]])
  t.same(feed.tick(2000).routes, {}, 'each second starts empty')
})
