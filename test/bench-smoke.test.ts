// The benchmarks are code too: bench/concurrency.js drives the gateway's own limiter through
// dist/, and once crashed for weeks after the runtime assembler changed the plan compiler's
// options (it built plans from a raw config). A short run in the suite keeps it working; the
// figures themselves come from `npm run bench` on a quiet machine, never from a test.
import t from 'tap'
import { execFile } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { tempDir } from './helpers/teardown.js'

const run = promisify(execFile)

t.test('bench/concurrency.js runs and writes every figure npm run bench reads', async t => {
  const out = join(tempDir(t, 'bench-smoke'), 'concurrency.json')
  await run(process.execPath, ['bench/concurrency.js', '--rounds', '1', '--seconds', '0.4', '--rate', '500', '--closed', '20', '--closed-rounds', '1', '--closed-seconds', '0.3', '--json', out], { timeout: 120_000 })
  const figures = JSON.parse(readFileSync(out, 'utf8')) as Record<string, Record<string, Record<string, { median: number }>>>
  // the open loop (a fixed offered rate) and the closed loop (saturation), on Redis and in process
  for (const kind of ['redis', 'memory', 'redisClosed', 'memoryClosed']) {
    for (const plan of ['A', 'B']) {
      const served = figures[kind]?.[plan]?.reqPerSecond?.median ?? 0
      t.ok(served > 100, `${kind} ${plan}: requests were served (${served}/s)`)
    }
    t.ok(Number.isFinite(figures[kind]?.extraClientCpuUs?.median), `${kind}: the extra CPU of a concurrency limit is a number`)
  }
  // B takes a lease per request and gives it back: its Redis calls are counted
  t.ok((figures.redis?.B?.redisCalls?.median ?? 0) > 0, 'B made Redis calls')
})

t.test('bench/limit.js runs every store scenario and writes its results file', async t => {
  const dir = tempDir(t, 'bench-smoke-limit')
  const { stdout } = await run(process.execPath, ['bench/limit.js', '--seconds', '0.2', '--only', 'redis,memory', '--out-dir', dir], { timeout: 120_000 })
  t.match(stdout, /Redis store, 200 decisions in flight/)
  const file = readdirSync(dir).find((f) => f.endsWith('-limit.json'))
  t.ok(file !== undefined, 'a results file was written')
  const results = JSON.parse(readFileSync(join(dir, file as string), 'utf8')) as Record<string, unknown>
  t.ok(Object.keys(results).length > 0, 'with figures in it')
})

t.test('bench/telemetry.js runs and counts every decision it makes', async t => {
  const { stdout } = await run(process.execPath, ['bench/telemetry.js'], { timeout: 120_000, env: { ...process.env, TELEMETRY_BENCH_REQUESTS: '2000', TELEMETRY_BENCH_ROUNDS: '1' } })
  const figures = JSON.parse(stdout.trim()) as { requests: number, usPerRequest: { median: number }, ipDecisionsCounted: number }
  t.equal(figures.requests, 2000)
  t.ok(Number.isFinite(figures.usPerRequest.median) && figures.usPerRequest.median > 0, `a time per request (${figures.usPerRequest.median} µs)`)
  t.ok(figures.ipDecisionsCounted >= 2000, `the ip decisions reached the metrics (${figures.ipDecisionsCounted})`)
})
