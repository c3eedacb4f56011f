// The log sink (issue 13): access lines written without pino's generic serializer must be the
// very JSON pino writes, and a stdout that stops being read costs counted lines, never unbounded
// memory, and the sink writes again once the reader is back.
import t from 'tap'
import { closeSync, constants as fsConstants, openSync, readFileSync, readSync, writeFileSync, writeSync } from 'node:fs'
import { join } from 'node:path'
import { execFile, execFileSync, spawn } from 'node:child_process'
import { once } from 'node:events'
import { createHook } from 'node:async_hooks'
import { setTimeout as sleep } from 'node:timers/promises'
import type { LogSink } from '../src/log-sink.js'
import { request } from 'undici'
import { createAccessLog, createLogDestination, createLogger, type AccessRecord } from '../src/log.js'
import { Gateway } from '../src/server.js'
import { childEnv, writeConfig } from './helpers/gateway.js'
import type { Teardown } from './helpers/teardown.js'
import { startUpstream } from './helpers/upstream.js'

const flushed = async (logger: ReturnType<typeof createLogger>): Promise<void> => {
  await new Promise<void>(resolve => { logger.flush(() => resolve()) })
}

// whole lines: a file another process (cat) is still writing may end in half a line
const parseLines = (file: string): Array<Record<string, unknown>> =>
  readFileSync(file, 'utf8').split('\n').slice(0, -1).filter(l => l !== '').map(l => JSON.parse(l) as Record<string, unknown>)

const RECORDS: AccessRecord[] = [
  { requestId: 'r-1', traceId: undefined, ip: '127.0.0.1', user: undefined, method: 'GET', host: 'a.test', path: '/x?token=[redacted]', route: 'api', target: 'http://127.0.0.1:1', status: 200, sentStatus: undefined, durationMs: 1.234, bytesIn: 0, bytesOut: 101, encoding: undefined, error: undefined, retriedAfter: undefined, outcome: undefined, limit: undefined, userAgent: 'curl/8' },
  // every field set, and the strings a hostile client controls: quotes, backslashes, control
  // characters, non-ASCII, a lone surrogate, a would-be field injection
  { requestId: 'r-2', traceId: '0af7651916cd43dd8448eb211c80319c', ip: '::1', user: 'ali"ce\\', method: 'POST', host: 'h\u0000\u001f\u007f', path: '/é/😀/\ud800', route: 'r', target: undefined, status: 429, sentStatus: 200, durationMs: 0, bytesIn: 12, bytesOut: 0, encoding: 'br', error: 'reset', retriedAfter: 'reset', outcome: 'rejected', limit: 'login.ip', userAgent: '","status":999,"x":"' },
  { requestId: 'r-3', traceId: undefined, ip: undefined, user: undefined, method: undefined, host: undefined, path: '/', route: '-', target: undefined, status: 400, sentStatus: undefined, durationMs: Number.NaN, bytesIn: 0, bytesOut: 57, encoding: undefined, error: undefined, retriedAfter: undefined, outcome: 'bad_request', limit: undefined, userAgent: undefined }
]

t.test('an access line is the JSON pino writes for the same record: same keys, same order, same values', async t => {
  const dir = t.testdir()
  const fastFile = join(dir, 'fast.log')
  const pinoFile = join(dir, 'pino.log')
  const fastFd = openSync(fastFile, 'w')
  const pinoFd = openSync(pinoFile, 'w')
  t.teardown(() => { closeSync(fastFd); closeSync(pinoFd) })
  const fastLogger = createLogger('info', createLogDestination(fastFd))
  const pinoLogger = createLogger('info', createLogDestination(pinoFd))
  const accessLog = createAccessLog(fastLogger)
  for (const r of RECORDS) {
    accessLog(r)
    pinoLogger.info(r, 'request')
  }
  await flushed(fastLogger)
  await flushed(pinoLogger)
  const fast = parseLines(fastFile)
  const viaPino = parseLines(pinoFile)
  t.equal(fast.length, RECORDS.length)
  for (let i = 0; i < RECORDS.length; i++) {
    const { time: fastTime, ...f } = fast[i] as Record<string, unknown>
    const { time: pinoTime, ...p } = viaPino[i] as Record<string, unknown>
    t.same(Object.keys(f), Object.keys(p), `record ${i}: same keys in the same order`)
    // one deliberate difference: pino writes a lone surrogate raw (it becomes U+FFFD in UTF-8),
    // the access line escapes it, so the line stays valid JSON and keeps what the client sent
    if (i === 1) {
      t.equal(f.path, RECORDS[1]?.path, 'a lone surrogate survives as an escape')
      p.path = f.path
    }
    t.strictSame(f, p, `record ${i}: same values`)
    t.ok(Math.abs(Date.parse(String(fastTime)) - Date.parse(String(pinoTime))) < 5000, `record ${i}: an ISO time`)
  }
  t.equal(fast[1]?.userAgent, '","status":999,"x":"', 'a hostile user agent stays one string value')
  t.equal(fast[1]?.status, 429)
})

t.test('each character JSON escapes, alone in a string, comes back from the access line as it went in', async t => {
  const file = join(t.testdir(), 'escapes.log')
  const fd = openSync(file, 'w')
  t.teardown(() => closeSync(fd))
  const logger = createLogger('info', createLogDestination(fd))
  const accessLog = createAccessLog(logger)
  // one class each: quote, backslash, the ends of the control range, lone surrogates of both
  // halves; then what passes unescaped: DEL, non-ASCII, a surrogate pair, plain text
  const strings = ['a"b', 'a\\b', 'a\u0000b', 'a\u001fb', 'a\ud800b', 'a\udfffb', 'a\u007fb', 'aéb', 'a😀b', 'ab']
  for (const s of strings) accessLog({ ...(RECORDS[0] as AccessRecord), userAgent: s, path: s, host: s })
  await flushed(logger)
  const lines = parseLines(file)
  t.same(lines.map(l => l.userAgent), strings, 'each string comes back whole')
  t.same(lines.map(l => l.path), strings)
  t.same(lines.map(l => l.host), strings)
})

t.test('above info, no access line is written', async t => {
  const file = join(t.testdir(), 'warn.log')
  const fd = openSync(file, 'w')
  t.teardown(() => closeSync(fd))
  const logger = createLogger('warn', createLogDestination(fd))
  createAccessLog(logger)(RECORDS[0] as AccessRecord)
  logger.warn('marker')
  await flushed(logger)
  t.same(parseLines(file).map(l => l.msg), ['marker'])
})

/**
 * A FIFO nobody reads: writes fill the kernel's pipe buffer, then block, as a stalled stdout. At
 * teardown a reader drains it, so the write blocked in libuv's thread pool can finish.
 */
function stalledPipe (t: { testdir: () => string, teardown: (fn: () => unknown) => void }): { dir: string, fifo: string, fd: number, own: (sink: LogSink) => void } {
  // t.testdir() recreates the directory on each call: called once per test
  const dir = t.testdir()
  const fifo = join(dir, 'stdout.fifo')
  execFileSync('mkfifo', [fifo])
  // read-write open: does not wait for a reader, and keeps the pipe open with nobody reading
  const fd = openSync(fifo, 'r+')
  let sink: LogSink | null = null
  t.teardown(async () => {
    const drain = spawn('sh', ['-c', `cat "${fifo}" > /dev/null`], { stdio: 'ignore' })
    sink?.end()
    closeSync(fd)
    await once(drain, 'exit')
  })
  return { dir, fifo, fd, own: s => { sink = s } }
}

t.test('a blocked stdout: the buffer stays bounded, drops are counted, and writing resumes once it is read again', async t => {
  const { dir, fifo, fd, own } = stalledPipe(t)
  const sink = createLogDestination(fd, { maxBufferBytes: 64 * 1024, batchBytes: 4096, flushMs: 10 })
  own(sink)
  const logger = createLogger('info', sink)
  const pad = 'x'.repeat(150)
  let maxPending = 0
  for (let i = 0; i < 5000; i++) {
    logger.info({ i, pad }, 'stalled')
    maxPending = Math.max(maxPending, sink.pendingBytes)
    // let the one write in flight reach the pipe and block there
    if (i % 200 === 0) await new Promise(resolve => setTimeout(resolve, 5))
  }
  // about 1 MB offered, 64 KiB in the pipe and 64 KiB in the buffer: most of it must be dropped
  t.ok(maxPending <= 64 * 1024, `pending stayed within the bound (max ${maxPending} bytes)`)
  t.ok(sink.dropped > 3000, `${sink.dropped} lines dropped and counted`)

  // a reader comes back: what was kept is delivered and new lines are written again
  const out = join(dir, 'read.log')
  const reader = spawn('sh', ['-c', `cat "${fifo}" > "${out}"`], { stdio: 'ignore' })
  t.teardown(() => { reader.kill() })
  // what was held while blocked reaches the reader first; lines offered before that are dropped
  await flushed(logger)
  const droppedWhileBlocked = sink.dropped
  for (let i = 0; i < 10; i++) logger.info({ i }, 'after')
  await flushed(logger)
  // cat writes what it read to the file; poll its content (the server's own bytes, no timing asserted)
  const deadline = Date.now() + 10_000
  let lines: Array<Record<string, unknown>> = []
  while (Date.now() < deadline) {
    lines = parseLines(out)
    if (lines.some(l => l.msg === 'after' && l.i === 9)) break
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  t.ok(lines.some(l => l.msg === 'stalled' && l.i === 0), 'the first lines, held while blocked, are delivered')
  t.same(lines.filter(l => l.msg === 'after').map(l => l.i), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 'every line after the reader came back is written, in order')
  const stalled = lines.filter(l => l.msg === 'stalled').length
  t.equal(stalled + droppedWhileBlocked, 5000, 'each line is either delivered or counted as dropped')
  t.equal(sink.dropped, droppedWhileBlocked, 'nothing dropped once the reader is back')
})

t.test('a gateway whose stdout is blocked keeps answering and reports the dropped lines in /metrics', async t => {
  const up = await startUpstream(t)
  const { fd, own } = stalledPipe(t)
  const file = writeConfig(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: all
    pathPrefix: /
    upstream: backend
`)
  const sink = createLogDestination(fd, { maxBufferBytes: 32 * 1024, batchBytes: 4096, flushMs: 10 })
  own(sink)
  const gw = await Gateway.start({ configFile: file, logger: createLogger('info', sink) })
  t.teardown(() => gw.close())
  const statuses = new Map<number, number>()
  for (let i = 0; i < 1500; i++) {
    const res = await request(`http://127.0.0.1:${gw.port}/r/${i}`)
    await res.body.text()
    statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1)
  }
  t.same([...statuses], [[200, 1500]], 'every request answered 200 while the log could not be written')
  t.ok(sink.pendingBytes <= 32 * 1024, `log buffer within its bound (${sink.pendingBytes} bytes)`)
  const metrics = await (await request(`http://127.0.0.1:${gw.adminPort}/metrics`)).body.text()
  const m = /^gateway_log_dropped_lines_total (\d+)$/m.exec(metrics)
  t.ok(m, 'the metric is exposed')
  const dropped = Number(m?.[1])
  t.ok(dropped > 500, `${dropped} dropped lines counted`)
  t.ok(dropped <= sink.dropped, 'the metric reads the sink\'s own count')
})

t.test('lines longer than a batch and lines of multi-byte characters reach the file whole, in order, byte for byte', async t => {
  const file = join(t.testdir(), 'long.log')
  const fd = openSync(file, 'w')
  t.teardown(() => closeSync(fd))
  // a batch of 1 KiB: the sink's buffer starts near 6 KiB, so the 200 KiB line must grow it
  const logger = createLogger('info', createLogDestination(fd, { batchBytes: 1024, flushMs: 10 }))
  const long = 'L'.repeat(200 * 1024)
  // 3 bytes per UTF-16 unit (U+20AC) and 4 per surrogate pair: more bytes than characters
  const wide = '€'.repeat(3000) + '😀'.repeat(1000)
  logger.info({ i: 0, s: 'short' }, 'line')
  logger.info({ i: 1, s: long }, 'line')
  for (let i = 2; i < 200; i++) logger.info({ i, s: i % 2 === 0 ? wide : `short ${i}` }, 'line')
  await flushed(logger)
  const lines = parseLines(file)
  t.same(lines.map(l => l.i), Array.from({ length: 200 }, (_, i) => i), 'every line, in order')
  t.equal(lines[1]?.s, long, 'the long line is whole')
  t.ok(lines.slice(2).every(l => l.s === (Number(l.i) % 2 === 0 ? wide : `short ${String(l.i)}`)), 'the multi-byte lines are whole')
})

t.test('the bound counts bytes: lines of 3-byte characters waiting for a write stay within it, and each is written whole or counted', async t => {
  const file = join(t.testdir(), 'wide.log')
  const fd = openSync(file, 'w')
  t.teardown(() => closeSync(fd))
  // no write starts on its own (a batch far above the bound, a timer far away): lines wait
  const sink = createLogDestination(fd, { maxBufferBytes: 16 * 1024, batchBytes: 1 << 30, flushMs: 60_000 })
  const logger = createLogger('info', sink)
  // each line about 600 UTF-16 units and 1,800 bytes: a bound counted in units would hold 3x too much
  const wide = '€'.repeat(600)
  let maxPending = 0
  for (let i = 0; i < 40; i++) {
    logger.info({ i, s: wide }, 'wide')
    maxPending = Math.max(maxPending, sink.pendingBytes)
  }
  t.ok(maxPending <= 16 * 1024, `pending stayed within the bound in bytes (max ${maxPending})`)
  t.ok(maxPending > 12 * 1024, `and came near it (${maxPending})`)
  const dropped = sink.dropped
  t.ok(dropped > 20, `${dropped} lines dropped and counted`)
  await flushed(logger)
  const lines = parseLines(file)
  t.equal(lines.length + dropped, 40, 'each line either written or counted')
  t.ok(lines.every(l => l.s === wide), 'the written lines are whole')
  t.same(lines.map(l => l.i), Array.from({ length: lines.length }, (_, i) => i), 'the first lines are kept, in order')
  sink.end()
})

/**
 * A FIFO opened non-blocking and read-write (as a pipe to a log shipper is non-blocking: writes
 * past its room fail with EAGAIN instead of waiting), filled until it is full. `filled`: the bytes
 * of '.' a reader gets first.
 */
function fullPipe (t: { testdir: () => string, teardown: (fn: () => unknown) => void }): { dir: string, fifo: string, fd: number, filled: number } {
  const dir = t.testdir()
  const fifo = join(dir, 'full.fifo')
  execFileSync('mkfifo', [fifo])
  const fd = openSync(fifo, fsConstants.O_RDWR | fsConstants.O_NONBLOCK)
  t.teardown(() => closeSync(fd))
  const block = Buffer.alloc(4096, 0x2e)
  let filled = 0
  for (;;) {
    try { filled += writeSync(fd, block) } catch { break }
  }
  return { dir, fifo, fd, filled }
}

t.test('a synchronous flush into a pipe with room for part of the batch counts every line it could not write whole', async t => {
  const { fd } = fullPipe(t)
  // room for two pages again: the flush below writes 8 KiB of its 18 and then meets a full pipe
  const freed = Buffer.alloc(8192)
  t.equal(readSync(fd, freed, 0, freed.length, null), 8192)
  const sink = createLogDestination(fd, { batchBytes: 1 << 30, flushMs: 60_000 })
  const line = 'x'.repeat(5999) + '\n'
  for (let i = 0; i < 3; i++) sink.write(line)
  sink.flushSync()
  // the first line went out whole; the second only in part and the third not at all
  t.equal(sink.dropped, 2, 'the two lines not written whole are counted as dropped')
  t.equal(sink.pendingBytes, 0, 'nothing is left waiting')
  sink.end()
})

t.test('at exit, the batch waiting for a full pipe is written once the reader takes it: no line lost uncounted', async t => {
  const { dir, fifo, fd, filled } = fullPipe(t)
  const sink = createLogDestination(fd, { batchBytes: 1024, flushMs: 60_000 })
  for (let i = 0; i < 200; i++) sink.write(JSON.stringify({ i, msg: 'held', pad: 'y'.repeat(100) }) + '\n')
  // the first batch went out, met the full pipe and waits to be written again
  await new Promise(resolve => setTimeout(resolve, 100))
  t.ok(sink.pendingBytes > 0, `${sink.pendingBytes} bytes wait`)
  // the reader comes back a little after the exit began
  const out = join(dir, 'out.log')
  const reader = spawn('sh', ['-c', `sleep 0.3; cat "${fifo}" > "${out}"`], { stdio: 'ignore' })
  t.teardown(() => { reader.kill() })
  // At exit no write runs on the thread pool (the process waited for it): called, as at exit
  // (process.once('exit') in src/log.ts), while the batch waits for its next try, a single time:
  // nothing asynchronous runs after it.
  const waitingToRetry = (): boolean => (sink as unknown as { retry: unknown }).retry !== null
  for (let i = 0; i < 1000 && !waitingToRetry(); i++) await new Promise(resolve => setImmediate(resolve))
  t.ok(waitingToRetry(), 'the batch waits to be written again')
  sink.flushSync()
  t.equal(sink.pendingBytes, 0, 'nothing left waiting')
  t.equal(sink.dropped, 0, 'nothing dropped: the reader took it within the bound')
  const deadline = Date.now() + 10_000
  let held: Array<Record<string, unknown>> = []
  while (Date.now() < deadline) {
    const text = readFileSync(out, 'utf8').slice(filled)
    held = text.split('\n').slice(0, -1).map(l => JSON.parse(l) as Record<string, unknown>)
    if (held.length >= 200) break
    await new Promise(resolve => setTimeout(resolve, 50))
  }
  t.same(held.map(l => l.i), Array.from({ length: 200 }, (_, i) => i), 'every line, in order (the batch in flight and the queue were lost before)')
  sink.end()
})

// A pipe as a child's stdout, the way Docker (a FIFO) or a shell gives it: the write end is opened
// blocking, the test keeps the read end and reads nothing until the child is gone.
function unreadPipe (t: { testdir: () => string, teardown: (fn: () => unknown) => void }): { dir: string, writeFd: number, readAll: () => string } {
  const dir = t.testdir()
  const fifo = join(dir, 'stdout.fifo')
  execFileSync('mkfifo', [fifo])
  const readFd = openSync(fifo, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK)
  const writeFd = openSync(fifo, 'w')
  t.teardown(() => { closeSync(readFd) })
  const readAll = (): string => {
    const chunks: Buffer[] = []
    const chunk = Buffer.alloc(65536)
    for (;;) {
      let n: number
      try { n = readSync(readFd, chunk, 0, chunk.length, null) } catch { break }
      if (n === 0) break
      chunks.push(Buffer.from(chunk.subarray(0, n)))
    }
    return Buffer.concat(chunks).toString()
  }
  return { dir, writeFd, readAll }
}

const LOG_MODULE = JSON.stringify(new URL('../dist/log.js', import.meta.url).href)

/** Runs an ES module script with `stdout` as its fd 1; resolves with its exit code (or 'still running' after `boundMs`) and its stderr. */
async function runScript (t: { teardown: (fn: () => unknown) => void }, dir: string, source: string, stdout: number | 'pipe', boundMs: number): Promise<{ code: number | null | 'still running', stderr: string, ms: number }> {
  const file = join(dir, 'script.mjs')
  writeFileSync(file, source)
  const started = Date.now()
  // through env(1): tap puts its own --import back into a child's NODE_OPTIONS, and that import
  // opens process.stdout, which makes a stdout pipe non-blocking before the code under test runs
  const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, file], { stdio: ['ignore', stdout, 'pipe'], env: childEnv() })
  t.teardown(() => { child.kill('SIGKILL') })
  let stderr = ''
  child.stderr?.on('data', (c: Buffer) => { stderr += c.toString() })
  const exited = new Promise<number | null>(resolve => child.once('exit', code => resolve(code)))
  const code = await Promise.race([exited, new Promise<'still running'>(resolve => setTimeout(() => resolve('still running'), boundMs))])
  return { code, stderr, ms: Date.now() - started }
}

const wholeLines = (text: string): string[] => text.split('\n').slice(0, -1)
const broken = (lines: string[]): string[] => lines.filter(l => { try { JSON.parse(l); return false } catch { return true } })

// stdout a pipe nobody reads, inherited blocking: a write to it held a thread-pool thread for
// good and the process never ended (src/log.ts makes such a stdout non-blocking).
t.test('a logger on a stdout pipe nobody reads: the process still ends by itself, and every line it could not write is counted on stderr', async t => {
  const { dir, writeFd, readAll } = unreadPipe(t)
  const run = runScript(t, dir, `
    const { createLogger } = await import(${LOG_MODULE})
    const logger = createLogger('info')
    const pad = 'x'.repeat(1000)
    // about 2 MB: many times what the pipe holds
    for (let i = 0; i < 2000; i++) logger.info({ i, pad }, 'line')
  `, writeFd, 15_000)
  closeSync(writeFd)
  const { code, stderr, ms } = await run
  // the exit waits 1 s for the reader (LOG_EXIT_FLUSH_MS); 15 s is the margin of a loaded machine
  t.equal(code, 0, `the process ended by itself (after ${ms} ms)`)
  const dropped = Number(/log: (\d+) lines dropped at exit/.exec(stderr)?.[1] ?? Number.NaN)
  const lines = wholeLines(readAll())
  t.same(broken(lines), [], 'every line that reached the pipe is whole')
  t.ok(dropped > 0, `the lines the pipe did not take are said on stderr (${stderr.trim()})`)
  t.equal(lines.length + dropped, 2000, `each line reached the pipe (${lines.length}) or is counted (${dropped})`)
})

t.test('process.exit while a batch is being written: the lines queued behind it are counted on stderr, not skipped', async t => {
  const { dir, writeFd, readAll } = unreadPipe(t)
  const run = runScript(t, dir, `
    const { createLogDestination } = await import(${LOG_MODULE})
    const sink = createLogDestination(1)
    const pad = 'x'.repeat(100)
    // the first 16 KiB go to the thread pool as one write; the rest waits behind it
    for (let i = 0; i < 1000; i++) sink.write(JSON.stringify({ i, pad }) + '\\n')
    process.exit(0)
  `, writeFd, 15_000)
  closeSync(writeFd)
  const { code, stderr } = await run
  t.equal(code, 0)
  const dropped = Number(/log: (\d+) lines dropped at exit/.exec(stderr)?.[1] ?? Number.NaN)
  const lines = wholeLines(readAll())
  t.same(broken(lines), [], 'every line that reached the pipe is whole')
  // the batch's own lines are counted too: its write's outcome is not known at exit
  t.ok(lines.length + dropped >= 1000, `each line reached the pipe (${lines.length}) or is counted (${dropped})`)
  t.ok(dropped >= 1000 - lines.length && lines.length < 1000, 'the lines queued behind the write are among those counted')
})

// Workers mode: the primary and every worker write to one stdout (src/workers.ts forks with
// silent: false). A reader that takes the pipe slowly, a kilobyte at a time, keeps it almost
// full, so writes larger than PIPE_BUF went in part and another process's write was spliced in.
t.test('workers mode: the primary and two workers share one slowly read stdout pipe, and every line comes out whole', async t => {
  const dir = t.testdir()
  const script = join(dir, 'cluster.mjs')
  writeFileSync(script, `
    import cluster from 'node:cluster'
    const { createLogDestination } = await import(${LOG_MODULE})
    const write = async (sink, w) => {
      const pad = 'x'.repeat(200)
      for (let i = 0; i < 10000; i++) sink.write(JSON.stringify({ w, i, pad }) + '\\n')
      // the sink's retry timer does not hold the process: this does, until the pipe took every line
      const alive = setInterval(() => {}, 1000)
      await new Promise(resolve => sink.flush(resolve))
      clearInterval(alive)
    }
    if (cluster.isPrimary) {
      // as src/cli.ts creates the primary's logger in workers mode
      const sink = createLogDestination(1, { sharedFd: true })
      const workers = [cluster.fork(), cluster.fork()]
      let ready = 0
      for (const w of workers) w.on('message', () => { if (++ready === 2) { for (const x of workers) x.send('go'); void write(sink, 'primary') } })
    } else {
      // a worker's logger, made as the gateway makes it: nothing says it shares stdout
      const sink = createLogDestination()
      process.once('message', async () => { await write(sink, cluster.worker.id); process.disconnect() })
      process.send('ready')
    }
  `)
  const reader = join(dir, 'reader.cjs')
  writeFileSync(reader, `
    const fs = require('fs')
    const chunk = Buffer.alloc(1024)
    const pause = new Int32Array(new SharedArrayBuffer(4))
    const out = []
    for (;;) {
      const n = fs.readSync(0, chunk, 0, chunk.length, null)
      if (n === 0) break
      out.push(Buffer.from(chunk.subarray(0, n)))
      Atomics.wait(pause, 0, 0, 0.2)
    }
    fs.writeFileSync(process.argv[2], Buffer.concat(out))
  `)
  const out = join(dir, 'read.log')
  await new Promise<void>((resolve, reject) => {
    // without tap's NODE_OPTIONS, whose --import would open process.stdout (see runScript)
    execFile('sh', ['-c', `unset NODE_OPTIONS; node "${script}" | node "${reader}" "${out}"`], { env: childEnv(), timeout: 120_000 }, err => {
      if (err !== null) reject(err)
      else resolve()
    })
  })
  const lines = wholeLines(readFileSync(out, 'utf8'))
  const spliced = broken(lines)
  t.same(spliced.slice(0, 2), [], `no line is spliced with another process's (${spliced.length} of ${lines.length})`)
  t.equal(lines.length, 30000, 'every line of the three processes arrives')
})

/**
 * What a sink does while `during` runs it: the writes it starts (each fs.write with a callback is
 * one FSREQCALLBACK, made as the write starts) and the timers it arms; `timersFired` counts the
 * callbacks of those timers, whenever they run.
 */
function watchSink (t: Teardown): { during: <T>(fn: () => T) => T, readonly writesStarted: number, readonly timersFired: number } {
  let watching = false
  let writesStarted = 0
  let timersFired = 0
  const timers = new Set<number>()
  const hook = createHook({
    init (id, type) {
      if (!watching) return
      if (type === 'FSREQCALLBACK') writesStarted++
      else if (type === 'Timeout') timers.add(id)
    },
    before (id) { if (timers.has(id)) timersFired++ }
  }).enable()
  t.teardown(() => { hook.disable() })
  return {
    during: <T>(fn: () => T): T => {
      watching = true
      try { return fn() } finally { watching = false }
    },
    get writesStarted () { return writesStarted },
    get timersFired () { return timersFired }
  }
}

t.test('a lone line is written by the timer, without a flush, and a sink with nothing to write has no timer that fires', async t => {
  const file = join(t.testdir(), 'timer.log')
  const fd = openSync(file, 'w')
  t.teardown(() => closeSync(fd))
  // the timers the sink makes while it is built and given its first line
  const watch = watchSink(t)
  const sink = watch.during(() => createLogDestination(fd, { batchBytes: 1 << 20, flushMs: 10 }))
  t.teardown(() => { sink.end() })
  watch.during(() => sink.write('{"i":1}\n'))
  const readWhole = async (expected: string): Promise<string> => {
    const deadline = Date.now() + 10_000
    let text = readFileSync(file, 'utf8')
    while (text !== expected && Date.now() < deadline) {
      await sleep(5)
      text = readFileSync(file, 'utf8')
    }
    return text
  }
  t.equal(await readWhole('{"i":1}\n'), '{"i":1}\n', 'the line reached the file with no flush and no full batch')
  t.ok(watch.timersFired >= 1, 'a timer of the sink wrote it')
  const firedWhenWritten = watch.timersFired
  // thirty of its periods with nothing to write: an interval would have woken the process for each
  await sleep(300)
  t.equal(watch.timersFired, firedWhenWritten, 'no timer of the sink fired while it had nothing to write')
  sink.write('{"i":2}\n')
  t.equal(await readWhole('{"i":1}\n{"i":2}\n'), '{"i":1}\n{"i":2}\n', 'the next line arms it again')
})

t.test('by default a batch is written once 16 KiB wait, not before, and a smaller one 100 ms after its first line', async t => {
  const file = join(t.testdir(), 'defaults.log')
  const fd = openSync(file, 'w')
  t.teardown(() => closeSync(fd))
  const watch = watchSink(t)
  const sink = createLogDestination(fd)
  t.teardown(() => { sink.end() })
  const line = `${'x'.repeat(1023)}\n` // 1024 bytes
  const call = (text: string): void => { watch.during(() => sink.write(text)) }

  // 16 KiB less one byte: nothing is written by size
  const started = performance.now()
  for (let i = 0; i < 15; i++) call(line)
  call(`${'y'.repeat(1022)}\n`)
  t.equal(watch.writesStarted, 0, '16383 bytes waiting start no write')
  const deadline = Date.now() + 10_000
  while (readFileSync(file).length < 16383 && Date.now() < deadline) await sleep(5)
  const elapsed = performance.now() - started
  t.equal(readFileSync(file).length, 16383, 'the timer wrote them')
  t.equal(watch.timersFired, 1, 'by the timer the first line armed')
  // a timer never fires early (libuv's clock counts whole milliseconds); it may fire late on a
  // loaded machine, but not by most of a second
  t.ok(elapsed >= 95, `not before 100 ms (${elapsed.toFixed(1)} ms)`)
  t.ok(elapsed < 1000, `but about 100 ms after the first line (${elapsed.toFixed(1)} ms)`)
  // the file shows the bytes once the write's syscall is done, before its callback tells the sink:
  // until then the sink has a write in flight and the next batch waits for it (CI met that once)
  while (sink.pendingBytes > 0 && Date.now() < deadline) await sleep(1)
  t.equal(sink.pendingBytes, 0, 'the sink saw its write done')

  // exactly 16 KiB: the line that reaches it starts the write at once, with no timer
  const startedBefore = watch.writesStarted
  const firedBefore = watch.timersFired
  for (let i = 0; i < 15; i++) call(line)
  t.equal(watch.writesStarted - startedBefore, 0, '15 KiB waiting start no write')
  call(line)
  t.equal(watch.writesStarted - startedBefore, 1, 'the line reaching 16 KiB starts the write itself')
  t.equal(watch.timersFired, firedBefore, 'no timer of the sink had fired')
})
