// `gateway reload -c FILE` validates FILE, but the gateway re-reads the file it was started with:
// naming another one reported "reloaded" while the gateway ran its own, unchanged.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { execFile } from 'node:child_process'
import { spawnGateway, childEnv, writeConfig } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

interface Run { code: number, stdout: string, stderr: string }

function gateway (args: string[]): Promise<Run> {
  return new Promise(resolve => {
    execFile(process.execPath, ['bin/gateway', ...args], { env: childEnv() }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : (err as { code?: number }).code ?? 1, stdout, stderr })
    })
  })
}

const config = (upstream: string, route: string): string => `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["${upstream}"] }
routes:
  - { name: ${route}, pathPrefix: /, upstream: backend }
`

t.test('reload -c naming a file other than the running gateway\'s exits 1 and says which file runs', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, config(up.url, 'first'))
  const other = writeConfig(t, config(up.url, 'second'))
  const r = await gateway(['reload', '-c', other, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(r.code, 1, r.stdout + r.stderr)
  t.equal(r.stdout, '')
  t.equal(r.stderr, `gateway reload: the running gateway reloaded its own file (${gw.file}), not the text of ${other} validated here (another file, or one edited since): generation 2 runs that file\n`)
  const live = await (await fetch(`${gw.adminUrl}/config`)).json() as { config: { routes: Array<{ name: string }> } }
  t.same(live.config.routes.map(r => r.name), ['first'], 'the route of the file named by -c is not live')

  // the gateway's own file, edited: reloaded, exit 0
  writeFileSync(gw.file, config(up.url, 'third'))
  const own = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(own.code, 0, own.stderr)
  t.match(own.stdout, /^reloaded: generation 2 -> 3 /)
})
