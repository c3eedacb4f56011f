// Signals that come while a start is still reading its file (bin/gateway, real processes). The
// config is a FIFO the test writes into only once the gateway is reading it, so the signal lands
// in that read whatever the machine's speed. SIGHUP there ended the process (no handler yet);
// SIGTERM to PID 1 was dropped and the gateway went on to serve.
import t, { type Test } from 'tap'
import { spawn } from 'node:child_process'
import { execFileSync } from 'node:child_process'
import { closeSync, constants as fsConstants, openSync, readdirSync, readlinkSync, realpathSync, writeSync } from 'node:fs'
import { join } from 'node:path'
import { childEnv } from './helpers/gateway.js'
import { tempDir, type Teardown } from './helpers/teardown.js'
import { answering, bodies, until } from './helpers/workers.js'

const yaml = (upstream: string, workers: number): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: ${workers}
upstreams: { b: { targets: [${upstream}] } }
routes:
  - { name: all, pathPrefix: /, upstream: b }
`

interface FifoGateway {
  readonly pid: number
  readonly logs: Array<Record<string, unknown>>
  readonly exited: Promise<{ code: number | null, signal: NodeJS.Signals | null }>
  /** Opens the FIFO for writing once the gateway reads it (a reader is there); the fd, or null once it exited. */
  readonly reader: () => Promise<number | null>
  /** Whether the gateway holds the FIFO open. */
  readonly holdsFifo: () => boolean
}

/** bin/gateway start -c FIFO; nothing is written into the FIFO here. */
function spawnOnFifo (t: Teardown): FifoGateway {
  const fifo = join(tempDir(t, 'gw-fifo'), 'gateway.yaml')
  execFileSync('mkfifo', [fifo])
  // /proc names the FIFO by its real path
  const real = realpathSync(fifo)
  const child = spawn(process.execPath, ['bin/gateway', 'start', '-c', fifo], { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv() })
  const exited = new Promise<{ code: number | null, signal: NodeJS.Signals | null }>(resolve => child.once('exit', (code, signal) => resolve({ code, signal })))
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL')
      await exited
    }
  })
  const logs: Array<Record<string, unknown>> = []
  let buf = ''
  child.stdout.on('data', (chunk: Buffer) => {
    buf += chunk.toString()
    let nl
    while ((nl = buf.indexOf('\n')) !== -1) {
      try { logs.push(JSON.parse(buf.slice(0, nl)) as Record<string, unknown>) } catch { /* not JSON */ }
      buf = buf.slice(nl + 1)
    }
  })
  child.stderr.resume()
  const pid = child.pid as number
  const gone = (): boolean => child.exitCode !== null || child.signalCode !== null
  const holdsFifo = (): boolean => {
    try {
      return readdirSync(`/proc/${pid}/fd`).some(fd => { try { return readlinkSync(`/proc/${pid}/fd/${fd}`) === real } catch { return false } })
    } catch {
      return false
    }
  }
  const reader = async (): Promise<number | null> => {
    for (;;) {
      if (gone()) return null
      // a writer's non-blocking open fails (ENXIO) until the gateway has opened the FIFO to read
      try { return openSync(fifo, fsConstants.O_WRONLY | fsConstants.O_NONBLOCK) } catch { /* no reader yet */ }
      await new Promise(resolve => setTimeout(resolve, 10))
    }
  }
  return { pid, logs, exited, reader, holdsFifo }
}

/** Answers each read of the FIFO with `text(n)` (n counts the reads fed, from 0), one whole text per read, until `t` ends. */
function feed (t: Teardown, gw: FifoGateway, text: (n: number) => string): void {
  let done = false
  let n = 0
  t.teardown(() => { done = true })
  void (async () => {
    while (!done) {
      const fd = await gw.reader()
      if (fd === null) return
      await deliver(gw, fd, text(n++))
    }
  })()
}

const tick = async (): Promise<void> => { await new Promise(resolve => setTimeout(resolve, 10)) }

/**
 * Waits until the gateway reads its FIFO (`reading` says which read), sends `signal` then, and
 * gives a loaded machine half a second to act on it: a signal is handled (or not) in the turn it
 * arrives. Returns the write end, for the text that ends the read.
 */
async function signalWhileReading (t: Test, gw: FifoGateway, signal: NodeJS.Signals, reading: string): Promise<number> {
  const fd = await gw.reader()
  t.not(fd, null, reading)
  process.kill(gw.pid, signal)
  await new Promise(resolve => setTimeout(resolve, 500))
  return fd as number
}

/** Whether the gateway is still running (it has not exited by now). */
async function running (gw: FifoGateway): Promise<boolean> {
  return await Promise.race([gw.exited.then(() => false), new Promise<boolean>(resolve => setTimeout(() => resolve(true), 1))])
}

/**
 * Writes `text` as one whole read: the write end stays open until the gateway's read end is open
 * (it cannot reach the end of the file before), and the next open waits until it let go, so two
 * texts never run into one read.
 */
async function deliver (gw: FifoGateway, fd: number, text: string): Promise<void> {
  writeSync(fd, text)
  while (!gw.holdsFifo()) {
    if (await Promise.race([gw.exited.then(() => true), tick().then(() => false)])) break
  }
  closeSync(fd)
  while (gw.holdsFifo()) await tick()
}

for (const workers of [1, 2]) {
  t.test(`workers: ${workers}: a SIGHUP while the start reads its file is held, and reloads once started`, async t => {
    const a = await answering(t, 'from a')
    const b = await answering(t, 'from b')
    const gw = spawnOnFifo(t)
    const fd = await signalWhileReading(t, gw, 'SIGHUP', 'the gateway reads its file')
    t.equal(await running(gw), true, 'the gateway is still running after the SIGHUP')
    await deliver(gw, fd, yaml(a, workers))
    // the start reads the file once more (Gateway.start; the primary keeping its text), then
    // the held SIGHUP's reload reads it: that one gets file b
    const startedMsg = workers === 1 ? 'gateway started' : 'gateway primary started'
    feed(t, gw, n => n === 0 ? yaml(a, workers) : yaml(b, workers))
    await until('started', () => gw.logs.some(l => l.msg === startedMsg))
    const started = gw.logs.find(l => l.msg === startedMsg) as Record<string, unknown>
    const adminUrl = `http://127.0.0.1:${started.adminPort as number}`
    await until('the held SIGHUP reloaded', async () => {
      const config = await (await fetch(`${adminUrl}/config`)).json() as { generation: number, reloadPending: boolean }
      return config.generation === 2 && !config.reloadPending
    })
    await until('ready', async () => (await fetch(`${adminUrl}/readyz`)).status === 200 && gw.logs.some(l => l.msg === 'gateway started'))
    const port = gw.logs.find(l => l.msg === 'gateway started')?.port as number
    t.same(await bodies(`http://127.0.0.1:${port}`, 10), new Array(10).fill('200 from b'), 'the file read after the start serves')
  })
}

t.test('a SIGTERM while the start reads its file ends the start: exit 0, nothing served', async t => {
  const a = await answering(t, 'from a')
  const gw = spawnOnFifo(t)
  const fd = await signalWhileReading(t, gw, 'SIGTERM', 'the gateway reads its file')
  t.equal(await running(gw), true, 'not ended by the signal itself (as PID 1 it would not be)')
  await deliver(gw, fd, yaml(a, 1))
  t.same(await gw.exited, { code: 0, signal: null }, 'it ends with 0 once the read is done')
  t.notOk(gw.logs.some(l => l.msg === 'gateway started'), 'without having started')
})

t.test('workers: 2: a SIGTERM while the primary reads its file again ends the start before any worker is forked', async t => {
  const a = await answering(t, 'from a')
  const gw = spawnOnFifo(t)
  const first = await gw.reader()
  await deliver(gw, first as number, yaml(a, 2))
  // the primary reads the file once more for the text it hands its workers
  const second = await signalWhileReading(t, gw, 'SIGTERM', 'the primary reads its file again')
  await deliver(gw, second, yaml(a, 2))
  t.same(await gw.exited, { code: 0, signal: null }, 'it ends with 0')
  t.notOk(gw.logs.some(l => l.msg === 'gateway primary started' || l.msg === 'gateway started'), 'no worker was forked, nothing served')
})
