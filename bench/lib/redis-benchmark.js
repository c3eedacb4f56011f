// The Redis ceiling for a limiter script: capture the exact command the store sends (via
// MONITOR), then have redis-benchmark send that same command as fast as Redis will take it.
import { spawn } from 'node:child_process'

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
      if (seen === null && /^(evalsha|eval|fcall|fcall_ro)$/i.test(args[0] ?? '')) seen = args
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
      const cells = row ? [...row.matchAll(/"([^"]*)"/g)].map((m) => m[1]) : []
      if (code !== 0 || cells.length < 7) return reject(new Error(`redis-benchmark exited ${code}: ${err || out}`))
      resolve({ rps: Number(cells[1]), p50Ms: Number(cells[4]), p99Ms: Number(cells[6]), argv })
    })
  })
}
