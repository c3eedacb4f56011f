// Consumers on plans (issue 9), through real HTTP and a real Redis: API keys map to consumers,
// consumers to plans; a plan's user limit and quota replace the gateway's; per-route auth; JWT
// planClaim; located config errors.
import t from 'tap'
import { SignJWT } from 'jose'
import { startGateway } from './helpers/gateway.js'
import { startRedis } from './helpers/redis.js'
import { startUpstream, type EchoBody } from './helpers/upstream.js'
import { send, type Reply } from './helpers/ratelimit.js'
import { parseConfigText, ConfigError } from '../src/config/load.js'
import { awayFromQuotaEdge } from './helpers/window-edge.js'

const redis = await startRedis(t)
const client = redis.client()

const PLANS = `consumers:
  alice: { plan: pro }
  bob: { plan: free }
  dave: { plan: tiny }
defaultPlan: free
plans:
  free:
    limits:
      user: { algorithm: sliding-window-log, limit: 3, window: 1h }
      quota: { limit: 5, period: day }
    routes:
      login: { user: { algorithm: sliding-window-log, limit: 1, window: 1h } }
  pro:
    limits:
      user: { algorithm: sliding-window-log, limit: 6, window: 1h }
      quota: { limit: 1000, period: month }
  tiny:
    limits:
      user: { algorithm: sliding-window-log, limit: 10, window: 1h }
      quota: { limit: 2, period: day }
limits:
  user: { algorithm: sliding-window-log, limit: 2, window: 1h }`

function config (upstream: string, identity: string, extra = PLANS): string {
  return `listen: "127.0.0.1:0"
admin: 127.0.0.1:0
redis: { url: ${redis.url}, timeout: 2s, onError: deny }
${identity}
${extra}
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: login
    path: /login
    upstream: backend
  - name: api
    pathPrefix: /api/
    upstream: backend
    auth: required
  - name: public
    pathPrefix: /public/
    upstream: backend
    auth: none
  - name: open
    pathPrefix: /
    upstream: backend
`
}

const API_KEYS = 'identity:\n  apiKeys:\n    header: x-api-key\n    keys: { k-alice: alice, k-bob: bob, k-carol: carol, k-dave: dave }'

async function statuses (n: number, url: string, headers: Record<string, string>): Promise<Reply[]> {
  const out: Reply[] = []
  for (let i = 0; i < n; i++) out.push(await send(url, { headers }))
  return out
}

t.test('plans change limits per consumer: pro, free, defaultPlan, and a per-route override', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, API_KEYS))
  const alice = await statuses(7, `${gw.url}/api/x`, { 'x-api-key': 'k-alice' })
  t.same(alice.map(r => r.status), [200, 200, 200, 200, 200, 200, 429], 'alice (pro): 6 an hour')
  t.equal(alice[6]?.json?.limit, 'pro:user', 'rejected by her plan\'s user limit')
  const bob = await statuses(4, `${gw.url}/api/x`, { 'x-api-key': 'k-bob' })
  t.same(bob.map(r => r.status), [200, 200, 200, 429], 'bob (free): 3 an hour, not the gateway-wide 2')
  t.equal(bob[3]?.json?.limit, 'free:user')
  const carol = await statuses(4, `${gw.url}/api/x`, { 'x-api-key': 'k-carol' })
  t.same(carol.map(r => r.status), [200, 200, 200, 429], 'carol has no consumers entry: defaultPlan free')
  const login = await statuses(2, `${gw.url}/login`, { 'x-api-key': 'k-carol' })
  t.same(login.map(r => r.status), [429, 429], 'carol spent her plan user limit on /api/ already: it applies on /login too')
})

t.test('plans.<p>.routes.<route>.user replaces that route\'s user limit', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, API_KEYS))
  const login2 = await statuses(2, `${gw.url}/login`, { 'x-api-key': 'k-bob' })
  t.same(login2.map(r => r.status), [200, 429], 'plans.free.routes.login.user: 1 an hour on /login')
  t.equal(login2[1]?.json?.limit, 'free:login.user')
  const aliceLogin = await statuses(2, `${gw.url}/login`, { 'x-api-key': 'k-alice' })
  t.same(aliceLogin.map(r => r.status), [200, 200], 'pro has no /login override')
})

t.test('the quota is in RateLimit-Policy / RateLimit beside the tightest limit', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, API_KEYS))
  // free:quota is a calendar day in UTC: its t and the midnight computed here name the same day
  await awayFromQuotaEdge('day', 30_000)
  const r = await send(`${gw.url}/api/x`, { headers: { 'x-api-key': 'k-bob' } })
  t.equal(r.status, 200)
  t.equal(r.headers['ratelimit-policy'], '"free:user";q=3;w=3600, "free:quota";q=5;w=86400')
  const m = /^"free:user";r=2;t=\d+, "free:quota";r=4;t=(\d+)$/.exec(String(r.headers.ratelimit))
  t.ok(m !== null, `RateLimit lists both: ${String(r.headers.ratelimit)}`)
  const toMidnight = 86400 - Math.floor(Date.now() / 1000) % 86400
  t.ok(Math.abs(Number(m?.[1]) - toMidnight) <= 2, 'the quota resets at the next UTC midnight')
})

t.test('all or nothing: a request rejected by the user limit uses no quota, one over quota uses no user budget', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, API_KEYS))
  // the quotas are calendar days in UTC: counts, refusals and Retry-After within one day
  await awayFromQuotaEdge('day', 30_000)
  const bob = await statuses(6, `${gw.url}/api/x`, { 'x-api-key': 'k-bob' })
  t.same(bob.map(r => r.status), [200, 200, 200, 429, 429, 429])
  t.equal(await client.hget('gw:quota.day:bob', 'c'), '3', 'three admitted requests, three quota units: the rejected ones took none')

  const dave = await statuses(4, `${gw.url}/api/x`, { 'x-api-key': 'k-dave' })
  t.same(dave.map(r => r.status), [200, 200, 429, 429], 'tiny: 2 a day')
  const over = dave[2] as Reply
  t.equal(over.json?.limit, 'tiny:quota')
  t.equal(over.json?.dimension, 'quota')
  const toMidnight = 86400 - Math.floor(Date.now() / 1000) % 86400
  t.ok(Math.abs(Number(over.headers['retry-after']) - toMidnight) <= 2, `Retry-After ${String(over.headers['retry-after'])} runs to the next period start (~${toMidnight} s)`)
  t.match(over.headers['ratelimit-policy'], /"tiny:quota";q=2;w=86400/)
  const userKeys = await client.keys('gw:tiny:\\*.user.*:dave')
  t.equal(userKeys.length, 1)
  t.equal(await client.zcard(userKeys[0] as string), 2, 'the user limit recorded only the two admitted requests')
  t.equal(up.requests, 3 + 2, 'only admitted requests reached the upstream')
})

t.test('a consumer over quota moved to a larger plan by a reload is admitted at once', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, API_KEYS))
  await awayFromQuotaEdge('day', 30_000)
  const dave = await statuses(3, `${gw.url}/api/x`, { 'x-api-key': 'k-dave' })
  t.same(dave.map(r => r.status), [200, 200, 429], 'tiny: 2 a day')
  const { writeFileSync, readFileSync } = await import('node:fs')
  const file = (gw as unknown as { options: { configFile: string } }).options.configFile
  writeFileSync(file, readFileSync(file, 'utf8').replace('dave: { plan: tiny }', 'dave: { plan: free }'))
  t.match(await gw.reload(), { ok: true })
  const after = await statuses(2, `${gw.url}/api/x`, { 'x-api-key': 'k-dave' })
  t.same(after.map(r => r.status), [200, 200], 'free: 5 a day, 2 used (the refusal under tiny\'s quota held until midnight before)')
  t.equal(await client.hget('gw:quota.day:dave', 'c'), '4', 'the day\'s count carried over')
})

t.test('per-route auth: required answers 401 on that route only, optional verifies when present, none strips the key', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, API_KEYS))
  const noKey = await send(`${gw.url}/api/x`)
  t.equal(noKey.status, 401, 'auth: required, no key')
  t.equal(noKey.json?.error, 'GW_ERR_UNAUTHORIZED')
  t.equal(noKey.json?.reason, 'missing credentials')
  t.equal((await send(`${gw.url}/other`)).status, 200, 'default (identity.required unset) is optional: anonymous passes')
  t.equal((await send(`${gw.url}/other`, { headers: { 'x-api-key': 'k-wrong' } })).status, 401, 'optional: a key that is present is verified')
  const pub = await send(`${gw.url}/public/x`, { headers: { 'x-api-key': 'k-wrong' } })
  t.equal(pub.status, 200, 'auth: none: the key is not verified')
  const echoed = pub.json as unknown as EchoBody
  t.equal(echoed.headers['x-api-key'], undefined, 'and not forwarded')
  t.notOk(echoed.rawHeaders.some(h => h.toLowerCase() === 'x-api-key'))
  const viaApi = (await send(`${gw.url}/api/x`, { headers: { 'x-api-key': 'k-alice' } })).json as unknown as EchoBody
  t.equal(viaApi.headers['x-api-key'], 'k-alice', 'a verified key is forwarded as before')
})

t.test('identity.required: true is the default that auth: optional overrides', async t => {
  await client.flushall()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `${API_KEYS}\n  required: true`).replace('    pathPrefix: /\n    upstream: backend\n', '    pathPrefix: /\n    upstream: backend\n    auth: optional\n'))
  t.equal((await send(`${gw.url}/login`)).status, 401, 'no auth key on the route: identity.required applies')
  t.equal((await send(`${gw.url}/other`)).status, 200, 'auth: optional on the route wins')
})

t.test('JWT planClaim names the plan; an unknown plan in a token falls back to the consumer\'s', async t => {
  await client.flushall()
  const secret = 'a-secret-of-at-least-thirty-two-bytes!'
  const key = new TextEncoder().encode(secret)
  const token = (sub: string, plan?: string): Promise<string> =>
    new SignJWT(plan === undefined ? {} : { tier: plan }).setProtectedHeader({ alg: 'HS256' }).setSubject(sub).setIssuedAt().setExpirationTime('1h').sign(key)
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, `identity:\n  jwt: { secret: "${secret}", claim: sub, planClaim: tier }`))
  const auth = async (sub: string, plan?: string): Promise<Record<string, string>> => ({ authorization: `Bearer ${await token(sub, plan)}` })
  // dave's third request is refused by tiny:quota, a calendar day in UTC: not across midnight
  await awayFromQuotaEdge('day', 30_000)
  const zed = await statuses(7, `${gw.url}/api/x`, await auth('zed', 'pro'))
  t.same(zed.map(r => r.status), [200, 200, 200, 200, 200, 200, 429], 'zed has no consumers entry; the token says pro')
  t.equal(zed[6]?.json?.limit, 'pro:user')
  const bobPro = await statuses(7, `${gw.url}/api/x`, await auth('bob', 'pro'))
  t.equal(bobPro[6]?.json?.limit, 'pro:user', 'the claim wins over the consumers entry')
  const yan = await statuses(4, `${gw.url}/api/x`, await auth('yan', 'platinum'))
  t.same(yan.map(r => r.status), [200, 200, 200, 429], 'a plan the config does not know: defaultPlan free')
  t.equal(yan[3]?.json?.limit, 'free:user')
  // dave has an entry (tiny, 2 a day): a plan the config does not know leaves him on it, not on defaultPlan
  const davePlatinum = await statuses(3, `${gw.url}/api/x`, await auth('dave', 'platinum'))
  t.same(davePlatinum.map(r => r.status), [200, 200, 429], 'an unknown plan in the token: the consumers entry')
  t.equal(davePlatinum[2]?.json?.limit, 'tiny:quota')
  const dave = await statuses(1, `${gw.url}/api/x`, await auth('dave'))
  t.equal(dave[0]?.json?.limit, 'tiny:quota', 'no claim: the consumers entry')
})

t.test('located config errors: unknown plans, a consumer on a missing plan, a key mapped to no consumer, ${VAR} keys', async t => {
  const base = (body: string): string => `upstreams:\n  b: { targets: ["http://127.0.0.1:1"] }\nroutes:\n  - { name: r, pathPrefix: /, upstream: b }\n${body}`
  const problems = (text: string, env: NodeJS.ProcessEnv = {}): string[] => {
    try {
      parseConfigText(text, 'gateway.yaml', env)
    } catch (err) {
      if (err instanceof ConfigError) return err.message.split('\n')
      throw err
    }
    return []
  }
  const keys = 'identity:\n  apiKeys:\n    header: x-api-key\n    keys:\n      k-1: alice\n      k-2: zoe\n'
  t.same(problems(base(`${keys}consumers:\n  alice: { plan: gold }\ndefaultPlan: silver\nplans:\n  free:\n    routes:\n      nope: { user: { limit: 1, window: 1s } }\n`)), [
    'gateway.yaml:12:18 consumers.alice.plan: unknown plan "gold" (plans: free)',
    'gateway.yaml:13:14 defaultPlan: unknown plan "silver" (plans: free)',
    'gateway.yaml:17:13 plans.free.routes.nope: unknown route "nope"'
  ])
  t.same(problems(base(`${keys}consumers:\n  alice: { plan: free }\nplans:\n  free: {}\n`)), [
    'gateway.yaml:10:12 identity.apiKeys.keys.<an API key>: API key maps to consumer "zoe", which has no entry in consumers (and there is no defaultPlan)'
  ], 'without defaultPlan every key must lead to a consumer entry')
  t.same(problems(base('identity:\n  apiKeys:\n    header: x-api-key\n    keys:\n      "${API_KEY}": alice\n')), [
    'gateway.yaml:9:21 identity.apiKeys.keys.${API_KEY}: environment variable API_KEY is not set and has no default (use ${API_KEY:-default})'
  ], 'an unset variable in a key')
  t.same(problems(base('identity:\n  apiKeys:\n    header: x-api-key\n    keys:\n      "k-live-9f3a${oops": alice\n')), [
    'gateway.yaml:9:28 identity.apiKeys.keys.<an API key>: "${" in a key is not a complete ${VAR} reference'
  ], 'a literal "${" in a key is never accepted silently, and the key, a secret but for its typo, is not shown')
  // a default written in a key reference is the key itself when the variable is unset
  const defaulted = problems(base('identity:\n  apiKeys:\n    header: x-api-key\n    keys:\n      k-live-default: bob\n      "${UNSET_KEY:-k-live-default}": alice\n'))
  t.equal(defaulted.length, 1, defaulted.join('\n'))
  t.notOk(defaulted.some(p => p.includes('k-live')), `a default written in a key is not shown either: ${defaulted.join('; ')}`)
  const ok = parseConfigText(base('identity:\n  apiKeys:\n    header: x-api-key\n    keys:\n      "${API_KEY}": alice\n'), 'gateway.yaml', { API_KEY: 'k-from-env' })
  const id = ok.config.identity
  t.same(id !== undefined && 'apiKeys' in id ? id.apiKeys.keys : null, { 'k-from-env': 'alice' }, 'a key from the environment')
  const file = parseConfigText(base('identity:\n  apiKeys: { header: x-api-key, file: ./keys.yaml }\n'), '/etc/gw/gateway.yaml')
  const fid = file.config.identity
  t.equal(fid !== undefined && 'apiKeys' in fid ? fid.apiKeys.file : null, '/etc/gw/keys.yaml', 'the key file is relative to gateway.yaml')
  t.same(problems(base('admin: { listen: "127.0.0.1:9901", token: short }\n')), ['gateway.yaml:5:43 admin.token: expected a token of at least 16 characters'], 'a short admin token')
})
