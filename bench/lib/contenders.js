// How bench/instructions.js and bench/alloc.js start one contender: the bare proxy (b) or the
// gateway under one of `npm run bench`'s configs, rendered with this run's ports, run from a given
// build's CLI (`dist`), not bin/gateway's (which always loads ./dist).
import { writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { answers200, freePort } from './processes.js'
import { renderConfig } from './configs.js'
import { runLoad } from './load.js'

const BENCH = fileURLToPath(new URL('..', import.meta.url))
const ROOT = join(BENCH, '..')

/**
 * The flags of both scripts: `--contenders`, `--warm`, `--requests`, `--repeat`, `--dist` (builds,
 * comma-separated) and `--json`, with a script's own defaults; `top` only where a script lists sites,
 * `scenario` only where it counts redis-server (a scenario of bench/lib/limit-stores.js).
 * @param {{ contenders: string, requests: string, top?: string }} defaults
 */
export function countFlags (defaults) {
  const { values: flags } = parseArgs({
    options: {
      contenders: { type: 'string', default: defaults.contenders },
      warm: { type: 'string', default: '20000' },
      requests: { type: 'string', default: defaults.requests },
      repeat: { type: 'string', default: '2' },
      top: { type: 'string', default: defaults.top ?? '0' },
      dist: { type: 'string', default: 'dist' },
      'main-thread': { type: 'boolean', default: false },
      keep: { type: 'boolean', default: false },
      'perf-map': { type: 'boolean', default: false },
      scenario: { type: 'string', default: 'four dimensions (e)' },
      json: { type: 'string' }
    }
  })
  return {
    json: flags.json,
    settings: {
      contenders: (flags.contenders ?? '').split(',').filter(Boolean),
      warm: Number(flags.warm),
      requests: Number(flags.requests),
      repeat: Number(flags.repeat),
      top: Number(flags.top),
      dists: (flags.dist ?? 'dist').split(',').filter(Boolean).map((d) => resolve(ROOT, d)),
      mainThread: flags['main-thread'] === true,
      keep: flags.keep === true,
      perfMap: flags['perf-map'] === true,
      scenario: flags.scenario ?? 'four dimensions (e)'
    }
  }
}

/** The gateway contenders of `npm run bench` these scripts can start. */
/** @type {Record<string, string>} */
export const GATEWAY_CONFIGS = { c: 'gateway-no-limits.yaml', d: 'gateway-local.yaml', e: 'gateway-shared-redis.yaml', f: 'gateway-shared-memory.yaml' }

/**
 * Arguments for `node` (after any flags of the caller's) that start contender `id`, its port, and
 * when it is ready. `logOn` turns the config's access log on (`log: { level: warn }` -> info);
 * `redisTimeout` replaces the config's bound on a Redis call (`timeout: 50ms`).
 * @param {string} id  b, u (bare + duties), or a key of GATEWAY_CONFIGS
 * @param {{ dist: string, dir: string, upstreamOrigin: string, redisUrl?: string | null, config?: string, logOn?: boolean, redisTimeout?: string }} env
 * @returns {Promise<{ port: number, args: string[], ready: () => Promise<boolean> }>}
 */
export async function contenderCommand (id, env) {
  const port = await freePort()
  if (id === 'b') return { port, args: [join(BENCH, 'bare-proxy.js'), String(port), env.upstreamOrigin], ready: () => answers200(`http://127.0.0.1:${port}/`) }
  // the bare proxy plus the gateway's per-request duties (contender (l) of bench/run.js)
  if (id === 'u') return { port, args: [join(BENCH, 'bare-duties.js'), String(port), env.upstreamOrigin], ready: () => answers200(`http://127.0.0.1:${port}/`) }
  const config = env.config ?? GATEWAY_CONFIGS[id]
  if (config === undefined) throw new Error(`unknown contender ${id}`)
  const adminPort = await freePort()
  const text = renderConfig(config, { GATEWAY_PORT: String(port), ADMIN_PORT: String(adminPort), UPSTREAM_ORIGIN: env.upstreamOrigin, ...(env.redisUrl == null ? {} : { REDIS_URL: env.redisUrl }) })
  const logged = env.logOn === true ? text.replace(/^log: \{ level: warn \}$/m, 'log: { level: info }') : text
  if (env.logOn === true && logged === text) throw new Error(`${config}: no "log: { level: warn }" line to turn the access log on`)
  const timed = env.redisTimeout === undefined ? logged : logged.replace(/^(redis: \{.*)timeout: 50ms/m, `$1timeout: ${env.redisTimeout}`)
  if (env.redisTimeout !== undefined && timed === logged) throw new Error(`${config}: no "redis: { ... timeout: 50ms" line to replace`)
  const file = join(env.dir, `${id}.yaml`)
  writeFileSync(file, timed)
  const runner = `const { main } = await import(${JSON.stringify(join(env.dist, 'cli.js'))}); process.exitCode = await main(process.argv.slice(1))`
  return { port, args: ['--input-type=module', '-e', runner, 'start', '-c', file], ready: () => answers200(`http://127.0.0.1:${adminPort}/readyz`) }
}

/**
 * `n` requests over 50 keep-alive connections (autocannon, as in `npm run bench`); throws unless
 * every one was answered 200. Returns the responses counted.
 * @param {number} port
 * @param {number} n
 */
export async function loadCounted (port, n) {
  // Under callgrind a contender runs about 50 times slower, and slower again on a busy machine: a
  // response may take longer than autocannon's 10 s, which counted as a timeout and ended the run.
  const r = await runLoad({ url: `http://127.0.0.1:${port}`, connections: 50, durationS: 900, amount: n, timeoutS: 120, requests: [{ path: '/api/items/42', headers: { 'x-user-id': 'user-1' } }] })
  if (r.non2xx + r.errors + r.timeouts > 0) throw new Error(`port ${port}: ${r.non2xx} non-2xx, ${r.errors} errors, ${r.timeouts} timeouts of ${r.requests}`)
  return r.requests
}
