// `npm test`'s preflight on a machine that lacks what the suite needs: one line that says what to
// install and a distinct exit code, never a cascade of "redis-server exited" failures (issue 12).
// PATH is a directory of this test's own, so the machine's real tools (and apt-get) are not seen.
import t from 'tap'
import { spawnSync } from 'node:child_process'
import { chmodSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { tempDir, type Teardown } from './helpers/teardown.js'

const SCRIPT = join(import.meta.dirname, '..', 'scripts', 'preflight.mjs')

function binDir (t: Teardown, tools: Record<string, string>): string {
  const dir = tempDir(t, 'gw-preflight')
  for (const [name, body] of Object.entries(tools)) {
    const file = join(dir, name)
    writeFileSync(file, `#!/bin/sh\n${body}\n`)
    chmodSync(file, 0o755)
  }
  return dir
}

function preflight (what: string, path: string): { status: number | null, stdout: string, stderr: string } {
  const r = spawnSync(process.execPath, [SCRIPT, what], { env: { PATH: path, HOME: tmpdir() }, encoding: 'utf8' })
  return { status: r.status, stdout: r.stdout, stderr: r.stderr }
}

const lines = (s: string): string[] => s.split('\n').filter(l => l !== '')
const isRoot = typeof process.getuid === 'function' && process.getuid() === 0

t.test('nothing installed and no way to install: one line naming every tool and how to install it, exit 2', async t => {
  const r = preflight('test', binDir(t, {}))
  t.equal(r.status, 2)
  t.equal(r.stdout, '')
  const out = lines(r.stderr)
  t.equal(out.length, 1, 'exactly one line')
  t.match(out[0], /^preflight: test needs redis-server, redis-cli, redis-sentinel, openssl, chromium, not found on PATH/)
  t.match(out[0], 'Debian/Ubuntu: sudo apt-get install -y redis-server redis-tools redis-sentinel openssl chromium')
  t.match(out[0], 'Fedora: sudo dnf install -y redis openssl chromium')
  t.match(out[0], 'macOS: brew install redis openssl && brew install --cask chromium')
})

t.test('only the missing tools are named', async t => {
  const r = preflight('test', binDir(t, { 'redis-server': 'exit 0', 'redis-cli': 'exit 0', openssl: 'exit 0', 'chromium-browser': 'exit 0' }))
  t.equal(r.status, 2)
  t.match(r.stderr, /^preflight: test needs redis-sentinel, not found on PATH; to install: Debian\/Ubuntu: sudo apt-get install -y redis-sentinel \|/)
})

t.test('everything on PATH: silent, exit 0', async t => {
  const r = preflight('test', binDir(t, { 'redis-server': 'exit 0', 'redis-cli': 'exit 0', 'redis-sentinel': 'exit 0', openssl: 'exit 0', chromium: 'exit 0' }))
  t.same([r.status, r.stdout, r.stderr], [0, '', ''])
})

t.test('apt-get that fails: one line with the log path and the hint (root), or the hint alone', async t => {
  const dir = binDir(t, { 'apt-get': 'echo "E: Unable to locate package" >&2; exit 100' })
  const r = preflight('test', dir)
  const out = lines(r.stderr)
  t.equal(out.length, 1)
  if (isRoot) {
    t.equal(r.status, 3, 'root with apt-get: the install was tried and failed')
    t.match(lines(r.stdout), ['preflight: installing redis-server redis-tools redis-sentinel openssl chromium from the OS packages (apt-get, as root)'])
    t.match(out[0], /^preflight: could not install redis-server, redis-cli, redis-sentinel, openssl, chromium with apt-get \(log: .*gateway-preflight-apt\.log\); to install: /)
  } else {
    t.equal(r.status, 2, 'not root: no install is tried')
  }
})

t.test('apt-get that installs: exit 0 once the tools are there (root); the hint alone otherwise', async t => {
  const dir = binDir(t, {})
  // an apt-get that "installs" by creating the commands in its own directory
  const script = `case "$1" in install) for c in redis-server redis-cli redis-sentinel openssl chromium; do printf '#!/bin/sh\\nexit 0\\n' > "${dir}/$c"; /bin/chmod +x "${dir}/$c"; done;; esac; exit 0`
  writeFileSync(join(dir, 'apt-get'), `#!/bin/sh\n${script}\n`)
  chmodSync(join(dir, 'apt-get'), 0o755)
  const r = preflight('test', dir)
  if (isRoot) {
    t.equal(r.status, 0, r.stderr)
    t.equal(r.stderr, '')
  } else {
    t.equal(r.status, 2, 'not root: no install is tried')
  }
})

t.test('bench: nginx is optional (one line, exit 0); redis-server is required', async t => {
  const r = preflight('bench', binDir(t, { 'redis-server': 'exit 0', 'redis-cli': 'exit 0' }))
  t.equal(r.status, 0)
  t.match(lines(r.stdout), [/^preflight: nginx not found: its contender is skipped \(to install: /])
  const missing = preflight('bench', binDir(t, {}))
  t.equal(missing.status, 2)
  t.match(missing.stderr, /^preflight: bench needs redis-server, redis-cli, not found on PATH/)
})

t.test('demo needs nothing but Node; an unknown command is a usage error', async t => {
  const demo = preflight('demo', binDir(t, {}))
  t.same([demo.status, demo.stdout, demo.stderr], [0, '', ''])
  const bad = preflight('tests', binDir(t, {}))
  t.equal(bad.status, 64)
  t.equal(lines(bad.stderr).length, 1)
})
