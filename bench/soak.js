// Soak and workers curve for the fully limited gateway (contender (e): local + global/user/ip/api
// on Redis):
//   - soak: full load for --soak seconds (default 60), RSS of the gateway sampled every 5 s; the
//     target is RSS flat within 10% after the first sample;
//   - workers: the same load for --duration seconds against `workers: 1..--max-workers`, req/s and
//     CPU per request of the whole process tree (primary + workers).
//   node bench/soak.js [--soak 60] [--duration 10] [--max-workers 2] [--out-dir bench/results]
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs'
import { tmpdir, cpus } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { answers200, freePort, sleep, startProcess, stopAll, stopProcess } from './lib/processes.js'
import { treeCpuMicros, treeRssKb } from './lib/proc-stats.js'
import { startRedis } from './lib/redis-server.js'
import { runLoad, userRequests } from './lib/load.js'
import { renderConfig } from './lib/configs.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const PATH = '/api/items/42'
const { values: flags } = parseArgs({
  options: { soak: { type: 'string' }, duration: { type: 'string' }, 'max-workers': { type: 'string' }, 'out-dir': { type: 'string' } }
})
const soakS = Number(flags.soak ?? 60)
const durationS = Number(flags.duration ?? 10)
const maxWorkers = Number(flags['max-workers'] ?? Math.max(2, cpus().length))
const outDir = flags['out-dir'] ?? join(ROOT, 'bench', 'results')

const dir = mkdtempSync(join(tmpdir(), 'gw-soak-'))
process.on('exit', () => rmSync(dir, { recursive: true, force: true }))

/**
 * @param {number} workers
 * @param {number} upstreamPort
 * @param {string} redisUrl
 */
async function startGateway (workers, upstreamPort, redisUrl) {
  const port = await freePort()
  const adminPort = await freePort()
  const text = renderConfig('gateway-shared-redis.yaml', {
    GATEWAY_PORT: String(port), ADMIN_PORT: String(adminPort), UPSTREAM_ORIGIN: `http://127.0.0.1:${upstreamPort}`, REDIS_URL: redisUrl
  }) + `workers: ${workers}\n`
  const file = join(dir, `gw-${workers}.yaml`)
  writeFileSync(file, text)
  const child = await startProcess(`gateway workers=${workers}`, process.execPath, [join(ROOT, 'bin', 'gateway'), 'start', '-c', file, '--log-level', 'warn'], {
    cwd: ROOT, ready: () => answers200(`http://127.0.0.1:${adminPort}/readyz`), timeoutMs: 20_000
  })
  return { child, url: `http://127.0.0.1:${port}${PATH}` }
}

const upstreamPort = await freePort()
await startProcess('upstream', process.execPath, [join(ROOT, 'bench', 'upstream.js'), String(upstreamPort)], {
  ready: () => answers200(`http://127.0.0.1:${upstreamPort}/`)
})
const redis = await startRedis(dir)
const requests = userRequests(1000, PATH)

// --- soak ---
const soakGw = await startGateway(1, upstreamPort, redis.url)
await runLoad({ url: soakGw.url, connections: 50, durationS: 3, requests }) // warm-up
/** @type {Array<{ t: number, rssMb: number }>} */
const samples = []
const started = Date.now()
const sampler = setInterval(() => samples.push({ t: Math.round((Date.now() - started) / 1000), rssMb: treeRssKb(soakGw.child.pid) / 1024 }), 5000)
const soak = await runLoad({ url: soakGw.url, connections: 50, durationS: soakS, requests })
clearInterval(sampler)
await stopProcess(soakGw.child)
const rss = samples.map(s => s.rssMb)
const first = rss[0] ?? 0
const maxRss = Math.max(...rss)
const minRss = Math.min(...rss)
const growth = first > 0 ? (rss[rss.length - 1] ?? first) / first : 1
console.log(`soak ${soakS}s: ${Math.round(soak.rps)} req/s, non-2xx ${soak.non2xx}; RSS MB every 5 s: ${rss.map(r => r.toFixed(0)).join(' ')}`)
console.log(`  RSS min ${minRss.toFixed(0)} max ${maxRss.toFixed(0)} MB; last/first ${growth.toFixed(3)} (target: within 10%)`)

// --- workers curve ---
/** @type {Array<{ workers: number, rps: number, cpuUsPerReq: number }>} */
const curve = []
for (let n = 1; n <= maxWorkers; n++) {
  const gw = await startGateway(n, upstreamPort, redis.url)
  await runLoad({ url: gw.url, connections: 50, durationS: 3, requests })
  const cpu0 = treeCpuMicros(gw.child.pid)
  const r = await runLoad({ url: gw.url, connections: 50, durationS, requests })
  const cpu = treeCpuMicros(gw.child.pid) - cpu0
  curve.push({ workers: n, rps: r.rps, cpuUsPerReq: cpu / r.requests })
  console.log(`workers ${n}: ${Math.round(r.rps)} req/s, ${(cpu / r.requests).toFixed(1)} µs CPU/req (primary + workers), non-2xx ${r.non2xx}`)
  await stopProcess(gw.child)
  await sleep(500)
}

mkdirSync(outDir, { recursive: true })
const file = join(outDir, `${new Date().toISOString().slice(0, 10)}-soak.json`)
writeFileSync(file, JSON.stringify({ date: new Date().toISOString(), cores: cpus().length, soak: { seconds: soakS, rps: soak.rps, non2xx: soak.non2xx, samples, growth }, workers: curve }, null, 2) + '\n')
console.log(`wrote ${file}`)
redis.client.disconnect()
await stopAll()
