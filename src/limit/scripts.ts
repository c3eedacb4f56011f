import { readFileSync } from 'node:fs'
import { ALGORITHM_CODES, type LimitCheck, type LimitDecision, type LimitSpec } from './types.js'

// The Lua scripts, built once at load time from the files in lua/: the shared helpers, one file
// per algorithm, then the entry point. See the header of each file for its KEYS, ARGV and reply.

const LUA_DIR = new URL('../../lua/', import.meta.url)
const LIBRARY = [
  'common.lua',
  'gcra.lua',
  'token-bucket.lua',
  'leaky-bucket.lua',
  'sliding-window-log.lua',
  'sliding-window.lua',
  'fixed-window.lua',
  'calendar-quota.lua',
  'lease.lua',
  'decide.lua'
]

const read = (file: string): string => readFileSync(new URL(file, LUA_DIR), 'utf8')
const library = LIBRARY.map(read).join('\n')

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

/** lua/lease-release.lua: gives back the leases released in one event-loop turn. */
export const LEASE_RELEASE_SCRIPT = read('lease-release.lua')
/** lua/lease-renew.lua: pushes the expiry of held leases one TTL ahead. */
export const LEASE_RENEW_SCRIPT = read('lease-renew.lua')

type Arg = string | number

// A check's six integers travel as one string, built once per (spec, cost) and reused: the client
// then encodes one short argument per check instead of converting six numbers on every call.
const checkArgs = new WeakMap<LimitSpec, { readonly cost: number, readonly arg: string }>()

function pushCheck (args: Arg[], check: LimitCheck): void {
  const s = check.spec
  let cached = checkArgs.get(s)
  if (cached === undefined || cached.cost !== check.cost) {
    cached = { cost: check.cost, arg: `${ALGORITHM_CODES[s.algorithm]},${s.limit},${s.windowMs},${s.burst},${check.cost},${s.maxDelayMs}` }
    checkArgs.set(s, cached)
  }
  args.push(cached.arg)
}

/**
 * ARGV of LIMIT_SCRIPT: now override (µs; 0 = Redis TIME, positive only in tests), request id,
 * then one "code,limit,windowMs,burst,cost,maxDelayMs" string per check.
 */
export function limitArgs (checks: readonly LimitCheck[], requestId: string, nowOverrideUs = 0): Arg[] {
  const args: Arg[] = [nowOverrideUs, requestId]
  for (const check of checks) pushCheck(args, check)
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

const NO_RELEASES: LeaseReleases = Object.freeze([])

/**
 * KEYS and ARGV of LIMIT_BATCH_SCRIPT, as one array after the key count: the releases' lease keys
 * and every request's keys, then now override, the request count, the release count and lease
 * ids, and per request its id, check count and checks.
 */
export function batchKeysAndArgs (batch: readonly BatchedRequest[], nowOverrideUs = 0, releases: LeaseReleases = NO_RELEASES): { numKeys: number, keysAndArgs: Arg[] } {
  const keysAndArgs: Arg[] = []
  for (const [key] of releases) keysAndArgs.push(key)
  for (const r of batch) for (const key of r.keys) keysAndArgs.push(key)
  const numKeys = keysAndArgs.length
  keysAndArgs.push(nowOverrideUs, batch.length, releases.length)
  for (const [, member] of releases) keysAndArgs.push(member)
  for (const r of batch) {
    keysAndArgs.push(r.id, r.checks.length)
    for (const check of r.checks) pushCheck(keysAndArgs, check)
  }
  return { numKeys, keysAndArgs }
}

/**
 * Splits LIMIT_BATCH_SCRIPT's reply (one string of comma-separated integers) into one limit.lua
 * reply per request; throws on anything else.
 */
export function parseBatchReply (reply: unknown, batch: readonly BatchedRequest[]): LimitReply[] {
  if (typeof reply !== 'string') throw new TypeError(`unexpected reply from limit-batch.lua: ${JSON.stringify(reply)}`)
  const values = parseIntegerList(reply)
  const out: LimitReply[] = []
  let at = 0
  for (const r of batch) {
    const length = values[at]
    if (length === undefined || at + 1 + length > values.length) throw new TypeError('limit-batch.lua returned fewer replies than requests')
    out.push(limitReplyAt(values, at + 1, length, r.checks.length))
    at += 1 + length
  }
  if (at !== values.length) throw new TypeError('limit-batch.lua returned more replies than requests')
  return out
}

/** "12,-1,0" -> [12, -1, 0]; throws on anything but optionally signed integers between commas. */
export function parseIntegerList (text: string): number[] {
  const values: number[] = []
  let value = 0
  let negative = false
  let digits = 0
  for (let i = 0; i <= text.length; i++) {
    const c = i === text.length ? 44 /* , */ : text.charCodeAt(i)
    if (c >= 48 && c <= 57) {
      value = value * 10 + (c - 48)
      digits++
    } else if (c === 44) {
      if (digits === 0) throw new TypeError(`unexpected reply from limit-batch.lua: ${JSON.stringify(text.slice(0, 200))}`)
      values.push(negative ? -value : value)
      value = 0
      negative = false
      digits = 0
    } else if (c === 45 /* - */ && digits === 0 && !negative) {
      negative = true
    } else {
      throw new TypeError(`unexpected reply from limit-batch.lua: ${JSON.stringify(text.slice(0, 200))}`)
    }
  }
  return values
}

/** ARGV of REFUND_SCRIPT: as limitArgs, each check followed by its receipt from the limit reply. */
export function refundArgs (checks: readonly LimitCheck[], receipts: readonly number[], requestId: string, nowOverrideUs = 0): Arg[] {
  const args: Arg[] = [nowOverrideUs, requestId]
  checks.forEach((check, i) => {
    pushCheck(args, check)
    args.push(receipts[i] as number)
  })
  return args
}

/** ARGV of CHARGE_SCRIPT: as limitArgs, with each check's cost the units to charge. */
export function chargeArgs (checks: readonly LimitCheck[], callId: string, nowOverrideUs = 0): Arg[] {
  return limitArgs(checks, callId, nowOverrideUs)
}

export interface LimitReply {
  readonly decision: LimitDecision
  /** Redis time of the decision, ms. */
  readonly nowMs: number
  /** One per check when allowed (what refund needs), empty when rejected. */
  readonly receipts: readonly number[]
  /** One per check: its budget left (after this request when allowed, before it when rejected). */
  readonly remainings: readonly number[]
}

/** Parses LIMIT_SCRIPT's reply for `checkCount` checks; throws on anything else. */
export function parseLimitReply (reply: unknown, checkCount: number): LimitReply {
  if (!Array.isArray(reply) || !reply.every((v) => typeof v === 'number')) {
    throw new TypeError(`unexpected reply from limit.lua: ${JSON.stringify(reply)}`)
  }
  return limitReplyAt(reply as number[], 0, reply.length, checkCount)
}

/** limit.lua's reply read from `values[start .. start + length)`. */
function limitReplyAt (values: readonly number[], start: number, length: number, checkCount: number): LimitReply {
  if (length < 7) throw new TypeError(`unexpected reply from limit.lua: ${JSON.stringify(values.slice(start, start + length))}`)
  const allowed = values[start] === 1
  const expected = 7 + (allowed ? 2 : 1) * checkCount
  if (length !== expected) throw new TypeError(`limit.lua returned ${length} values for ${checkCount} checks (expected ${expected})`)
  const remainings = values.slice(start + expected - checkCount, start + expected)
  return {
    decision: {
      allowed,
      remaining: values[start + 1] as number,
      retryAfterMs: values[start + 2] as number,
      resetMs: values[start + 3] as number,
      limitingIndex: values[start + 4] as number,
      delayMs: values[start + 5] as number,
      ...(allowed && checkCount > 0 ? { remainings } : {})
    },
    nowMs: values[start + 6] as number,
    receipts: allowed ? values.slice(start + 7, start + 7 + checkCount) : [],
    remainings
  }
}
