// npm run bench:log: CPU per access-log line of the gateway's logger (dist/log.js), to a pipe
// that is drained, as stdout is in production. CPU is the whole process's (process.cpuUsage:
// the main thread and libuv's write threads), per line, against the same loop with logging off.
// Compares the access line as the gateway writes it (createAccessLog: serialized by hand into the
// bounded sink) with the same record through pino on the same sink, and with pino's plain async
// destination and the wildcard redaction the gateway used before (issue 13).
import { pino } from 'pino'
import { spawn } from 'node:child_process'
import { createAccessLog, createLogger, createLogDestination } from '../dist/log.js'

const LINES = Number(process.env.LOG_BENCH_LINES ?? 300_000)
const ROUNDS = Number(process.env.LOG_BENCH_ROUNDS ?? 3)

// a reader process drains the pipe (cat > /dev/null), like a log shipper reading stdout
const reader = spawn('sh', ['-c', 'cat > /dev/null'], { stdio: ['pipe', 'ignore', 'inherit'] })
const fd = reader.stdin._handle.fd

// the record the gateway logs for a forwarded request (src/pipeline.ts)
const line = (i) => ({ requestId: `3f1c2a8e-8f1d-4a4e-9c55-${String(i).padStart(12, '0')}`, traceId: undefined, ip: '127.0.0.1', user: undefined, method: 'GET', host: '127.0.0.1:8080', path: '/api/hello', route: 'api', target: 'http://127.0.0.1:3000', status: 200, sentStatus: undefined, durationMs: 1.234, bytesIn: 0, bytesOut: 101, error: undefined, outcome: undefined, limit: undefined, userAgent: 'autocannon/8' })

// each contender is a function logging one access record, as the gateway's request path does
const viaPino = (logger) => (record) => { if (logger.isLevelEnabled('info')) logger.info(record, 'request') }
const contenders = {
  off: () => createAccessLog(createLogger('warn', createLogDestination(fd))),
  'access line (the gateway now)': () => createAccessLog(createLogger('info', createLogDestination(fd))),
  'pino info, same sink': () => viaPino(createLogger('info', createLogDestination(fd))),
  'pino async, wildcard redact (before)': () => viaPino(pino({ level: 'info', base: { pid: process.pid }, timestamp: pino.stdTimeFunctions.isoTime, redact: { paths: ['*.authorization', '*.password', '*.secret', '*["x-api-key"]', 'headers.cookie'], censor: '[redacted]' } }, pino.destination({ dest: fd, sync: false })))
}

async function measure (make) {
  const log = make()
  for (let i = 0; i < 10_000; i++) log(line(i))
  await new Promise(resolve => setTimeout(resolve, 200))
  const before = process.cpuUsage()
  for (let i = 0; i < LINES; i++) {
    log(line(i))
    // yield now and then so the async writes can run, as a server's event loop would
    if (i % 500 === 0) await new Promise(resolve => setImmediate(resolve))
  }
  await new Promise(resolve => setTimeout(resolve, 300))
  const used = process.cpuUsage(before)
  return (used.user + used.system) / LINES
}

const results = {}
for (let r = 0; r < ROUNDS; r++) {
  for (const [name, make] of Object.entries(r % 2 === 0 ? contenders : Object.fromEntries(Object.entries(contenders).reverse()))) {
    (results[name] ??= []).push(await measure(make))
  }
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const off = median(results.off)
console.log(`lines per round: ${LINES}, rounds: ${ROUNDS}, CPU µs per line (median), and beyond logging off:`)
for (const [name, xs] of Object.entries(results)) {
  console.log(`  ${name.padEnd(40)} ${median(xs).toFixed(2).padStart(6)} µs   +${(median(xs) - off).toFixed(2)} µs`)
}
reader.stdin.end()
process.exit(0)
