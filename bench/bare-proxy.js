// The floor of any undici-based proxy: node:http in front of an undici Pool, no routing, no limits.
// Usage: node bench/bare-proxy.js <port> <upstream-origin>
import http from 'node:http'
import { Pool } from 'undici'

const port = Number(process.argv[2] ?? 8081)
const pool = new Pool(process.argv[3] ?? 'http://127.0.0.1:3000', { connections: 128, pipelining: 1, keepAliveTimeout: 60_000 })
// RFC 9110 §7.6.1: connection-specific fields are not forwarded (host is set by undici from the origin).
const hopByHop = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'host'])

const server = http.createServer((req, res) => {
  /** @type {Record<string, string | string[]>} */
  const headers = {}
  for (const [name, value] of Object.entries(req.headers)) if (value !== undefined && !hopByHop.has(name)) headers[name] = value
  const hasBody = req.method !== 'GET' && req.method !== 'HEAD'
  pool.stream({ path: req.url ?? '/', method: /** @type {import('undici').Dispatcher.HttpMethod} */ (req.method), headers, body: hasBody ? req : null },
    ({ statusCode, headers: upstreamHeaders }) => {
      for (const name of hopByHop) delete upstreamHeaders[name]
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
server.listen(port, '127.0.0.1', () => console.log(`bare proxy listening on 127.0.0.1:${port}`))
process.on('SIGTERM', () => server.close(() => pool.close().then(() => process.exit(0))))
