import t from 'tap'
import { checkRuntime } from '../src/runtime.js'
import { parseConfigText } from '../src/config/load.js'
import { createServer } from 'node:http'
import { inspect } from 'node:util'
import type { AddressInfo } from 'node:net'
import type { IncomingHttpHeaders } from 'node:http'
import { SignJWT, exportJWK, exportSPKI, generateKeyPair, type CryptoKey } from 'jose'
import { compileIdentity, type IdentityResolver, type IdentityResult } from '../src/identify/identity.js'

const SECRET = 'a-test-secret-that-is-32-bytes-long!'
const now = (): number => Math.floor(Date.now() / 1000)

async function sign (alg: string, key: CryptoKey | Uint8Array, claims: Record<string, unknown> = { sub: 'alice' }, opts: { exp?: number | string; kid?: string; iss?: string; aud?: string } = {}): Promise<string> {
  const jwt = new SignJWT(claims).setProtectedHeader(opts.kid === undefined ? { alg } : { alg, kid: opts.kid }).setIssuedAt()
  if (opts.exp !== undefined) jwt.setExpirationTime(opts.exp)
  if (opts.iss !== undefined) jwt.setIssuer(opts.iss)
  if (opts.aud !== undefined) jwt.setAudience(opts.aud)
  return await jwt.sign(key)
}

const bearer = (token: string): IncomingHttpHeaders => ({ authorization: `Bearer ${token}` })
const resolve = async (r: IdentityResolver, headers: IncomingHttpHeaders): Promise<IdentityResult> => await r.resolve(headers)

t.test('no identity config: everyone is anonymous', async (t) => {
  const r = await compileIdentity(undefined)
  t.same(r.resolve({ 'x-user': 'alice' }), { ok: true, user: null })
})

t.test('header mode', async (t) => {
  const r = await compileIdentity({ header: 'X-User' })
  t.same(r.resolve({ 'x-user': '  alice  ' }), { ok: true, user: 'alice' }, 'trimmed, name matched case-insensitively')
  t.same(r.resolve({}), { ok: true, user: null }, 'absent -> anonymous')
  t.same(r.resolve({ 'x-user': '   ' }), { ok: true, user: null }, 'blank -> anonymous')
  t.same(r.resolve({ 'x-user': 'a'.repeat(256) }), { ok: true, user: 'a'.repeat(256) })
  t.same(r.resolve({ 'x-user': 'a'.repeat(257) }), { ok: false, reason: 'identity header too long' })
  t.equal((await r.resolve({ 'x-user': ['a', 'b'] })).ok, false, 'repeated header refused')
  t.notOk(r.resolve({ 'x-user': 'alice' }) instanceof Promise, 'synchronous')
  const required = await compileIdentity({ header: 'x-user', required: true })
  t.same(required.resolve({}), { ok: false, reason: 'missing credentials' })
  t.same(required.resolve({ 'x-user': 'bob' }), { ok: true, user: 'bob' })
  await t.rejects(compileIdentity({ header: 'bad header' }), { code: 'GW_ERR_CONFIG_INVALID' })
})

t.test('API keys', async (t) => {
  const r = await compileIdentity({ apiKeys: { header: 'x-api-key', keys: { k1: 'alice', k2: 'bob' } } })
  t.same(r.resolve({ 'x-api-key': 'k1' }), { ok: true, user: 'alice' })
  t.same(r.resolve({ 'x-api-key': ' k2 ' }), { ok: true, user: 'bob' })
  t.same(r.resolve({ 'x-api-key': 'nope' }), { ok: false, reason: 'unknown API key' })
  t.same(r.resolve({}), { ok: true, user: null })
  t.notOk(r.resolve({ 'x-api-key': 'k1' }) instanceof Promise, 'synchronous')
  for (const k of ['constructor', '__proto__', 'toString', 'hasOwnProperty']) {
    t.same(r.resolve({ 'x-api-key': k }), { ok: false, reason: 'unknown API key' }, `prototype key "${k}" is unknown`)
  }
  const result = r.resolve({ 'x-api-key': 'nope' })
  t.notMatch(JSON.stringify(result), /nope/, 'the key is never echoed')
  const required = await compileIdentity({ apiKeys: { header: 'x-api-key', keys: { k1: 'alice' } }, required: true })
  t.same(required.resolve({}), { ok: false, reason: 'missing credentials' })
})

t.test('HS256', async (t) => {
  const key = new TextEncoder().encode(SECRET)
  const r = await compileIdentity({ jwt: { secret: SECRET } })
  const token = await sign('HS256', key, { sub: 'alice' }, { exp: '1h' })
  t.same(await resolve(r, bearer(token)), { ok: true, user: 'alice' })
  t.same(await resolve(r, { authorization: `bearer   ${token}` }), { ok: true, user: 'alice' }, 'scheme is case-insensitive')
  t.same(await resolve(r, {}), { ok: true, user: null }, 'no token -> anonymous')
  // issue 15 item 5: forwarded as anonymous, these reached the upstream unverified
  for (const value of ['Basic dXNlcjpwYXNz', `Bearer\t${token}`, `Bearer${token}`, `Bearer: ${token}`, token, '']) {
    t.same(await resolve(r, { authorization: value }), { ok: false, reason: 'credentials are not a Bearer token' }, `refused: ${JSON.stringify(value.slice(0, 12))}`)
  }

  const wrong = await sign('HS256', new TextEncoder().encode('another-secret-that-is-32-bytes!!'), { sub: 'alice' }, { exp: '1h' })
  t.same(await resolve(r, bearer(wrong)), { ok: false, reason: 'invalid token signature' })
  const expired = await sign('HS256', key, { sub: 'alice' }, { exp: now() - 10 })
  t.same(await resolve(r, bearer(expired)), { ok: false, reason: 'token expired' })
  t.same(await resolve(r, bearer('not.a.jwt')), { ok: false, reason: 'malformed token' })
  t.same(await resolve(r, bearer('garbage')), { ok: false, reason: 'malformed token' })
  const hs512 = await sign('HS512', new TextEncoder().encode(SECRET.repeat(2)), { sub: 'alice' })
  t.same(await resolve(r, bearer(hs512)), { ok: false, reason: 'token algorithm not allowed' }, 'only HS256 by default')
  const noSub = await sign('HS256', key, { name: 'alice' })
  t.same(await resolve(r, bearer(noSub)), { ok: false, reason: 'token has no usable "sub" claim' })
  t.same(await resolve(r, bearer('x'.repeat(9000))), { ok: false, reason: 'token too large' })

  // alg "none" (RFC 8725 §2.1): an unsigned token with a plausible payload.
  const b64 = (o: unknown): string => Buffer.from(JSON.stringify(o)).toString('base64url')
  const unsigned = `${b64({ alg: 'none', typ: 'JWT' })}.${b64({ sub: 'admin' })}.`
  t.same(await resolve(r, bearer(unsigned)), { ok: false, reason: 'token algorithm not allowed' })
})

t.test('custom claim, custom header, issuer and audience', async (t) => {
  const key = new TextEncoder().encode(SECRET)
  const r = await compileIdentity({ jwt: { secret: SECRET, claim: 'uid', header: 'X-Token', issuer: 'https://idp', audience: 'gw' } })
  const good = await sign('HS256', key, { uid: 42 }, { iss: 'https://idp', aud: 'gw' })
  t.same(await resolve(r, { 'x-token': good }), { ok: true, user: '42' }, 'bare token in a custom header, numeric claim')
  t.same(await resolve(r, { 'x-token': `Bearer ${good}` }), { ok: true, user: '42' })
  const otherIss = await sign('HS256', key, { uid: 'a' }, { iss: 'https://evil', aud: 'gw' })
  t.same(await resolve(r, { 'x-token': otherIss }), { ok: false, reason: 'token "iss" claim check failed' })
  const otherAud = await sign('HS256', key, { uid: 'a' }, { iss: 'https://idp', aud: 'other' })
  t.same(await resolve(r, { 'x-token': otherAud }), { ok: false, reason: 'token "aud" claim check failed' })
})

t.test('RS256 and ES256 public keys, alg confusion', async (t) => {
  for (const alg of ['RS256', 'ES256']) {
    const { publicKey, privateKey } = await generateKeyPair(alg, { extractable: true })
    const pem = await exportSPKI(publicKey)
    const r = await compileIdentity({ jwt: { publicKey: pem } })
    const token = await sign(alg, privateKey, { sub: `user-${alg}` }, { exp: '1h' })
    t.same(await resolve(r, bearer(token)), { ok: true, user: `user-${alg}` }, `${alg} detected from the key`)
    const other = await generateKeyPair(alg)
    const forged = await sign(alg, other.privateKey, { sub: 'mallory' }, { exp: '1h' })
    t.same(await resolve(r, bearer(forged)), { ok: false, reason: 'invalid token signature' }, `${alg} wrong key`)
    const expired = await sign(alg, privateKey, { sub: 'x' }, { exp: now() - 10 })
    t.same(await resolve(r, bearer(expired)), { ok: false, reason: 'token expired' })
    // The attacker knows the public key and uses its PEM text as an HMAC secret.
    const confused = await sign('HS256', new TextEncoder().encode(pem), { sub: 'admin' }, { exp: '1h' })
    t.same(await resolve(r, bearer(confused)), { ok: false, reason: 'token algorithm not allowed' }, `${alg} alg confusion`)
  }
  const rsa = await generateKeyPair('RS256', { extractable: true })
  const rsaPem = await exportSPKI(rsa.publicKey)
  const both = await compileIdentity({ jwt: { publicKey: rsaPem, algorithms: ['RS256', 'PS256'] } })
  const ps = await sign('PS256', (await generateKeyPair('PS256', { extractable: true })).privateKey)
  t.same(await resolve(both, bearer(ps)), { ok: false, reason: 'invalid token signature' }, 'PS256 with another key')
  t.same(await resolve(both, bearer(await sign('RS256', rsa.privateKey))), { ok: true, user: 'alice' }, 'listed algorithms')
  await t.rejects(compileIdentity({ jwt: { publicKey: rsaPem, algorithms: ['HS256'] } }), { code: 'GW_ERR_CONFIG_INVALID', message: /cannot be used with a public key/ })
  await t.rejects(compileIdentity({ jwt: { publicKey: rsaPem, algorithms: ['ES256'] } }), { code: 'GW_ERR_CONFIG_INVALID' })
  await t.rejects(compileIdentity({ jwt: { publicKey: 'not a pem' } }), { code: 'GW_ERR_CONFIG_INVALID', message: /PEM/ })
})

t.test('config errors', async (t) => {
  await t.rejects(compileIdentity({ jwt: { secret: 'short' } }), { code: 'GW_ERR_CONFIG_INVALID', message: /at least 32 bytes/ })
  await t.rejects(compileIdentity({ jwt: { secret: SECRET, algorithms: ['RS256'] } }), { code: 'GW_ERR_CONFIG_INVALID' })
  await t.rejects(compileIdentity({ jwt: {} }), { code: 'GW_ERR_CONFIG_INVALID', message: /exactly one/ })
  await t.rejects(compileIdentity({ jwt: { secret: SECRET, jwksUrl: 'http://x/' } }), { code: 'GW_ERR_CONFIG_INVALID', message: /exactly one/ })
  await t.rejects(compileIdentity({ jwt: { jwksUrl: 'ftp://x/keys' } }), { code: 'GW_ERR_CONFIG_INVALID' })
  // the loader refuses such a URL first; an embedder calling compileIdentity meets this message
  const unparsable = await compileIdentity({ jwt: { jwksUrl: 'https://idp.example:99999/jwks?sig=Jwks-Sig-9&kid=a' } }).then(() => null, (err: unknown) => err as Error)
  t.match(unparsable, { code: 'GW_ERR_CONFIG_INVALID', message: 'identity: jwt.jwksUrl is not a URL: https://idp.example:99999/jwks?sig=[redacted]&kid=a' }, 'an unparsable JWKS URL is quoted with its signature redacted')
  t.notMatch(inspect(unparsable, { depth: 5 }), 'Jwks-Sig-9', 'the signature is nowhere in the error as printed, a cause included (a URL TypeError keeps its input)')
  await t.rejects(compileIdentity({ jwt: { jwksUrl: 'http://x/', algorithms: ['HS256'] } }), { code: 'GW_ERR_CONFIG_INVALID' })
})

t.test('verified tokens are cached, never past their exp', async (t) => {
  const key = new TextEncoder().encode(SECRET)
  const r = await compileIdentity({ jwt: { secret: SECRET } })
  const token = await sign('HS256', key, { sub: 'alice' }, { exp: now() + 2 })
  const first = r.resolve(bearer(token))
  t.ok(first instanceof Promise, 'first sight verifies')
  t.same(await first, { ok: true, user: 'alice' })
  const second = r.resolve(bearer(token))
  t.notOk(second instanceof Promise, 'second sight is a synchronous cache hit')
  t.same(second, { ok: true, user: 'alice' })
  const bad = await sign('HS256', new TextEncoder().encode('another-secret-that-is-32-bytes!!'), { sub: 'alice' })
  t.ok(r.resolve(bearer(bad)) instanceof Promise, 'failures are not cached')
  await r.resolve(bearer(bad))
  t.ok(r.resolve(bearer(bad)) instanceof Promise)
  await new Promise(resolve => setTimeout(resolve, 2100))
  t.same(await resolve(r, bearer(token)), { ok: false, reason: 'token expired' }, 'cache entry expired with the token')
})

t.test('README: verified tokens are cached for 60 s at most, even when they expire much later', async (t) => {
  // the cache's own clock, moved by the test: no 60 s wait
  let ms = 1_000_000
  const clock = { now: () => ms }
  const r = await compileIdentity({ jwt: { secret: SECRET } }, undefined, { cacheClock: clock })
  const token = await sign('HS256', new TextEncoder().encode(SECRET), { sub: 'alice' }, { exp: now() + 3600 })
  t.same(await r.resolve(bearer(token)), { ok: true, user: 'alice' })
  // lru-cache reads its clock at most once per ms (ttlResolution): let that pass after each move
  const tick = (): Promise<void> => new Promise(resolve => setTimeout(resolve, 5))
  ms += 59_000
  await tick()
  t.notOk(r.resolve(bearer(token)) instanceof Promise, 'still a cache hit 59 s later')
  ms += 2_000
  await tick()
  const again = r.resolve(bearer(token))
  t.ok(again instanceof Promise, 'verified again after 61 s, although the token is valid for an hour')
  t.same(await again, { ok: true, user: 'alice' })
})

t.test('JWKS from a real HTTP server', async (t) => {
  const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true })
  const jwk = { ...(await exportJWK(publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' }
  let fetches = 0
  const server = createServer((req, res) => {
    fetches++
    if (req.url !== '/.well-known/jwks.json') {
      res.statusCode = 404
      res.end()
      return
    }
    res.setHeader('content-type', 'application/json')
    res.end(JSON.stringify({ keys: [jwk] }))
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => server.close(() => resolve())))
  const { port } = server.address() as AddressInfo

  const r = await compileIdentity({ jwt: { jwksUrl: `http://127.0.0.1:${port}/.well-known/jwks.json` }, required: true })
  const token = await sign('ES256', privateKey, { sub: 'carol' }, { kid: 'k1', exp: '1h' })
  t.same(await resolve(r, bearer(token)), { ok: true, user: 'carol' })
  t.same(await resolve(r, {}), { ok: false, reason: 'missing credentials' }, 'required')
  const stranger = await generateKeyPair('ES256')
  const unknownKid = await sign('ES256', stranger.privateKey, { sub: 'mallory' }, { kid: 'k2', exp: '1h' })
  t.same(await resolve(r, bearer(unknownKid)), { ok: false, reason: 'no key matches the token' })
  const forged = await sign('ES256', stranger.privateKey, { sub: 'mallory' }, { kid: 'k1', exp: '1h' })
  t.same(await resolve(r, bearer(forged)), { ok: false, reason: 'invalid token signature' })
  const hs = await sign('HS256', new TextEncoder().encode(SECRET), { sub: 'mallory' }, { kid: 'k1' })
  t.same(await resolve(r, bearer(hs)), { ok: false, reason: 'token algorithm not allowed' })
  t.ok(fetches >= 1 && fetches <= 3, `the key set is fetched once and refetched at most on an unknown kid (${fetches})`)

  const down = await compileIdentity({ jwt: { jwksUrl: `http://127.0.0.1:${port}/missing` } })
  const res = await resolve(down, bearer(token))
  t.same(res, { ok: false, reason: 'key set unavailable', unavailable: true }, 'a non-200 key set: the token cannot be checked')

  // Nothing listens on a port just released by a closed server.
  const gone = createServer()
  await new Promise<void>(resolve => gone.listen(0, '127.0.0.1', resolve))
  const gonePort = (gone.address() as AddressInfo).port
  await new Promise<void>(resolve => gone.close(() => resolve()))
  const refused = await compileIdentity({ jwt: { jwksUrl: `http://127.0.0.1:${gonePort}/jwks.json` } })
  t.same(await resolve(refused, bearer(token)), { ok: false, reason: 'key set unavailable', unavailable: true }, 'connection refused')
})

t.test('gateway validate (checkRuntime) opens no connection to a JWKS URL; the gateway fetches it at start', async (t) => {
  let fetches = 0
  const server = createServer((_req, res) => {
    fetches++
    res.setHeader('content-type', 'application/json')
    res.end('{"keys":[]}')
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => server.close(() => resolve())))
  const { port } = server.address() as AddressInfo
  const text = `identity: { jwt: { jwksUrl: "http://127.0.0.1:${port}/jwks.json" } }
upstreams:
  b: { targets: [http://127.0.0.1:1] }
routes:
  - { name: a, pathPrefix: /, upstream: b }
`
  await checkRuntime(parseConfigText(text, 'gw.yaml'))
  await new Promise(resolve => setTimeout(resolve, 300))
  t.equal(fetches, 0, 'validate fetched nothing')
  await compileIdentity({ jwt: { jwksUrl: `http://127.0.0.1:${port}/jwks.json` } })
  for (let i = 0; i < 40 && fetches === 0; i++) await new Promise(resolve => setTimeout(resolve, 25))
  t.equal(fetches, 1, 'a serving gateway warms its key set')
})
