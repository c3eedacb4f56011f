// Regression (issue 9's gap): DELETE /limits while Redis is away. The `onError: local` fallback
// limits the client in process then; a reset must free it there too (RedisGuard.forgetFallback),
// answer within a bound even when Redis stalls, and say that the Redis keys were not reset.
import t, { type Test } from 'tap'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { childEnv, startGateway } from './helpers/gateway.js'
import { startRedis, type RedisServer } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { send, type Reply } from './helpers/ratelimit.js'

const TOKEN = 'admin-token-0123456789abcdef'

function config (upstream: string, redisUrl: string): string {
  return `listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0, token: ${TOKEN} }
redis: { url: ${redisUrl}, timeout: 100ms, onError: local }
limits:
  ip: { algorithm: sliding-window-log, limit: 3, window: 1h }
upstreams: { b: { targets: [${upstream}] } }
routes:
  - { name: api, pathPrefix: /, upstream: b }
`
}

/** Limits the client in the fallback, resets it; resolves with the admin address and how long the reset took. */
async function limitedInFallback (t: Test, away: (redis: RedisServer) => Promise<void>): Promise<{ admin: string, waited: number }> {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, redis.url))
  t.equal((await send(`${gw.url}/x`)).status, 200, 'one request decided by Redis')
  await away(redis)
  const statuses: number[] = []
  for (let i = 0; i < 4; i++) statuses.push((await send(`${gw.url}/x`)).status)
  // the fallback starts from what Redis last said was left (2 of 3)
  t.same(statuses, [200, 200, 429, 429], 'Redis away: the fallback admits the rest of the budget, then refuses')
  t.ok(gw.lines.some(l => l.msg === 'rate limiter falling back: Redis unavailable'), 'decided by the fallback')

  const started = Date.now()
  const reset: Reply = await send(`${gw.adminUrl}/limits?route=api&ip=127.0.0.1`, { method: 'DELETE', headers: { authorization: `Bearer ${TOKEN}` } })
  const waited = Date.now() - started
  t.equal(reset.status, 200, 'the reset is done where it can be')
  t.match(reset.json, { complete: false, keysDeleted: null, instances: null, warning: /Redis did not answer .*reset again once Redis is back/ })
  // 1.5 s of slack for a loaded machine: a bound raised to 3 s fails it
  t.ok(waited < 2500, `answered in ${waited} ms, though Redis does not answer (bound 1 s)`)
  t.ok(gw.lines.some(l => l.msg === 'limits reset in this process alone: Redis did not answer'), 'logged as partial')
  const after: number[] = []
  for (let i = 0; i < 4; i++) after.push((await send(`${gw.url}/x`)).status)
  t.same(after, [200, 200, 200, 429], 'the client is admitted again: a whole fallback budget of 3')
  return { admin: gw.adminUrl.replace('http://', ''), waited }
}

t.test('Redis stopped: a client limited by the fallback is freed by a reset; the CLI says it was partial', async t => {
  const { admin } = await limitedInFallback(t, async (redis) => { await redis.kill() })
  const cli = await promisify(execFile)(process.execPath, ['bin/gateway', 'limits', 'reset', '--route', 'api', '--ip', '127.0.0.1', '--admin', admin, '--token', TOKEN], { env: childEnv() })
  t.equal(cli.stdout, 'route api, ip 127.0.0.1: reset ip (Redis keys not deleted, other instances not told)\n')
  t.match(cli.stderr, /^gateway limits reset: warning: Redis did not answer/, 'exit 0, with a warning on stderr')
})

t.test('Redis paused (SIGSTOP): the reset answers within its bound and frees the client', async t => {
  const { waited } = await limitedInFallback(t, async (redis) => {
    const info = await redis.client().info('server')
    const pid = Number(/process_id:(\d+)/.exec(info)?.[1])
    t.ok(pid > 0, 'redis-server pid')
    process.kill(pid, 'SIGSTOP')
    t.teardown(() => { try { process.kill(pid, 'SIGCONT') } catch { /* gone */ } })
  })
  t.ok(waited >= 950, `the reset waited out the 1 s bound on Redis (${waited} ms)`)
})
