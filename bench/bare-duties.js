// The bare proxy (bare-proxy.js) plus the per-request duties the gateway has whatever its config,
// written as plainly as node:http and undici allow: a request id (echoed to the client), a W3C
// traceparent for the upstream, X-Forwarded-For/-Proto/-Host, forgeable client headers removed,
// a request counter, a duration histogram and an in-flight gauge, and a close listener per
// response. No routing, no limits, no access log. Its cost over the bare proxy is what those
// duties cost on their own: the part of the gateway (c)'s ratio no limiter work can remove.
// Usage: node bench/bare-duties.js <port> <upstream-origin>
import http from 'node:http'
import { randomFillSync, randomUUID } from 'node:crypto'
import { Pool } from 'undici'

const port = Number(process.argv[2] ?? 8082)
const pool = new Pool(process.argv[3] ?? 'http://127.0.0.1:3000', { connections: 128, pipelining: 1, keepAliveTimeout: 60_000 })
const hopByHop = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'host'])
// What the gateway sets itself, or drops from a client that is not a trusted proxy.
const replaced = new Set([...hopByHop, 'expect', 'x-forwarded-for', 'x-forwarded-proto', 'x-forwarded-host', 'x-request-id', 'traceparent',
  'forwarded', 'x-real-ip', 'true-client-ip', 'x-client-ip', 'cf-connecting-ip', 'fastly-client-ip', 'x-cluster-client-ip',
  'x-forwarded-port', 'x-forwarded-prefix', 'x-forwarded-server', 'x-forwarded-scheme', 'x-forwarded-ssl', 'front-end-https',
  'x-original-url', 'x-rewrite-url'])

const TRACEPARENT_RE = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/
const random = Buffer.alloc(4096)
let offset = random.length
/** @param {number} bytes */
function randomHex (bytes) {
  if (offset + bytes > random.length) { randomFillSync(random); offset = 0 }
  const hex = random.toString('hex', offset, offset + bytes)
  offset += bytes
  return hex
}

/** @param {string | string[] | undefined} incoming */
function traceparentFor (incoming) {
  const m = typeof incoming === 'string' ? TRACEPARENT_RE.exec(incoming) : null
  return `00-${m === null ? randomHex(16) : m[2]}-${randomHex(8)}-${m === null ? '01' : m[4]}`
}

// Metrics as plain counters keyed by method and status, a histogram's buckets and a gauge.
const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
/** @type {Map<string, number>} */
const requests = new Map()
const histogram = { counts: new Array(BUCKETS.length + 1).fill(0), sum: 0 }
let inflight = 0

/** @param {string} method @param {number} status @param {number} seconds */
function countRequest (method, status, seconds) {
  const key = method + ' ' + status
  requests.set(key, (requests.get(key) ?? 0) + 1)
  let i = 0
  while (i < BUCKETS.length && seconds > /** @type {number} */ (BUCKETS[i])) i++
  histogram.counts[i]++
  histogram.sum += seconds
}

const server = http.createServer((req, res) => {
  const started = performance.now()
  const requestId = randomUUID()
  inflight++
  res.on('close', () => {
    inflight--
    countRequest(req.method ?? 'GET', res.statusCode, (performance.now() - started) / 1e3)
  })
  const incoming = req.headers
  /** @type {string[]} */
  const headers = incoming.host === undefined ? [] : ['host', incoming.host]
  for (const name in incoming) {
    if (replaced.has(name)) continue
    const value = incoming[name]
    if (typeof value === 'string') headers.push(name, value)
    else if (value !== undefined) for (const item of value) headers.push(name, item)
  }
  const peer = req.socket.remoteAddress ?? ''
  headers.push('x-forwarded-for', peer.startsWith('::ffff:') ? peer.slice(7) : peer, 'x-forwarded-proto', 'http')
  if (incoming.host !== undefined) headers.push('x-forwarded-host', incoming.host)
  headers.push('x-request-id', requestId, 'traceparent', traceparentFor(incoming.traceparent))
  const hasBody = req.method !== 'GET' && req.method !== 'HEAD'
  pool.stream({ path: req.url ?? '/', method: /** @type {import('undici').Dispatcher.HttpMethod} */ (req.method), headers, body: hasBody ? req : null },
    ({ statusCode, headers: upstreamHeaders }) => {
      for (const name of hopByHop) delete upstreamHeaders[name]
      upstreamHeaders['x-request-id'] = requestId
      res.writeHead(statusCode, /** @type {http.OutgoingHttpHeaders} */ (upstreamHeaders))
      return res
    },
    (err) => {
      if (err === null) return
      if (res.headersSent) res.destroy(err)
      else res.writeHead(502, { 'content-type': 'text/plain' }).end('bad gateway\n')
    })
})
server.keepAliveTimeout = 120_000
server.listen(port, '127.0.0.1', () => console.log(`bare proxy with duties listening on 127.0.0.1:${port} (${inflight} in flight)`))
process.on('SIGTERM', () => server.close(() => pool.close().then(() => process.exit(0))))
