// Issue 7 item 2: a reload is a transaction. A reload that failed late (in identity or in the
// route table) had already set the live Redis client's timeout to the new file's value, so the
// rejected file changed how the running config treats a slow Redis. Real Redis, real gateway:
// after the rejected reload, a Redis that hangs must still cost the old timeout (onError: deny ->
// 503 at once), not the rejected file's 10 s (the request would wait for Redis and pass).
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { metric, send } from './helpers/ratelimit.js'

function config (upstream: string, redisUrl: string, timeout: string, extra = { identity: 'identity: { header: x-user-id }', path: 'pathPrefix: /' }): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redisUrl}, timeout: ${timeout}, onError: deny }
${extra.identity}
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: r
    ${extra.path}
    upstream: backend
    limits:
      user: { limit: 1000, window: 1m }
`
}

const LATE_FAILURES = [
  // compileIdentity refuses a secret shorter than the hash (RFC 7518 §3.2): found after the limiter was built
  { what: 'identity', extra: { identity: 'identity: { jwt: { secret: too-short } }', path: 'pathPrefix: /' }, located: /:4:\d+ identity\.jwt: jwt\.secret must be at least 32 bytes/ },
  // the route table refuses a path that is not in normal form: it was compiled last
  { what: 'route table', extra: { identity: 'identity: { header: x-user-id }', path: 'pathPrefix: /a/../b/' }, located: /:9:\d+ routes\[0\]\.pathPrefix: path "\/a\/\.\.\/b\/" is not in normal form/ }
]

for (const failure of LATE_FAILURES) {
  t.test(`a reload rejected in ${failure.what} compilation leaves the live Redis timeout as it was`, async t => {
    const redis = await startRedis(t)
    const up = await startUpstream(t)
    const gw = await startGateway(t, config(up.url, redis.url, '100ms'))
    const runtime = gw.runtime
    if (runtime === null) throw new Error('no runtime')
    t.equal((await send(`${gw.url}/x`, { headers: { 'x-user-id': 'warmup' } })).status, 200, 'Redis answers: admitted')

    writeFileSync(runtime.file, config(up.url, redis.url, '10s', failure.extra))
    const result = await gw.reload()
    t.equal(result.ok, false, 'the reload is rejected')
    t.match(result.ok ? '' : result.error, failure.located, 'located in the file')
    t.equal(gw.runtime?.generation, 1, 'generation 1 keeps serving')
    const shown = await (await fetch(`${gw.adminUrl}/config`)).json() as { generation: number, config: { redis: { timeout: string } } }
    t.equal(shown.config.redis.timeout, '100ms', '/config still shows the timeout in force')

    // Redis hangs for 3 s: with the 100 ms timeout in force the gateway gives up on it and
    // onError: deny answers 503 at once; the rejected file's 10 s would wait and admit (200).
    await redis.client().call('CLIENT', 'PAUSE', '3000', 'ALL')
    const reply = await send(`${gw.url}/x`, { headers: { 'x-user-id': 'alice' } })
    t.equal(reply.status, 503, 'the old timeout decides: Redis given up on, onError deny')
    t.equal(reply.json?.error, 'GW_ERR_LIMITER_UNAVAILABLE')
    t.ok(await metric(gw.adminUrl, 'gateway_redis_errors_total', { kind: 'timeout' }) >= 1, 'counted as a Redis timeout')
  })
}
