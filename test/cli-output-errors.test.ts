// The CLI's promise "every failure is one line on stderr, never a stack trace" held for its own
// errors, not for stdout itself: a write that failed was an unhandled 'error' event.
import t from 'tap'
import { spawn, spawnSync } from 'node:child_process'
import { openSync, closeSync } from 'node:fs'

t.test('gateway schema to a full disk is one line on stderr and exit 1, not a stack trace', async t => {
  const full = openSync('/dev/full', 'w')
  t.teardown(() => closeSync(full))
  const r = spawnSync(process.execPath, ['bin/gateway', 'schema'], { stdio: ['ignore', full, 'pipe'], encoding: 'utf8' })
  t.equal(r.status, 1)
  t.equal(r.stderr, 'gateway: cannot write to stdout: ENOSPC: no space left on device, write\n')
})

t.test('gateway schema into a pipe whose reader is gone (| true) exits 0 without a word', async t => {
  const child = spawn(process.execPath, ['bin/gateway', 'schema'], { stdio: ['ignore', 'pipe', 'pipe'] })
  child.stdout.destroy()
  let stderr = ''
  child.stderr.on('data', (d: Buffer) => { stderr += d.toString() })
  const status = await new Promise<number | null>(resolve => child.on('close', resolve))
  t.equal(stderr, '')
  t.equal(status, 0)
})
