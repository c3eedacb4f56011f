import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { ALGORITHM_CODES, type LimitCheck, type LimitDecision, type LimitSpec } from './types.js'

// The Lua scripts, built once at load time from the files in lua/: the shared helpers, the
// algorithm files as the branches of one loader (algorithmLoader), the decision, then the entry
// point. See the header of each file for its KEYS, ARGV and reply.

const LUA_DIR = new URL('../../lua/', import.meta.url)
// The algorithm files: the branches of load_algorithm (lua/common.lua), one per code.
const ALGORITHM_FILES = [
  'gcra.lua',
  'token-bucket.lua',
  'leaky-bucket.lua',
  'sliding-window-log.lua',
  'sliding-window.lua',
  'fixed-window.lua',
  'calendar-quota.lua',
  'lease.lua'
]

const read = (file: string): string => readFileSync(new URL(file, LUA_DIR), 'utf8')

/**
 * lua/common.lua's load_algorithm: one function whose branch for each code is the file that
 * registers ALGORITHMS[code], so a call makes only the algorithms it names. Lua 5.1 gives a
 * function at most 60 upvalues: all the branches together may use at most 60 of common.lua's
 * locals (past that, every script fails to load, and so every test that runs one).
 */
export function algorithmLoader (files: ReadonlyArray<readonly [file: string, text: string]>): string {
  const branches = files.map(([file, text], i) => {
    const codes = [...text.matchAll(/^ALGORITHMS\[(\d+)\] = /gm)]
    if (codes.length !== 1) throw new Error(`lua/${file} registers ${codes.length} algorithms: a branch of load_algorithm makes one`)
    return `${i === 0 ? 'if' : 'elseif'} code == ${(codes[0] as RegExpMatchArray)[1]} then\n${text}\n`
  })
  return `load_algorithm = function (code)\n${branches.join('')}end\nend`
}

const library = [
  read('common.lua'),
  algorithmLoader(ALGORITHM_FILES.map((file) => [file, read(file)])),
  read('decide.lua')
].join('\n')

/** lua/limit.lua with its library: decides all checks of a request atomically, all or nothing. */
export const LIMIT_SCRIPT = `${library}\n${read('limit.lua')}`
/** lua/limit-batch.lua with its library: the limit requests of one event-loop turn in one call. */
export const LIMIT_BATCH_SCRIPT = `${library}\n${read('limit-batch.lua')}`
/** lua/refund.lua with its library: undoes admissions recorded by LIMIT_SCRIPT. */
export const REFUND_SCRIPT = `${library}\n${read('refund.lua')}`
/** lua/peek.lua with its library: what limit.lua would decide, consuming nothing (read-only). */
export const PEEK_SCRIPT = `${library}\n${read('peek.lua')}`
/** lua/charge.lua with its library: records units a fallback admitted (a debt). */
export const CHARGE_SCRIPT = `${library}\n${read('charge.lua')}`

/** The store's entry points, each a function of FUNCTION_LIBRARY named functionName(entry). */
export type FunctionEntry = 'limit' | 'limit_batch' | 'refund' | 'charge'

const FUNCTION_ENTRIES: ReadonlyArray<readonly [FunctionEntry, string]> = [
  ['limit', 'limit.lua'],
  ['limit_batch', 'limit-batch.lua'],
  ['refund', 'refund.lua'],
  ['charge', 'charge.lua']
]

/**
 * The library and its entry scripts as one Redis function library (Redis >= 7, FUNCTION LOAD,
 * called with FCALL: src/limit/redis-functions.ts). Redis runs a script's whole chunk on every
 * EVALSHA: the library's helpers, the algorithms a call names and the limits it parses are made
 * again each time. A function library is loaded once, and this one makes the library on its first
 * call and keeps it (lua/common.lua, begin_call). Redis runs a library's top level with nothing but
 * `redis` in reach (no `math`, no `string`), so the library is made inside `setup`, at call time.
 * The entry scripts are the same files as the EVALSHA scripts', as function bodies whose KEYS and
 * ARGV are their arguments. The name carries a hash of the text: instances of two versions of the
 * gateway (a rolling deploy) each call their own, side by side.
 */
function functionLibrary (): { name: string, text: string } {
  const body = [
    'local call_entry',
    'local function setup ()',
    library,
    'local entries = {}',
    ...FUNCTION_ENTRIES.map(([entry, file]) => `entries.${entry} = function (KEYS, ARGV)\n${read(file)}\nend`),
    'return function (entry, keys, args)',
    '  begin_call()',
    '  return entries[entry](keys, args)',
    'end',
    'end'
  ].join('\n')
  const name = `gateway_${createHash('sha1').update(body).digest('hex').slice(0, 16)}`
  const registrations = FUNCTION_ENTRIES.map(([entry]) =>
    `redis.register_function('${name}_${entry}', function (keys, args)\n` +
    '  if not call_entry then call_entry = setup() end\n' +
    `  return call_entry('${entry}', keys, args)\nend)`)
  return { name, text: `#!lua name=${name}\n${body}\n${registrations.join('\n')}\n` }
}

const FUNCTIONS = functionLibrary()
/** The library's name in Redis (FUNCTION LIST, FUNCTION DELETE): gateway_ and a hash of its code. */
export const FUNCTION_LIBRARY_NAME = FUNCTIONS.name
/** FUNCTION LOAD's argument. */
export const FUNCTION_LIBRARY = FUNCTIONS.text
/** FCALL's name of an entry point. */
export const functionName = (entry: FunctionEntry): string => `${FUNCTIONS.name}_${entry}`

/** lua/lease-release.lua: gives back the leases released in one event-loop turn. */
export const LEASE_RELEASE_SCRIPT = read('lease-release.lua')
/** lua/lease-renew.lua: pushes the expiry of held leases one TTL ahead. */
export const LEASE_RENEW_SCRIPT = read('lease-renew.lua')

type Arg = string | number

// A check's six integers travel as one string, built once per (spec, cost) and reused: the client
// then encodes one short argument per check instead of converting six numbers on every call.
const checkArgs = new WeakMap<LimitSpec, { readonly cost: number, readonly arg: string }>()

function checkArg (check: LimitCheck): string {
  const s = check.spec
  let cached = checkArgs.get(s)
  if (cached === undefined || cached.cost !== check.cost) {
    cached = { cost: check.cost, arg: `${ALGORITHM_CODES[s.algorithm]},${s.limit},${s.windowMs},${s.burst},${check.cost},${s.maxDelayMs}` }
    checkArgs.set(s, cached)
  }
  return cached.arg
}

/**
 * ARGV of LIMIT_SCRIPT: now override (µs; 0 = Redis TIME, positive only in tests), request id,
 * then one "code,limit,windowMs,burst,cost,maxDelayMs" string per check.
 */
export function limitArgs (checks: readonly LimitCheck[], requestId: string, nowOverrideUs = 0): Arg[] {
  const args: Arg[] = [nowOverrideUs, requestId]
  for (const check of checks) args.push(checkArg(check))
  return args
}

/** One request of a LIMIT_BATCH_SCRIPT call: its keys (prefixed) and checks, in the same order. */
export interface BatchedRequest {
  readonly keys: readonly string[]
  readonly checks: readonly LimitCheck[]
  readonly id: string
}

/** Lease releases riding with a limit call: [lease key (prefixed), lease id] pairs. */
export type LeaseReleases = ReadonlyArray<readonly [string, string]>

/** Where the releases that ride with limit calls come from (src/limit/concurrency.ts, LeaseKeeper). */
export interface ReleaseCarrier {
  /** The releases waiting, for the call about to be sent; null when none wait. */
  take(): LeaseReleases | null
  /** The call that carried `releases` failed: whether Redis took them is unknown. */
  failed(releases: LeaseReleases, err: unknown): void
}

const NO_RELEASES: LeaseReleases = Object.freeze([])

// The numbers of a batch's request strings: three characters of '0'..'o' each (base 64, see
// lua/limit-batch.lua), so the script reads them with string.byte instead of a pattern.
const CODE_DIGITS = 64
const CODE_LIMIT = CODE_DIGITS ** 3
const codes: string[] = []
function codeOf (n: number): string {
  let code = codes[n]
  if (code === undefined) {
    if (!Number.isInteger(n) || n < 0 || n >= CODE_LIMIT) throw new RangeError(`a limit batch cannot number ${n} (at most ${CODE_LIMIT - 1} keys, checks or checks per request)`)
    code = String.fromCharCode(48 + Math.floor(n / 4096), 48 + (Math.floor(n / 64) % 64), 48 + (n % 64))
    codes[n] = code
  }
  return code
}

/**
 * KEYS and ARGV of LIMIT_BATCH_SCRIPT (see its header), as one array after the key count. Each
 * distinct key and check string goes once; a request is one string of indexes into them and its
 * id. Arguments are what the call costs on both ends: four limits on a batch of 50 requests sent
 * as ten arguments per request cost about twice the client CPU of the decisions themselves.
 */
export function batchKeysAndArgs (batch: readonly BatchedRequest[], nowOverrideUs = 0, releases: LeaseReleases = NO_RELEASES): { numKeys: number, keysAndArgs: Arg[] } {
  const keysAndArgs: Arg[] = []
  // Lua's 1-based positions in KEYS and in the list of check strings
  const keyAt = new Map<string, number>()
  const keyIndex = (key: string): number => {
    let at = keyAt.get(key)
    if (at === undefined) {
      at = keysAndArgs.push(key)
      keyAt.set(key, at)
    }
    return at
  }
  const checks: string[] = []
  const checkAt = new Map<string, number>()
  const released: string[] = []
  for (const [key, member] of releases) released.push(codeOf(keyIndex(key)) + member)
  const requests: string[] = []
  for (const r of batch) {
    let described = codeOf(r.checks.length)
    for (let i = 0; i < r.checks.length; i++) {
      const arg = checkArg(r.checks[i] as LimitCheck)
      let c = checkAt.get(arg)
      if (c === undefined) {
        c = checks.push(arg)
        checkAt.set(arg, c)
      }
      described += codeOf(keyIndex(r.keys[i] as string)) + codeOf(c)
    }
    requests.push(described + r.id)
  }
  const numKeys = keysAndArgs.length
  keysAndArgs.push(nowOverrideUs, batch.length, releases.length, ...released, checks.length, ...checks, ...requests)
  return { numKeys, keysAndArgs }
}

/**
 * Splits LIMIT_BATCH_SCRIPT's reply (one string of comma-separated integers, asked for as bytes)
 * into one limit.lua reply per request: nowMs once, then per request its six values and one
 * remaining per check (no receipts: nothing batched is ever refunded). Each request's length is
 * known here from its checks, so the script sends none; a reply of another shape throws.
 * - Bytes, not a string: indexing a Uint8Array is a plain element load, where a string's length
 *   and charCodeAt went through V8's generic LoadIC in the gateway (a quarter of the batcher's
 *   CPU in a perf profile), and ioredis skips decoding the reply to a string.
 * - Each request's values are read into locals and its remainings into their own array: no array
 *   of the whole reply, whose elements would change kind from small integers to doubles at the
 *   first large value of every call.
 */
export function parseBatchReply (reply: unknown, batch: readonly BatchedRequest[]): LimitReply[] {
  if (!(reply instanceof Uint8Array)) throw new TypeError(`unexpected reply from limit-batch.lua: ${JSON.stringify(reply)}`)
  const out: LimitReply[] = new Array(batch.length)
  const end = reply.length
  const nowMs = readInteger(reply, 0)
  let at = integerEnd + 1
  for (let r = 0; r < batch.length; r++) {
    const request = batch[r] as BatchedRequest
    const n = request.checks.length
    // every value but the last of the reply is followed by a comma: at most `end` while one is due
    if (at + 2 * (6 + n) - 1 > end) throw new TypeError('limit-batch.lua returned fewer values than its requests need')
    const allowed = readInteger(reply, at)
    const remaining = readInteger(reply, integerEnd + 1)
    const retryAfterMs = readInteger(reply, integerEnd + 1)
    const resetMs = readInteger(reply, integerEnd + 1)
    const limitingIndex = readInteger(reply, integerEnd + 1)
    const delayMs = readInteger(reply, integerEnd + 1)
    const remainings: number[] = new Array(n)
    for (let i = 0; i < n; i++) remainings[i] = readInteger(reply, integerEnd + 1)
    at = integerEnd + 1
    if (allowed !== 0 && allowed !== 1) throw new TypeError(`unexpected reply from limit-batch.lua: allowed is ${allowed}`)
    out[r] = {
      // two literals rather than a spread of an optional field: no object cloned per reply
      decision: allowed === 1
        ? { allowed: true, remaining, retryAfterMs, resetMs, limitingIndex, delayMs, remainings }
        : { allowed: false, remaining, retryAfterMs, resetMs, limitingIndex, delayMs },
      callId: request.id,
      nowMs,
      receipts: NO_RECEIPTS,
      remainings
    }
  }
  if (at <= end) throw new TypeError('limit-batch.lua returned more values than its requests need')
  return out
}

/** Where the integer readInteger read last ends (its comma, or the end of the bytes). */
let integerEnd = 0

/**
 * The optionally signed integer at bytes[at ...], which must end at a comma or at the end of the
 * bytes (then integerEnd is set there); throws on anything else.
 */
function readInteger (bytes: Uint8Array, at: number): number {
  const end = bytes.length
  let i = at
  let negative = false
  if (i < end && bytes[i] === 45 /* - */) {
    negative = true
    i++
  }
  let value = 0
  const start = i
  for (; i < end; i++) {
    const c = bytes[i] as number
    if (c < 48 || c > 57) break
    value = value * 10 + (c - 48)
  }
  if (i === start || (i < end && bytes[i] !== 44 /* , */)) {
    throw new TypeError(`unexpected reply from limit-batch.lua: ${JSON.stringify(Buffer.from(bytes.subarray(0, 200)).toString('latin1'))}`)
  }
  integerEnd = i
  return negative ? -value : value
}

/** "12,-1,0" -> [12, -1, 0]; throws on anything but optionally signed integers between commas. */
export function parseIntegerList (text: string | Uint8Array): number[] {
  const bytes = typeof text === 'string' ? Buffer.from(text, 'utf8') : text
  const values: number[] = []
  let at = 0
  do {
    values.push(readInteger(bytes, at))
    at = integerEnd + 1
  } while (at <= bytes.length)
  return values
}

/** ARGV of REFUND_SCRIPT: as limitArgs, each check followed by its receipt from the limit reply. */
export function refundArgs (checks: readonly LimitCheck[], receipts: readonly number[], requestId: string, nowOverrideUs = 0): Arg[] {
  const args: Arg[] = [nowOverrideUs, requestId]
  checks.forEach((check, i) => {
    args.push(checkArg(check), receipts[i] as number)
  })
  return args
}

/** ARGV of CHARGE_SCRIPT: as limitArgs, with each check's cost the units to charge. */
export function chargeArgs (checks: readonly LimitCheck[], callId: string, nowOverrideUs = 0): Arg[] {
  return limitArgs(checks, callId, nowOverrideUs)
}

export interface LimitReply {
  readonly decision: LimitDecision
  /** The id the call recorded under (lease members, sliding-window-log entries); '' when not given. */
  readonly callId: string
  /** Redis time of the decision, ms. */
  readonly nowMs: number
  /**
   * One per check when allowed (what refund needs), empty when rejected, and always empty from a
   * batch: only Redis Cluster refunds, and it is never batched.
   */
  readonly receipts: readonly number[]
  /** One per check: its budget left (after this request when allowed, before it when rejected). */
  readonly remainings: readonly number[]
}

/** Parses LIMIT_SCRIPT's reply for `checkCount` checks; throws on anything else. */
export function parseLimitReply (reply: unknown, checkCount: number, callId = ''): LimitReply {
  if (!Array.isArray(reply) || !reply.every((v) => typeof v === 'number')) {
    throw new TypeError(`unexpected reply from limit.lua: ${JSON.stringify(reply)}`)
  }
  const values = reply as number[]
  const length = values.length
  if (length < 7) throw new TypeError(`unexpected reply from limit.lua: ${JSON.stringify(values)}`)
  const allowed = values[0] === 1
  const expected = 7 + (allowed ? 2 : 1) * checkCount
  if (length !== expected) throw new TypeError(`limit.lua returned ${length} values for ${checkCount} checks (expected ${expected})`)
  const remainings = values.slice(expected - checkCount, expected)
  const remaining = values[1] as number
  const retryAfterMs = values[2] as number
  const resetMs = values[3] as number
  const limitingIndex = values[4] as number
  const delayMs = values[5] as number
  return {
    decision: allowed && checkCount > 0
      ? { allowed, remaining, retryAfterMs, resetMs, limitingIndex, delayMs, remainings }
      : { allowed, remaining, retryAfterMs, resetMs, limitingIndex, delayMs },
    callId,
    nowMs: values[6] as number,
    receipts: allowed ? values.slice(7, 7 + checkCount) : NO_RECEIPTS,
    remainings
  }
}

const NO_RECEIPTS: readonly number[] = Object.freeze([])

