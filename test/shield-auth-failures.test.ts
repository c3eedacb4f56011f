// Issue 15 items 2 and 3: requests that fail identity, routing or parsing are limited, and the
// local level is keyed by client IP (rotating a client-chosen user header buys nothing).
import t from 'tap'
import { SignJWT, generateKeyPair } from 'jose'
import { startGateway } from './helpers/gateway.js'
import { refusingUrl, startUpstream } from './helpers/upstream.js'
import { startRedis } from './helpers/redis.js'
import { limitCalls, send, statusCounts } from './helpers/ratelimit.js'

const redis = await startRedis(t)

t.test('unknown API keys from one IP: 401 until identity.failureLimit is spent, then 429, one Redis call each', async t => {
  const upstream = await startUpstream(t)
  // exact counts: 2 s, not the default 50 ms (startRedis in test/helpers/redis.ts says why)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, keyPrefix: authfail1, timeout: 2s }
identity:
  apiKeys: { header: x-api-key, keys: { good-key: alice } }
  failureLimit: { limit: 5, window: 1m }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const admin = redis.client()
  const before = await limitCalls(admin)
  const replies = []
  for (let i = 0; i < 8; i++) replies.push(await send(`${gw.url}/x`, { headers: { 'x-api-key': `guess-${i}` } }))
  t.same(replies.map(r => r.status), [401, 401, 401, 401, 401, 429, 429, 429])
  t.equal(replies[5]?.json?.limit, 'identity.failures', 'the 429 names the failed-identity budget')
  t.ok(replies[5]?.headers['retry-after'] !== undefined, 'with Retry-After')
  const calls = await limitCalls(admin) - before
  // one call per failure until the deny cache holds the key; never more than one per request
  t.ok(calls >= 5 && calls <= 8, `${calls} Redis calls for 8 failed requests`)
  t.equal(upstream.requests, 0, 'nothing reached the upstream')
  // the right key from the locked-out IP answers as a wrong one does: a 200 told a key-guesser
  // which of its guesses was right
  const right = await send(`${gw.url}/x`, { headers: { 'x-api-key': 'good-key' } })
  t.same([right.status, right.json?.limit], [429, 'identity.failures'], 'a valid key from the IP that spent the budget: the same 429')
  t.equal(upstream.requests, 0, 'and it did not reach the upstream')
  const elsewhere = await send(`${gw.url}/x`, { headers: { 'x-api-key': 'good-key' }, localAddress: '127.0.0.2' })
  t.equal(elsewhere.status, 200, 'the same key from another IP is served')
  t.equal((await send(`${gw.url}/x`)).status, 200, 'a request without a credential from the locked-out IP is served (the route does not require one)')
  // an empty key is no key (it is served anonymously): it was held as a guess, a 429
  for (const blank of ['', '  ']) {
    const empty = await send(`${gw.url}/x`, { headers: { 'x-api-key': blank } })
    t.same([empty.status, empty.json?.limit], [200, undefined], `an X-API-Key of ${JSON.stringify(blank)} from the locked-out IP is served as no key is`)
  }
  t.equal(upstream.requests, 4, 'the four requests served reached the upstream')
})

t.test('a failed identity is charged against the gateway-wide ip limit too', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${redis.url}, keyPrefix: authfail2, timeout: 2s }
identity:
  apiKeys: { header: x-api-key, keys: { good-key: alice } }
  failureLimit: { limit: 100, window: 1m }
limits:
  ip: { limit: 3, window: 1m }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  for (let i = 0; i < 3; i++) t.equal((await send(`${gw.url}/x`, { headers: { 'x-api-key': 'bad' } })).status, 401)
  const good = await send(`${gw.url}/x`, { headers: { 'x-api-key': 'good-key' } })
  t.equal(good.status, 429, 'the IP spent its budget on failed attempts')
  t.equal(good.json?.limit, 'ip')
})

t.test('bad-signature JWTs without Redis: the in-process store throttles them the same way', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity:
  jwt: { secret: a-secret-of-enough-length-for-hs256-000000 }
  failureLimit: { limit: 3, window: 1m }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  // header.payload of {"alg":"HS256"} / {"sub":"x"} with a signature that does not verify
  const forged = 'eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.' + 'A'.repeat(43)
  const statuses = []
  for (let i = 0; i < 6; i++) statuses.push((await send(`${gw.url}/x`, { headers: { authorization: `Bearer ${forged}` } })).status)
  t.same(statuses, [401, 401, 401, 429, 429, 429])
})

t.test('the local level keys by client IP: 20 rotating X-User-Id values share one bucket', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { header: x-user-id }
local: { limit: 5, window: 1m }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const replies = []
  for (let i = 0; i < 20; i++) replies.push(await send(`${gw.url}/x`, { headers: { 'x-user-id': `user-${i}` } }))
  t.same(statusCounts(replies), { 200: 5, 429: 15 })
  t.equal(replies[19]?.json?.limit, 'local')
})

t.test('404s and 400s count against the local level', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
local: { limit: 4, window: 1m }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: api, pathPrefix: /api, upstream: backend }
`)
  const replies = []
  for (let i = 0; i < 3; i++) replies.push(await send(`${gw.url}/nope/${i}`))
  replies.push(await send(`${gw.url}/api/a%2fb`))
  replies.push(await send(`${gw.url}/nope/again`))
  replies.push(await send(`${gw.url}/api/ok`))
  t.same(replies.map(r => r.status), [404, 404, 404, 400, 429, 429], 'the flood of misses spent the budget')
  t.equal(upstream.requests, 0)
})

t.test('an Authorization header that is not "Bearer <token>" is a 401 with JWT identity, never forwarded', async t => {
  const { SignJWT } = await import('jose')
  const secret = 'a-secret-of-enough-length-for-hs256-000000'
  const token = await new SignJWT({ sub: 'alice' }).setProtectedHeader({ alg: 'HS256' }).sign(new TextEncoder().encode(secret))
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity:
  jwt: { secret: ${secret} }
  failureLimit: { limit: 100, window: 1m }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  for (const value of [`Bearer\t${token}`, `Bearer${token}`, `Bearer: ${token}`, token, 'Basic dXNlcjpwYXNz']) {
    const reply = await send(`${gw.url}/x`, { headers: { authorization: value } })
    t.equal(reply.status, 401, JSON.stringify(value.slice(0, 10)))
  }
  t.equal(upstream.requests, 0, 'none reached the upstream')
  t.equal((await send(`${gw.url}/x`, { headers: { authorization: `Bearer ${token}` } })).status, 200, 'the well-formed header passes')
})

t.test('with Redis away the failure budget holds on this instance whatever redis.onError says; failureLimit.onError: deny refuses 503', async t => {
  const upstream = await startUpstream(t)
  const away = `redis://127.0.0.1:${new URL(await refusingUrl()).port}`
  const config = (onError: string, failureLimit: string): string => `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis: { url: ${away}, onError: ${onError} }
identity:
  apiKeys: { header: x-api-key, keys: { good-key: alice } }
  failureLimit: ${failureLimit}
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`
  for (const onError of ['allow', 'deny']) {
    const gw = await startGateway(t, config(onError, '{ limit: 5, window: 1m }'))
    const statuses = []
    for (let i = 0; i < 8; i++) statuses.push((await send(`${gw.url}/x`, { headers: { 'x-api-key': `guess-${i}` } })).status)
    // every guess got its 401 before, uncounted
    t.same(statuses, [401, 401, 401, 401, 401, 429, 429, 429], `redis.onError: ${onError}: the budget of 5 holds (this instance's share)`)
    const right = await send(`${gw.url}/x`, { headers: { 'x-api-key': 'good-key' } })
    t.same([right.status, right.json?.limit], [429, 'identity.failures'], `redis.onError: ${onError}: the right key is refused as the wrong ones are (the fallback's refusal is held too)`)
    await gw.close()
  }
  const strict = await startGateway(t, config('allow', '{ limit: 5, window: 1m, onError: deny }'))
  const refused = await send(`${strict.url}/x`, { headers: { 'x-api-key': 'guess' } })
  t.same([refused.status, refused.json?.error], [503, 'GW_ERR_LIMITER_UNAVAILABLE'], 'failureLimit.onError: deny: a failed identity is refused 503 while Redis is away, as every denying limit is')
  t.equal(upstream.requests, 0)
})

t.test('an identity provider whose key set cannot be fetched: 503 GW_ERR_IDENTITY_UNAVAILABLE, no client\'s failure budget charged', async t => {
  const upstream = await startUpstream(t)
  const jwks = new URL(await refusingUrl())
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity:
  jwt: { jwksUrl: "http://127.0.0.1:${jwks.port}/jwks.json" }
  failureLimit: { limit: 3, window: 1m }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const { privateKey } = await generateKeyPair('ES256')
  const token = await new SignJWT({ sub: 'alice' }).setProtectedHeader({ alg: 'ES256', kid: 'k1' }).setExpirationTime('1h').sign(privateKey)
  const replies = []
  for (let i = 0; i < 5; i++) replies.push(await send(`${gw.url}/x`, { headers: { authorization: `Bearer ${token}` } }))
  // each was a 401 "key set unavailable" before, and the fourth a 429 that locked the IP out
  t.same(replies.map(r => [r.status, r.json?.error]), Array(5).fill([503, 'GW_ERR_IDENTITY_UNAVAILABLE']), 'the provider\'s outage, not the client\'s token, every time')
  t.equal(replies[0]?.json?.reason, 'key set unavailable')
  t.equal(upstream.requests, 0)
  t.match(gw.lines.find(l => l.msg === 'request'), { status: 503, outcome: 'identity_unavailable' })
})

t.test('a header identity has nothing to guess: a client that spent the failure budget is still served with its user header', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity:
  header: x-user-id
  failureLimit: { limit: 2, window: 1m }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: private, pathPrefix: /private/, auth: required, upstream: backend }
  - { name: open, pathPrefix: /, upstream: backend }
`)
  const missing = []
  for (let i = 0; i < 3; i++) missing.push((await send(`${gw.url}/private/x`)).status)
  t.same(missing, [401, 401, 429], 'requests without the header on a required route spend the budget')
  t.equal((await send(`${gw.url}/x`, { headers: { 'x-user-id': 'alice' } })).status, 200, 'the same client with its user header is served (the lockout is for keys and tokens)')
})
