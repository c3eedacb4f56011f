// The peer contender of `npm run bench` (issue 13): what a Node user would pick instead of the
// gateway. fastify 5 + @fastify/http-proxy (undici, keep-alive), optionally with
// @fastify/rate-limit on Redis: one limit keyed by the X-User-Id header (the gateway's contender
// (e) has four), never rejecting, so both do a Redis round trip per request and forward it.
// Usage: node bench/peer/fastify-proxy.js <port> <upstream-origin> [redis-url]
import Fastify from 'fastify'
import proxy from '@fastify/http-proxy'
import rateLimit from '@fastify/rate-limit'
import { Redis } from 'ioredis'

const port = Number(process.argv[2])
const upstream = process.argv[3] ?? 'http://127.0.0.1:3000'
const redisUrl = process.argv[4]

const app = Fastify({ logger: false })
let redis = null
if (redisUrl !== undefined) {
  redis = new Redis(redisUrl, { connectTimeout: 500, maxRetriesPerRequest: 1 })
  await app.register(rateLimit, {
    global: true,
    max: 1_000_000_000,
    timeWindow: 60_000,
    redis,
    nameSpace: 'bench-peer:',
    keyGenerator: (req) => String(req.headers['x-user-id'] ?? req.ip)
  })
}
await app.register(proxy, { upstream, prefix: '/', http: undefined, undici: { connections: 128, pipelining: 1, keepAliveTimeout: 60_000 } })
await app.listen({ port, host: '127.0.0.1' })
console.log(`fastify peer listening on 127.0.0.1:${port}${redis ? ' (rate-limit on Redis)' : ''}`)
process.on('SIGTERM', () => { app.close().then(() => { redis?.disconnect(); process.exit(0) }) })
