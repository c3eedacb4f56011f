// A throw-away redis-server on a free port, and the counters the bench reads from it.
import { readdirSync, readFileSync } from 'node:fs'
import { connect } from 'node:net'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import { freePort, startProcess } from './processes.js'

/**
 * @param {string} dir  working directory (no persistence is configured, but redis wants one)
 * @param {string[]} [under]  a command redis-server runs under (bench/instructions.js: valgrind and its options)
 * @returns {Promise<{ port: number, url: string, child: import('./processes.js').Child, client: Redis }>}
 */
export async function startRedis (dir, under = []) {
  const port = await freePort()
  const [command, ...args] = [...under, 'redis-server',
    '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, '--loglevel', 'warning']
  const child = await startProcess('redis-server', /** @type {string} */ (command), args, { ready: () => pingRaw(port), timeoutMs: under.length > 0 ? 120_000 : 15_000 })
  const client = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 })
  return { port, url: `redis://127.0.0.1:${port}`, child, client }
}

/**
 * PING over a raw socket, so readiness does not depend on a client's reconnect policy.
 * @param {number} port
 * @returns {Promise<boolean>}
 */
function pingRaw (port) {
  return new Promise((resolve) => {
    const sock = connect(port, '127.0.0.1')
    sock.setTimeout(500, () => { sock.destroy(); resolve(false) })
    sock.on('error', () => resolve(false))
    sock.on('connect', () => sock.write('PING\r\n'))
    sock.on('data', (d) => { sock.destroy(); resolve(d.toString().startsWith('+PONG')) })
  })
}

/**
 * Calls per command from INFO commandstats (e.g. { evalsha: 1200, ping: 3 }).
 * @param {Redis} client
 * @returns {Promise<Record<string, number>>}
 */
export async function commandCalls (client) {
  const text = await client.info('commandstats')
  /** @type {Record<string, number>} */
  const calls = {}
  for (const m of text.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) calls[/** @type {string} */ (m[1])] = Number(m[2])
  return calls
}

const SCRIPT_COMMANDS = new Set(['eval', 'evalsha', 'eval_ro', 'evalsha_ro', 'fcall', 'fcall_ro'])

/**
 * Names of the commands the Lua scripts in `dir` issue (redis.call / redis.pcall), lower-case.
 * INFO commandstats counts those too, once per call inside a script, so they are told apart
 * from the client's own round trips by name.
 * @param {string} dir
 */
export function commandsUsedByScripts (dir) {
  const names = new Set()
  /** @type {string[]} */
  let files
  try { files = readdirSync(dir).filter((f) => f.endsWith('.lua')) } catch { return names }
  for (const f of files) {
    for (const m of readFileSync(join(dir, f), 'utf8').matchAll(/redis\.p?call\(\s*['"]([A-Za-z_]+)['"]/g)) names.add(/** @type {string} */ (m[1]).toLowerCase())
  }
  return names
}

/**
 * Calls made between two snapshots, leaving out the bench's own INFO calls. `roundTrips` are
 * the commands clients sent (script invocations and any command the scripts never use);
 * `inScripts` the commands run inside scripts.
 * @param {Record<string, number>} before
 * @param {Record<string, number>} after
 * @param {Set<string>} scriptInternal  from commandsUsedByScripts
 */
export function callsBetween (before, after, scriptInternal) {
  /** @type {Record<string, number>} */
  const byCommand = {}
  let roundTrips = 0
  let scripts = 0
  let inScripts = 0
  for (const [cmd, n] of Object.entries(after)) {
    if (cmd === 'info') continue
    const d = n - (before[cmd] ?? 0)
    if (d <= 0) continue
    byCommand[cmd] = d
    if (SCRIPT_COMMANDS.has(cmd)) { scripts += d; roundTrips += d } else if (scriptInternal.has(cmd)) inScripts += d
    else roundTrips += d
  }
  return { roundTrips, scripts, inScripts, byCommand }
}
