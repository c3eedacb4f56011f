// The admin API of issue 9 through real HTTP: GET /limits reads without consuming, DELETE /limits
// resets a client on every instance (Redis keys, local level, deny cache) within a second, only
// with the admin token; GET /consumers/NAME; the `gateway limits` CLI.
import t from 'tap'
import { createHash } from 'node:crypto'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { tempDir } from './helpers/teardown.js'
import { childEnv, startGateway } from './helpers/gateway.js'
import { commandCalls, startRedis } from './helpers/redis.js'
import { startUpstream } from './helpers/upstream.js'
import { eventually, send, type Reply } from './helpers/ratelimit.js'
import { awayFromQuotaEdge } from './helpers/window-edge.js'

const run = promisify(execFile)
const redis = await startRedis(t)
const client = redis.client()

const TOKEN = 'admin-token-0123456789abcdef'

function config (upstream: string, admin: string): string {
  return `listen: "127.0.0.1:0"
admin: ${admin}
redis: { url: ${redis.url}, timeout: 2s, onError: deny }
local: { limit: 4, window: 1h }
identity:
  apiKeys: { header: x-api-key, keys: { k-bob: bob } }
consumers:
  bob: { plan: free }
plans:
  free:
    limits:
      user: { algorithm: sliding-window-log, limit: 100, window: 1h }
      quota: { limit: 1000, period: day }
limits:
  ip: { algorithm: sliding-window-log, limit: 3, window: 1h }
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
}

const WITH_TOKEN = '{ listen: "127.0.0.1:0", token: "${ADMIN_TOKEN}" }'

async function admin (url: string, method = 'GET', token?: string): Promise<Reply> {
  return await send(url, { method, headers: token === undefined ? {} : { authorization: `Bearer ${token}` } })
}

interface LimitEntry { name: string, dimension: string, remaining: number, retryAfterMs: number, deniedMs: number, key: string }
const entry = (r: Reply, name: string): LimitEntry => ((r.json?.limits ?? []) as LimitEntry[]).find(l => l.name === name) as LimitEntry

/** Limit calls (FCALL, EVALSHA) and read-only script calls (the admin API's peek) so far. */
async function evalCalls (): Promise<{ limit: number, readOnly: number }> {
  return { limit: await commandCalls(client, 'evalsha', 'fcall'), readOnly: await commandCalls(client, 'evalsha_ro', 'eval_ro') }
}

t.test('reset unblocks a client on both instances within 1 s (Redis keys, local level, deny cache); reads consume nothing; no token, no change', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const a = await startGateway(t, config(up.url, WITH_TOKEN), { ADMIN_TOKEN: TOKEN })
  const b = await startGateway(t, config(up.url, WITH_TOKEN), { ADMIN_TOKEN: TOKEN })
  const statuses = async (gw: { url: string }, n: number): Promise<number[]> => {
    const out: number[] = []
    for (let i = 0; i < n; i++) out.push((await send(`${gw.url}/x`)).status)
    return out
  }
  t.same(await statuses(a, 3), [200, 200, 200], 'the ip limit: 3 an hour')
  const onA = await send(`${a.url}/x`)
  t.equal(onA.json?.limit, 'ip', 'A: the 4th is rejected by Redis (and deny-cached)')
  t.equal((await send(`${a.url}/x`)).json?.limit, 'local', 'A: the 5th by the local level (4 an hour)')
  t.same(await statuses(b, 2), [429, 429], 'B: rejected too')

  const limitsUrl = (gw: { adminUrl: string }): string => `${gw.adminUrl}/limits?route=api&ip=127.0.0.1`
  const callsBefore = await evalCalls()
  const read1 = await admin(limitsUrl(a))
  const read2 = await admin(limitsUrl(a))
  const callsAfter = await evalCalls()
  t.equal(read1.status, 200)
  const budget = (r: Reply): unknown => (r.json?.limits as LimitEntry[]).map(l => [l.name, l.key, l.remaining])
  t.same(budget(read1), budget(read2), 'reading twice reads the same budget: nothing consumed')
  const ip = entry(read1, 'ip')
  t.match(ip, { dimension: 'ip', remaining: 0, key: 'gw:' + ip.key.slice(3) })
  t.ok(ip.retryAfterMs > 3_500_000, `limited for about an hour (${ip.retryAfterMs} ms)`)
  t.ok(ip.deniedMs > 0, 'A holds the client in its deny cache')
  t.ok(entry(await admin(limitsUrl(b)), 'ip').deniedMs > 0, 'so does B')
  t.equal(await client.zcard(ip.key), 3, 'the log still holds exactly the 3 admitted requests')
  t.equal(callsAfter.limit, callsBefore.limit, 'no limit call (FCALL or EVALSHA) was made by the reads')
  t.ok(callsAfter.readOnly > callsBefore.readOnly, 'the reads ran read-only scripts')
  t.same((read1.json?.limits as LimitEntry[]).map(l => l.name), ['local', 'ip', 'identity.failures'], 'anonymous: the local level, the ip limit and the failed-identity budget')
  // the local level (4 an hour) is each instance's own: A took 4 tokens, B 2
  const localA = entry(read1, 'local')
  t.match(localA, { dimension: 'ip', algorithm: 'token-bucket', limit: 4, windowMs: 3_600_000, scope: 'instance', key: 'local:127.0.0.1', remaining: 0, deniedMs: 0 }, 'A\'s bucket is empty')
  t.ok(localA.retryAfterMs > 850_000 && localA.retryAfterMs <= 900_000, `a token comes back every 15 min (${localA.retryAfterMs} ms)`)
  const localB = async (): Promise<number> => entry(await admin(limitsUrl(b)), 'local').remaining
  t.same([await localB(), await localB()], [2, 2], 'B\'s holds 2, read twice: nothing taken')
  t.match(entry(read1, 'identity.failures'), { remaining: 10, resetMs: 0, retryAfterMs: 0 }, 'an untouched budget: whole, nothing to wait for')

  const noToken = await admin(limitsUrl(a), 'DELETE')
  t.equal(noToken.status, 401)
  t.equal(noToken.json?.error, 'GW_ERR_ADMIN_UNAUTHORIZED')
  const wrong = await admin(limitsUrl(a), 'DELETE', TOKEN + 'x')
  t.equal(wrong.status, 401, 'a wrong token is refused')
  t.equal(await client.zcard(ip.key), 3, 'nothing was reset')
  t.equal((await send(`${a.url}/x`)).status, 429, 'A still refuses the client')
  t.equal((await send(`${b.url}/x`)).status, 429, 'B still refuses the client')

  const reset = await admin(limitsUrl(a), 'DELETE', TOKEN)
  const resetAt = Date.now()
  t.equal(reset.status, 200)
  t.same(reset.json?.reset, [{ name: 'ip', dimension: 'ip', key: ip.key }, { name: 'identity.failures', dimension: 'ip', key: entry(read1, 'identity.failures').key }])
  t.equal(reset.json?.instances, 2, 'both instances received the reset')
  t.equal(await client.exists(ip.key), 0, 'the Redis key is gone')
  t.equal((await send(`${a.url}/x`)).status, 200, 'A admits the client at once (local level and deny cache reset)')
  await eventually('B admits the client again', async () => (await send(`${b.url}/x`)).status === 200, 1000, 20)
  t.ok(Date.now() - resetAt < 1000, `within 1 s (${Date.now() - resetAt} ms)`)
  t.equal(entry(await admin(limitsUrl(b)), 'ip').remaining, 1, 'a fresh budget: 3 minus the two just admitted')
  t.equal(entry(await admin(limitsUrl(a)), 'local').remaining, 3, 'A\'s local bucket was refilled by the reset: 4 minus the one admitted since')

  const line = a.lines.find(l => l.msg === 'limits reset')
  t.match(line, { by: createHash('sha256').update(TOKEN).digest('hex').slice(0, 12), route: 'api', ip: '127.0.0.1', limits: ['ip', 'identity.failures'], instances: 2 }, 'the reset is logged with who (token hash prefix) and what')
  t.notOk(JSON.stringify(a.lines).includes(TOKEN), 'the token itself is never logged')
})

t.test('without a configured admin.token, DELETE /limits answers 403 and says why', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, '127.0.0.1:0'))
  for (let i = 0; i < 4; i++) await send(`${gw.url}/x`)
  const r = await admin(`${gw.adminUrl}/limits?route=api&ip=127.0.0.1`, 'DELETE', TOKEN)
  t.equal(r.status, 403)
  t.equal(r.json?.error, 'GW_ERR_ADMIN_FORBIDDEN')
  t.match(r.json?.message, /no admin\.token is configured/)
  t.equal((await send(`${gw.url}/x`)).status, 429, 'nothing was reset')
  t.equal((await admin(`${gw.adminUrl}/limits?route=api&ip=127.0.0.1`)).status, 200, 'reads need no token')
  t.equal((await admin(`${gw.adminUrl}/limits?route=nope&ip=127.0.0.1`)).json?.message, 'unknown route "nope"')
  t.equal((await admin(`${gw.adminUrl}/limits?route=api&ip=not-an-ip`)).status, 400)
})

t.test('GET /consumers/NAME: plan, effective limits per route, quota used and when it resets', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, WITH_TOKEN), { ADMIN_TOKEN: TOKEN })
  // the quota is a calendar day in UTC: used 2 and the midnight it resets at hold within one day
  await awayFromQuotaEdge('day', 30_000)
  await send(`${gw.url}/x`, { headers: { 'x-api-key': 'k-bob' } })
  await send(`${gw.url}/x`, { headers: { 'x-api-key': 'k-bob' } })
  const r = await admin(`${gw.adminUrl}/consumers/bob`)
  t.equal(r.status, 200)
  const midnight = new Date((Math.floor(Date.now() / 86_400_000) + 1) * 86_400_000).toISOString()
  t.match(r.json, {
    consumer: 'bob',
    plan: 'free',
    planFrom: 'consumers',
    routes: { api: { auth: 'optional', limits: [{ name: 'free:user', limit: 100 }, { name: 'free:quota', period: 'day', limit: 1000 }] } },
    quota: { name: 'free:quota', limit: 1000, used: 2, remaining: 998, resetsAt: midnight }
  })
  const user = await admin(`${gw.adminUrl}/limits?route=api&ip=127.0.0.1&user=bob`)
  t.same((user.json?.limits as LimitEntry[]).map(l => l.name), ['local', 'ip', 'free:user', 'free:quota', 'identity.failures'], 'with a user: the plan\'s limits too')
  t.equal(entry(user, 'free:quota').remaining, 998)
  t.equal((await admin(`${gw.adminUrl}/consumers/nobody`)).json?.plan, null, 'no entry and no defaultPlan: no plan')
  const asPlan = await admin(`${gw.adminUrl}/limits?route=api&user=zed&plan=free`)
  t.same((asPlan.json?.limits as LimitEntry[]).map(l => l.name), ['free:user', 'free:quota'], 'plan=P: the limits of that plan, for a plan only a token could name')
  t.equal((await admin(`${gw.adminUrl}/limits?route=api&user=zed&plan=gold`)).json?.message, 'unknown plan "gold"')
  const shown = await admin(`${gw.adminUrl}/config`)
  t.same((shown.json?.config as { admin: unknown }).admin, { listen: '127.0.0.1:0', token: '[redacted]', reads: 'open' }, '/config never shows the admin token')
})

t.test('gateway limits get|reset calls the admin API', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, WITH_TOKEN), { ADMIN_TOKEN: TOKEN })
  for (let i = 0; i < 4; i++) await send(`${gw.url}/x`)
  const adminAddr = gw.adminUrl.replace('http://', '')
  const cli = async (args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number, stdout: string, stderr: string }> => {
    try {
      const { stdout, stderr } = await run(process.execPath, ['bin/gateway', 'limits', ...args, '--admin', adminAddr], { env: childEnv(env) })
      return { code: 0, stdout, stderr }
    } catch (err) {
      const e = err as { code: number, stdout: string, stderr: string }
      return { code: e.code, stdout: e.stdout, stderr: e.stderr }
    }
  }
  const get = await cli(['get', '--route', 'api', '--ip', '127.0.0.1'])
  t.equal(get.code, 0, get.stderr)
  t.match(get.stdout, /route api, ip 127\.0\.0\.1: 3 limit\(s\)\n {2}local \(ip, token-bucket\) remaining 0\/4, reset in \d+ ms, limited, retry in \d+ ms {2}local:127\.0\.0\.1\n {2}ip \(ip, sliding-window-log\) remaining 0\/3, reset in \d+ ms, limited, retry in \d+ ms, deny-cached \d+ ms here {2}gw:/)
  const refused = await cli(['reset', '--route', 'api', '--ip', '127.0.0.1'], { GATEWAY_ADMIN_TOKEN: 'wrong-token-wrong-token' })
  t.equal(refused.code, 1)
  t.match(refused.stderr, /401 GW_ERR_ADMIN_UNAUTHORIZED/)
  t.equal((await send(`${gw.url}/x`)).status, 429, 'a refused reset changed nothing')
  const reset = await cli(['reset', '--route', 'api', '--ip', '127.0.0.1'], { GATEWAY_ADMIN_TOKEN: TOKEN })
  t.equal(reset.code, 0, reset.stderr)
  t.match(reset.stdout, /route api, ip 127\.0\.0\.1: reset ip, identity\.failures \(1 key\(s\) deleted, 1 instance\(s\) notified\)/)
  t.equal((await send(`${gw.url}/x`)).status, 200, 'the client is admitted again')
  t.equal((await cli(['get'])).code, 2, 'usage error without --route')
  const asPlan = await cli(['get', '--route', 'api', '--user', 'zed', '--plan', 'free', '--json'])
  t.equal(asPlan.code, 0, asPlan.stderr)
  t.same((JSON.parse(asPlan.stdout) as { limits: LimitEntry[] }).limits.map(l => l.name), ['free:user', 'free:quota'], '--plan P: the limits of that plan')
  const unknownPlan = await cli(['get', '--route', 'api', '--user', 'zed', '--plan', 'gold'])
  t.equal(unknownPlan.code, 1, 'an unknown plan is an error')
  t.match(unknownPlan.stderr, /unknown plan "gold"/)
  // without --admin and --token: both from the config file (its ${VAR} substituted)
  const file = join(tempDir(t, 'gw-cli'), 'gateway.yaml')
  writeFileSync(file, config(up.url, `{ listen: "${adminAddr}", token: "\${ADMIN_TOKEN}" }`))
  for (let i = 0; i < 3; i++) await send(`${gw.url}/x`)
  const fromFile = await run(process.execPath, ['bin/gateway', 'limits', 'reset', '--route', 'api', '--ip', '127.0.0.1', '-c', file], { env: childEnv({ ADMIN_TOKEN: TOKEN }) })
  t.match(fromFile.stdout, /reset ip, identity\.failures/, 'admin address and token from the file')
  const withOption = await run(process.execPath, ['bin/gateway', 'limits', 'get', '--route', 'api', '--ip', '127.0.0.1', '--admin', adminAddr, '--token', TOKEN, '--json'])
  t.equal((JSON.parse(withOption.stdout) as { limits: LimitEntry[] }).limits.find(l => l.name === 'ip')?.remaining, 3, '--json prints the answer; the reset gave the whole budget back')
})

t.test('without Redis: GET /limits reads the in-process store, DELETE /limits resets it', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, WITH_TOKEN).replace(/^redis: .*\n/m, ''), { ADMIN_TOKEN: TOKEN })
  for (let i = 0; i < 3; i++) t.equal((await send(`${gw.url}/x`)).status, 200)
  t.equal((await send(`${gw.url}/x`)).json?.limit, 'ip')
  const url = `${gw.adminUrl}/limits?route=api&ip=127.0.0.1`
  const read = await admin(url)
  t.match(entry(read, 'ip'), { remaining: 0, key: /^gw:\*\.ip\..*:127\.0\.0\.1$/ })
  t.equal(entry(await admin(url), 'ip').remaining, 0, 'reading consumed nothing')
  // a client never seen: nothing was held for it (it said 4, the count of keys asked about)
  const unseen = await admin(`${gw.adminUrl}/limits?route=api&ip=203.0.113.77`, 'DELETE', TOKEN)
  t.match(unseen.json, { keysDeleted: 0, instances: 1 }, 'no key deleted for a client never seen')
  const reset = await admin(url, 'DELETE', TOKEN)
  t.equal(reset.status, 200)
  t.equal(reset.json?.instances, 1)
  t.ok(typeof reset.json?.keysDeleted === 'number' && reset.json.keysDeleted >= 1 && reset.json.keysDeleted < (reset.json.reset as unknown[]).length + 1, `the keys held for the client: at least its ip budget (${String(reset.json?.keysDeleted)})`)
  t.equal((await admin(url, 'DELETE', TOKEN)).json?.keysDeleted, 0, 'reset again: nothing left to delete')
  t.equal((await send(`${gw.url}/x`)).status, 200, 'admitted again')
  t.equal(entry(await admin(url), 'ip').remaining, 2, 'a whole budget minus the request just admitted')
})

t.test('DELETE /limits resets budgets, never a concurrency cap\'s count of requests in flight (Redis and in process)', async t => {
  for (const withRedis of [true, false]) {
    await client.flushall()
    const up = await startUpstream(t)
    const yaml = config(up.url, WITH_TOKEN).replace('{ name: api, pathPrefix: /, upstream: backend }', '{ name: api, pathPrefix: /, upstream: backend, concurrency: { route: 1 } }')
    const gw = await startGateway(t, withRedis ? yaml : yaml.replace(/^redis: .*\n/m, ''), { ADMIN_TOKEN: TOKEN })
    const holding = send(`${gw.url}/slow?ms=1500`)
    await new Promise(resolve => setTimeout(resolve, 300))
    t.equal((await send(`${gw.url}/x`)).json?.error, 'GW_ERR_CONCURRENCY_LIMITED', 'the route\'s one place is taken')
    const cap = async (): Promise<LimitEntry | undefined> => ((await admin(`${gw.adminUrl}/limits?route=api&ip=203.0.113.9`)).json?.limits as LimitEntry[]).find(l => l.name.includes('concurrency'))
    // it showed 2^50 + 1, the unbounded remaining an admitting lease check reports for the headers
    t.match(await cap(), { remaining: 0, retryAfterMs: 1000 }, `GET /limits: no place left on the cap (${withRedis ? 'Redis' : 'in process'})`)
    // another client's reset: the route's total count is not theirs to clear
    const reset = await admin(`${gw.adminUrl}/limits?route=api&ip=203.0.113.9`, 'DELETE', TOKEN)
    t.equal(reset.status, 200)
    t.notOk(((reset.json?.reset ?? []) as Array<{ name: string }>).some(r => r.name.includes('concurrency')), 'the answer lists no concurrency limit as reset')
    t.equal((await send(`${gw.url}/x`)).json?.error, 'GW_ERR_CONCURRENCY_LIMITED', `still refused after the reset (${withRedis ? 'Redis' : 'in process'}; admitted before)`)
    t.equal((await holding).status, 200)
    // given back as the response closes, which can come after the client has read it
    await eventually('the place given back', async () => (await cap())?.remaining === 1, 10_000)
    t.match(await cap(), { remaining: 1, retryAfterMs: 0 }, 'its place back once the request ended')
    await gw.close()
  }
})

t.test('GET /consumers/NAME says where the plan came from: consumers, or defaultPlan for a consumer without an entry', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, '127.0.0.1:0').replace('consumers:\n', 'defaultPlan: free\nconsumers:\n'))
  t.match((await admin(`${gw.adminUrl}/consumers/bob`)).json, { consumer: 'bob', plan: 'free', planFrom: 'consumers' })
  t.match((await admin(`${gw.adminUrl}/consumers/zed`)).json, { consumer: 'zed', plan: 'free', planFrom: 'defaultPlan' })
})
