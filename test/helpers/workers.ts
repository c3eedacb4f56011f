// Two workers of bin/gateway in workers mode (real processes), for the tests of test/workers-*.
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { spawnGateway, type GatewayProcess } from './gateway.js'
import type { Teardown } from './teardown.js'
import { eventually } from './ratelimit.js'

/** An upstream that answers every request with `body`. */
export async function answering (t: Teardown, body: string): Promise<string> {
  const server = createServer((req, res) => res.end(body))
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { server.closeAllConnections(); server.close() })
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

export const config = (upstream: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
upstreams: { b: { targets: [${upstream}] } }
routes:
  - { name: all, pathPrefix: /, upstream: b }
`

export const until = async (what: string, check: () => Promise<boolean> | boolean, timeoutMs = 30_000): Promise<void> =>
  await eventually(what, async () => await check(), timeoutMs)

export interface Running { readonly gw: GatewayProcess, readonly adminUrl: string, readonly workerPids: () => number[] }

/** Starts `yaml` (with `workers: 2`; `env` added to the gateway's) and waits until both workers are ready. */
export async function twoWorkers (t: Teardown, yaml: string, env?: NodeJS.ProcessEnv): Promise<Running> {
  const gw = await spawnGateway(t, yaml, [], env !== undefined ? { env } : {})
  const primary = await gw.waitForLog(l => l.msg === 'gateway primary started')
  const adminUrl = `http://127.0.0.1:${primary.adminPort as number}`
  const workerPids = (): number[] => [...new Set(gw.logs.filter(l => l.msg === 'gateway started').map(l => l.pid as number))]
  await until('both workers ready', async () => (await fetch(`${adminUrl}/readyz`)).status === 200 && workerPids().length === 2)
  return { gw, adminUrl, workerPids }
}

/** Answers of `n` requests, each on a new connection, so both workers take some. */
export async function bodies (url: string, n: number): Promise<string[]> {
  return await Promise.all(Array.from({ length: n }, async () => {
    const res = await fetch(`${url}/x`, { headers: { connection: 'close' } })
    return `${res.status} ${await res.text()}`
  }))
}

/** Kills one worker with SIGKILL and waits until its replacement has started and the primary is ready again. */
export async function replaceOne (r: Running): Promise<number> {
  const victim = r.workerPids()[0] as number
  process.kill(victim, 'SIGKILL')
  await r.gw.waitForLog(l => l.msg === 'worker exited; starting a new one' && l.worker === victim)
  await until('the replacement started', () => r.workerPids().length === 3)
  const replacement = r.workerPids()[2] as number
  await until('/readyz ready again', async () => (await fetch(`${r.adminUrl}/readyz`)).status === 200)
  return replacement
}
