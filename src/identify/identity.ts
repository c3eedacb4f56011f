import type { IncomingHttpHeaders } from 'node:http'
import { isUtf8 } from 'node:buffer'
import { createPublicKey } from 'node:crypto'
import { createRemoteJWKSet, importSPKI, jwtVerify, type CryptoKey, type JWTPayload, type JWTVerifyGetKey, type JWTVerifyOptions } from 'jose'
import { LRUCache } from 'lru-cache'
import { GatewayError } from '../errors.js'
import { redactUrl } from '../admin/redact.js'
import { readApiKeyFile } from './api-key-file.js'

// Who is the user? Compiled once per config into a resolver. `compileIdentity` is async because
// importing a PEM key is (WebCrypto); the resolver it returns answers synchronously for the header
// and API-key modes and for cached tokens, and returns a Promise only when it must verify a JWT.

export type IdentityConfig =
  | { header: string; required?: boolean }
  | { apiKeys: { header: string; keys?: Readonly<Record<string, string>>; file?: string }; required?: boolean }
  | {
    jwt: {
      secret?: string
      publicKey?: string
      jwksUrl?: string
      /** Claim naming the user; default `sub`. */
      claim?: string
      /** Claim naming the consumer's plan (issue 9); a plan not in `plans` is ignored. */
      planClaim?: string
      /** Default `authorization`, with the Bearer scheme (RFC 6750 §2.1). */
      header?: string
      issuer?: string
      audience?: string
      algorithms?: string[]
    }
    required?: boolean
  }

/** Who is on which plan: `consumers`, `defaultPlan` and the names of `plans` (issue 9). */
export interface ConsumerDirectory {
  /** consumer -> plan name */
  readonly plans: ReadonlyMap<string, string>
  /** Plan of identified consumers without an entry; null = none (route limits as configured). */
  readonly defaultPlan: string | null
  /** Every configured plan name: a JWT's plan claim must name one of them. */
  readonly known: ReadonlySet<string>
}

export const NO_CONSUMERS: ConsumerDirectory = Object.freeze({ plans: new Map(), defaultPlan: null, known: new Set<string>() })

/** `ok: false` -> the caller answers 401. `reason` never contains a credential. */
/** `plan` is the consumer's plan (issue 9); absent = none: the route's own limits apply. */
/**
 * A failure's `unavailable`: the credential could not be checked because the identity provider's
 * key set could not be had (its fault, not the client's): a 503, never charged to the client's
 * failure budget.
 */
export type IdentityResult = { ok: true; user: string | null; plan?: string } | { ok: false; reason: string; unavailable?: true }

export interface IdentityResolver {
  /**
   * `required` is the route's `auth` (true: 401 without credentials; false: anonymous without);
   * undefined = `identity.required`. A credential that is present is always verified.
   * `peerTrusted`: the peer is one of `trustedProxies` (default true). A `header` identity set by
   * an auth layer is believed only from there when trustedProxies is set: from anyone else the
   * header is removed (never forwarded) and the request is anonymous.
   */
  resolve(headers: IncomingHttpHeaders, required?: boolean, peerTrusted?: boolean): IdentityResult | Promise<IdentityResult>
  /** The (lowercase) header carrying the credential: removed on `auth: none` routes. Null without identity. */
  readonly credentialHeader: string | null
  /**
   * Whether the request offers a secret that can be guessed (an API key, a token): an IP that spent
   * its failure budget is refused whatever it offers. False for a `header` identity, whose every
   * value is a user (nothing to guess), and for what `resolve` takes for no credential (an empty
   * API key), which is served as a request without one is.
   */
  offersSecret(headers: IncomingHttpHeaders): boolean
}

/** The claim naming the user, and the header carrying the token (RFC 6750 §2.1), when not configured. */
export const DEFAULT_JWT_CLAIM = 'sub'
export const DEFAULT_JWT_HEADER = 'authorization'

/** Longest user name taken from a header or a claim: it becomes part of limiter keys. */
export const MAX_USER_LENGTH = 256
// Real tokens are well under this; bigger ones are refused before any crypto work.
const MAX_TOKEN_LENGTH = 8192
const CACHE_MAX_TTL_MS = 60_000

const ANONYMOUS: IdentityResult = Object.freeze({ ok: true, user: null })
const failure = (reason: string): IdentityResult => Object.freeze({ ok: false, reason })
const MISSING = failure('missing credentials')
const offersNone = (): boolean => false
const NO_IDENTITY: IdentityResolver = Object.freeze({ resolve: () => ANONYMOUS, credentialHeader: null, offersSecret: offersNone })

/** What a request without credentials gets: 401 when required, else anonymous (no user, no plan). */
type Absent = (required: boolean | undefined) => IdentityResult

const planOf = (dir: ConsumerDirectory, user: string): string | null => dir.plans.get(user) ?? dir.defaultPlan

/** An identified user, with its plan only when it has one. */
function identified (user: string, plan: string | null): IdentityResult {
  return plan === null ? { ok: true, user } : { ok: true, user, plan }
}

const HMAC_ALGS = ['HS256', 'HS384', 'HS512']
const ASYMMETRIC_ALGS = ['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512', 'EdDSA', 'Ed25519']
// RFC 7518 §3.2: an HMAC key MUST be at least as long as the hash output.
const HMAC_MIN_BYTES: Readonly<Record<string, number>> = { HS256: 32, HS384: 48, HS512: 64 }

const invalid = (message: string, cause?: unknown): GatewayError =>
  new GatewayError('GW_ERR_CONFIG_INVALID', `identity: ${message}`, cause === undefined ? undefined : { cause })

/** Tests only: the clock the verified-token cache measures its 60 s with (default: performance). */
export interface IdentityOptions {
  readonly cacheClock?: { now: () => number }
  /** `trustedProxies` is set: a `header` identity is believed from those peers only. */
  readonly headerFromTrustedPeersOnly?: boolean
  /** Fetch a JWKS at once (default); false for `gateway validate`, which opens no connection. */
  readonly warmJwks?: boolean
  /** Reads the API key file (default: the disk; a worker gets its primary's copy). */
  readonly readFile?: (path: string) => Promise<Buffer>
}

export async function compileIdentity (config: IdentityConfig | undefined, consumers: ConsumerDirectory = NO_CONSUMERS, options: IdentityOptions = {}): Promise<IdentityResolver> {
  if (config === undefined) return NO_IDENTITY
  const requiredByDefault = config.required === true
  const absent: Absent = (required) => (required ?? requiredByDefault) ? MISSING : ANONYMOUS
  if ('header' in config) return compileHeaderIdentity(config.header, absent, consumers, options.headerFromTrustedPeersOnly === true)
  if ('apiKeys' in config) return compileApiKeys(config.apiKeys, absent, consumers, await readApiKeyFile(config.apiKeys.file, consumers, options.readFile))
  if ('jwt' in config) return await compileJwt(config.jwt, absent, consumers, options)
  throw invalid('expected one of "header", "apiKeys" or "jwt"')
}

// Node lowercases incoming header names; a repeated custom header arrives joined with ", ", only a
// few (set-cookie) arrive as arrays. An array here means a credential was sent twice: refuse it.
function headerName (name: string): string {
  const lower = name.trim().toLowerCase()
  if (!/^[!#$%&'*+.^_`|~0-9a-z-]+$/.test(lower)) throw invalid(`"${name}" is not a header name`)
  return lower
}

function compileHeaderIdentity (header: string, absent: Absent, consumers: ConsumerDirectory, trustedPeersOnly: boolean): IdentityResolver {
  const name = headerName(header)
  const tooLong = failure('identity header too long')
  const repeated = failure('identity header repeated or holds a comma')
  return {
    credentialHeader: name,
    offersSecret: offersNone,
    resolve (headers, required, peerTrusted = true) {
      const raw = headers[name]
      if (raw === undefined) return absent(required)
      if (trustedPeersOnly && !peerTrusted) {
        // a client claiming a user (and its plan and budget) past the auth layer
        delete headers[name]
        return absent(required)
      }
      if (typeof raw !== 'string') return repeated
      // Node joins a repeated field with ", ": an auth layer that appends its X-User-Id to the
      // client's would hand over "forged, real", a made-up user with a budget of its own. A name
      // holding a comma cannot be told from that, so it is refused too.
      if (raw.includes(',')) return repeated
      // Only spaces and tabs are trimmed (node strips them already; a caller handing a value of
      // its own may not), never with trim(), which takes every Unicode space. Before decoding it
      // cut U+00A0, the last byte (0xA0) of many a UTF-8 character read as Latin-1 ("voilà"
      // became "voilÃ", another user); after it, it made "alice" of "alice\u00a0" and
      // "\ufeffalice", names an auth layer may let anyone register.
      const user = textOfHeader(trimSpacesAndTabs(raw))
      if (user.length === 0) return absent(required)
      if (user.length > MAX_USER_LENGTH) return tooLong
      return identified(user, planOf(consumers, user))
    }
  }
}

/**
 * A header value as text: node reads each byte of a field as one Latin-1 character, so a user
 * named "zoë" in UTF-8 (as every auth layer sends it) arrived as "zoÃ«", matched no consumer of
 * that name, and was another user than the one the admin API and a JWT claim name. A value whose
 * bytes are valid UTF-8 is read as UTF-8; any other is left as Latin-1, byte for byte. An ASCII
 * value (nearly all) is returned as is, after one pass over its characters.
 */
export function textOfHeader (value: string): string {
  for (let i = 0; i < value.length; i++) {
    if (value.charCodeAt(i) > 0x7f) {
      const bytes = Buffer.from(value, 'latin1')
      return isUtf8(bytes) ? bytes.toString('utf8') : value
    }
  }
  return value
}

/** `value` without the spaces and tabs around it (HTTP's optional whitespace, RFC 9110 §5.6.3). */
function trimSpacesAndTabs (value: string): string {
  let start = 0
  let end = value.length
  while (start < end && (value.charCodeAt(start) === 0x20 || value.charCodeAt(start) === 0x09)) start++
  while (end > start && (value.charCodeAt(end - 1) === 0x20 || value.charCodeAt(end - 1) === 0x09)) end--
  return start === 0 && end === value.length ? value : value.slice(start, end)
}

function compileApiKeys (
  apiKeys: { header: string; keys?: Readonly<Record<string, string>> },
  absent: Absent,
  consumers: ConsumerDirectory,
  fromFile: ReadonlyArray<readonly [string, string]>
): IdentityResolver {
  const name = headerName(apiKeys.header)
  // A Map, not the config object: a key named "constructor" or "__proto__" must not find
  // Object.prototype. Results (user and plan) are built once so a lookup allocates nothing.
  const users = new Map<string, IdentityResult>()
  const inline = Object.entries(apiKeys.keys ?? {})
  for (const [i, [key, user]] of [...inline, ...fromFile].entries()) {
    if (key.trim() !== key || key.length === 0) throw invalid('API keys must be non-empty without surrounding spaces')
    if (user.length === 0 || user.length > MAX_USER_LENGTH) throw invalid(`API key user names must have 1 to ${MAX_USER_LENGTH} characters`)
    const before = users.get(key)
    // the file's line would silently take the key from the inline consumer (the key is never shown)
    if (before !== undefined && before.ok && before.user !== user) {
      throw invalid(`an API key is given twice: in identity.apiKeys.keys for consumer "${before.user ?? ''}" and in the key file (entry [${i - inline.length}]) for "${user}"`)
    }
    users.set(key, Object.freeze(identified(user, planOf(consumers, user))))
  }
  const unknown = failure('unknown API key')
  const repeated = failure('API key header repeated')
  return {
    credentialHeader: name,
    offersSecret (headers) {
      const raw = headers[name]
      return typeof raw === 'string' ? raw.trim().length > 0 : raw !== undefined
    },
    resolve (headers, required) {
      const raw = headers[name]
      if (raw === undefined) return absent(required)
      if (typeof raw !== 'string') return repeated
      const key = raw.trim()
      if (key.length === 0) return absent(required)
      // node joins a header sent twice with ", " (a client's key beside a proxy's): said as such,
      // where "unknown API key" sent its owner looking for a typo. Only past the miss: no cost to a known key.
      return users.get(key) ?? (raw.includes(', ') ? repeated : unknown)
    }
  }
}

type JwtConfig = Extract<IdentityConfig, { jwt: unknown }>['jwt']

async function compileJwt (jwt: JwtConfig, absent: Absent, consumers: ConsumerDirectory, testing: IdentityOptions): Promise<IdentityResolver> {
  const sources = [jwt.secret, jwt.publicKey, jwt.jwksUrl].filter(s => s !== undefined).length
  if (sources !== 1) throw invalid('jwt needs exactly one of "secret", "publicKey" or "jwksUrl"')
  const { key, algorithms } = await compileJwtKey(jwt, testing.warmJwks !== false)
  const remote = jwt.jwksUrl !== undefined
  const claim = jwt.claim ?? DEFAULT_JWT_CLAIM
  const options: JWTVerifyOptions = { algorithms }
  if (jwt.issuer !== undefined) options.issuer = jwt.issuer
  if (jwt.audience !== undefined) options.audience = jwt.audience

  const name = headerName(jwt.header ?? DEFAULT_JWT_HEADER)
  // A custom header may carry the bare token; Authorization must say "Bearer <token>".
  const bareTokenAllowed = name !== 'authorization'
  // Anything else in the header (another scheme, "Bearer\t", "Bearer:", a bare token) is refused:
  // treated as anonymous it would reach the upstream unverified, and the upstream may believe it.
  const notBearer = failure('credentials are not a Bearer token')
  const tooLarge = failure('token too large')
  const repeated = failure('token header repeated')
  const noUser = failure(`token has no usable "${claim}" claim`)

  // Verified tokens, until min(exp, 60 s): a cached entry can never outlive the token, and the
  // bound keeps key rotation and revocation delays short. Size-bounded since keys are whole tokens.
  const verified = new LRUCache<string, IdentityResult>({
    max: 10_000,
    maxSize: 16 * 1024 * 1024,
    sizeCalculation: (_value, token) => token.length + 64,
    ...(testing.cacheClock !== undefined ? { perf: testing.cacheClock } : {})
  })

  const verify = async (token: string): Promise<IdentityResult> => {
    let payload: JWTPayload
    try {
      payload = (await jwtVerify(token, key, options)).payload
    } catch (err) {
      return joseFailure(err, remote)
    }
    const value = payload[claim]
    const user = typeof value === 'string' ? value : typeof value === 'number' && Number.isFinite(value) ? String(value) : ''
    if (user.length === 0 || user.length > MAX_USER_LENGTH) return noUser
    // The token's plan claim wins over `consumers`; a plan the config does not know is ignored
    // (the consumer's entry or defaultPlan applies): a token cannot name limits that do not exist.
    const claimed = jwt.planClaim === undefined ? undefined : payload[jwt.planClaim]
    const plan = typeof claimed === 'string' && consumers.known.has(claimed) ? claimed : planOf(consumers, user)
    const result: IdentityResult = Object.freeze(identified(user, plan))
    const ttl = payload.exp === undefined ? CACHE_MAX_TTL_MS : Math.min(CACHE_MAX_TTL_MS, payload.exp * 1000 - Date.now())
    if (ttl >= 1) verified.set(token, result, { ttl: Math.floor(ttl) })
    return result
  }

  return {
    credentialHeader: name,
    // any value is a token or a failure (an empty Authorization is not "Bearer <token>")
    offersSecret: headers => headers[name] !== undefined,
    resolve (headers, required) {
      const raw = headers[name]
      if (raw === undefined) return absent(required)
      if (typeof raw !== 'string') return repeated
      const token = bearerToken(raw, bareTokenAllowed)
      if (token === null) return notBearer
      if (token.length > MAX_TOKEN_LENGTH) return tooLarge
      return verified.get(token) ?? verify(token)
    }
  }
}

// RFC 6750 §2.1: "Bearer" 1*SP token; RFC 9110 §11.1: the scheme is case-insensitive.
function bearerToken (value: string, bareTokenAllowed: boolean): string | null {
  const v = value.trim()
  if (v.length > 7 && v.charCodeAt(6) === 0x20 && v.slice(0, 6).toLowerCase() === 'bearer') {
    const token = v.slice(7).trimStart()
    return token.length === 0 ? null : token
  }
  if (!bareTokenAllowed || v.length === 0 || v.includes(' ')) return null
  return v
}

async function compileJwtKey (jwt: JwtConfig, warmJwks: boolean): Promise<{ key: Uint8Array | JWTVerifyGetKey; algorithms: string[] }> {
  const listed = jwt.algorithms
  if (listed !== undefined && listed.length === 0) throw invalid('jwt.algorithms is empty')

  if (jwt.secret !== undefined) {
    const algorithms = listed ?? ['HS256']
    for (const alg of algorithms) {
      if (!HMAC_ALGS.includes(alg)) throw invalid(`jwt.algorithms: "${alg}" does not use a shared secret (expected ${HMAC_ALGS.join(', ')})`)
    }
    const key = new TextEncoder().encode(jwt.secret)
    const needed = Math.max(...algorithms.map(a => HMAC_MIN_BYTES[a] ?? 0))
    if (key.byteLength < needed) throw invalid(`jwt.secret must be at least ${needed} bytes for ${algorithms.join(', ')} (RFC 7518 §3.2)`)
    return { key, algorithms }
  }

  if (jwt.publicKey !== undefined) {
    const pem = jwt.publicKey
    const algorithms = listed ?? [defaultAlgorithmOf(pem)]
    // Import once per algorithm: a WebCrypto key is bound to one algorithm. Only asymmetric
    // algorithms are allowed, so an HS256 token "signed" with the public key text is refused
    // before any key is chosen (the classic alg-confusion attack, RFC 8725 §2.1).
    const keys = new Map<string, CryptoKey>()
    for (const alg of algorithms) {
      if (!ASYMMETRIC_ALGS.includes(alg)) throw invalid(`jwt.algorithms: "${alg}" cannot be used with a public key`)
      try {
        keys.set(alg, await importSPKI(pem, alg))
      } catch (err) {
        throw invalid(`jwt.publicKey cannot be used with ${alg}: ${(err as Error).message}`, err)
      }
    }
    const getKey: JWTVerifyGetKey = (header) => {
      const k = header.alg === undefined ? undefined : keys.get(header.alg)
      // Unreachable while `algorithms` is passed to jwtVerify, which checks alg first.
      if (k === undefined) throw new Error('no key for this algorithm')
      return k
    }
    return { key: getKey, algorithms }
  }

  const algorithms = listed ?? ASYMMETRIC_ALGS
  for (const alg of algorithms) {
    if (!ASYMMETRIC_ALGS.includes(alg)) throw invalid(`jwt.algorithms: "${alg}" cannot be used with a JWKS URL`)
  }
  let url: URL
  try {
    url = new URL(jwt.jwksUrl as string)
  } catch {
    // quoted redacted, and without the TypeError as cause: it carries the URL as written (`input`)
    throw invalid(`jwt.jwksUrl is not a URL: ${redactUrl(jwt.jwksUrl as string)}`)
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') throw invalid('jwt.jwksUrl must be http(s)')
  // jose caches the set, refetches on an unknown "kid" at most once per cooldown, and bounds each
  // fetch: an identity provider outage costs a request at most timeoutDuration.
  const jwks = createRemoteJWKSet(url, { timeoutDuration: 3000, cooldownDuration: 30_000, cacheMaxAge: 600_000 })
  // Warm the cache so the first request does not wait; a failure here is retried on use.
  if (warmJwks) jwks.reload().catch(() => {})
  return { key: jwks, algorithms }
}

// The algorithm a bare PEM key implies: RSA -> RS256, EC -> by curve, Ed25519 -> EdDSA.
function defaultAlgorithmOf (pem: string): string {
  let type: string | undefined
  let curve: string | undefined
  try {
    const k = createPublicKey(pem)
    type = k.asymmetricKeyType
    curve = k.asymmetricKeyDetails?.namedCurve
  } catch (err) {
    throw invalid(`jwt.publicKey is not a PEM public key: ${(err as Error).message}`, err)
  }
  if (type === 'rsa') return 'RS256'
  if (type === 'rsa-pss') return 'PS256'
  if (type === 'ed25519') return 'EdDSA'
  if (type === 'ec') {
    if (curve === 'prime256v1') return 'ES256'
    if (curve === 'secp384r1') return 'ES384'
    if (curve === 'secp521r1') return 'ES512'
  }
  throw invalid(`jwt.publicKey: unsupported key type ${type ?? 'unknown'}${curve === undefined ? '' : ` (${curve})`}, list jwt.algorithms`)
}

const KEY_SET_UNAVAILABLE: IdentityResult = Object.freeze({ ok: false, reason: 'key set unavailable', unavailable: true })
// Reasons by jose error code (stable, unlike messages); frozen so a failure allocates nothing more.
const JOSE_REASONS: ReadonlyMap<string, IdentityResult> = new Map([
  ['ERR_JWT_EXPIRED', failure('token expired')],
  ['ERR_JWS_SIGNATURE_VERIFICATION_FAILED', failure('invalid token signature')],
  ['ERR_JOSE_ALG_NOT_ALLOWED', failure('token algorithm not allowed')],
  ['ERR_JOSE_NOT_SUPPORTED', failure('token algorithm not supported')],
  ['ERR_JWS_INVALID', failure('malformed token')],
  ['ERR_JWT_INVALID', failure('malformed token')],
  ['ERR_JWKS_NO_MATCHING_KEY', failure('no key matches the token')],
  ['ERR_JWKS_TIMEOUT', KEY_SET_UNAVAILABLE],
  ['ERR_JWKS_INVALID', KEY_SET_UNAVAILABLE]
])
const CLAIM_REASONS: ReadonlyMap<string, IdentityResult> = new Map(
  ['iss', 'aud', 'nbf', 'iat', 'exp', 'sub', 'jti'].map(c => [c, failure(`token "${c}" claim check failed`)])
)
const INVALID_TOKEN = failure('invalid token')
const UNVERIFIABLE = failure('token could not be verified')

function joseFailure (err: unknown, remote: boolean): IdentityResult {
  const { code, claim } = err as { code?: unknown; claim?: unknown }
  if (code === 'ERR_JWT_CLAIM_VALIDATION_FAILED' && typeof claim === 'string') return CLAIM_REASONS.get(claim) ?? INVALID_TOKEN
  // A JWKS fetch that fails at the socket (undici TypeError) or answers non-200 (generic
  // JOSEError) carries no specific code.
  if (remote && (code === undefined || code === 'ERR_JOSE_GENERIC')) return KEY_SET_UNAVAILABLE
  if (typeof code === 'string') return JOSE_REASONS.get(code) ?? INVALID_TOKEN
  return UNVERIFIABLE
}
