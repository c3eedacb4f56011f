// Limiter micro-benchmarks, all in one run on one redis-server:
//   1. decisions/s through the Redis store from one process, 200 decisions in flight, with
//      ioredis auto-pipelining off and on, beside the Redis ceiling for the same script
//      (redis-benchmark replaying the exact EVALSHA the store sent, -c 50 -P 16);
//   2. decisions/s of the in-process store;
//   3. Redis memory per key for each algorithm (MEMORY USAGE);
//   4. gateway RSS after 1,000,000 distinct client IPs through the local level (bounded by maxKeys).
//
//   node bench/limit.js [--seconds 5] [--ips 1000000] [--inflight 200] [--only redis,memory,keys,rss]
//                       [--out-dir bench/results]
// Env: BENCH_LIMIT_SECONDS, BENCH_LIMIT_IPS, BENCH_ONLY, BENCH_OUT_DIR.
import { existsSync, mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir, cpus } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { performance } from 'node:perf_hooks'
import { setImmediate } from 'node:timers/promises'
import { Redis } from 'ioredis'
import autocannon from 'autocannon'
import { answers200, freePort, killAllSync, sleep, startProcess, stopAll, stopProcess } from './lib/processes.js'
import { treeCpuMicros, treePeakRssKb, treeRssKb } from './lib/proc-stats.js'
import { startRedis, commandCalls, callsBetween, commandsUsedByScripts } from './lib/redis-server.js'
import { captureScriptCall, runRedisBenchmark } from './lib/redis-benchmark.js'
import { scrapeGatewayMetrics } from './lib/gateway-metrics.js'
import { fmt } from './lib/summary.js'
import { printLimitReport } from './lib/report-limit.js'
import { checksByClient, loadStores, scenarios } from './lib/limit-stores.js'
import { renderConfig } from './lib/configs.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const BENCH = join(ROOT, 'bench')
const DIST = join(ROOT, 'dist')
const SCRIPT_INTERNAL = commandsUsedByScripts(join(ROOT, 'lua'))

const { values: flags } = parseArgs({
  options: {
    seconds: { type: 'string' },
    ips: { type: 'string' },
    inflight: { type: 'string' },
    only: { type: 'string' },
    'out-dir': { type: 'string' }
  }
})
const settings = {
  seconds: Number(flags.seconds ?? process.env.BENCH_LIMIT_SECONDS ?? 5),
  ips: Number(flags.ips ?? process.env.BENCH_LIMIT_IPS ?? 1_000_000),
  inflight: Number(flags.inflight ?? 200),
  only: (flags.only ?? process.env.BENCH_ONLY ?? '').split(',').map((s) => s.trim()).filter(Boolean),
  outDir: flags['out-dir'] ?? process.env.BENCH_OUT_DIR ?? join(BENCH, 'results'),
  // Distinct clients the decisions are spread over (keys per limit).
  clients: 1000
}
/** @param {string} section */
const wanted = (section) => settings.only.length === 0 || settings.only.includes(section)

// --- the store under test (compiled by `npm run build`) -------------------------------------

/**
 * @typedef {import('../src/limit/types.js').LimitCheck} LimitCheck
 * @typedef {import('../src/limit/types.js').LimitStore} LimitStore
 * @typedef {import('./lib/limit-stores.js').Scenario} Scenario
 */

// --- 1. Redis store ------------------------------------------------------------------------

/**
 * Decisions/s with `inflight` decisions outstanding at all times, for `seconds`.
 * @param {LimitStore} store
 * @param {ReadonlyArray<readonly LimitCheck[]>} byClient
 * @param {number} seconds
 * @param {number} inflight
 */
async function driveStore (store, byClient, seconds, inflight) {
  let decisions = 0
  let rejected = 0
  let next = 0
  const stopAt = performance.now() + seconds * 1000
  const worker = async () => {
    while (performance.now() < stopAt) {
      const checks = /** @type {readonly LimitCheck[]} */ (byClient[next++ % byClient.length])
      const d = await store.decide(checks, `r${next}`)
      decisions++
      if (!d.allowed) rejected++
    }
  }
  const t0 = performance.now()
  await Promise.all(Array.from({ length: inflight }, worker))
  const s = (performance.now() - t0) / 1000
  return { decisions, rejected, seconds: s, perSecond: decisions / s }
}

/**
 * @param {Awaited<ReturnType<typeof loadStores>>} stores
 * @param {Awaited<ReturnType<typeof startRedis>>} redis
 * @param {Scenario[]} list
 */
async function benchRedisStore (stores, redis, list) {
  const rows = []
  for (const s of list) {
    const row = { scenario: s.name, checks: s.limits.length, store: /** @type {Record<string, unknown>} */ ({}), ceiling: /** @type {Record<string, unknown> | null} */ (null) }
    // one script call per decision (maxBatch 1, as before issue 13) against the default: the
    // decisions of one event-loop turn in one lua/limit-batch.lua call. ioredis auto-pipelining
    // stays off (it was slower in every scenario, see bench/README.md).
    for (const variant of /** @type {const} */ (['perRequest', 'batched'])) {
      const client = new Redis({ host: '127.0.0.1', port: redis.port, enableAutoPipelining: false, maxRetriesPerRequest: 1 })
      const store = /** @type {NonNullable<typeof stores.createRedisStore>} */ (stores.createRedisStore)({ client, ...(variant === 'perRequest' ? { maxBatch: 1 } : {}) })
      const byClient = checksByClient(s, `bench-${variant}`, settings.clients)
      // warm-up: scripts loaded, connections open, keys created
      await driveStore(store, byClient, 0.5, settings.inflight)
      const calls0 = await commandCalls(redis.client)
      const redisCpu0 = treeCpuMicros(redis.child.pid)
      const cpu0 = process.cpuUsage()
      const r = await driveStore(store, byClient, settings.seconds, settings.inflight)
      const cpu = process.cpuUsage(cpu0)
      const redisCpu = treeCpuMicros(redis.child.pid) - redisCpu0
      const calls = callsBetween(calls0, await commandCalls(redis.client), SCRIPT_INTERNAL)
      row.store[variant] = {
        ...r,
        redisCallsPerDecision: calls.roundTrips / r.decisions,
        redisCommandsInScriptsPerDecision: calls.inScripts / r.decisions,
        redisCallsByCommand: calls.byCommand,
        clientCpuPerDecision: (cpu.user + cpu.system) / r.decisions,
        redisCpuPerDecision: redisCpu / r.decisions
      }
      console.log(`  redis store  ${s.name.padEnd(20)} ${variant.padEnd(10)}  ${fmt(r.perSecond)} decisions/s  ${fmt(calls.roundTrips / r.decisions)} Redis calls/decision (${fmt(calls.inScripts / r.decisions)} commands inside the script)  client ${fmt((cpu.user + cpu.system) / r.decisions)} µs/decision  redis ${fmt(redisCpu / r.decisions)} µs/decision`)
      // redis-benchmark counts requests, not time: size it to last about as long as the store's run.
      if (variant === 'batched') {
        const best = Math.max(r.perSecond, /** @type {{ perSecond: number }} */ (row.store.perRequest).perSecond)
        row.ceiling = await redisCeiling(store, byClient, redis, Math.min(1_000_000, Math.max(20_000, Math.round(best * settings.seconds * 1.5))))
      }
      await store.close()
      client.disconnect()
    }
    rows.push(row)
  }
  return rows
}

/**
 * The same script call as the store makes, replayed by redis-benchmark.
 * @param {LimitStore} store
 * @param {ReadonlyArray<readonly LimitCheck[]>} byClient
 * @param {Awaited<ReturnType<typeof startRedis>>} redis
 * @param {number} requests
 */
async function redisCeiling (store, byClient, redis, requests) {
  let captured = await captureScriptCall(redis.client, () => Promise.resolve(store.decide(/** @type {readonly LimitCheck[]} */ (byClient[0]), 'capture-1')))
  if (captured === null) return { skipped: 'no EVALSHA/EVAL/FCALL seen from the store' }
  // A script's first call on a connection may go out as EVAL with its whole source: replay it as
  // EVALSHA, as the store sends it from then on (and redis-benchmark's report stays one line).
  if (/^eval$/i.test(captured[0] ?? '')) {
    const sha = /** @type {string} */ (await redis.client.script('LOAD', /** @type {string} */ (captured[1])))
    captured = ['evalsha', sha, ...captured.slice(2)]
  }
  // Per-client key parts and the request id become __rand_int__, so the replay spreads over
  // clients like the store's own run did instead of hammering one key.
  const command = captured.map((a, i) => i === 0 ? a : a.replace(/:c0$/, ':c__rand_int__').replace(/^capture-1~.*$/, 'r__rand_int__'))
  const check = await redis.client.call(/** @type {string} */ (command[0]), ...command.slice(1).map((a) => a.replace(/__rand_int__/g, '000000000001'))).then(() => null, (/** @type {Error} */ e) => e.message)
  if (check !== null) return { skipped: `replayed command fails: ${check}`, command }
  // a ceiling that cannot be measured is reported as skipped: it must not end the whole bench
  let r
  try {
    r = await runRedisBenchmark({ port: redis.port, command, requests, clients: 50, pipeline: 16, keyspace: settings.clients })
  } catch (err) {
    const reason = /** @type {Error} */ (err).message.slice(0, 300)
    console.log(`  redis-benchmark ceiling (same ${command[0]}, -c 50 -P 16): not measured (${reason})`)
    return { skipped: reason, command }
  }
  console.log(`  redis-benchmark ceiling (same ${command[0]}, -c 50 -P 16): ${fmt(r.rps)} calls/s`)
  return { command, ...r }
}

// --- 2. in-process store -------------------------------------------------------------------

/**
 * @param {Awaited<ReturnType<typeof loadStores>>} stores
 * @param {Scenario[]} list
 */
async function benchMemoryStore (stores, list) {
  const rows = []
  for (const s of list) {
    const store = /** @type {NonNullable<typeof stores.createMemoryStore>} */ (stores.createMemoryStore)({ maxKeys: 100_000 })
    const byClient = checksByClient(s, 'mem', settings.clients)
    const run = async (/** @type {number} */ seconds) => {
      let decisions = 0
      const stopAt = performance.now() + seconds * 1000
      const t0 = performance.now()
      while (performance.now() < stopAt) {
        // Chunks of 1000 between clock reads; awaiting only when the store returns a promise.
        for (let i = 0; i < 1000; i++) {
          const d = store.decide(/** @type {readonly LimitCheck[]} */ (byClient[decisions % byClient.length]), `r${decisions}`)
          if (d instanceof Promise) await d
          decisions++
        }
        await setImmediate()
      }
      return { decisions, seconds: (performance.now() - t0) / 1000 }
    }
    await run(0.3)
    const cpu0 = process.cpuUsage()
    const r = await run(settings.seconds)
    const cpu = process.cpuUsage(cpu0)
    rows.push({ scenario: s.name, checks: s.limits.length, ...r, perSecond: r.decisions / r.seconds, cpuPerDecision: (cpu.user + cpu.system) / r.decisions })
    console.log(`  memory store ${s.name.padEnd(20)} ${fmt(r.decisions / r.seconds)} decisions/s`)
    await store.close()
  }
  return rows
}

// --- 3. Redis memory per key -------------------------------------------------------------

/**
 * For each algorithm: 200 clients, `hits` admitted requests each, then MEMORY USAGE of every key
 * the store created for them. Sliding-window-log keeps one entry per request, so it is measured
 * at two fill levels.
 * @param {Awaited<ReturnType<typeof loadStores>>} stores
 * @param {Awaited<ReturnType<typeof startRedis>>} redis
 */
async function benchKeyMemory (stores, redis) {
  const compile = /** @type {NonNullable<typeof stores.compileLimitSpec>} */ (stores.compileLimitSpec)
  const client = new Redis({ host: '127.0.0.1', port: redis.port })
  const store = /** @type {NonNullable<typeof stores.createRedisStore>} */ (stores.createRedisStore)({ client })
  const rows = []
  const cases = [
    { algorithm: 'gcra', hits: 10, limit: { algorithm: 'gcra', limit: 100, window: '1m', burst: 100 } },
    { algorithm: 'token-bucket', hits: 10, limit: { algorithm: 'token-bucket', limit: 100, window: '1m', burst: 100 } },
    { algorithm: 'leaky-bucket', hits: 10, limit: { algorithm: 'leaky-bucket', limit: 100, window: '1m', burst: 100 } },
    { algorithm: 'sliding-window-log', hits: 10, limit: { algorithm: 'sliding-window-log', limit: 100, window: '1m' } },
    { algorithm: 'sliding-window-log', hits: 100, limit: { algorithm: 'sliding-window-log', limit: 100, window: '1m' } },
    { algorithm: 'sliding-window', hits: 10, limit: { algorithm: 'sliding-window', limit: 100, window: '1m' } },
    { algorithm: 'fixed-window', hits: 10, limit: { algorithm: 'fixed-window', limit: 100, window: '1m' } }
  ]
  for (const c of cases) {
    const spec = compile(`mem${c.hits}`, 'user', c.limit)
    const clients = 200
    for (let h = 0; h < c.hits; h++) {
      await Promise.all(Array.from({ length: clients }, (_, i) => store.decide([{ key: `gw:${spec.id}:c${i}`, spec, cost: 1 }], `m${h}-${i}`)))
    }
    /** @type {string[]} */
    const keys = []
    let cursor = '0'
    do {
      const [next, batch] = await client.scan(cursor, 'MATCH', `*${spec.id}*`, 'COUNT', 1000)
      cursor = next
      keys.push(...batch)
    } while (cursor !== '0')
    let bytes = 0
    for (const k of keys) bytes += Number(await client.call('MEMORY', 'USAGE', k, 'SAMPLES', '0'))
    rows.push({ algorithm: c.algorithm, requestsPerClient: c.hits, clients, keys: keys.length, keysPerClient: keys.length / clients, bytesPerClient: bytes / clients, bytesPerKey: keys.length ? bytes / keys.length : NaN })
    console.log(`  ${c.algorithm.padEnd(20)} after ${String(c.hits).padStart(3)} requests: ${fmt(bytes / clients)} bytes per client (${fmt(keys.length / clients)} keys)`)
  }
  await store.close()
  client.disconnect()
  return rows
}

// --- 4. gateway RSS under a million client addresses ----------------------------------------

/**
 * Distinct X-Forwarded-For addresses (trusted from 127.0.0.1) through a local-level-only gateway;
 * RSS is sampled as the addresses go by. The local level is an LRU of `maxKeys` buckets, so RSS
 * should level off once maxKeys distinct clients have been seen.
 * @param {string} dir
 */
async function benchLocalRss (dir) {
  if (!existsSync(join(ROOT, 'bin', 'gateway')) || !existsSync(join(DIST, 'cli.js'))) return { skipped: 'gateway not built' }
  const upstreamPort = await freePort()
  const upstream = await startProcess('upstream', process.execPath, [join(BENCH, 'upstream.js'), String(upstreamPort)], {
    ready: () => answers200(`http://127.0.0.1:${upstreamPort}/`)
  })
  const port = await freePort()
  const adminPort = await freePort()
  const maxKeys = 100_000
  const conf = renderConfig('gateway-local-rss.yaml', {
    GATEWAY_PORT: String(port), ADMIN_PORT: String(adminPort), UPSTREAM_ORIGIN: `http://127.0.0.1:${upstreamPort}`, MAX_KEYS: String(maxKeys)
  })
  const file = join(dir, 'gateway-local-rss.yaml')
  writeFileSync(file, conf)
  const gw = await startProcess('gateway', process.execPath, [join(ROOT, 'bin', 'gateway'), 'start', '-c', file, '--log-level', 'warn'], {
    cwd: ROOT, env: { ...process.env, NODE_ENV: 'production' }, ready: () => answers200(`http://127.0.0.1:${adminPort}/readyz`), timeoutMs: 20_000
  })
  const admin = `http://127.0.0.1:${adminPort}`
  const rssAtStartMb = treeRssKb(gw.pid) / 1024

  let sent = 0
  /** @type {Array<{ clients: number, rssMb: number, localKeys: number | null }>} */
  const samples = []
  const sample = async () => {
    const m = await scrapeGatewayMetrics(admin).catch(() => ({}))
    samples.push({ clients: sent, rssMb: treeRssKb(gw.pid) / 1024, localKeys: /** @type {Record<string, number>} */ (m).gateway_ratelimit_local_keys ?? null })
  }
  let sampling = true
  const sampler = (async () => { while (sampling) { await sample(); await sleep(1000) } })()
  const t0 = performance.now()
  const result = await new Promise((resolve, reject) => {
    autocannon({
      url: `http://127.0.0.1:${port}`,
      connections: 50,
      amount: settings.ips,
      timeout: 10,
      requests: [{
        method: 'GET',
        path: '/rss',
        setupRequest: (req) => {
          const i = sent++
          req.headers = { 'x-forwarded-for': `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}` }
          return req
        }
      }]
    }, (err, res) => err ? reject(err) : resolve(res))
  })
  sampling = false
  await sampler
  await sample()
  const seconds = (performance.now() - t0) / 1000
  const r = /** @type {{ requests: { total: number }, non2xx: number, errors: number }} */ (result)
  const last = /** @type {typeof samples[number]} */ (samples[samples.length - 1])
  // RSS once the LRU is full versus at the end: the growth a further 900k clients caused.
  const atMaxKeys = samples.find((x) => x.clients >= maxKeys * 1.2) ?? last
  const out = {
    clients: settings.ips,
    maxKeys,
    requests: r.requests.total,
    non2xx: r.non2xx,
    errors: r.errors,
    seconds,
    rssAtStartMb,
    rssAtMaxKeysMb: atMaxKeys.rssMb,
    rssAtMaxKeysClients: atMaxKeys.clients,
    rssAtEndMb: last.rssMb,
    peakRssMb: treePeakRssKb(gw.pid) / 1024,
    localKeysAtEnd: last.localKeys,
    bounded: last.localKeys !== null ? last.localKeys <= maxKeys : null,
    samples
  }
  console.log(`  ${settings.ips} client IPs in ${fmt(seconds)} s: RSS ${fmt(rssAtStartMb)} MB at start, ${fmt(atMaxKeys.rssMb)} MB after ${atMaxKeys.clients} clients, ${fmt(last.rssMb)} MB at the end (peak ${fmt(out.peakRssMb)} MB); local keys ${last.localKeys} (maxKeys ${maxKeys})`)
  await stopProcess(gw)
  await stopProcess(upstream)
  return out
}

// --- main ----------------------------------------------------------------------------------

function today () {
  const d = new Date()
  return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, '0')}-${String(d.getDate()).padStart(2, '0')}`
}

async function main () {
  const dir = mkdtempSync(join(tmpdir(), 'gateway-limit-bench-'))
  const report = {
    date: today(),
    startedAt: new Date().toISOString(),
    machine: { cpuModel: cpus()[0]?.model ?? 'unknown', cpuCount: cpus().length, node: process.version },
    settings,
    /** @type {string[]} */
    skipped: [],
    /** @type {unknown} */ redisStore: null,
    /** @type {unknown} */ memoryStore: null,
    /** @type {unknown} */ keyMemory: null,
    /** @type {unknown} */ localLevelRss: null
  }
  const stores = await loadStores(DIST)
  if (stores.missing.length) {
    report.skipped.push(`store benchmarks: dist/${stores.missing.join(', dist/')} missing (run \`npm run build\` once src/limit/*-store.ts exist)`)
    console.log(`skipped: ${report.skipped[0]}`)
  } else {
    const list = scenarios(/** @type {NonNullable<typeof stores.compileLimitSpec>} */ (stores.compileLimitSpec))
    const redis = await startRedis(dir)
    report.machine.redis = (await redis.client.info('server')).match(/redis_version:(\S+)/)?.[1] ?? null
    if (wanted('redis')) {
      console.log(`Redis store, ${settings.inflight} decisions in flight, ${settings.seconds} s each:`)
      report.redisStore = await benchRedisStore(stores, redis, list)
    }
    if (wanted('memory')) {
      console.log(`In-process store, ${settings.seconds} s each:`)
      report.memoryStore = await benchMemoryStore(stores, list)
    }
    if (wanted('keys')) {
      console.log('Redis memory per client key:')
      report.keyMemory = await benchKeyMemory(stores, redis)
    }
    redis.client.disconnect()
  }
  if (wanted('rss')) {
    console.log('Gateway RSS through the local level:')
    report.localLevelRss = await benchLocalRss(dir)
  }
  report.finishedAt = new Date().toISOString()
  printLimitReport(report)
  mkdirSync(settings.outDir, { recursive: true })
  const file = join(settings.outDir, `${report.date}-limit.json`)
  writeFileSync(file, JSON.stringify(report, null, 2) + '\n')
  console.log(`\nwrote ${file}`)
  await stopAll()
  rmSync(dir, { recursive: true, force: true })
}

process.on('exit', killAllSync)
for (const sig of /** @type {const} */ (['SIGINT', 'SIGTERM'])) process.on(sig, () => { stopAll().finally(() => process.exit(130)) })
main().catch(async (err) => {
  console.error(err)
  await stopAll()
  process.exit(1)
})
