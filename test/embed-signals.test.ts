// README (Embedding): "It installs no signal handlers: what SIGHUP and SIGTERM mean is the
// embedding process's choice." The public startGateway, run as the README's example runs it.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { startGateway } from '../src/index.js'
import { startUpstream } from './helpers/upstream.js'

const SIGNALS = ['SIGHUP', 'SIGTERM', 'SIGINT', 'SIGUSR1', 'SIGUSR2', 'SIGQUIT', 'SIGPIPE'] as const
const counts = (): number[] => SIGNALS.map(s => process.listenerCount(s))

t.test('startGateway, a reload and close() leave the process\'s signal handlers as they were', async t => {
  const up = await startUpstream(t)
  const file = join(t.testdir({}), 'gateway.yaml')
  writeFileSync(file, `listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstreams: { b: { targets: ["${up.url}"] } }\nroutes:\n  - { name: all, pathPrefix: /, upstream: b }\n`)
  const before = counts()
  const gw = await startGateway({ configFile: file, logLevel: 'warn' })
  t.teardown(async () => { await gw.close() })
  t.same(counts(), before, 'none added by the start')
  const res = await fetch(`${gw.url}/x`)
  t.equal(res.status, 200, 'it serves')
  await res.arrayBuffer()
  t.match(await gw.reload(), { ok: true }, 'a reload')
  t.same(counts(), before, 'none added by a reload')
  await gw.close()
  t.same(counts(), before, 'none left by close()')
})
