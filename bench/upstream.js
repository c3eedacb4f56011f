// The upstream every contender forwards to: node:http answering 200 with a fixed ~100-byte body.
// Kept as plain as possible so that its cost is the same floor under every contender.
// Usage: node bench/upstream.js <port>
import http from 'node:http'
import { Buffer } from 'node:buffer'

const port = Number(process.argv[2] ?? 3000)
const body = Buffer.from(JSON.stringify({ ok: true, service: 'bench-upstream', note: 'x'.repeat(52) }) + '\n')
const headers = { 'content-type': 'application/json', 'content-length': String(body.length) }

const server = http.createServer((req, res) => {
  // Drain any request body so the keep-alive connection can be reused.
  req.resume()
  req.on('end', () => {
    res.writeHead(200, headers)
    res.end(body)
  })
})
// Proxies hold pooled connections open between rounds; node's default 5 s would close them mid-bench.
server.keepAliveTimeout = 120_000
server.headersTimeout = 121_000
server.listen(port, '127.0.0.1', () => console.log(`upstream listening on 127.0.0.1:${port} (${body.length}-byte body)`))

process.on('SIGTERM', () => server.close(() => process.exit(0)))
