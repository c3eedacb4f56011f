// Starts real gateways for tests: in process (Gateway.start) or as `bin/gateway` (for signals).
// Every start registers its teardown on the test right away.
import { closeSync, constants as fsConstants, openSync, readSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { Writable } from 'node:stream'
import { Gateway } from '../../src/server.js'
import { createLogger } from '../../src/log.js'
import { tempDir, type Teardown } from './teardown.js'

/**
 * The environment for child processes: without tap's NODE_OPTIONS (its TypeScript loader would
 * otherwise be injected into bin/gateway, which runs the compiled JavaScript).
 */
export function childEnv (extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const [k, v] of Object.entries(process.env)) {
    if (k !== 'NODE_OPTIONS' && !k.startsWith('_TAPJS_') && !k.startsWith('TAP_')) env[k] = v
  }
  return { ...env, ...extra }
}

export interface LogCapture {
  readonly lines: Array<Record<string, unknown>>
}

/** A gateway config on free ports with one upstream, `backend` at `url`, and the routes given (YAML list items). */
export function backendConfig (url: string, routes: string): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}] }
routes:
${routes}`
}

export function writeConfig (t: Teardown, yaml: string): string {
  const file = join(tempDir(t, 'gw-test'), 'gateway.yaml')
  writeFileSync(file, yaml)
  return file
}

/** A stream a logger writes JSON lines to, each line parsed into `lines` as it comes. */
export function jsonLineSink (): { lines: Array<Record<string, unknown>>, sink: Writable } {
  const lines: Array<Record<string, unknown>> = []
  const sink = new Writable({
    write (chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString().split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>)
      cb()
    }
  })
  return { lines, sink }
}

/** A gateway in this process; its JSON log lines are captured for assertions. */
export async function startGateway (t: Teardown, yaml: string, env: NodeJS.ProcessEnv = {}): Promise<Gateway & LogCapture> {
  const file = writeConfig(t, yaml)
  const { lines, sink } = jsonLineSink()
  const gw = await Gateway.start({ configFile: file, logger: createLogger('info', sink), env: { ...process.env, ...env } })
  t.teardown(() => gw.close())
  return Object.assign(gw, { lines })
}

export interface GatewayProcess {
  readonly child: ChildProcess
  readonly file: string
  readonly pidFile: string
  readonly port: number
  readonly adminPort: number
  readonly url: string
  readonly adminUrl: string
  readonly logs: Array<Record<string, unknown>>
  readonly stderr: () => string
  /** Resolves with the exit code. */
  readonly exited: Promise<number | null>
  /** Waits until a log line matches (e.g. { msg: 'configuration reloaded' }). */
  waitForLog: (match: (line: Record<string, unknown>) => boolean, timeoutMs?: number) => Promise<Record<string, unknown>>
}

/** `bin/gateway start` as a child process (needs `npm run build`); ports come from its start-up log line. */
/**
 * `bin/gateway start` as a child process. `group`: in a process group of its own (as systemd or a
 * shell runs it), so a test can signal the whole group like `kill -TERM -PGID` or Ctrl-C.
 */
export async function spawnGateway (t: Teardown, yaml: string, extraArgs: string[] = [], options: { group?: boolean, env?: NodeJS.ProcessEnv, waitFor?: string, openFiles?: number } = {}): Promise<GatewayProcess> {
  const file = writeConfig(t, yaml)
  const pidFile = file.replace(/gateway\.yaml$/, 'gateway.pid')
  const args = ['bin/gateway', 'start', '-c', file, '--pid-file', pidFile, ...extraArgs]
  const spawnOptions = { stdio: ['ignore', 'pipe', 'pipe'] as Array<'ignore' | 'pipe'>, env: childEnv(options.env), detached: options.group === true }
  // openFiles: the process's open-file limit (ulimit -n, soft and hard), set by a shell that then
  // becomes the gateway (exec: the child's pid is the gateway's)
  const child = options.openFiles === undefined
    ? spawn(process.execPath, args, spawnOptions)
    : spawn('bash', ['-c', 'ulimit -n "$0" && exec "$@"', String(options.openFiles), process.execPath, ...args], spawnOptions)
  const exited = new Promise<number | null>(resolve => child.once('exit', code => resolve(code)))
  t.teardown(async () => {
    if (options.group === true && child.pid !== undefined) {
      try { process.kill(-child.pid, 'SIGKILL') } catch { /* the group is gone */ }
    }
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL')
      await exited
    }
  })
  const logs: Array<Record<string, unknown>> = []
  const waiters = new Set<() => void>()
  let buf = ''
  child.stdout?.on('data', (chunk: Buffer) => {
    buf += chunk.toString()
    let nl
    while ((nl = buf.indexOf('\n')) !== -1) {
      const line = buf.slice(0, nl)
      buf = buf.slice(nl + 1)
      try { logs.push(JSON.parse(line) as Record<string, unknown>) } catch { /* not JSON */ }
    }
    for (const w of waiters) w()
  })
  let err = ''
  child.stderr?.on('data', (c: Buffer) => { err += c.toString() })
  const waitForLog = (match: (line: Record<string, unknown>) => boolean, timeoutMs = 30_000): Promise<Record<string, unknown>> =>
    new Promise((resolve, reject) => {
      const check = (): void => {
        const found = logs.find(match)
        if (found !== undefined) {
          waiters.delete(check)
          clearTimeout(timer)
          resolve(found)
        }
      }
      const timer = setTimeout(() => { waiters.delete(check); reject(new Error(`no matching log line within ${timeoutMs}ms; stderr: ${err}`)) }, timeoutMs)
      waiters.add(check)
      check()
    })
  const started = await Promise.race([
    waitForLog(l => l.msg === (options.waitFor ?? 'gateway started')),
    exited.then(code => { throw new Error(`gateway exited with ${code}: ${err}`) })
  ])
  const port = started.port as number
  const adminPort = started.adminPort as number
  return { child, file, pidFile, port, adminPort, url: `http://127.0.0.1:${port}`, adminUrl: `http://127.0.0.1:${adminPort}`, logs, stderr: () => err, exited, waitForLog }
}

export interface UnreadStdoutGateway {
  readonly child: ChildProcess
  readonly port: number
  readonly adminPort: number
  /** Resolves with the exit code. */
  readonly exited: Promise<number | null>
  readonly stderr: () => string
  /** What the gateway wrote since the last read (never blocks); its start-up lines are in `head`. */
  readonly readPipe: () => string
  readonly head: string
}

/**
 * `bin/gateway start -c file` with its stdout on a FIFO the test reads only when it calls
 * readPipe: a log shipper that stalls (Docker's FIFO, a shell pipe). Resolves once the gateway
 * has said it started. Through env(1): tap puts its own --import back into a child's
 * NODE_OPTIONS, and that import opens process.stdout, which would make the pipe non-blocking
 * before the gateway's code runs.
 */
export async function gatewayOnUnreadStdout (t: Teardown, file: string): Promise<UnreadStdoutGateway> {
  const fifo = join(tempDir(t, 'gw-fifo'), 'stdout.fifo')
  execFileSync('mkfifo', [fifo])
  const readFd = openSync(fifo, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK)
  t.teardown(() => { closeSync(readFd) })
  const writeFd = openSync(fifo, 'w')
  const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, 'bin/gateway', 'start', '-c', file], { stdio: ['ignore', writeFd, 'pipe'], env: childEnv() })
  closeSync(writeFd)
  let stderr = ''
  child.stderr?.on('data', (c: Buffer) => { stderr += c.toString() })
  const exited = new Promise<number | null>(resolve => child.once('exit', code => resolve(code)))
  t.teardown(() => { child.kill('SIGKILL') })
  const chunk = Buffer.alloc(65536)
  const readPipe = (): string => {
    let text = ''
    for (;;) {
      let n: number
      try { n = readSync(readFd, chunk, 0, chunk.length, null) } catch { return text }
      if (n === 0) return text
      text += chunk.toString('utf8', 0, n)
    }
  }
  let head = ''
  for (const deadline = Date.now() + 30_000; Date.now() < deadline;) {
    head += readPipe()
    const line = head.split('\n').find(l => l.includes('"gateway started"'))
    if (line !== undefined) {
      const { port, adminPort } = JSON.parse(line) as { port: number, adminPort: number }
      return { child, port, adminPort, exited, stderr: () => stderr, readPipe, head }
    }
    await new Promise(resolve => setTimeout(resolve, 20))
  }
  throw new Error(`the gateway did not start: ${stderr}`)
}
