// bin/gateway run as an operator runs it (a real process), for the CLI tests.
import { execFile, spawnSync } from 'node:child_process'
import { childEnv } from './gateway.js'

export interface Run { code: number, stdout: string, stderr: string }

/** Runs `bin/gateway ARGS` to its exit. */
export function gateway (args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise(resolve => {
    execFile(process.execPath, ['bin/gateway', ...args], { env: childEnv(env) }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : (err as { code?: number }).code ?? 1, stdout, stderr })
    })
  })
}

/** What `bin/gateway explain -c FILE ARGS` prints; a failing exit throws with its stderr. */
export function explainOutput (file: string, ...args: string[]): string {
  const out = spawnSync(process.execPath, ['bin/gateway', 'explain', '-c', file, ...args], { encoding: 'utf8', env: childEnv() })
  if (out.status !== 0) throw new Error(`explain exited ${String(out.status)}: ${out.stderr}`)
  return out.stdout
}

/** One route named `route` to `upstream`, listener and admin on free ports. */
export const oneRoute = (upstream: string, route: string): string => `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["${upstream}"] }
routes:
  - { name: ${route}, pathPrefix: /, upstream: backend }
`
