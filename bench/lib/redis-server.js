// A throw-away redis-server on a free port, and the counters the bench reads from it.
import { connect } from 'node:net'
import { Redis } from 'ioredis'
import { freePort, startProcess } from './processes.js'

/**
 * @param {string} dir  working directory (no persistence is configured, but redis wants one)
 * @returns {Promise<{ port: number, url: string, child: import('./processes.js').Child, client: Redis }>}
 */
export async function startRedis (dir) {
  const port = await freePort()
  const child = await startProcess('redis-server', 'redis-server', [
    '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, '--loglevel', 'warning'
  ], { ready: () => pingRaw(port) })
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

/**
 * Calls made between two snapshots, leaving out the bench's own INFO calls.
 * @param {Record<string, number>} before
 * @param {Record<string, number>} after
 */
export function callsBetween (before, after) {
  /** @type {Record<string, number>} */
  const diff = {}
  let total = 0
  for (const [cmd, n] of Object.entries(after)) {
    if (cmd === 'info') continue
    const d = n - (before[cmd] ?? 0)
    if (d > 0) { diff[cmd] = d; total += d }
  }
  return { total, byCommand: diff }
}
