// Instructions per request, counted by valgrind's callgrind: a figure that does not move with the
// machine's load, for changes too small for the CPU-time benches. Repeats of one gateway build still
// differ by up to 10% (V8's compiler threads and per-second work are counted: bench/README.md,
// tenth session), so builds are compared on one config, with repeats. On these shared 2-core VMs the
// same contender's CPU per request moves by a factor of two between rounds, while what is left of
// the plain proxy path (issue 13) is spread over many frames of 1-5% each.
//
//   node bench/instructions.js [--contenders b,c,d,e,f,l,r,r1,r9] [--warm 20000] [--requests 5000]
//                              [--repeat 2] [--dist dist[,other/dist]] [--main-thread] [--keep]
//                              [--perf-map] [--scenario NAME] [--json FILE]
//
// Each contender runs under `valgrind --tool=callgrind --instr-atstart=no`: `--warm` requests
// (50 keep-alive connections) let V8 optimise the hot path uninstrumented, then counting is turned
// on (`callgrind_control -i on`) for `--requests` requests and off again, so start-up and warm-up
// are not counted. The count is every instruction of the contender's process in that window (its
// JavaScript, V8's compiler and GC, libuv, the kernel's entry stubs excluded), divided by the
// requests. Repeats of one build agree within about 1%; JIT timing is what still moves them.
// Contenders: b the bare undici proxy (bench/bare-proxy.js), u the bare proxy plus the gateway's
// per-request duties (bench/bare-duties.js, (l) of bench/run.js), c/d/f the gateway configs of
// `npm run bench`, l = f with the access log on. e is (e), the four limits on a redis-server of
// its own (not under valgrind), counted to see where its instructions go, not as a figure to
// hold against `npm run bench`: its batching depends on timing, and valgrind slows the gateway
// about 20-50x, so its batches are larger than at full speed. Its line gives the script calls
// per request of the counted window beside the count. Its Redis calls are given 10 s instead of
// the config's 50 ms: under valgrind some took longer, and the fallback's decisions were counted.
// r, r1 and r9 count redis-server instead, per decision: the four limits of (e) (the "four dimensions
// (e)" scenario of bench/lib/limit-stores.js) decided through the build's Redis store by this
// process, 50 decisions in flight over 1,000 clients. r batches them (lua/limit-batch.lua: the 50
// decisions of a turn in one call, so the count repeats within 0.1%), r1 sends one lua/limit.lua
// call per decision (the store's maxBatch 1), r9 calls of nine decisions (maxBatch 9: about the
// batches of (e) in `npm run bench`, 0.11 calls per request, where a call's fixed cost still
// weighs). Their warm-up is 2,000 decisions (Lua has no JIT).
// `--scenario` counts another scenario of bench/lib/limit-stores.js instead, e.g. `gcra` (one check:
// one limit.lua call per decision is what Redis Cluster sends, never batched).
// `--main-thread` counts the main thread alone (callgrind's --separate-threads): V8's compiler and
// GC helper threads are what moves repeats of one build by up to 10%; the request path's
// JavaScript, node:http and undici all run on the main thread.
// `--keep` leaves callgrind's dumps in their directory (named on stdout with each run's pid) for
// `callgrind_annotate`: node's C++ and V8's builtins and runtime functions are named there, the
// JavaScript is not.
// `--perf-map` (with `--keep`) runs node with --perf-basic-prof and keeps its map beside the dumps:
// `node bench/callgrind-callers.js <dump> Builtins_LoadIC --perf-map <map> --per <requests>` then
// names the JavaScript functions that call a builtin, which the dumps know only by address.
// `--dist` compares builds: each directory is a compiled dist/ (for example a `git worktree` of
// another commit after `npx tsc -p tsconfig.build.json`).
import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Redis } from 'ioredis'
import { answers200, freePort, killAllSync, startProcess, stopAll, stopProcess } from './lib/processes.js'
import { GATEWAY_CONFIGS, contenderCommand, countFlags, loadCounted } from './lib/contenders.js'
import { fmt, spread } from './lib/summary.js'
import { commandCalls, startRedis } from './lib/redis-server.js'
import { checksByClient, loadStores, scenarios } from './lib/limit-stores.js'

/** Contenders that are not the gateway: one row whatever --dist says. */
const BARE = new Set(['b', 'u'])
const ROOT = fileURLToPath(new URL('..', import.meta.url))
const BENCH = join(ROOT, 'bench')

const { json, settings } = countFlags({ contenders: 'b,c,d,f', requests: '5000' })

// l is (f) with the access log on (`log.level: info`), its stdout read by a `cat` of its own:
// l - f is the access line's cost in instructions, free of the rate effects that blur it in
// `npm run bench`, where (i) runs slower than (e) because the log's reader takes CPU.
const GATEWAYS = new Set(['c', 'd', 'e', 'f', 'l'])

function requireValgrind () {
  for (const tool of ['valgrind', 'callgrind_control']) {
    try {
      execFileSync(tool, ['--version'], { stdio: 'ignore' })
    } catch {
      console.error(`bench/instructions.js needs ${tool} (Debian: apt-get install valgrind)`)
      process.exit(2)
    }
  }
}

/**
 * Sum of the `totals:` lines of the dumps callgrind wrote for `pid`.
 * @param {string} dir
 * @param {number} pid
 * @param {boolean} [mainThread]  count the main thread's dump alone (--separate-threads)
 */
function countedInstructions (dir, pid, mainThread = false) {
  let total = 0
  for (const f of readdirSync(dir)) {
    if (!f.startsWith(`cg.${pid}`)) continue
    // with --separate-threads each thread has its own file, the main thread's ending in -01
    if (mainThread && !f.endsWith('-01')) continue
    const m = /^totals:\s+(\d+)/m.exec(readFileSync(join(dir, f), 'utf8'))
    if (m !== null) total += Number(m[1])
  }
  return total
}

/**
 * One contender under callgrind: warm up uninstrumented, count `requests`, stop.
 * @param {string} id  b, c, d, e, f or l
 * @param {string} dist
 * @param {{ dir: string, upstreamOrigin: string }} env
 */
async function measure (id, dist, env) {
  const redis = id === 'e' ? await startRedis(env.dir) : null
  try {
    return await measureGateway(id, dist, env, redis)
  } finally {
    if (redis !== null) {
      redis.client.disconnect()
      await stopProcess(redis.child)
    }
  }
}

/**
 * @param {string} id
 * @param {string} dist
 * @param {{ dir: string, upstreamOrigin: string }} env
 * @param {Awaited<ReturnType<typeof startRedis>> | null} redis  (e)'s redis-server
 */
async function measureGateway (id, dist, env, redis) {
  const { port, args, ready } = await contenderCommand(id, { dist, dir: env.dir, upstreamOrigin: env.upstreamOrigin, redisUrl: redis?.url ?? null, ...(redis === null ? {} : { redisTimeout: '10s' }), ...(id === 'l' ? { config: GATEWAY_CONFIGS.f, logOn: true } : {}) })
  const threads = settings.mainThread ? ['--separate-threads=yes'] : []
  // node names its JIT code in /tmp/perf-<pid>.map, which callgrind's dumps only know by address
  const perfMap = settings.perfMap ? ['--perf-basic-prof'] : []
  const child = await startProcess(`${id} under callgrind`, 'valgrind', ['--tool=callgrind', '--instr-atstart=no', ...threads, `--callgrind-out-file=${join(env.dir, 'cg.%p')}`, process.execPath, ...perfMap, ...args], {
    env: { ...process.env, NODE_ENV: 'production' },
    drainStdout: true,
    ready,
    timeoutMs: 180_000
  })
  try {
    await loadCounted(port, settings.warm)
    const before = redis === null ? null : await scriptCalls(redis.client)
    execFileSync('callgrind_control', ['-i', 'on', String(child.pid)], { stdio: 'ignore' })
    const counted = await loadCounted(port, settings.requests)
    execFileSync('callgrind_control', ['-i', 'off', String(child.pid)], { stdio: 'ignore' })
    if (redis !== null && before !== null) console.log(`  (${id}: ${((await scriptCalls(redis.client) - before) / counted).toFixed(3)} script calls per request while counted)`)
    execFileSync('callgrind_control', ['-d', String(child.pid)], { stdio: 'ignore' })
    const instructions = countedInstructions(env.dir, child.pid, settings.mainThread)
    if (settings.keep) console.log(`  (${id}, ${dist}: callgrind's dumps ${join(env.dir, `cg.${child.pid}`)}*)`)
    if (settings.perfMap) copyFileSync(`/tmp/perf-${child.pid}.map`, join(env.dir, `perf-${child.pid}.map`))
    if (instructions === 0) throw new Error(`${id}: callgrind wrote no count`)
    return instructions / counted
  } finally {
    await stopProcess(child)
  }
}

/**
 * Script calls redis-server has served so far: FCALL of the function library, EVALSHA and EVAL
 * (before the library is loaded, or where the server refuses it).
 * @param {Redis} client
 */
async function scriptCalls (client) {
  const calls = await commandCalls(client)
  return (calls.fcall ?? 0) + (calls.evalsha ?? 0) + (calls.eval ?? 0)
}

/** Redis contenders: the store's maxBatch (undefined: its default). */
/** @type {Record<string, number | undefined>} */
const REDIS = { r: undefined, r1: 1, r9: 9 }

/**
 * redis-server's instructions per decision for contender r or r1 (see the header).
 * @param {string} id
 * @param {string} dist
 * @param {{ dir: string }} env
 */
async function measureRedis (id, dist, env) {
  const stores = await loadStores(dist)
  if (stores.missing.length > 0 || !stores.createRedisStore || !stores.compileLimitSpec) throw new Error(`${dist}: ${stores.missing.join(', ')} missing (npm run build)`)
  const scenario = scenarios(stores.compileLimitSpec).find((s) => s.name === settings.scenario)
  if (scenario === undefined) throw new Error(`bench/lib/limit-stores.js has no "${settings.scenario}" scenario`)
  const byClient = checksByClient(scenario, `instructions-${id}`, 1000)
  const redis = await startRedis(env.dir, ['valgrind', '--tool=callgrind', '--instr-atstart=no', `--callgrind-out-file=${join(env.dir, 'cg.%p')}`])
  const client = new Redis({ host: '127.0.0.1', port: redis.port, enableAutoPipelining: false, maxRetriesPerRequest: 1 })
  const store = stores.createRedisStore({ client, ...(REDIS[id] === undefined ? {} : { maxBatch: REDIS[id] }) })
  let next = 0
  /** 50 workers, each awaiting `each` decisions in turn: every turn asks for 50 decisions. */
  const decide = async (/** @type {number} */ each) => {
    const worker = async () => {
      for (let k = 0; k < each; k++) {
        const d = await store.decide(/** @type {import('../src/limit/types.js').LimitCheck[]} */ (byClient[next % byClient.length]), `r${next++}`)
        if (!d.allowed) throw new Error(`${id}: a decision was a rejection; the limits are meant never to reject`)
      }
    }
    await Promise.all(Array.from({ length: 50 }, worker))
    return 50 * each
  }
  try {
    await decide(40)
    execFileSync('callgrind_control', ['-i', 'on', String(redis.child.pid)], { stdio: 'ignore' })
    const counted = await decide(Math.max(1, Math.round(settings.requests / 50)))
    execFileSync('callgrind_control', ['-i', 'off', String(redis.child.pid)], { stdio: 'ignore' })
    execFileSync('callgrind_control', ['-d', String(redis.child.pid)], { stdio: 'ignore' })
    const instructions = countedInstructions(env.dir, redis.child.pid)
    if (instructions === 0) throw new Error(`${id}: callgrind wrote no count`)
    return instructions / counted
  } finally {
    await store.close()
    client.disconnect()
    redis.client.disconnect()
    await stopProcess(redis.child)
  }
}

async function main () {
  requireValgrind()
  const dir = mkdtempSync(join(tmpdir(), 'gw-instructions-'))
  process.on('exit', () => {
    killAllSync()
    if (settings.keep) console.log(`callgrind's dumps are kept in ${dir}`)
    else rmSync(dir, { recursive: true, force: true })
  })
  const upstreamPort = await freePort()
  await startProcess('upstream', process.execPath, [join(BENCH, 'upstream.js'), String(upstreamPort)], { ready: () => answers200(`http://127.0.0.1:${upstreamPort}/`) })
  const env = { dir, upstreamOrigin: `http://127.0.0.1:${upstreamPort}` }
  /** @type {Array<{ id: string, dist: string, runs: number[] }>} */
  const rows = []
  for (const id of settings.contenders) {
    if (!BARE.has(id) && !GATEWAYS.has(id) && !(id in REDIS)) throw new Error(`unknown contender ${id} (b, u, c, d, e, f, l, r, r1 or r9)`)
    for (const dist of BARE.has(id) ? [settings.dists[0]] : settings.dists) rows.push({ id, dist: /** @type {string} */ (dist), runs: [] })
  }
  console.log(`instructions per request${settings.mainThread ? ' (main thread)' : ''}: ${settings.warm} warm-up requests, ${settings.requests} counted, ${settings.repeat} repeats`)
  for (let r = 0; r < settings.repeat; r++) {
    for (const row of r % 2 === 0 ? rows : [...rows].reverse()) {
      const perRequest = row.id in REDIS ? await measureRedis(row.id, row.dist, env) : await measure(row.id, row.dist, env)
      row.runs.push(perRequest)
      console.log(`  ${row.id} ${BARE.has(row.id) ? 'bare proxy' + (row.id === 'u' ? ' + duties' : '') : row.dist}: ${fmt(perRequest)}`)
    }
  }
  const bare = rows.find((row) => row.id === 'b')
  console.log('\ncontender | build | instructions per request, r/r1: Redis instructions per decision (median [min-max]) | / bare proxy, r: / r1 of its build')
  const report = rows.map((row) => {
    const s = spread(row.runs)
    // the gateway's contenders against the bare proxy; r (batched) against r1 (one call per decision)
    const base = row.id === 'r' ? rows.find((o) => o.id === 'r1' && o.dist === row.dist) : row.id in REDIS || row.id === 'b' ? undefined : bare
    const ratio = base === undefined ? null : spread(row.runs.map((x, i) => x / /** @type {number} */ (base.runs[i])))
    console.log(`${row.id} | ${BARE.has(row.id) ? '-' : row.dist} | ${fmt(s?.median)} [${fmt(s?.min)}-${fmt(s?.max)}] | ${ratio === null ? '-' : `${fmt(ratio.median)} [${fmt(ratio.min)}-${fmt(ratio.max)}]`}`)
    return { contender: row.id, dist: row.dist, runs: row.runs, perRequest: s, ...(row.id === 'r' ? { toR1: ratio } : { toBare: ratio }) }
  })
  if (json !== undefined) writeFileSync(json, JSON.stringify({ date: new Date().toISOString(), settings, report }, null, 2))
  await stopAll()
}

main().catch(async (err) => {
  console.error(err)
  await stopAll()
  process.exitCode = 1
})
