// The store's Lua as a Redis function library (src/limit/redis-functions.ts) against real
// redis-servers: loaded once and called by FCALL, EVALSHA for good where the server refuses it,
// a call's state that does not outlive the call although the library does, and every master of a
// Cluster.
import t from 'tap'
import { Redis, type Cluster } from 'ioredis'
import { commandStats, fcallStats, functionLibraries, startRedis, startRedisCluster } from './helpers/redis.js'
import { eventually } from './helpers/ratelimit.js'
import type { Teardown } from './helpers/teardown.js'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import { createRedisStore, type RedisStore } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { FUNCTION_LIBRARY, FUNCTION_LIBRARY_NAME, functionName } from '../src/limit/scripts.js'
import type { AlgorithmName, LimitCheck, LimitSpec } from '../src/limit/types.js'

const spec = (algorithm: AlgorithmName, limit: number, windowMs: number): LimitSpec =>
  Object.freeze({ id: `${algorithm}-${limit}-${windowMs}`, algorithm, limit, windowMs, burst: limit, maxDelayMs: 0 })
const check = (key: string, s: LimitSpec): LimitCheck[] => [{ key, spec: s, cost: 1 }]

/** Each kind of script call tried so far: executed or refused (a refused FUNCTION LOAD, NOPERM, is rejected, not a call). */
async function scriptCalls (client: Redis): Promise<{ fcall: number, evalsha: number, eval: number, functionLoad: number }> {
  const stat = await commandStats(client)
  const tried = (command: string): number => stat(command).calls + stat(command).rejected
  return { fcall: tried('fcall'), evalsha: tried('evalsha'), eval: tried('eval'), functionLoad: tried('function|load') }
}

/** Decisions until one goes by FCALL: the store has the library loaded (it loads in the background). */
async function untilFunctionCalls (store: RedisStore, reader: Redis): Promise<void> {
  await eventually('the store calling its function library', async () => {
    const before = (await fcallStats(reader)).calls
    await store.decide(check('warm-up', spec('gcra', 1_000_000, 1000)), 'warm')
    return (await fcallStats(reader)).calls > before
  })
}

interface FreshStoreOptions {
  /** Runs on the new server before the client connects. */
  readonly prepare?: (reader: Redis) => Promise<unknown>
  /** The client's URL from the server's port (default: the server's own URL). */
  readonly url?: (port: number) => string
  readonly onFunctionsRefused?: (reason: unknown) => void
}

/** A redis-server of the test's own, a production-configured client on it and a store. */
async function freshStore (t: Teardown, options: FreshStoreOptions = {}): Promise<{ reader: Redis, client: Redis | Cluster, store: RedisStore }> {
  const redis = await startRedis(t)
  const reader = redis.client()
  await options.prepare?.(reader)
  const client = createRedisClient({ url: options.url?.(redis.port) ?? redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const onFunctionsRefused = options.onFunctionsRefused
  return { reader, client, store: createRedisStore({ client, ...(onFunctionsRefused !== undefined ? { onFunctionsRefused } : {}) }) }
}

t.test('the library is loaded once the connection is up, and every decision after it is one FCALL', async (t) => {
  const { reader, store } = await freshStore(t)
  await untilFunctionCalls(store, reader)
  t.same(await functionLibraries(reader), [FUNCTION_LIBRARY_NAME], 'one library, named after its code')
  t.match(FUNCTION_LIBRARY_NAME, /^gateway_[0-9a-f]{16}$/, 'gateway_ and a hash of the code, as the README names it for FUNCTION DELETE')
  t.ok(Buffer.byteLength(FUNCTION_LIBRARY) < 64 * 1024, 'under 64 KB of code (the README says so)')
  await reader.config('RESETSTAT')
  const s = spec('fixed-window', 3, 3_600_000)
  const allowed: boolean[] = []
  for (let i = 0; i < 5; i++) allowed.push((await store.decide(check('exact', s), `r${i}`)).allowed)
  t.same(allowed, [true, true, true, false, false], 'exactly the limit admitted')
  t.match(await scriptCalls(reader), { fcall: 5, evalsha: 0, eval: 0, functionLoad: 0 }, 'five FCALLs, no script and no second load')
})

t.test('a server that refuses FUNCTION LOAD is called by EVALSHA for good, and recovers from SCRIPT FLUSH', async (t) => {
  const refusals: string[] = []
  // an ACL user who may run scripts but not load functions
  const { reader, store } = await freshStore(t, {
    prepare: async (reader) => await reader.acl('SETUSER', 'no-functions', 'on', '>secret', '~*', '+@all', '-function'),
    url: (port) => `redis://no-functions:secret@127.0.0.1:${port}`,
    onFunctionsRefused: (reason) => refusals.push((reason as Error).message)
  })
  const s = spec('token-bucket', 10, 3_600_000)
  const remaining = async (): Promise<number> => (await store.decide(check('bucket', s), 'r')).remaining
  t.same([await remaining(), await remaining(), await remaining()], [9, 8, 7])
  const noscript = async (): Promise<number> => Number(/errorstat_NOSCRIPT:count=(\d+)/.exec(await reader.info('errorstats'))?.[1] ?? 0)
  const before = await noscript()
  t.equal(await reader.script('FLUSH'), 'OK')
  t.equal(await remaining(), 6, 'decided correctly after the flush')
  t.equal(await noscript(), before + 1, 'the EVALSHA did hit NOSCRIPT once (then EVAL reloaded it)')
  t.same([await remaining(), await remaining()], [5, 4])
  t.equal(await noscript(), before + 1, 'and EVALSHA works again afterwards')
  // past the 5 s after which a load that failed for another reason is tried again
  await new Promise((resolve) => setTimeout(resolve, 5100))
  t.equal(await remaining(), 3)
  const calls = await scriptCalls(reader)
  t.equal(calls.functionLoad, 1, 'FUNCTION LOAD was tried once, not again on later calls')
  t.equal(calls.fcall, 0, 'no FCALL')
  t.equal(calls.evalsha + calls.eval, 8, 'eight decisions, eight script calls')
  t.same(await functionLibraries(reader), [], 'nothing loaded')
  t.match(refusals, [/^NOPERM/], 'the refusal was told once, with the server\'s words')
})

t.test('FCALL refused after the library was in (an ACL changed): every call goes by EVALSHA from then on', async (t) => {
  const refusals: string[] = []
  const { reader, client, store } = await freshStore(t, {
    prepare: async (reader) => await reader.acl('SETUSER', 'gw', 'on', '>secret', '~*', '+@all'),
    url: (port) => `redis://gw:secret@127.0.0.1:${port}`,
    onFunctionsRefused: (reason) => refusals.push((reason as Error).message)
  })
  await untilFunctionCalls(store, reader)
  // the operator takes functions away from the gateway's user and drops its connection
  await reader.acl('SETUSER', 'gw', '-fcall', '-function')
  // wait for the client to see the drop before waiting for it to be ready again
  const closed = new Promise((resolve) => client.once('close', resolve))
  await reader.client('KILL', 'USER', 'gw')
  await closed
  await whenReady(client)
  const s = spec('fixed-window', 3, 3_600_000)
  const decisions = []
  for (let i = 0; i < 5; i++) decisions.push((await store.decide(check('after-acl', s), `r${i}`)).allowed)
  t.same(decisions, [true, true, true, false, false], 'every decision answered, exactly')
  t.equal(refusals.length, 1, 'the refusal told once')
  t.match(refusals[0], /^NOPERM/)
  const fcallsBefore = (await scriptCalls(reader)).fcall
  await store.decide(check('after-acl', s), 'again')
  t.equal((await scriptCalls(reader)).fcall, fcallsBefore, 'no FCALL tried any more')
})

t.test('over maxmemory a rejection is still answered, as scripts answered it', async (t) => {
  const { reader, store } = await freshStore(t)
  await untilFunctionCalls(store, reader)
  const s = spec('gcra', 1, 60_000)
  t.equal((await store.decide(check('full', s), 'a')).allowed, true)
  // noeviction (the default) and no memory left: a function that may write is refused whole
  await reader.config('SET', 'maxmemory', '1')
  t.teardown(async () => { await reader.config('SET', 'maxmemory', '0') })
  const rejected = await store.decide(check('full', s), 'b')
  t.same([rejected.allowed, rejected.retryAfterMs > 0], [false, true], 'rejected by Redis, with its wait')
  await t.rejects(store.decide(check('other', s), 'c'), /^OOM/, 'an admission, which writes, is refused as before')
})

t.test('a load that failed for another reason than a refusal is tried again, on a call 5 s later', async (t) => {
  const startedAt = Date.now()
  // over maxmemory, FUNCTION LOAD is refused with OOM: a passing state, not a refusal of functions
  const { reader, store } = await freshStore(t, { prepare: async (reader) => await reader.config('SET', 'maxmemory', '1') })
  await eventually('the first load refused', async () => (await scriptCalls(reader)).functionLoad === 1)
  await reader.config('SET', 'maxmemory', '0')
  const s = spec('gcra', 1_000_000, 1000)
  for (let i = 0; i < 5; i++) t.equal((await store.decide(check('k', s), `r${i}`)).allowed, true)
  const soon = await scriptCalls(reader)
  if (Date.now() - startedAt < 4000) t.same([soon.functionLoad, soon.fcall], [1, 0], 'not tried again at once: the decisions went by EVALSHA')
  await eventually('the library loaded on a later call', async () => {
    await store.decide(check('k', s), 'later')
    return (await functionLibraries(reader)).includes(FUNCTION_LIBRARY_NAME)
  }, 15_000, 250)
  t.ok(Date.now() - startedAt >= 5000, 'loaded once 5 s had passed')
  await untilFunctionCalls(store, reader)
  t.equal((await scriptCalls(reader)).functionLoad, 2, 'tried twice in all')
})

t.test('the library outlives a call, a call\'s state does not', async (t) => {
  const { reader, client, store } = await freshStore(t)
  await untilFunctionCalls(store, reader)

  t.test('a batch that fails half-way leaves its key cache behind for no later call', async (t) => {
    const s = spec('gcra', 10, 1000)
    // the second request's key is a list: its GET fails inside the call, after the first request
    // was decided into the batch's cache of keys
    await reader.rpush('not-a-string', 'x')
    const failed = await Promise.allSettled([store.decide(check('first', s), 'a'), store.decide(check('not-a-string', s), 'b')])
    t.same(failed.map((f) => f.status), ['rejected', 'rejected'], 'the batch failed whole')
    t.equal(await reader.exists('first'), 0, 'and wrote nothing')
    // a lone request: one limit call, which writes its key itself
    t.equal((await store.decide(check('lone', s), 'c')).allowed, true)
    t.equal(await reader.exists('lone'), 1, 'the next call wrote its state to Redis')
  })

  t.test('a call that fails while it writes its reply leaves nothing in the next call\'s reply', async (t) => {
    const one = spec('gcra', 10, 1000)
    t.equal((await store.decide(check('before', one), 'a')).allowed, true, 'a reply for one check')
    // two checks on one key, sent past the store (which refuses that): gcra writes the key as a
    // string, then the token bucket's HSET is refused (WRONGTYPE) after the first commit wrote its
    // part of the reply. Functions share one Lua state on the server, whatever the connection.
    const twice = reader.call('FCALL', functionName('limit'), 2, 'twice', 'twice', 0, 'b', '1,10,1000,10,1,0', '2,10,1000,10,1,0')
    await t.rejects(twice, /WRONGTYPE/, 'the call failed in its second commit')
    const after = await store.decide(check('after', one), 'c')
    t.same([after.allowed, after.remaining], [true, 9], 'the next call\'s reply is its own')
  })

  t.test('a test clock\'s TTL slack does not reach the next call of the real clock', async (t) => {
    const virtual = createRedisStore({ client, nowUs: () => Date.now() * 1000 })
    // its calls too by FCALL, into the library the real clock's calls use
    await untilFunctionCalls(virtual, reader)
    const s = spec('gcra', 10, 1000)
    t.equal((await virtual.decide(check('virtual', s), 'v')).allowed, true)
    t.ok(await reader.pttl('virtual') > 600_000, 'the virtual clock\'s key keeps 600 s of slack (src: common.lua)')
    t.equal((await store.decide(check('real', s), 'r')).allowed, true)
    const ttl = await reader.pttl('real')
    t.ok(ttl > 0 && ttl <= 1000, `the real clock's key lives as long as its window needs (${ttl} ms)`)
  })
})

t.test('a batch reply the store cannot read fails every request of the batch, and the next batch is decided', async (t) => {
  // A library under this version's name that answers a batch with too few values (what a
  // library edited by hand, or a bug in limit-batch.lua, would send): the store's load finds the
  // name taken ("already exists") and calls it.
  const junk = `#!lua name=${FUNCTION_LIBRARY_NAME}\n` +
    `redis.register_function('${functionName('limit_batch')}', function (keys, args) return '1700000000000,1,0' end)\n` +
    `redis.register_function('${functionName('limit')}', function (keys, args) return redis.error_reply('ERR not used') end)\n`
  const { reader, store } = await freshStore(t, { prepare: async (reader) => await reader.call('FUNCTION', 'LOAD', junk) })
  await eventually('the store\'s own load refused as already there', async () => (await scriptCalls(reader)).functionLoad === 2)
  const s = spec('gcra', 1_000_000, 1000)
  // three requests of one turn: one call of the batch function
  const hung = new Promise<'hung'>((resolve) => { setTimeout(() => { resolve('hung') }, 5000).unref() })
  const settled = await Promise.race([Promise.allSettled([0, 1, 2].map(async (i) => await store.decide(check(`k${i}`, s), `r${i}`))), hung])
  if (settled === 'hung') {
    t.fail('a request of the batch was left waiting')
    return
  }
  t.same(settled.map((r) => r.status), ['rejected', 'rejected', 'rejected'], 'each request of the batch fails (each then takes its onError path)')
  t.match(settled.map((r) => r.status === 'rejected' ? String(r.reason) : ''), Array(3).fill(/fewer values than its requests need/))
  t.same((await fcallStats(reader)).calls, 1, 'one call for the three')

  // the library repaired: the next turn's batch is decided
  await reader.call('FUNCTION', 'LOAD', 'REPLACE', FUNCTION_LIBRARY)
  const next = await Promise.all([0, 1].map(async (i) => await store.decide(check(`k${i}`, s), `n${i}`)))
  t.same(next.map((d) => d.allowed), [true, true], 'the next batch is admitted')
})

t.test('two versions side by side: a library of another version is left alone', async (t) => {
  // what an instance of another version loaded: its own name, its own function names
  const other = FUNCTION_LIBRARY.replaceAll(FUNCTION_LIBRARY_NAME, 'gateway_0000000000000000')
  const { reader, store } = await freshStore(t, { prepare: async (reader) => await reader.call('FUNCTION', 'LOAD', other) })
  await untilFunctionCalls(store, reader)
  t.same((await functionLibraries(reader)).sort(), ['gateway_0000000000000000', FUNCTION_LIBRARY_NAME].sort(), 'both libraries loaded')
  t.equal((await store.decide(check('k', spec('gcra', 1, 60_000)), 'a')).allowed, true)
  t.equal((await store.decide(check('k', spec('gcra', 1, 60_000)), 'b')).allowed, false, 'decided on the state both versions share')
})

t.test('Redis Cluster: the library is loaded on every master, and each decides by FCALL', async (t) => {
  const servers = await startRedisCluster(t)
  const cluster = createRedisClient({ cluster: servers.urls }) as Cluster
  t.teardown(() => cluster.disconnect())
  await whenReady(cluster, 15_000)
  const store = createRedisStore({ client: cluster })
  const masters = servers.ports.map((port) => new Redis({ port, lazyConnect: false }))
  t.teardown(() => { for (const m of masters) m.disconnect() })
  await eventually('the library on every master', async () => {
    const libs = await Promise.all(masters.map(functionLibraries))
    return libs.every((l) => l.includes(FUNCTION_LIBRARY_NAME))
  })
  // keys spread over the slots of all three masters, each decided exactly
  const s = spec('fixed-window', 2, 3_600_000)
  // how many of 30 keys, spread over the three masters' slots, get exactly 2 of 3 requests through
  const exactKeys = async (prefix: string): Promise<number> => {
    let exact = 0
    for (let i = 0; i < 30; i++) {
      const key = `${prefix}:${i}`
      const d = [await store.decide(check(key, s), 'a'), await store.decide(check(key, s), 'b'), await store.decide(check(key, s), 'c')]
      if (d.map((x) => x.allowed).join() === 'true,true,false') exact++
    }
    return exact
  }
  t.equal(await exactKeys('spread'), 30, 'every key decided exactly')
  const calls = await Promise.all(masters.map(fcallStats))
  t.ok(calls.every((c) => c.calls > 0 && c.failed === 0), `FCALL on every master (${calls.map((c) => c.calls).join(', ')})`)

  // one master loses the library: its next call goes by EVALSHA, the library is loaded again there
  await (masters[0] as Redis).call('FUNCTION', 'FLUSH')
  t.equal(await exactKeys('after-flush'), 30, 'every key decided exactly through the flush')
  t.equal((await fcallStats(masters[0] as Redis)).failed, 1, 'the flushed master answered "not found" once')
  await eventually('the library back on the flushed master', async () => (await functionLibraries(masters[0] as Redis)).includes(FUNCTION_LIBRARY_NAME))
  t.same(await functionLibraries(masters[0] as Redis), [FUNCTION_LIBRARY_NAME], 'the library loaded there again')
})

t.test('the gateway says once, in its log, that Redis refused the library and the limits run as scripts', async (t) => {
  const redis = await startRedis(t)
  await redis.client().acl('SETUSER', 'no-functions', 'on', '>secret', '~*', '+@all', '-function')
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
redis: { url: 'redis://no-functions:secret@127.0.0.1:${redis.port}', timeout: 2s }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: r
    pathPrefix: /
    upstream: backend
    limits:
      api: { algorithm: fixed-window, limit: 2, window: 1h }
`)
  const statuses = [(await send(`${gw.url}/x`)).status, (await send(`${gw.url}/x`)).status, (await send(`${gw.url}/x`)).status]
  t.same(statuses, [200, 200, 429], 'the limit holds on scripts')
  const refused = gw.lines.filter((l) => String(l.msg).startsWith('Redis refused the gateway\'s function library'))
  t.equal(refused.length, 1, 'one line')
  t.match(refused[0], { level: 30, err: /^NOPERM/ }, 'at info, with the server\'s words')
})
