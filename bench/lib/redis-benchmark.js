// The Redis ceiling for a limiter script: capture the exact command the store sends (via
// MONITOR), then have redis-benchmark send that same command as fast as Redis will take it.
import { spawn } from 'node:child_process'

/**
 * MONITOR prints each argument the way Redis's sdscatrepr does (newlines as \n, quotes as \", other bytes as \xHH), and
 * ioredis hands it over as printed: undo that. Without this a script's source came back as one
 * long comment line (its newlines written as backslash-n), and the ceiling ran an empty script.
 * @param {string} arg
 */
export function unrepr (arg) {
  if (!arg.includes('\\')) return arg
  /** @type {number[]} */
  const bytes = []
  const named = /** @type {Record<string, number>} */ ({ n: 10, r: 13, t: 9, a: 7, b: 8, '"': 34, '\\': 92 })
  for (let i = 0; i < arg.length; i++) {
    const c = arg[i]
    if (c === '\\' && arg[i + 1] === 'x' && /^[0-9a-f]{2}$/i.test(arg.slice(i + 2, i + 4))) {
      bytes.push(parseInt(arg.slice(i + 2, i + 4), 16))
      i += 3
    } else if (c === '\\' && (arg[i + 1] ?? '') in named) {
      bytes.push(/** @type {number} */ (named[/** @type {string} */ (arg[i + 1])]))
      i += 1
    } else {
      bytes.push(...Buffer.from(/** @type {string} */ (c), 'utf8'))
    }
  }
  return Buffer.from(bytes).toString('utf8')
}

/**
 * Run `send()` while a MONITOR connection watches, and return the first script call seen
 * (EVALSHA, EVAL, FCALL or FCALL_RO) with all its arguments.
 * @param {import('ioredis').Redis} client  any connection to the server; monitor() opens its own
 * @param {() => Promise<unknown>} send
 * @returns {Promise<string[] | null>}
 */
export async function captureScriptCall (client, send) {
  const monitor = await client.monitor()
  try {
    /** @type {string[] | null} */
    let seen = null
    monitor.on('monitor', (/** @type {string} */ _time, /** @type {string[]} */ args) => {
      if (seen === null && /^(evalsha|eval|fcall|fcall_ro)$/i.test(args[0] ?? '')) seen = args.map(unrepr)
    })
    // MONITOR only reports commands issued after it is active; give the reply a moment.
    await new Promise((resolve) => setTimeout(resolve, 100))
    await send()
    for (let i = 0; i < 20 && seen === null; i++) await new Promise((resolve) => setTimeout(resolve, 50))
    return seen
  } finally {
    monitor.disconnect()
  }
}

/**
 * redis-benchmark sends one fixed command; `__rand_int__` in an argument is replaced by a random
 * number below `keyspace` on each call, which spreads the keys like distinct clients would.
 * @param {{ port: number, command: string[], requests: number, clients?: number, pipeline?: number, keyspace?: number }} opts
 * @returns {Promise<{ rps: number, p50Ms: number, p99Ms: number, argv: string[] }>}
 */
export function runRedisBenchmark (opts) {
  // Options must come before the command: everything after it is sent as arguments.
  const argv = ['-h', '127.0.0.1', '-p', String(opts.port), '-n', String(opts.requests), '-c', String(opts.clients ?? 50),
    '-P', String(opts.pipeline ?? 16), '-r', String(opts.keyspace ?? 1000), '--csv', ...opts.command]
  return new Promise((resolve, reject) => {
    const proc = spawn('redis-benchmark', argv, { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    proc.stdout.on('data', (d) => { out += d })
    proc.stderr.on('data', (d) => { err += d })
    const timer = setTimeout(() => proc.kill('SIGTERM'), 120_000)
    proc.on('error', reject)
    proc.on('exit', (code) => {
      clearTimeout(timer)
      // CSV: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
      const row = out.trim().split('\n').find((l) => !l.startsWith('"test"'))
      // the figures are the row's last seven cells: the first, the command's text, may hold
      // quotes and commas of its own (a script's source)
      const cells = row ? [...row.matchAll(/"([^"]*)"/g)].map((m) => m[1]).slice(-7) : []
      const figures = { rps: Number(cells[0]), p50Ms: Number(cells[3]), p99Ms: Number(cells[5]), argv }
      if (code !== 0 || cells.length < 7 || !Number.isFinite(figures.rps)) return reject(new Error(`redis-benchmark exited ${code}: ${(err || out).slice(0, 300)}`))
      resolve(figures)
    })
  })
}
