// The extra CPU per request of one concurrency limit (issue 10; target: at most 5 µs).
//
// Drives the gateway's own Limiter (dist/limit/limiter.js) the way the pipeline does: check a
// request, then release its lease when the "response" ends a little later, at a fixed offered rate. Two plans alternate round by round on one redis-server:
//   A  one rate limit (user, gcra), as a route with a limit has;
//   B  the same rate limit plus `concurrency: { user: N }` (N far above the load, never refusing).
// B - A is the cost of the concurrency limit: the lease check inside the same Lua call, the lease
// record, and its release, batched per event-loop turn into one call. Measured in this process
// (process.cpuUsage: the gateway's side) and in redis-server (/proc), per request; the same two
// plans are also run on the in-process store (no Redis configured).
//
// The open loop above leaves the process mostly idle, so its per-request CPU carries the timers'
// and the scheduler's noise, as large as the effect. A closed loop (--closed N requests in flight,
// each released one event-loop turn after its verdict, as a response ending under load would, and
// followed at once by the next) keeps the process saturated; its short rounds alternate A and B
// (--closed-rounds, --closed-seconds) and the figure is the median of the paired differences.
//
//   node bench/concurrency.js [--seconds 5] [--rounds 3] [--rate 3000] [--hold-ms 2] [--inflight 1000]
//                             [--closed 200] [--closed-seconds 2] [--closed-rounds 9] [--json FILE]
// --json writes the figures (medians and ranges over rounds) for `npm run bench` (bench/run.js).
import { mkdtempSync, rmSync, existsSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { performance } from 'node:perf_hooks'
import { Redis } from 'ioredis'
import { startRedis, commandCalls, callsBetween, commandsUsedByScripts } from './lib/redis-server.js'
import { treeCpuMicros } from './lib/proc-stats.js'
import { stopAll, killAllSync } from './lib/processes.js'
import { fmt, fmtSpread, spread } from './lib/summary.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const DIST = join(ROOT, 'dist')
const { values: flags } = parseArgs({
  options: {
    seconds: { type: 'string' },
    rounds: { type: 'string' },
    inflight: { type: 'string' },
    'hold-ms': { type: 'string' },
    rate: { type: 'string' },
    closed: { type: 'string' },
    'closed-seconds': { type: 'string' },
    'closed-rounds': { type: 'string' },
    json: { type: 'string' }
  }
})
const settings = {
  seconds: Number(flags.seconds ?? 5),
  rounds: Number(flags.rounds ?? 3),
  // more outstanding than this at a tick counts as the bench falling behind the offered rate
  inflight: Number(flags.inflight ?? 1000),
  holdMs: Number(flags['hold-ms'] ?? 2),
  rate: Number(flags.rate ?? 3000),
  // closed loop: this many requests in flight, each followed at once by the next (saturation)
  closedInflight: Number(flags.closed ?? 200),
  closedSeconds: Number(flags['closed-seconds'] ?? 2),
  closedRounds: Number(flags['closed-rounds'] ?? 9),
  users: 1000
}

if (!existsSync(join(DIST, 'limit/limiter.js'))) {
  console.error('dist/ is missing: run `npm run build` first')
  process.exit(1)
}
/** @param {string} f */
const load = (f) => import(pathToFileURL(join(DIST, f)).href)
const [{ Limiter }, { DenyCache }, { createMemoryStore, createInProcessLevel }, { createRedisStore }, { RedisGuard }, { LeaseKeeper }, { routeLimitPlan }, { parseConfigText }, { NOOP_TELEMETRY }] = await Promise.all([
  'limit/limiter.js', 'limit/local-level.js', 'limit/memory-store.js', 'limit/redis-store.js', 'limit/redis-guard.js',
  'limit/concurrency.js', 'runtime.js', 'config/load.js', 'telemetry.js'
].map(load))

/**
 * The route plan of a config with one user rate limit and, for B, one user concurrency limit.
 * @param {boolean} withConcurrency
 * @param {boolean} redis
 */
function plan (withConcurrency, redis) {
  // through the config loader and the runtime's own plan compiler, so every default applies
  const yaml = `${redis ? 'redis: { url: "redis://127.0.0.1:1", leaseTtl: 10s }\n' : ''}identity: { header: x-user-id }
limits:
  user: { algorithm: gcra, limit: 1000000, window: 1s, burst: 1000000 }
upstreams: { u: { targets: ["http://127.0.0.1:1"] } }
routes:
  - { name: bench, pathPrefix: /, upstream: u${withConcurrency ? ', concurrency: { user: 1000000 }' : ''} }
`
  const { config } = parseConfigText(yaml, 'bench/concurrency.js')
  return routeLimitPlan(config, config.routes[0])
}

/**
 * Requests through `limiter` for `seconds`, offered at `--rate` per second (every 10 ms a slice),
 * the same rate for both plans, so that neither gets more syscalls amortized than the other; each
 * releases its lease `holdMs` after its verdict, as a response ending would.
 * @param {any} limiter
 * @param {any} routePlan
 * @param {number} seconds
 */
async function drive (limiter, routePlan, seconds) {
  let done = 0
  let refused = 0
  let next = 0
  let late = 0
  const perTick = Math.max(1, Math.round(settings.rate / 100))
  const one = async () => {
    const i = next++
    const v = await limiter.check({ route: 'bench', plan: routePlan, ipKey: '127.0.0.1', user: `u${i % settings.users}`, requestId: `r${i}` })
    if (v.kind !== 'allow') refused++
    await new Promise((resolve) => setTimeout(resolve, settings.holdMs))
    if (v.kind === 'allow' && v.lease !== null) limiter.release(v.lease)
    done++
  }
  /** @type {Promise<void>[]} */
  const all = []
  const started = performance.now()
  await new Promise((resolve) => {
    const timer = setInterval(() => {
      const due = Math.floor((performance.now() - started) / 10) * perTick
      // a tick that came late launches what it owes, so the offered rate holds
      while (next < due) all.push(one())
      if (next - done > settings.inflight) late++
      if (performance.now() - started >= seconds * 1000) {
        clearInterval(timer)
        resolve(undefined)
      }
    }, 10)
  })
  await Promise.all(all)
  return { done, refused, late }
}

/**
 * Closed loop: `settings.closedInflight` requests in flight for `seconds`; each releases its lease
 * one event-loop turn after its verdict (the response), then the next request starts at once.
 * @param {any} limiter
 * @param {any} routePlan
 * @param {number} seconds
 */
async function driveClosed (limiter, routePlan, seconds) {
  let done = 0
  let refused = 0
  let next = 0
  const end = performance.now() + seconds * 1000
  const loop = async () => {
    while (performance.now() < end) {
      const i = next++
      const v = await limiter.check({ route: 'bench', plan: routePlan, ipKey: '127.0.0.1', user: `u${i % settings.users}`, requestId: `r${i}` })
      if (v.kind !== 'allow') refused++
      await new Promise((resolve) => setImmediate(resolve))
      if (v.kind === 'allow' && v.lease !== null) limiter.release(v.lease)
      done++
    }
  }
  await Promise.all(Array.from({ length: settings.closedInflight }, loop))
  return { done, refused, late: 0 }
}

/** @param {'redis' | 'memory'} storeKind @param {any} redis @param {boolean} [closed] */
async function run (storeKind, redis, closed = false) {
  const kind = storeKind
  /** @type {Record<'A' | 'B', { client: number[], redis: number[], calls: number[], perSecond: number[] }>} */
  const results = { A: { client: [], redis: [], calls: [], perSecond: [] }, B: { client: [], redis: [], calls: [], perSecond: [] } }
  let client = null
  let limiter
  let leases
  if (storeKind === 'redis') {
    client = new Redis({ host: '127.0.0.1', port: redis.port, maxRetriesPerRequest: 1 })
    const store = createRedisStore({ client })
    const guard = new RedisGuard({ store, fallbackMaxKeys: 100_000, timeoutMs: 2000, instances: () => 1, telemetry: NOOP_TELEMETRY, onStateChange: () => {} })
    leases = new LeaseKeeper({ redis: { client, guard, store }, ttlMs: 10_000 })
    limiter = new Limiter({ local: null, deny: new DenyCache(100_000), shared: guard, legacyHeaders: false, telemetry: NOOP_TELEMETRY, leases })
  } else {
    const memory = createMemoryStore({ maxKeys: 100_000 })
    leases = new LeaseKeeper({ memory, ttlMs: 10_000 })
    limiter = new Limiter({ local: null, deny: new DenyCache(100_000), shared: createInProcessLevel(memory), legacyHeaders: false, telemetry: NOOP_TELEMETRY, leases })
  }
  const plans = { A: plan(false, storeKind === 'redis'), B: plan(true, storeKind === 'redis') }
  const internal = commandsUsedByScripts(join(ROOT, 'lua'))
  // warm-up: scripts loaded, keys created, code optimized
  const driver = closed ? driveClosed : drive
  const rounds = closed ? settings.closedRounds : settings.rounds
  const seconds = closed ? settings.closedSeconds : settings.seconds
  for (const p of /** @type {const} */ (['A', 'B'])) await driver(limiter, plans[p], 1)
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 === 0 ? /** @type {const} */ (['A', 'B']) : /** @type {const} */ (['B', 'A'])
    for (const p of order) {
      const calls0 = storeKind === 'redis' ? await commandCalls(redis.client) : {}
      const redisCpu0 = storeKind === 'redis' ? treeCpuMicros(redis.child.pid) : 0
      const cpu0 = process.cpuUsage()
      const t0 = performance.now()
      const r = await driver(limiter, plans[p], seconds)
      const cpu = process.cpuUsage(cpu0)
      const secs = (performance.now() - t0) / 1000
      if (r.refused > 0) throw new Error(`${p}: ${r.refused} requests refused; the bench measures admissions`)
      if (r.late > 0) console.log(`  warning: ${kind} ${p} fell behind the offered rate at ${r.late} ticks`)
      results[p].client.push((cpu.user + cpu.system) / r.done)
      results[p].perSecond.push(r.done / secs)
      if (storeKind === 'redis') {
        // let the last releases land before reading the counters
        await new Promise((resolve) => setTimeout(resolve, 50))
        results[p].redis.push((treeCpuMicros(redis.child.pid) - redisCpu0) / r.done)
        results[p].calls.push(callsBetween(calls0, await commandCalls(redis.client), internal).roundTrips / r.done)
      }
    }
  }
  await leases.close()
  client?.disconnect()
  return results
}

/**
 * The in-process store in a tight loop: check then release, synchronously, no timers and no I/O,
 * so what is left is the CPU of the limiter's code path alone (steadier on a loaded machine).
 */
function tightLoop () {
  const memory = createMemoryStore({ maxKeys: 100_000 })
  const leases = new LeaseKeeper({ memory, ttlMs: 10_000 })
  const limiter = new Limiter({ local: null, deny: new DenyCache(100_000), shared: createInProcessLevel(memory), legacyHeaders: false, telemetry: NOOP_TELEMETRY, leases })
  const plans = { A: plan(false, false), B: plan(true, false) }
  const n = 200_000
  /** @param {any} p */
  const pass = (p) => {
    const cpu0 = process.cpuUsage()
    for (let i = 0; i < n; i++) {
      const v = limiter.check({ route: 'bench', plan: p, ipKey: '127.0.0.1', user: `u${i % settings.users}`, requestId: 'r' })
      if (v.kind === 'allow' && v.lease !== null) limiter.release(v.lease)
    }
    const cpu = process.cpuUsage(cpu0)
    return (cpu.user + cpu.system) / n
  }
  pass(plans.A); pass(plans.B)
  /** @type {{ A: number[], B: number[] }} */
  const r = { A: [], B: [] }
  for (let round = 0; round < settings.rounds * 3; round++) {
    const order = round % 2 === 0 ? /** @type {const} */ (['A', 'B']) : /** @type {const} */ (['B', 'A'])
    for (const p of order) r[p].push(pass(plans[p]))
  }
  const extra = r.B.map((b, i) => b - /** @type {number} */ (r.A[i]))
  console.log(`\nin-process store, tight loop (${n} check + release per pass, ${settings.rounds * 3} passes each)`)
  console.log(`  A one rate limit             CPU µs/req ${fmtSpread(spread(r.A))}`)
  console.log(`  B + concurrency: { user }    CPU µs/req ${fmtSpread(spread(r.B))}`)
  console.log(`  B - A (same pass pair)       CPU µs/req ${fmtSpread(spread(extra))}`)
  return { n, A: spread(r.A), B: spread(r.B), extra: spread(extra) }
}

const tight = tightLoop()
/** @type {Record<string, unknown>} */
const figures = { settings, tightLoop: tight }
const dir = mkdtempSync(join(tmpdir(), 'gw-bench-conc-'))
process.once('exit', () => { killAllSync(); rmSync(dir, { recursive: true, force: true }) })
const redis = await startRedis(dir)
console.log(`concurrency bench: ${settings.rounds} rounds x ${settings.seconds} s per plan, ${settings.rate} req/s offered, leases held ${settings.holdMs} ms`)
for (const [kind, closed] of /** @type {const} */ ([['redis', false], ['memory', false], ['redisClosed', true], ['memoryClosed', true]])) {
  const onRedis = kind === 'redis' || kind === 'redisClosed'
  const r = await run(onRedis ? 'redis' : 'memory', redis, closed)
  const extra = r.B.client.map((b, i) => b - /** @type {number} */ (r.A.client[i]))
  console.log(`\n${onRedis ? 'redis' : 'memory'} store, ${closed ? `closed loop (${settings.closedInflight} in flight, ${settings.closedRounds} rounds x ${settings.closedSeconds} s per plan)` : `open loop (${settings.rate} req/s offered)`}`)
  console.log(`  A one rate limit           client CPU µs/req ${fmtSpread(spread(r.A.client))}  req/s ${fmtSpread(spread(r.A.perSecond))}${onRedis ? `  redis CPU µs/req ${fmtSpread(spread(r.A.redis))}  Redis calls/req ${fmtSpread(spread(r.A.calls))}` : ''}`)
  console.log(`  B + concurrency: { user }   client CPU µs/req ${fmtSpread(spread(r.B.client))}  req/s ${fmtSpread(spread(r.B.perSecond))}${onRedis ? `  redis CPU µs/req ${fmtSpread(spread(r.B.redis))}  Redis calls/req ${fmtSpread(spread(r.B.calls))}` : ''}`)
  console.log(`  B - A (same round)          client CPU µs/req ${fmtSpread(spread(extra))}${onRedis ? `  redis CPU µs/req ${fmtSpread(spread(r.B.redis.map((b, i) => b - /** @type {number} */ (r.A.redis[i]))))}` : ''}`)
  if (onRedis) console.log(`  (releases batched: ${fmt((spread(r.B.calls)?.median ?? 0) - (spread(r.A.calls)?.median ?? 0))} extra Redis calls per request)`)
  figures[kind] = {
    A: { clientCpuUs: spread(r.A.client), reqPerSecond: spread(r.A.perSecond), ...(onRedis ? { redisCpuUs: spread(r.A.redis), redisCalls: spread(r.A.calls) } : {}) },
    B: { clientCpuUs: spread(r.B.client), reqPerSecond: spread(r.B.perSecond), ...(onRedis ? { redisCpuUs: spread(r.B.redis), redisCalls: spread(r.B.calls) } : {}) },
    // paired within a round: the machine's noise hits both plans of a round alike
    extraClientCpuUs: spread(extra),
    ...(onRedis ? { extraRedisCpuUs: spread(r.B.redis.map((b, i) => b - /** @type {number} */ (r.A.redis[i]))) } : {})
  }
}
if (flags.json !== undefined) writeFileSync(flags.json, JSON.stringify(figures, null, 2) + '\n')
await redis.client.quit()
await stopAll()
