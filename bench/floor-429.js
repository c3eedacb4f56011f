// The floor of a rejection in Node: node:http answering every request with the gateway's 429
// (the same status, headers and JSON body size), no routing, no limiter, no metrics. What the
// flood's rejection cost at saturation is compared with (issue 13 item 5).
// Usage: node bench/floor-429.js <port>
import http from 'node:http'
import { randomUUID } from 'node:crypto'

const port = Number(process.argv[2] ?? 8082)
const server = http.createServer((req, res) => {
  if (req.url === '/ready') return res.end('ok')
  const requestId = randomUUID()
  const body = JSON.stringify({ error: 'rate_limited', message: 'rate limit exceeded', dimension: 'local', limit: 'local', retryAfterMs: 1000, requestId })
  res.statusCode = 429
  res.setHeader('content-type', 'application/json; charset=utf-8')
  res.setHeader('content-length', Buffer.byteLength(body))
  res.setHeader('x-request-id', requestId)
  res.setHeader('ratelimit-policy', '"local";q=200;w=1')
  res.setHeader('ratelimit', '"local";r=0;t=1')
  res.setHeader('retry-after', '1')
  res.end(body)
})
server.keepAliveTimeout = 60_000
server.listen(port, '127.0.0.1')
process.on('SIGTERM', () => server.close(() => process.exit(0)))
