// `gateway reload -c FILE` validates FILE, but the gateway re-reads the file it was started with:
// naming another one reported "reloaded" while the gateway ran its own, unchanged.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { spawnGateway, writeConfig } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { gateway, oneRoute } from './helpers/cli.js'

t.test('reload -c naming a file other than the running gateway\'s exits 1 and says which file runs', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'first'))
  const other = writeConfig(t, oneRoute(up.url, 'second'))
  const r = await gateway(['reload', '-c', other, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(r.code, 1, r.stdout + r.stderr)
  t.equal(r.stdout, '')
  t.equal(r.stderr, `gateway reload: the running gateway reloaded its own file (${gw.file}), not the text of ${other} validated here (another file, or one edited since): generation 2 runs that file\n`)
  const live = await (await fetch(`${gw.adminUrl}/config`)).json() as { config: { routes: Array<{ name: string }> } }
  t.same(live.config.routes.map(r => r.name), ['first'], 'the route of the file named by -c is not live')

  // the gateway's own file, edited: reloaded, exit 0
  writeFileSync(gw.file, oneRoute(up.url, 'third'))
  const own = await gateway(['reload', '-c', gw.file, '--pid-file', gw.pidFile, '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(own.code, 0, own.stderr)
  t.match(own.stdout, /^reloaded: generation 2 -> 3 /)
})
