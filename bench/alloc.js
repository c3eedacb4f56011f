// Bytes of JavaScript heap allocated per request, by V8's sampling heap profiler: like
// bench/instructions.js, a figure the machine's load does not move, for what drives the young
// generation's scavenges (their pauses are 2-4% of a request's CPU here: bench/README.md,
// thirteenth session).
//
//   node bench/alloc.js [--contenders b,c,d,e,f] [--warm 20000] [--requests 20000] [--repeat 2]
//                       [--top 12] [--dist dist] [--json FILE]
//
// Each contender runs at full speed with bench/lib/alloc-sampler.js preloaded: `--warm` requests
// (50 keep-alive connections) first, then sampling on for `--requests` requests (SIGUSR2 on and
// off). Contenders: b the bare undici proxy (bench/bare-proxy.js), c/d/e/f the gateway configs of
// `npm run bench` (e with a redis-server of its own). Prints bytes per request against the bare
// proxy's and, per contender, the `--top` allocating functions of the gateway's own code
// (dist/, its node_modules/ but undici) in bytes per request.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { answers200, freePort, killAllSync, sleep, startProcess, stopAll, stopProcess } from './lib/processes.js'
import { GATEWAY_CONFIGS, contenderCommand, countFlags, loadCounted } from './lib/contenders.js'
import { fmt, spread } from './lib/summary.js'
import { startRedis } from './lib/redis-server.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const BENCH = join(ROOT, 'bench')
const SAMPLER = join(BENCH, 'lib', 'alloc-sampler.js')

const { json, settings } = countFlags({ contenders: 'b,c,d,e,f', requests: '20000', top: '12' })
if (settings.dists.length !== 1) throw new Error('bench/alloc.js measures one build (--dist): run it once per build to compare')
const dist = /** @type {string} */ (settings.dists[0])

/**
 * One contender: warm up, sample `requests`, stop.
 * @param {string} id
 * @param {{ dir: string, upstreamOrigin: string, redisUrl: string | null }} env
 * @returns {Promise<{ perRequest: number, sites: Record<string, number> }>}
 */
async function measure (id, env) {
  const out = join(env.dir, `${id}.alloc.json`)
  rmSync(out, { force: true })
  const { port, args, ready } = await contenderCommand(id, { dist, dir: env.dir, upstreamOrigin: env.upstreamOrigin, redisUrl: env.redisUrl })
  const child = await startProcess(id, process.execPath, ['--import', SAMPLER, ...args], { env: { ...process.env, NODE_ENV: 'production', ALLOC_SAMPLER_OUT: out }, drainStdout: true, ready })
  try {
    await loadCounted(port, settings.warm)
    child.proc.kill('SIGUSR2')
    const counted = await loadCounted(port, settings.requests)
    child.proc.kill('SIGUSR2')
    /** @type {{ intervalBytes: number, samples: number, sites: Record<string, number> } | null} */
    let profile = null
    for (let i = 0; i < 100 && profile === null; i++) {
      await sleep(100)
      try { profile = JSON.parse(readFileSync(out, 'utf8')) } catch { profile = null }
    }
    if (profile === null) throw new Error(`${id}: the sampler wrote no profile\n${child.output()}`)
    const scale = profile.intervalBytes / counted
    /** @type {Record<string, number>} */
    const sites = {}
    for (const [name, n] of Object.entries(profile.sites)) sites[name] = n * scale
    return { perRequest: profile.samples * scale, sites }
  } finally {
    await stopProcess(child)
  }
}

/** The gateway's own code: its dist/ and the libraries it calls, but not node: or undici. */
const OWN = /(^|[ /])dist\/|node_modules\/(?!undici\/)/

async function main () {
  const dir = mkdtempSync(join(tmpdir(), 'gw-alloc-'))
  process.on('exit', () => { killAllSync(); rmSync(dir, { recursive: true, force: true }) })
  const upstreamPort = await freePort()
  await startProcess('upstream', process.execPath, [join(BENCH, 'upstream.js'), String(upstreamPort)], { ready: () => answers200(`http://127.0.0.1:${upstreamPort}/`) })
  const redis = settings.contenders.includes('e') ? await startRedis(dir) : null
  const env = { dir, upstreamOrigin: `http://127.0.0.1:${upstreamPort}`, redisUrl: redis?.url ?? null }
  for (const id of settings.contenders) if (id !== 'b' && !(id in GATEWAY_CONFIGS)) throw new Error(`unknown contender ${id} (b, c, d, e or f)`)
  /** @type {Map<string, { runs: number[], sites: Record<string, number>[] }>} */
  const rows = new Map(settings.contenders.map((id) => [id, { runs: [], sites: [] }]))
  console.log(`bytes allocated per request: ${settings.warm} warm-up requests, ${settings.requests} sampled, ${settings.repeat} repeats (${dist})`)
  for (let r = 0; r < settings.repeat; r++) {
    for (const id of r % 2 === 0 ? settings.contenders : [...settings.contenders].reverse()) {
      const m = await measure(id, env)
      const row = /** @type {{ runs: number[], sites: Record<string, number>[] }} */ (rows.get(id))
      row.runs.push(m.perRequest)
      row.sites.push(m.sites)
      console.log(`  ${id}: ${fmt(m.perRequest)} bytes per request`)
    }
  }
  const bare = rows.get('b')
  console.log('\ncontender | bytes per request (median [min-max]) | - bare proxy (median of paired repeats)')
  const report = [...rows].map(([id, row]) => {
    const s = spread(row.runs)
    const over = bare === undefined || id === 'b' ? null : spread(row.runs.map((x, i) => x - /** @type {number} */ (bare.runs[i])))
    console.log(`${id} | ${fmt(s?.median)} [${fmt(s?.min)}-${fmt(s?.max)}] | ${over === null ? '-' : fmt(over.median)}`)
    /** @type {Record<string, number>} */
    const mean = {}
    for (const sites of row.sites) for (const [name, b] of Object.entries(sites)) mean[name] = (mean[name] ?? 0) + b / row.sites.length
    const top = Object.entries(mean).filter(([name]) => OWN.test(name)).sort((a, b) => b[1] - a[1]).slice(0, settings.top)
    return { contender: id, runs: row.runs, perRequest: s, overBare: over, top: top.map(([name, b]) => ({ site: name, bytes: Math.round(b) })) }
  })
  for (const r of report) {
    if (r.top.length === 0) continue
    console.log(`\n${r.contender}: the gateway's own allocating functions, bytes per request (mean of repeats)`)
    for (const t of r.top) console.log(`  ${String(t.bytes).padStart(6)}  ${t.site}`)
  }
  if (json !== undefined) writeFileSync(json, JSON.stringify({ date: new Date().toISOString(), settings, report }, null, 2))
  redis?.client.disconnect()
  await stopAll()
}

main().catch(async (err) => {
  console.error(err)
  await stopAll()
  process.exitCode = 1
})
