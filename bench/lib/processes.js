// Starting the bench's own child processes, waiting until they answer, and stopping exactly those.
import { execFileSync, spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { request } from 'undici'

/** A free TCP port on 127.0.0.1 (bound then released: the usual small race, fine on a bench box). */
export function freePort () {
  return new Promise((resolve, reject) => {
    const srv = createServer()
    srv.unref()
    srv.on('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address()
      const port = typeof addr === 'object' && addr !== null ? addr.port : 0
      srv.close(() => resolve(port))
    })
  })
}

/**
 * @typedef {object} Child
 * @property {string} name
 * @property {number} pid
 * @property {import('node:child_process').ChildProcess} proc
 * @property {() => string} output  last few kB of stdout+stderr, for error messages
 * @property {() => boolean} alive
 */

/** @type {Set<Child>} */
const started = new Set()

/**
 * Where processes run: null leaves them to the scheduler; otherwise the measured contender gets
 * `contender` (a taskset CPU list) to itself and everything else (this process with its load
 * generator, the upstream, redis-server, a log's reader) shares `rest`. On a 2-core machine the
 * scheduler otherwise moves the contender between cores and beside the upstream and redis-server
 * from round to round, which moved one build's CPU per request by up to 1.6x between rounds.
 * @type {{ contender: string, rest: string, all: string } | null}
 */
let placement = null

/**
 * The CPUs this process may run on (a container's cpuset or an outer taskset can leave fewer
 * than `os.cpus()` counts), from /proc/self/status; null where that is not readable.
 * @returns {number[] | null}
 */
function allowedCpus () {
  let status
  try {
    status = readFileSync('/proc/self/status', 'utf8')
  } catch {
    return null
  }
  const m = /^Cpus_allowed_list:\s*(\S+)$/m.exec(status)
  if (m === null) return null
  /** @type {number[]} */
  const list = []
  for (const part of /** @type {string} */ (m[1]).split(',')) {
    const [a, b] = part.split('-').map(Number)
    for (let c = /** @type {number} */ (a); c <= (b ?? /** @type {number} */ (a)); c++) list.push(c)
  }
  return list
}

/**
 * Pin this process (all its threads) and every process started from now on, if at least 2 CPUs
 * are allowed and `taskset` works: the first allowed CPU for the contender, the others for the
 * rest. Returns the placement, or null with the reason it is not used.
 * @returns {{ placement: { contender: string, rest: string, all: string } | null, why: string }}
 */
export function pinProcesses () {
  const cpus = allowedCpus()
  if (cpus === null) return { placement: null, why: 'allowed CPUs unknown (no /proc/self/status)' }
  if (cpus.length < 2) return { placement: null, why: `${cpus.length} CPU allowed` }
  const wanted = { contender: String(cpus[0]), rest: cpus.slice(1).join(','), all: cpus.join(',') }
  try {
    execFileSync('taskset', ['-c', wanted.contender, 'true'], { stdio: 'ignore' })
    execFileSync('taskset', ['-a', '-p', '-c', wanted.rest, String(process.pid)], { stdio: 'ignore' })
  } catch (err) {
    return { placement: null, why: `taskset failed: ${/** @type {Error} */ (err).message.split('\n')[0]}` }
  }
  placement = wanted
  return { placement, why: '' }
}

/**
 * The command line that runs `command` on its role's CPUs (unchanged when nothing is pinned):
 * `all` for what is not part of the pinned measurement (another bench started by this one), as
 * it would run unpinned. Anything else started by this process inherits its CPUs, the rest.
 * taskset execs the command, so the pid spawned is the command's own.
 * @param {'contender' | 'all'} role
 * @param {string} command
 * @param {string[]} args
 * @returns {[string, string[]]}
 */
export function placed (role, command, args) {
  if (placement === null) return [command, args]
  return ['taskset', ['-c', placement[role], command, ...args]]
}

/**
 * A run's placement as its results record it (`machine.placement`: pinProcesses' placement, or
 * a string saying why nothing was pinned; runs before 2026-11-25 recorded none), in words.
 * @param {{ contender: string, rest: string } | string | undefined} p
 */
export function describePlacement (p) {
  if (p === undefined) return 'processes not pinned'
  if (typeof p === 'string') return `processes ${p}`
  return `the measured contender alone on CPU ${p.contender} (but for (a), the upstream itself), the load generator, upstream and redis-server on CPU ${p.rest}`
}

/**
 * Spawn a long-lived child and wait until `ready()` resolves true.
 * @param {string} name
 * @param {string} command
 * @param {string[]} args
 * `drainStdout`: the child's stdout goes into a pipe read by a `cat > /dev/null` of its own, as a
 * log shipper would read a gateway's access log, instead of into this process, which also runs
 * the load generator and reads late while it is busy. Only stderr is then kept for messages.
 * `contender`: the process being measured, placed on the contender's CPUs when pinned (see
 * `pinProcesses`); any other process shares the rest.
 * @param {{ ready: () => Promise<boolean>, cwd?: string, env?: NodeJS.ProcessEnv, timeoutMs?: number, drainStdout?: boolean, contender?: boolean }} opts
 * @returns {Promise<Child>}
 */
export async function startProcess (name, command, args, opts) {
  const drain = opts.drainStdout === true ? spawn('sh', ['-c', 'exec cat > /dev/null'], { stdio: ['pipe', 'ignore', 'ignore'] }) : null
  const proc = spawn(...(opts.contender === true ? placed('contender', command, args) : [command, args]), { cwd: opts.cwd, env: opts.env ?? process.env, stdio: ['ignore', drain?.stdin ?? 'pipe', 'pipe'] })
  // the drain reads until the child's end of the pipe closes, then exits by itself
  drain?.stdin?.destroy()
  let tail = ''
  let exited = false
  /** @param {Buffer} chunk */
  const keep = (chunk) => { tail = (tail + chunk.toString()).slice(-4000) }
  proc.stdout?.on('data', keep)
  proc.stderr?.on('data', keep)
  proc.on('exit', (code, signal) => { exited = true; tail += `\n[${name} exited code=${code} signal=${signal}]` })
  proc.on('error', (err) => { exited = true; tail += `\n[${name} spawn error: ${err.message}]` })
  /** @type {Child} */
  const child = { name, pid: proc.pid ?? -1, proc, output: () => tail, alive: () => !exited }
  started.add(child)

  const deadline = Date.now() + (opts.timeoutMs ?? 15_000)
  while (Date.now() < deadline) {
    if (exited) throw new Error(`${name} exited before it was ready:\n${tail}`)
    if (await opts.ready().catch(() => false)) return child
    await sleep(100)
  }
  await stopProcess(child)
  throw new Error(`${name} not ready after ${opts.timeoutMs ?? 15_000} ms:\n${tail}`)
}

/**
 * True once GET <url> answers 200.
 * @param {string} url
 */
export async function answers200 (url) {
  const res = await request(url, { headersTimeout: 1000, bodyTimeout: 1000 })
  await res.body.dump()
  return res.statusCode === 200
}

/**
 * SIGTERM, then SIGKILL after a grace period. Only ever signals the pid we spawned.
 * @param {Child} child
 */
export async function stopProcess (child) {
  started.delete(child)
  if (!child.alive()) return
  const gone = new Promise((resolve) => child.proc.once('exit', resolve))
  child.proc.kill('SIGTERM')
  const timer = setTimeout(() => { if (child.alive()) child.proc.kill('SIGKILL') }, 3000)
  await gone
  clearTimeout(timer)
}

/** Stop every child this module started, newest first (proxies before their upstream). */
export async function stopAll () {
  for (const child of [...started].reverse()) await stopProcess(child)
}

/** Synchronous last resort for process 'exit': signal our own children only. */
export function killAllSync () {
  for (const child of started) if (child.alive()) child.proc.kill('SIGKILL')
}

/** @param {number} ms */
export function sleep (ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}
