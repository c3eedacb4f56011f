// The wire format of a limit batch (lua/limit-batch.lua, issue 13): each distinct key and check
// string goes once, each request is one string of three-character index codes followed by its
// id. These tests call the script on a real redis-server the way the store does, and check what
// Redis then holds: the ids come back whole whatever they contain, shared keys are sent once,
// and a malformed batch is refused with its reason before any counter is written.
import t from 'tap'
import { commandStats, startRedis } from './helpers/redis.js'
import { LIMIT_BATCH_SCRIPT, batchKeysAndArgs, type BatchedRequest } from '../src/limit/scripts.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import type { LimitCheck, LimitSpec } from '../src/limit/types.js'

const gcra: LimitSpec = Object.freeze({ id: 'g', algorithm: 'gcra', limit: 100, windowMs: 1000, burst: 100, maxDelayMs: 0 })
const log: LimitSpec = Object.freeze({ id: 'l', algorithm: 'sliding-window-log', limit: 100, windowMs: 60_000, burst: 100, maxDelayMs: 0 })

const check = (key: string, spec: LimitSpec): LimitCheck => ({ key, spec, cost: 1 })
const request = (id: string, ...checks: LimitCheck[]): BatchedRequest => ({ id, checks, keys: checks.map((c) => c.key) })

t.test('shared keys and check strings are sent once; every request gets its own decision and ids come back whole', async (t) => {
  const redis = await startRedis(t)
  const client = redis.client()
  const now = Date.now() * 1000
  // ids as a client's X-Request-Id may make them: commas, the code characters, non-ASCII
  const ids = ['a,b,,c', '000001o0o', 'ünï-çødé ✓', '']
  const batch = ids.map((id, i) => request(id, check('global', gcra), check(`log:${i % 2}`, log)))
  const { numKeys, keysAndArgs } = batchKeysAndArgs(batch, now)

  t.same(keysAndArgs.slice(0, numKeys), ['global', 'log:0', 'log:1'], 'each key once, in the order of first use')
  const argv = keysAndArgs.slice(numKeys)
  t.same(argv.slice(0, 4), [now, 4, 0, 2], 'now, request count, no releases, two distinct check strings')
  t.equal(argv.length, 4 + 2 + 4, 'the two check strings once, then one string per request')

  const reply = await client.eval(LIMIT_BATCH_SCRIPT, numKeys, ...keysAndArgs) as string
  const values = reply.split(',').map(Number)
  t.equal(values[0], Math.floor(now / 1000), 'the batch\'s time in ms, once')
  // per request eight values (six, then a remaining per check: a batch sends no receipts):
  // allowed = 1, and after the six values what is left of the shared gcra budget and of its log
  for (let i = 0; i < 4; i++) {
    t.equal(values[1 + i * 8], 1, `request ${i} decided and admitted`)
    t.same([values[1 + i * 8 + 6], values[1 + i * 8 + 7]], [99 - i, 99 - Math.floor(i / 2)], `request ${i}: the remainings of its two checks`)
  }
  t.equal(values.length, 1 + 4 * 8, 'the time, then four replies')
  t.equal(await client.get('global'), String(now + 4 * 10_000), 'the shared gcra key counted all four requests')
  const members = [...await client.zrange('log:0', '0', '-1'), ...await client.zrange('log:1', '0', '-1')].sort()
  t.same(members, ids.map((id) => `${id}:1`).sort(), 'each log entry carries its request id unchanged')
})

t.test('a malformed batch is refused with its reason, and no counter is written', async (t) => {
  const redis = await startRedis(t)
  const client = redis.client()
  const now = Date.now() * 1000
  const { numKeys, keysAndArgs } = batchKeysAndArgs([request('r1', check('global', gcra)), request('r2', check('global', gcra))], now)
  const keys = keysAndArgs.slice(0, numKeys)
  const args = keysAndArgs.slice(numKeys)
  const refused = async (argv: Array<string | number>, keyList: Array<string | number> = keys): Promise<string> =>
    await client.eval(LIMIT_BATCH_SCRIPT, keyList.length, ...keyList, ...argv).then(() => 'answered', (err: Error) => err.message)

  const good = args.slice()
  const lastRequest = String(good[good.length - 1])
  const cases: Array<[string, Array<string | number>, RegExp, Array<string | number>?]> = [
    ['request count 0', [now, 0, ...args.slice(2)], /bad request count/],
    ['one argument missing', good.slice(0, -1), /arguments do not match/],
    ['a key index past KEYS', [...good.slice(0, -1), `001002001${lastRequest.slice(9)}`], /bad request/],
    ['a check index past the check strings', [...good.slice(0, -1), `001001002${lastRequest.slice(9)}`], /bad request/],
    // '0/q' would read as key 1 if the characters were not checked: (0, -1, 65) in base 64
    ['a code character outside 0..o', [...good.slice(0, -1), `0010/q001${lastRequest.slice(9)}`], /bad request/],
    ['a check code character outside 0..o', [...good.slice(0, -1), `0010010/q${lastRequest.slice(9)}`], /bad request/],
    ['a request string cut short', [...good.slice(0, -1), '00100'], /bad request/],
    ['a release naming no key', [now, 2, 1, '005lease', ...args.slice(3)], /bad lease release/]
  ]
  for (const [name, argv, reason] of cases) {
    t.match(await refused(argv), new RegExp(`limit-batch\\.lua: .*${reason.source}`), name)
  }
  t.equal(await client.exists('global'), 0, 'no refused batch wrote the shared key')
  t.match(await refused(good), /answered/, 'the well-formed batch is answered')
  t.equal(await client.get('global'), String(now + 2 * 10_000), 'and counts its two requests')
})

t.test('keys that every request of a batch shares are read once and written once per batch', async (t) => {
  const redis = await startRedis(t)
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const reader = redis.client()
  const store = createRedisStore({ client })
  const fixed: LimitSpec = Object.freeze({ id: 'f', algorithm: 'fixed-window', limit: 1000, windowMs: 3_600_000, burst: 1000, maxDelayMs: 0 })
  // the gateway's four dimensions: global (gcra, a string), api (fixed-window, a hash), ip
  // (sliding-window-log, a sorted set), all three shared, and a user key of each request's own
  const checksOf = (i: number): LimitCheck[] => [check('global', gcra), check('api', fixed), check('ip', log), check(`user:${i}`, log)]
  // a warm-up batch of two: limit-batch.lua loaded, so the counts below are the batch's alone
  await Promise.all([store.decide(checksOf(98), 'warm1'), store.decide(checksOf(99), 'warm2')])
  await reader.config('RESETSTAT')
  const decisions = await Promise.all(Array.from({ length: 10 }, (_, i) => store.decide(checksOf(i), `r${i}`)))
  t.ok(decisions.every((d) => d.allowed), 'all ten admitted')
  const stat = await commandStats(reader)
  const calls = (command: string): number => stat(command).calls
  t.equal(calls('fcall') + calls('evalsha') + calls('eval'), 1, 'one script call for the ten requests')
  t.same({ get: calls('get'), set: calls('set') }, { get: 1, set: 1 }, 'the shared gcra key: one GET, one SET')
  t.same({ hmget: calls('hmget'), hset: calls('hset') }, { hmget: 1, hset: 1 }, 'the shared fixed window: one HMGET, one HSET')
  // ip once, each request's own user log once
  t.same({ zcount: calls('zcount'), zadd: calls('zadd'), zremrangebyscore: calls('zremrangebyscore') }, { zcount: 11, zadd: 11, zremrangebyscore: 11 },
    'the shared log: one count, one ZADD and one trim (the ten user logs one each)')
  t.equal(calls('pexpire'), 1 + 11, 'one expiry per written hash and log')
  t.equal(await reader.zcard('ip'), 12, 'the shared log holds the two warm-up requests and the ten')
})

t.test('one log key checked under two windows in one batch counts every entry the batch admitted', async (t) => {
  // The gateway never makes this (a key's limit id names its window), but the batch's cache of a
  // log belongs to a single window: it must not hide admissions made under the other one.
  const redis = await startRedis(t)
  const client = redis.client()
  const now = Date.now() * 1000
  const longLog: LimitSpec = Object.freeze({ id: 'l1', algorithm: 'sliding-window-log', limit: 2, windowMs: 60_000, burst: 2, maxDelayMs: 0 })
  const shortLog: LimitSpec = Object.freeze({ id: 'l2', algorithm: 'sliding-window-log', limit: 2, windowMs: 30_000, burst: 2, maxDelayMs: 0 })
  const batch = [
    request('r1', check('log', longLog)),
    request('r2', check('log', shortLog)),
    request('r3', check('log', shortLog), check('log', longLog)),
    request('r4', check('log', longLog)),
    request('r5', check('log', shortLog))
  ]
  const { numKeys, keysAndArgs } = batchKeysAndArgs(batch, now)
  const allowed = admittedOf(await client.eval(LIMIT_BATCH_SCRIPT, numKeys, ...keysAndArgs) as string, batch)
  // one call per request in this order: r1 and r2 fill the limit of 2, whichever window counts
  t.same(allowed, [1, 1, 0, 0, 0], 'two admitted, every later request refused under either window')
  t.same((await client.zrange('log', '0', '-1')).sort(), ['r1:1', 'r2:1'], 'the log holds the two admitted entries')

  // One request under both windows with different costs: its short-window entries (two) are more
  // than its long-window ones (one), and the later requests must count all of them.
  const roomy = (spec: LimitSpec): LimitSpec => Object.freeze({ ...spec, limit: 3, burst: 3 })
  const second = [
    request('s1', { key: 'log2', spec: roomy(shortLog), cost: 2 }, { key: 'log2', spec: roomy(longLog), cost: 1 }),
    request('s2', check('log2', roomy(longLog))),
    request('s3', check('log2', roomy(longLog)))
  ]
  const next = batchKeysAndArgs(second, now)
  const allowed2 = admittedOf(await client.eval(LIMIT_BATCH_SCRIPT, next.numKeys, ...next.keysAndArgs) as string, second)
  t.same(allowed2, [1, 1, 0], 's1 wrote two entries: s2 fills the limit of 3, s3 is refused')
  t.same((await client.zrange('log2', '0', '-1')).sort(), ['s1:1', 's1:2', 's2:1'], 'the log holds every admitted entry')
})

/** Each request's allowed flag (1 or 0) from a limit-batch.lua reply: the time, then per request six values and its remainings. */
function admittedOf (reply: string, batch: readonly BatchedRequest[]): number[] {
  const values = reply.split(',').map(Number)
  const allowed: number[] = []
  let pos = 1
  for (const r of batch) {
    allowed.push(values[pos] as number)
    pos += 6 + r.checks.length
  }
  if (pos !== values.length) throw new Error(`a reply of ${values.length} values for ${pos} expected`)
  return allowed
}
