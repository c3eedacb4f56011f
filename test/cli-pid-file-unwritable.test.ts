// `gateway start --pid-file FILE` whose FILE cannot be written (a missing /run/gateway directory,
// one the service user may not write) wrote it after the start: the write threw, the CLI printed
// one line and set exit code 1, yet the listeners stayed open and the process served on, with no
// SIGTERM drain installed and no pid file for `gateway reload`. It now stops and exits 1.
import t from 'tap'
import { execFile } from 'node:child_process'
import { existsSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { childEnv } from './helpers/gateway.js'
import { oneRoute } from './helpers/cli.js'
import { tempDir } from './helpers/teardown.js'

interface Exit { code: number | null, signal: NodeJS.Signals | null, stderr: string }

t.test('a pid file that cannot be written stops the gateway with exit 1 and one line', async t => {
  const dir = tempDir(t, 'pid-unwritable')
  const config = join(dir, 'gateway.yaml')
  writeFileSync(config, oneRoute('http://127.0.0.1:9', 'r') + 'log: { level: silent }\n')
  const pidFile = join(dir, 'missing-dir', 'gateway.pid')
  // without the fix the gateway never exits: killed after 15 s, the test fails instead of hanging
  const exit = await new Promise<Exit>(resolve => {
    execFile(process.execPath, ['bin/gateway', 'start', '-c', config, '--pid-file', pidFile], { env: childEnv(), timeout: 15_000, killSignal: 'SIGKILL' }, (err, _stdout, stderr) => {
      const e = err as { code?: number | null, signal?: NodeJS.Signals | null } | null
      resolve({ code: e === null ? 0 : e.code ?? null, signal: e?.signal ?? null, stderr })
    })
  })
  t.equal(exit.signal, null, 'it exited by itself')
  t.equal(exit.code, 1)
  t.match(exit.stderr, /^gateway: cannot write the pid file: ENOENT: [^\n]*missing-dir\/gateway\.pid'\n$/)
  t.notOk(existsSync(pidFile))
})
