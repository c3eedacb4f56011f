// Full-load benchmark: the gateway against its baselines, on one machine, in one run.
//
// Every contender is its own process, started once and kept for all rounds; rounds interleave
// the contenders (a warm-up round first, then >= 3 measured rounds, every other round in reverse
// order) so that machine noise hits all of them alike. Ratios are computed inside each round
// from contenders measured next to each other, then summarised over rounds.
//
//   node bench/run.js [--duration 10] [--rounds 3] [--warmup 3] [--connections 50]
//                     [--only a,b,e,h] [--out-dir bench/results] [--pin]
// After the contenders, bench/concurrency.js measures the extra CPU per request of one
// concurrency limit (issue 10) and its figures join the report (`--only` without "concurrency"
// skips it when other contenders are named).
// Each flag also reads an environment variable: BENCH_DURATION, BENCH_ROUNDS, BENCH_WARMUP,
// BENCH_CONNECTIONS, BENCH_ONLY, BENCH_OUT_DIR, BENCH_PIN=1; --flood-rate (BENCH_FLOOD_RATE) sets the flood's offered req/s.
import { existsSync, mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
import { tmpdir, cpus, totalmem, release, loadavg } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { performance } from 'node:perf_hooks'
import { request } from 'undici'
import { answers200, describePlacement, freePort, killAllSync, pinProcesses, placed, sleep, startProcess, stopAll, stopProcess } from './lib/processes.js'
import { treeCpuMicros, treePeakRssKb, CLOCK_TICKS } from './lib/proc-stats.js'
import { startRedis, commandCalls, callsBetween, commandsUsedByScripts } from './lib/redis-server.js'
import { nginxVersion, startNginx } from './lib/nginx.js'
import { runLoad, runPacedLoad, userRequests, clientRequests } from './lib/load.js'
import { fmt, spread } from './lib/summary.js'
import { scrapeGatewayMetrics, gatewayMetricsBetween } from './lib/gateway-metrics.js'
import { printReport } from './lib/report-table.js'
import { renderSvg } from './lib/report-svg.js'
import { renderConfig } from './lib/configs.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const BENCH = join(ROOT, 'bench')
const PATH = '/api/items/42'
const SCRIPT_INTERNAL = commandsUsedByScripts(join(ROOT, 'lua'))

// --- settings -----------------------------------------------------------------------------

const { values: flags } = parseArgs({
  options: {
    duration: { type: 'string' },
    rounds: { type: 'string' },
    warmup: { type: 'string' },
    connections: { type: 'string' },
    'flood-rate': { type: 'string' },
    only: { type: 'string' },
    'out-dir': { type: 'string' },
    pin: { type: 'boolean' }
  }
})

/**
 * @param {string | undefined} flag
 * @param {string | undefined} env
 * @param {number} fallback
 */
function numberSetting (flag, env, fallback) {
  const n = Number(flag ?? env ?? fallback)
  if (!Number.isFinite(n) || n < 0) throw new Error(`not a number: ${flag ?? env}`)
  return n
}

const settings = {
  durationS: numberSetting(flags.duration, process.env.BENCH_DURATION, 10),
  // 5, not 3: one noisy round moves a median of 3 (the access line read 38.4 µs [12.4-39.0] with 3
  // rounds and 1.18 [-2.64-44.4] with 4 on the same code, 2026-11-24)
  rounds: numberSetting(flags.rounds, process.env.BENCH_ROUNDS, 5),
  warmupS: numberSetting(flags.warmup, process.env.BENCH_WARMUP, 3),
  connections: numberSetting(flags.connections, process.env.BENCH_CONNECTIONS, 50),
  only: (flags.only ?? process.env.BENCH_ONLY ?? '').split(',').map((s) => s.trim()).filter(Boolean),
  outDir: flags['out-dir'] ?? process.env.BENCH_OUT_DIR ?? join(BENCH, 'results'),
  // the measured contender on a CPU of its own, everything else on the others (lib/processes.js);
  // opt-in: one pinned full run (2026-11-25) spread its rounds no less than unpinned runs
  pin: flags.pin === true || process.env.BENCH_PIN === '1',
  identities: 64,
  // Flood: requests/s offered in all, 10% by 1000 well-behaved clients (a fraction of a request/s
  // each) on their own connections, 90% by one abusive client on the remaining connections.
  floodRate: numberSetting(flags['flood-rate'], process.env.BENCH_FLOOD_RATE, 5000),
  floodGoodConnections: 10,
  floodGoodIdentities: 1000,
  pauseMs: 500
}

// --- contenders -----------------------------------------------------------------------------

/**
 * @typedef {object} Contender
 * @property {string} id
 * @property {string} letter
 * @property {string} label
 * @property {string} [config]     gateway config template in bench/configs
 * @property {boolean} [needsRedis]
 * @property {string} [logLevel]  gateways: the log level it runs at (default warn: access log off)
 * @property {string} [url]
 * @property {string} [adminUrl]  gateways only
 * @property {number} [pid]
 * @property {boolean} [optIn]  measured only when --only names it
 * @property {string | null} skipped  why it was not measured, or null
 * @property {string[]} notes
 * @property {Array<Record<string, unknown>>} runs
 */

/** @type {Contender[]} */
const contenders = [
  { id: 'direct', letter: 'a', label: 'upstream direct', skipped: null, notes: [], runs: [] },
  { id: 'bare', letter: 'b', label: 'bare undici proxy', skipped: null, notes: [], runs: [] },
  { id: 'gw-none', letter: 'c', label: 'gateway, no limits', config: 'gateway-no-limits.yaml', skipped: null, notes: [], runs: [] },
  { id: 'gw-local', letter: 'd', label: 'gateway, local level', config: 'gateway-local.yaml', skipped: null, notes: [], runs: [] },
  { id: 'gw-redis', letter: 'e', label: 'gateway, local + 4 shared on Redis', config: 'gateway-shared-redis.yaml', needsRedis: true, skipped: null, notes: [], runs: [] },
  { id: 'gw-memory', letter: 'f', label: 'gateway, local + 4 shared in-process', config: 'gateway-shared-memory.yaml', skipped: null, notes: [], runs: [] },
  { id: 'flood', letter: 'g', label: 'gateway under flood (Redis)', config: 'gateway-flood.yaml', needsRedis: true, skipped: null, notes: [], runs: [] },
  { id: 'nginx', letter: 'h', label: 'nginx proxy_pass keepalive', skipped: null, notes: [], runs: [] },
  // (e) with its access log on, stdout a pipe the bench drains: the difference to (e) is one line's cost
  { id: 'gw-redis-log', letter: 'i', label: 'gateway (e), access log on', config: 'gateway-shared-redis.yaml', needsRedis: true, logLevel: 'info', skipped: null, notes: [], runs: [] },
  // the peer (bench/peer): fastify + @fastify/http-proxy, and with @fastify/rate-limit on Redis (1 limit)
  { id: 'fastify', letter: 'j', label: 'fastify + @fastify/http-proxy', skipped: null, notes: [], runs: [] },
  { id: 'fastify-rl', letter: 'k', label: 'fastify + http-proxy + rate-limit on Redis (1 limit)', needsRedis: true, skipped: null, notes: [], runs: [] },
  // the bare proxy plus the gateway's per-request duties (bare-duties.js): run only when named in --only
  { id: 'bare-duties', letter: 'l', label: 'bare proxy + request id, trace, X-Forwarded-*, metrics', optIn: true, skipped: null, notes: [], runs: [] }
]
/** @param {string} id */
const byId = (id) => /** @type {Contender} */ (contenders.find((c) => c.id === id))

// Order inside a round: each ratio's pair sits side by side where possible (gw-none|bare,
// bare|gw-redis, gw-redis|direct); gw-redis|nginx is two apart. Odd rounds run it backwards.
// (i) sits next to (e) (the access line's cost) and to (k) (the peer with its log off, as (e)).
const ROUND_ORDER = ['gw-local', 'gw-memory', 'gw-none', 'bare-duties', 'fastify', 'bare', 'gw-redis', 'gw-redis-log', 'fastify-rl', 'direct', 'nginx', 'flood']
const RATIOS = [
  { name: 'gateway(e) / direct', num: 'gw-redis', den: 'direct' },
  { name: 'gateway(e) / bare proxy', num: 'gw-redis', den: 'bare' },
  { name: 'gateway(e) / nginx', num: 'gw-redis', den: 'nginx' },
  { name: 'gateway(c) / bare proxy', num: 'gw-none', den: 'bare' },
  { name: 'gateway(f) / bare proxy', num: 'gw-memory', den: 'bare' },
  { name: 'gateway(i) log on / bare proxy', num: 'gw-redis-log', den: 'bare' },
  { name: 'gateway(d) local level / bare proxy', num: 'gw-local', den: 'bare' },
  { name: 'gateway(i) log on / gateway(e) log off', num: 'gw-redis-log', den: 'gw-redis' },
  { name: 'gateway(e) 4 limits / fastify+rate-limit(k) 1 limit', num: 'gw-redis', den: 'fastify-rl' },
  { name: 'fastify(j) / bare proxy', num: 'fastify', den: 'bare' },
  { name: 'bare + duties(l) / bare proxy', num: 'bare-duties', den: 'bare' },
  { name: 'gateway(c) / bare + duties(l)', num: 'gw-none', den: 'bare-duties' }
]
// CPU µs per request of num minus den, per round: what one feature costs on its own
const DIFFERENCES = [
  { name: 'access line (i) - (e), CPU µs/req', num: 'gw-redis-log', den: 'gw-redis' }
]
const PEER_DIR = join(BENCH, 'peer')

// --- starting everything ------------------------------------------------------------------

/** What the gateway CLI offers, read once from `gateway --help`. */
function gatewayCli () {
  const bin = join(ROOT, 'bin', 'gateway')
  if (!existsSync(bin)) return { ok: false, why: 'bin/gateway does not exist yet', logFlag: false }
  if (!existsSync(join(ROOT, 'dist', 'cli.js'))) return { ok: false, why: 'dist/cli.js missing (run `npm run build`)', logFlag: false }
  let help
  try {
    help = execFileSync(process.execPath, [bin, '--help'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 10_000 })
  } catch (err) {
    const e = /** @type {{ stdout?: string, stderr?: string }} */ (err)
    help = `${e.stdout ?? ''}${e.stderr ?? ''}`
  }
  return { ok: true, why: '', logFlag: help.includes('--log-level') }
}

/**
 * Start one gateway contender. A config the gateway rejects skips that contender with the
 * gateway's own message; `log:` is the one key the contract leaves open, so a rejection that
 * names it is retried once without it (and noted).
 * @param {Contender} c
 * @param {{ dir: string, upstreamOrigin: string, redisUrl: string | null, logFlag: boolean }} env
 */
async function startGateway (c, env) {
  const gatewayPort = await freePort()
  const adminPort = await freePort()
  let text = renderConfig(/** @type {string} */ (c.config), {
    GATEWAY_PORT: String(gatewayPort),
    ADMIN_PORT: String(adminPort),
    UPSTREAM_ORIGIN: env.upstreamOrigin,
    REDIS_URL: env.redisUrl ?? 'redis://127.0.0.1:1'
  })
  const args = [join(ROOT, 'bin', 'gateway'), 'start', '-c', '']
  if (env.logFlag) args.push('--log-level', c.logLevel ?? 'warn')
  for (let attempt = 0; attempt < 2; attempt++) {
    const file = join(env.dir, `${c.id}.yaml`)
    writeFileSync(file, text)
    args[3] = file
    try {
      const child = await startProcess(`gateway ${c.id}`, process.execPath, args, {
        cwd: ROOT,
        env: { ...process.env, NODE_ENV: 'production' },
        // the access log (i) is read by a process of its own, as in a deployment (see startProcess)
        drainStdout: true,
        contender: true,
        ready: () => answers200(`http://127.0.0.1:${adminPort}/readyz`),
        timeoutMs: 20_000
      })
      return { child, port: gatewayPort, adminUrl: `http://127.0.0.1:${adminPort}` }
    } catch (err) {
      const msg = /** @type {Error} */ (err).message
      if (attempt === 0 && /\blog\b/.test(msg.split('\n').slice(1).join('\n')) && /^log:/m.test(text)) {
        c.notes.push('gateway rejected the `log:` key; ran without it')
        text = text.replace(/^log:.*\n/m, '')
        continue
      }
      throw err
    }
  }
  throw new Error('unreachable')
}

/**
 * One request through a freshly started contender: it must answer 200 before it is measured.
 * @param {string} url
 * @param {Record<string, string>} headers
 */
async function smokeTest (url, headers) {
  const res = await request(url + PATH, { headers })
  const body = await res.body.text()
  if (res.statusCode !== 200) throw new Error(`smoke request answered ${res.statusCode}: ${body.slice(0, 300)}`)
}

// --- measuring ----------------------------------------------------------------------------

/**
 * @typedef {object} Probes
 * @property {number} pid
 * @property {number} upstreamPid
 * @property {number | null} redisPid
 * @property {import('ioredis').Redis | null} redis
 * @property {string | null} adminUrl
 */

/** @param {Probes} p */
async function snapshot (p) {
  const calls = p.redis ? await commandCalls(p.redis) : null
  const metrics = p.adminUrl ? await scrapeGatewayMetrics(p.adminUrl) : null
  return {
    calls,
    metrics,
    cpu: treeCpuMicros(p.pid),
    upstreamCpu: treeCpuMicros(p.upstreamPid),
    redisCpu: p.redisPid ? treeCpuMicros(p.redisPid) : 0,
    loadgen: process.cpuUsage(),
    t: performance.now()
  }
}

/**
 * Snapshot, run `load`, snapshot, and turn the differences into per-request figures.
 * @template {{ requests: number }} L
 * @param {Probes} p
 * @param {() => Promise<L>} load
 */
async function measured (p, load) {
  const before = await snapshot(p)
  const result = await load()
  const afterCpu = treeCpuMicros(p.pid)
  const afterUpstream = treeCpuMicros(p.upstreamPid)
  const afterRedis = p.redisPid ? treeCpuMicros(p.redisPid) : 0
  const loadgen = process.cpuUsage(before.loadgen)
  const wallS = (performance.now() - before.t) / 1000
  const callsAfter = p.redis ? await commandCalls(p.redis) : null
  const metricsAfter = p.adminUrl ? await scrapeGatewayMetrics(p.adminUrl) : null
  const n = result.requests || 1
  const cpu = afterCpu - before.cpu
  const upstreamCpu = p.upstreamPid === p.pid ? 0 : afterUpstream - before.upstreamCpu
  const redisCpu = afterRedis - before.redisCpu
  const redisCalls = before.calls && callsAfter ? callsBetween(before.calls, callsAfter, SCRIPT_INTERNAL) : { roundTrips: 0, scripts: 0, inScripts: 0, byCommand: {} }
  const loadgenCpu = loadgen.user + loadgen.system
  const gateway = before.metrics && metricsAfter ? gatewayMetricsBetween(before.metrics, metricsAfter) : null
  return {
    load: result,
    wallS,
    cpuMicros: cpu,
    cpuPerReq: cpu / n,
    cpuCorePct: cpu / (wallS * 1e4),
    upstreamCpuPerReq: upstreamCpu / n,
    redisCpuPerReq: redisCpu / n,
    totalServerCpuPerReq: (cpu + upstreamCpu + redisCpu) / n,
    loadgenCpuPerReq: loadgenCpu / n,
    loadgenCorePct: loadgenCpu / (wallS * 1e4),
    redisCalls: redisCalls.roundTrips,
    redisCallsPerReq: redisCalls.roundTrips / n,
    redisScriptCallsPerReq: redisCalls.scripts / n,
    redisCommandsInScriptsPerReq: redisCalls.inScripts / n,
    redisCallsByCommand: redisCalls.byCommand,
    peakRssMb: treePeakRssKb(p.pid) / 1024,
    gateway,
    gatewayRedisErrors: gateway?.redisErrors ?? 0,
    // the gateway's GC pauses per request: a request path that makes V8 promote its objects shows
    // here first (issue 13: 6-7 ms scavenges from one Set of open responses)
    gatewayGcPauseUsPerReq: gateway === null ? NaN : gateway.gcSeconds * 1e6 / n,
    gatewayFallbackShare: fallbackShare(gateway?.decisions)
  }
}

/**
 * @param {Contender} c
 * @param {Probes} p
 * @param {number} durationS
 */
async function measureContender (c, p, durationS) {
  if (c.id === 'flood') return measureFlood(c, p, durationS)
  const m = await measured(p, () => runLoad({
    url: /** @type {string} */ (c.url), connections: settings.connections, durationS, requests: userRequests(settings.identities, PATH)
  }))
  const { load, ...rest } = m
  return { ...load, ...rest }
}

/**
 * The flood is two measurements back to back: the well-behaved clients alone (their baseline),
 * then the same clients beside the abusive one. Both groups are rate-bound (autocannon
 * overallRate), so that the abusive client sends 90% of the requests whenever the gateway keeps
 * up; if it does not, the achieved rates and the well-behaved latency show it. The abusive
 * requests' rejection cost is what the gateway spent beyond the admitted requests, each admitted
 * one costed at the baseline rate.
 * @param {Contender} c
 * @param {Probes} p
 * @param {number} durationS
 */
async function measureFlood (c, p, durationS) {
  const url = /** @type {string} */ (c.url)
  const good = clientRequests(settings.floodGoodIdentities, 'good', 1, PATH)
  const abusive = clientRequests(1, 'abuser', 66, PATH)
  const goodLoad = { url, connections: settings.floodGoodConnections, durationS, requests: good, overallRate: settings.floodRate * 0.1 }
  const abusiveLoad = { url, connections: settings.connections - settings.floodGoodConnections, durationS, requests: abusive, overallRate: settings.floodRate * 0.9 }
  const alone = await measured(p, () => runPacedLoad(goodLoad, 10))
  await sleep(settings.pauseMs)
  const flood = await measured(p, async () => {
    const [g, a] = await Promise.all([runPacedLoad(goodLoad, 10), runPacedLoad(abusiveLoad, 10)])
    return { good: g, abusive: a, requests: g.requests + a.requests }
  })
  const g = flood.load.good
  const a = flood.load.abusive
  const rejected = a.statusCodes['429'] ?? 0
  const admitted = g.requests - g.non2xx + (a.requests - a.non2xx)
  const rejectionCpu = rejected > 0 ? (flood.cpuMicros - admitted * alone.cpuPerReq) / rejected : NaN
  const decisions = flood.gateway?.decisions ?? {}
  const rejectedDecisions = Object.entries(decisions).filter(([k]) => k.endsWith(':rejected')).reduce((sum, [, n]) => sum + n, 0)
  // the local level and the deny cache count as level "local": refused without a Redis call
  const rejectedWithoutRedis = rejectedDecisions > 0 ? (decisions['local:rejected'] ?? 0) / rejectedDecisions : NaN
  await sleep(settings.pauseMs)
  // Saturation (issue 13 item 5): the abusive client alone at full rate, not paced; nearly every
  // request is refused, so CPU per request is the cost of a rejection. The same load against a
  // bare node:http server answering the same 429 gives Node's floor in the same round.
  const saturationLoad = { url, connections: settings.connections, durationS, requests: abusive }
  const saturated = await measured(p, () => runLoad(saturationLoad))
  await sleep(settings.pauseMs)
  const floor = await measureRejectionFloor(saturationLoad, durationS)
  const { load: _load, ...rest } = flood
  return {
    ...rest,
    requests: flood.load.requests,
    seconds: Math.max(g.seconds, a.seconds),
    rps: g.rps + a.rps,
    p50Ms: g.p50Ms,
    p99Ms: g.p99Ms,
    non2xx: g.non2xx + a.non2xx,
    errors: g.errors + a.errors,
    timeouts: g.timeouts + a.timeouts,
    statusCodes: mergeCounts(g.statusCodes, a.statusCodes),
    // Flat, so that every field can be summarised over rounds like the main figures.
    flood: {
      goodAloneRps: alone.load.rps,
      goodRps: g.rps,
      goodThroughputKept: g.rps / alone.load.rps,
      goodAloneP50Ms: alone.load.p50Ms,
      goodP50Ms: g.p50Ms,
      goodAloneP99Ms: alone.load.p99Ms,
      goodP99Ms: g.p99Ms,
      goodNon2xx: g.non2xx,
      goodAloneCpuPerReq: alone.cpuPerReq,
      abusiveRps: a.rps,
      abusiveShare: a.requests / (g.requests + a.requests),
      abusiveRejected: rejected,
      abusiveAdmitted: a.requests - a.non2xx,
      abusiveP50Ms: a.p50Ms,
      abusiveP99Ms: a.p99Ms,
      rejectionCpuPerReq: rejectionCpu,
      rejectedWithoutRedisShare: rejectedWithoutRedis,
      saturationRps: saturated.load.rps,
      saturationRejectedShare: (saturated.load.statusCodes['429'] ?? 0) / (saturated.load.requests || 1),
      saturationCpuPerReq: saturated.cpuPerReq,
      saturationRedisCallsPerReq: saturated.redisCallsPerReq,
      floorRps: floor.load.rps,
      floorCpuPerReq: floor.cpuPerReq,
      saturationToFloor: saturated.cpuPerReq / floor.cpuPerReq
    }
  }
}

/**
 * Node's floor for a rejection: bench/floor-429.js (node:http answering the gateway's 429, nothing
 * else) under `load` pointed at it, CPU per request of its process.
 * @param {{ url: string, connections: number, durationS: number, requests: ReturnType<typeof clientRequests> }} load
 * @param {number} durationS
 */
async function measureRejectionFloor (load, durationS) {
  const port = await freePort()
  const child = await startProcess('floor-429', process.execPath, [join(BENCH, 'floor-429.js'), String(port)], {
    contender: true,
    ready: () => answers200(`http://127.0.0.1:${port}/ready`)
  })
  try {
    return await measured({ pid: child.pid, upstreamPid: child.pid, redisPid: null, redis: null, adminUrl: null },
      () => runLoad({ ...load, url: `http://127.0.0.1:${port}`, durationS }))
  } finally {
    await stopProcess(child)
  }
}

/**
 * Share of limiter decisions taken by the fallback store because Redis failed or was slow.
 * @param {Record<string, number> | undefined} decisions  by "level:result"
 */
function fallbackShare (decisions) {
  if (!decisions) return 0
  let all = 0
  let fallback = 0
  for (const [k, n] of Object.entries(decisions)) {
    if (k.startsWith('local:')) continue
    all += n
    if (k.startsWith('fallback:')) fallback += n
  }
  return all ? fallback / all : 0
}

/** @param {Record<string, number>[]} maps */
function mergeCounts (...maps) {
  /** @type {Record<string, number>} */
  const out = {}
  for (const m of maps) for (const [k, v] of Object.entries(m)) out[k] = (out[k] ?? 0) + v
  return out
}

// --- summaries ----------------------------------------------------------------------------

const SUMMARY_FIELDS = ['rps', 'p50Ms', 'p99Ms', 'cpuPerReq', 'cpuCorePct', 'upstreamCpuPerReq', 'redisCpuPerReq', 'totalServerCpuPerReq',
  'loadgenCpuPerReq', 'loadgenCorePct', 'redisCallsPerReq', 'redisScriptCallsPerReq', 'redisCommandsInScriptsPerReq', 'peakRssMb', 'non2xx', 'errors', 'gatewayRedisErrors', 'gatewayFallbackShare', 'gatewayGcPauseUsPerReq']
/** @param {Contender} c */
function summarize (c) {
  /** @type {Record<string, import('./lib/summary.js').Spread | null>} */
  const s = {}
  for (const field of SUMMARY_FIELDS) s[field] = spread(c.runs.map((r) => Number(r[field])))
  const flood = /** @type {Record<string, number> | undefined} */ (c.runs[0]?.flood)
  if (flood) {
    for (const field of Object.keys(flood)) {
      s[`flood.${field}`] = spread(c.runs.map((r) => /** @type {Record<string, number>} */ (r.flood)[field] ?? NaN))
    }
  }
  return s
}

function ratios () {
  return RATIOS.map(({ name, num, den }) => {
    const a = byId(num)
    const b = byId(den)
    if (a.skipped || b.skipped || a.runs.length === 0 || b.runs.length === 0) {
      return { name, num, den, skipped: a.skipped ? `${a.id}: ${a.skipped}` : `${b.id}: ${b.skipped ?? 'no runs'}` }
    }
    const perRound = a.runs.map((ra) => {
      const rb = /** @type {Record<string, unknown>} */ (b.runs.find((x) => x.round === ra.round))
      return {
        round: ra.round,
        cpuPerReq: Number(ra.cpuPerReq) / Number(rb.cpuPerReq),
        totalServerCpuPerReq: Number(ra.totalServerCpuPerReq) / Number(rb.totalServerCpuPerReq),
        rps: Number(ra.rps) / Number(rb.rps),
        p99Ms: Number(ra.p99Ms) / Number(rb.p99Ms),
        positionsApart: Math.abs(Number(ra.position) - Number(rb.position))
      }
    })
    return {
      name,
      num,
      den,
      cpuPerReq: spread(perRound.map((r) => r.cpuPerReq)),
      totalServerCpuPerReq: spread(perRound.map((r) => r.totalServerCpuPerReq)),
      rps: spread(perRound.map((r) => r.rps)),
      p99Ms: spread(perRound.map((r) => r.p99Ms)),
      positionsApart: perRound[0]?.positionsApart,
      perRound
    }
  })
}

function differences () {
  return DIFFERENCES.map(({ name, num, den }) => {
    const a = byId(num)
    const b = byId(den)
    if (a.skipped || b.skipped || a.runs.length === 0 || b.runs.length === 0) return { name, num, den, skipped: a.skipped ?? b.skipped ?? 'no runs' }
    const perRound = a.runs.map((ra) => Number(ra.cpuPerReq) - Number(/** @type {Record<string, unknown>} */ (b.runs.find((x) => x.round === ra.round)).cpuPerReq))
    return { name, num, den, cpuPerReq: spread(perRound), perRound }
  })
}

function machineInfo () {
  /** @param {string} cmd @param {string[]} args */
  const tryRun = (cmd, args) => {
    try { return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim() } catch { return null }
  }
  /** @param {string} name */
  const pkgVersion = (name) => {
    try { return JSON.parse(readFileSync(join(ROOT, 'node_modules', name, 'package.json'), 'utf8')).version } catch { return null }
  }
  return {
    cpuModel: cpus()[0]?.model ?? 'unknown',
    cpuCount: cpus().length,
    totalMemMb: Math.round(totalmem() / 2 ** 20),
    kernel: release(),
    node: process.version,
    nginx: nginxVersion(),
    redis: tryRun('redis-server', ['--version']),
    autocannon: pkgVersion('autocannon'),
    undici: pkgVersion('undici'),
    ioredis: pkgVersion('ioredis'),
    gitCommit: tryRun('git', ['-C', ROOT, 'rev-parse', '--short', 'HEAD']),
    clockTicks: CLOCK_TICKS,
    loadavgAtStart: loadavg()
  }
}

function today () {
  const d = new Date()
  return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, '0')}-${String(d.getDate()).padStart(2, '0')}`
}

// --- main ---------------------------------------------------------------------------------

async function main () {
  const startedAt = new Date().toISOString()
  const machine = machineInfo()
  const dir = mkdtempSync(join(tmpdir(), 'gateway-bench-'))
  const named = (/** @type {Contender} */ c) => settings.only.includes(c.id) || settings.only.includes(c.letter)
  const wanted = (/** @type {Contender} */ c) => named(c) || (settings.only.length === 0 && c.optIn !== true)
  for (const c of contenders) if (!wanted(c)) c.skipped = 'not selected (--only)'

  // A budget for the whole run, so that nothing can keep the machine busy indefinitely.
  const perRound = contenders.filter((c) => !c.skipped).length + 3 // the flood is four loads
  const budgetS = 2 * (perRound * (settings.warmupS + settings.rounds * settings.durationS + 3 * (settings.rounds + 1))) + 120
  const budget = setTimeout(() => {
    console.error(`bench: over its ${budgetS} s budget, stopping`)
    stopAll().finally(() => process.exit(2))
  }, budgetS * 1000)
  budget.unref()

  if (settings.pin) {
    const pinned = pinProcesses()
    machine.placement = pinned.placement ?? `not pinned: ${pinned.why}`
  } else {
    machine.placement = 'not pinned (--pin pins them)'
  }
  console.log(`bench: ${describePlacement(machine.placement)}`)
  console.log(`bench: ${settings.rounds} rounds x ${settings.durationS} s, warm-up ${settings.warmupS} s, ${settings.connections} connections, on ${machine.cpuCount} x ${machine.cpuModel}, node ${machine.node}`)

  const upstreamPort = await freePort()
  const upstream = await startProcess('upstream', process.execPath, [join(BENCH, 'upstream.js'), String(upstreamPort)], {
    ready: () => answers200(`http://127.0.0.1:${upstreamPort}/`)
  })
  const upstreamOrigin = `http://127.0.0.1:${upstreamPort}`

  const cli = gatewayCli()
  if (!cli.ok) for (const c of contenders) if (c.config && !c.skipped) c.skipped = `gateway not available: ${cli.why}`

  /** @type {Awaited<ReturnType<typeof startRedis>> | null} */
  let redis = null
  if (contenders.some((c) => !c.skipped && (c.config || c.needsRedis))) {
    try {
      redis = await startRedis(dir)
    } catch (err) {
      for (const c of contenders) if (c.needsRedis && !c.skipped) c.skipped = `redis-server failed: ${/** @type {Error} */ (err).message.split('\n')[0]}`
    }
  }

  /** @type {Map<string, number>} */
  const pids = new Map()
  for (const c of contenders) {
    if (c.skipped) continue
    try {
      if (c.id === 'direct') {
        c.url = upstreamOrigin
        pids.set(c.id, upstream.pid)
      } else if (c.id === 'bare' || c.id === 'bare-duties') {
        const port = await freePort()
        const child = await startProcess(c.id === 'bare' ? 'bare-proxy' : c.id, process.execPath, [join(BENCH, `${c.id === 'bare' ? 'bare-proxy' : c.id}.js`), String(port), upstreamOrigin], {
          contender: true,
          ready: () => answers200(`http://127.0.0.1:${port}/`)
        })
        c.url = `http://127.0.0.1:${port}`
        pids.set(c.id, child.pid)
      } else if (c.id === 'fastify' || c.id === 'fastify-rl') {
        if (!existsSync(join(PEER_DIR, 'node_modules', 'fastify'))) { c.skipped = 'bench/peer not installed (npm ci --prefix bench/peer)'; continue }
        if (c.id === 'fastify-rl' && !redis) { c.skipped = 'no redis-server'; continue }
        const port = await freePort()
        const args = [join(PEER_DIR, 'fastify-proxy.js'), String(port), upstreamOrigin]
        if (c.id === 'fastify-rl') args.push(/** @type {string} */ (redis?.url))
        const child = await startProcess(c.id, process.execPath, args, { cwd: PEER_DIR, contender: true, ready: () => answers200(`http://127.0.0.1:${port}/`) })
        c.url = `http://127.0.0.1:${port}`
        pids.set(c.id, child.pid)
      } else if (c.id === 'nginx') {
        if (!machine.nginx) { c.skipped = 'nginx not on PATH'; continue }
        const n = await startNginx(join(dir, 'nginx'), upstreamPort)
        c.url = `http://127.0.0.1:${n.port}`
        pids.set(c.id, n.child.pid)
      } else {
        const g = await startGateway(c, { dir, upstreamOrigin, redisUrl: redis?.url ?? null, logFlag: cli.logFlag })
        c.url = `http://127.0.0.1:${g.port}`
        c.adminUrl = g.adminUrl
        pids.set(c.id, g.child.pid)
      }
      const smokeHeaders = c.id === 'flood' ? { 'x-user-id': 'good-0', 'x-forwarded-for': '10.1.0.0' } : { 'x-user-id': 'user-0' }
      await smokeTest(c.url, smokeHeaders)
    } catch (err) {
      c.skipped = `failed to start: ${/** @type {Error} */ (err).message}`
    }
  }
  for (const c of contenders) if (c.skipped && c.skipped !== 'not selected (--only)') console.log(`  skipped (${c.letter}) ${c.id}: ${c.skipped.split('\n').slice(0, 6).join('\n    ')}`)

  const order = ROUND_ORDER.map(byId).filter((c) => !c.skipped)
  /** @param {Contender} c @returns {Probes} */
  const probes = (c) => ({
    pid: /** @type {number} */ (pids.get(c.id)),
    upstreamPid: upstream.pid,
    redisPid: redis?.child.pid ?? null,
    redis: redis?.client ?? null,
    adminUrl: c.adminUrl ?? null
  })

  /** @type {Array<Record<string, unknown>>} */
  const warmup = []
  if (settings.warmupS > 0) {
    console.log(`warm-up round (${settings.warmupS} s each, discarded)`)
    for (const c of order) {
      const r = await measureContender(c, probes(c), settings.warmupS)
      warmup.push({ id: c.id, rps: r.rps, non2xx: r.non2xx, errors: r.errors })
      await sleep(settings.pauseMs)
    }
  }
  for (let round = 1; round <= settings.rounds; round++) {
    const thisRound = round % 2 === 0 ? [...order].reverse() : order
    console.log(`round ${round}/${settings.rounds}: ${thisRound.map((c) => c.letter).join(' ')}`)
    for (const [position, c] of thisRound.entries()) {
      const r = await measureContender(c, probes(c), settings.durationS)
      c.runs.push({ round, position, ...r })
      console.log(`  (${c.letter}) ${c.id.padEnd(9)} ${Math.round(r.rps)} req/s  ${r.cpuPerReq.toFixed(1)} µs CPU/req  p99 ${fmt(r.p99Ms)} ms${Number.isFinite(r.gatewayGcPauseUsPerReq) ? `  GC ${fmt(r.gatewayGcPauseUsPerReq)} µs/req` : ''}${r.non2xx ? `  non-2xx ${r.non2xx}` : ''}${r.errors ? `  errors ${r.errors}` : ''}${r.gatewayRedisErrors ? `  gateway Redis errors ${r.gatewayRedisErrors}` : ''}`)
      await sleep(settings.pauseMs)
    }
  }

  machine.loadavgAtEnd = loadavg()
  const report = {
    date: today(),
    startedAt,
    finishedAt: new Date().toISOString(),
    machine,
    settings: { ...settings, order: ROUND_ORDER, path: PATH },
    contenders: contenders.map((c) => ({
      id: c.id, letter: c.letter, label: c.label, config: c.config ?? null, skipped: c.skipped, notes: c.notes,
      summary: c.runs.length ? summarize(c) : null,
      runs: c.runs
    })),
    ratios: ratios(),
    differences: differences(),
    warmup
  }
  printReport(report)
  report.concurrency = concurrencyFigures(dir)
  mkdirSync(settings.outDir, { recursive: true })
  const base = join(settings.outDir, report.date)
  writeFileSync(`${base}.json`, JSON.stringify(report, null, 2) + '\n')
  writeFileSync(`${base}.svg`, renderSvg(report))
  console.log(`\nwrote ${base}.json and ${base}.svg`)

  await redis?.client.quit()
  await stopAll()
  rmSync(dir, { recursive: true, force: true })
}

/**
 * Issue 10's figure: the extra CPU per request of one concurrency limit, from bench/concurrency.js
 * (its own rounds, plans A and B paired within each round; its output is shown as it runs).
 * @param {string} dir
 */
function concurrencyFigures (dir) {
  if (settings.only.length > 0 && !settings.only.includes('concurrency')) return { skipped: 'not selected (--only)' }
  const file = join(dir, 'concurrency.json')
  const args = ['--rounds', String(Math.max(3, settings.rounds)), '--seconds', String(Math.min(5, settings.durationS)), '--json', file]
  console.log(`
concurrency limit: node bench/concurrency.js ${args.slice(0, 4).join(' ')}`)
  try {
    // its own processes, on every CPU as before: the placement of --pin is for the contenders
    execFileSync(...placed('all', process.execPath, [join(BENCH, 'concurrency.js'), ...args]), { stdio: 'inherit', timeout: 15 * 60_000 })
  } catch (err) {
    console.log(`  concurrency bench failed: ${/** @type {Error} */ (err).message}`)
    return { skipped: `failed: ${/** @type {Error} */ (err).message}` }
  }
  const figures = JSON.parse(readFileSync(file, 'utf8'))
  const show = (/** @type {any} */ s) => s ? `${fmt(s.median)} [${fmt(s.min)}-${fmt(s.max)}]` : '-'
  console.log(`concurrency limit, extra CPU per request (B - A, median [range] of rounds; target <= 5 µs): Redis path ${show(figures.redisClosed?.extraClientCpuUs)} µs closed loop, ${show(figures.redis?.extraClientCpuUs)} µs at a fixed rate; in-process ${show(figures.memoryClosed?.extraClientCpuUs)} µs closed loop, ${show(figures.memory?.extraClientCpuUs)} µs at a fixed rate, ${show(figures.tightLoop?.extra)} µs tight loop`)
  return figures
}

process.on('exit', killAllSync)
for (const sig of /** @type {const} */ (['SIGINT', 'SIGTERM'])) {
  process.on(sig, () => { stopAll().finally(() => process.exit(130)) })
}
main().catch(async (err) => {
  console.error(err)
  await stopAll()
  process.exit(1)
})
