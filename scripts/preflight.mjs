#!/usr/bin/env node
// Makes sure what a command needs is on this machine before it starts, so that a fresh machine
// gets one clear line instead of a cascade of failures (issue 12). One script for `npm test`,
// `npm run bench`, `npm run demo` and `.ci/run`:
//
//   node scripts/preflight.mjs test|bench|demo
//
// Missing required tools are installed from the OS packages when that is possible without asking
// (root with apt-get, as CI is); otherwise it stops with one line naming what to install and how.
// Exit codes: 0 ready, 2 something required is missing and cannot be installed here, 3 the
// install was tried and failed, 4 Node.js is too old, 64 usage.
// Only node built-ins: it must run before `npm ci` has finished, and on any machine.
import { spawnSync } from 'node:child_process'
import { accessSync, constants, readFileSync, writeFileSync } from 'node:fs'
import { delimiter, join } from 'node:path'
import { tmpdir } from 'node:os'
import { pathToFileURL } from 'node:url'

export const EXIT = Object.freeze({ ok: 0, missing: 2, installFailed: 3, oldNode: 4, usage: 64 })
// package.json's engines.node (">=20.18.1"), read so that the two cannot differ: a copy here said
// 20.18, and Node 20.18.0 passed the preflight of a package that needs 20.18.1 (undici 7's floor)
const MIN_NODE = minNode(JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).engines?.node)

function minNode (range) {
  const m = /^>=\s*(\d+)\.(\d+)\.(\d+)$/.exec(String(range).trim())
  if (m === null) throw new Error(`package.json engines.node should be ">=X.Y.Z", not "${range}"`)
  return m.slice(1).map(Number)
}

/**
 * Each tool: the command looked for on PATH and the package that provides it per OS family.
 * `optional` tools are skipped with one line when missing (the benchmark's other contenders).
 */
const TOOLS = {
  'redis-server': { apt: 'redis-server', dnf: 'redis', brew: 'redis' },
  'redis-cli': { apt: 'redis-tools', dnf: 'redis', brew: 'redis' },
  'redis-sentinel': { apt: 'redis-sentinel', dnf: 'redis', brew: 'redis' },
  openssl: { apt: 'openssl', dnf: 'openssl', brew: 'openssl' },
  // the admin page's browser tests (playwright-core drives it); Ubuntu and Fedora name it chromium-browser
  chromium: { apt: 'chromium', dnf: 'chromium', brewCask: 'chromium', names: ['chromium', 'chromium-browser', 'google-chrome'] },
  nginx: { apt: 'nginx', dnf: 'nginx', brew: 'nginx' }
}

const NEEDS = {
  // the suite starts real redis-server processes (standalone, Sentinel, Cluster) and makes TLS
  // certificates with openssl
  test: { required: ['redis-server', 'redis-cli', 'redis-sentinel', 'openssl', 'chromium'], optional: [] },
  // the Redis contenders need redis-server; nginx is an extra contender (skipped when missing)
  bench: { required: ['redis-server', 'redis-cli'], optional: ['nginx'] },
  // the demo keeps its limits in process: Node is all it needs
  demo: { required: [], optional: [] }
}

/** The path of `cmd` on `PATH`, or null. */
export function findOnPath (cmd, pathVar = process.env.PATH ?? '') {
  for (const dir of pathVar.split(delimiter)) {
    if (dir === '') continue
    const candidate = join(dir, cmd)
    try {
      accessSync(candidate, constants.X_OK)
      return candidate
    } catch { /* not here */ }
  }
  return null
}

function nodeTooOld (version = process.versions.node) {
  const v = version.split('.').map(Number)
  for (let i = 0; i < MIN_NODE.length; i++) if (v[i] !== MIN_NODE[i]) return v[i] < MIN_NODE[i]
  return false
}

function unique (list) {
  return [...new Set(list)]
}

/** The one line that tells a person what to install, for the three families we document. */
export function installHint (missing) {
  const pk = family => unique(missing.map(m => TOOLS[m][family]).filter(p => p !== undefined)).join(' ')
  const brew = [pk('brew') && `brew install ${pk('brew')}`, pk('brewCask') && `brew install --cask ${pk('brewCask')}`].filter(Boolean).join(' && ')
  return `to install: Debian/Ubuntu: sudo apt-get install -y ${pk('apt')} | Fedora: sudo dnf install -y ${pk('dnf')} | macOS: ${brew}`
}

/** The path of a tool under any of its names, or null. */
export function findTool (tool, pathVar) {
  for (const name of TOOLS[tool]?.names ?? [tool]) {
    const found = findOnPath(name, pathVar)
    if (found !== null) return found
  }
  return null
}

function canInstallWithApt () {
  return typeof process.getuid === 'function' && process.getuid() === 0 && findOnPath('apt-get') !== null
}

function aptInstall (packages) {
  const log = join(tmpdir(), 'gateway-preflight-apt.log')
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }
  const out = []
  for (const args of [['update', '-qq'], ['install', '-y', '-qq', ...packages]]) {
    const r = spawnSync('apt-get', args, { env, encoding: 'utf8' })
    out.push(`$ apt-get ${args.join(' ')}`, r.stdout ?? '', r.stderr ?? '')
    if (r.status !== 0) {
      writeFileSync(log, out.join('\n'))
      return { ok: false, log }
    }
  }
  return { ok: true, log }
}

export function preflight (what, { log = console.log, error = console.error } = {}) {
  const need = NEEDS[what]
  if (need === undefined) {
    error(`preflight: usage: node scripts/preflight.mjs ${Object.keys(NEEDS).join('|')}`)
    return EXIT.usage
  }
  if (nodeTooOld()) {
    error(`preflight: Node.js ${process.versions.node} is too old: ${what} needs Node.js >= ${MIN_NODE.join('.')} (https://nodejs.org, or your OS packages)`)
    return EXIT.oldNode
  }
  for (const tool of need.optional) {
    if (findTool(tool) === null) log(`preflight: ${tool} not found: its contender is skipped (${installHint([tool])})`)
  }
  let missing = need.required.filter(tool => findTool(tool) === null)
  if (missing.length === 0) return EXIT.ok
  if (!canInstallWithApt()) {
    error(`preflight: ${what} needs ${missing.join(', ')}, not found on PATH; ${installHint(missing)}`)
    return EXIT.missing
  }
  const packages = unique(missing.map(m => TOOLS[m].apt))
  log(`preflight: installing ${packages.join(' ')} from the OS packages (apt-get, as root)`)
  const installed = aptInstall(packages)
  missing = need.required.filter(tool => findTool(tool) === null)
  if (!installed.ok || missing.length > 0) {
    error(`preflight: could not install ${missing.join(', ') || packages.join(', ')} with apt-get (log: ${installed.log}); ${installHint(missing.length > 0 ? missing : need.required)}`)
    return EXIT.installFailed
  }
  return EXIT.ok
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.exitCode = preflight(process.argv[2] ?? '')
}
