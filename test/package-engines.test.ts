// The Node.js version the gateway promises (package.json `engines`, the README) is one every
// package it runs with supports: a dependency that needs a newer Node would make `npm ci` warn
// (or fail under engine-strict) on a machine that meets the promise, and could break at run time
// in a path the tests here, on one Node version, do not take. Read from package-lock.json, which
// is what `npm ci` installs. Development-only packages (tests, lint, benchmarks) are left out.
import t from 'tap'
import { readFileSync } from 'node:fs'
import semver from 'semver'

const ROOT = new URL('../', import.meta.url)
const read = (file: string): string => readFileSync(new URL(file, ROOT), 'utf8')

interface LockedPackage { version?: string, dev?: boolean, devOptional?: boolean, engines?: { node?: string } | string[] }

// an array is the old, advisory form of the field (ignored by npm)
const nodeRange = (p: LockedPackage | undefined): string | undefined => Array.isArray(p?.engines) ? undefined : p?.engines?.node

const pkg = JSON.parse(read('package.json')) as { engines: { node: string } }
const lock = JSON.parse(read('package-lock.json')) as { packages: Record<string, LockedPackage> }
const promised = pkg.engines.node
const oldest = semver.minVersion(promised)

t.test('every package the gateway runs with supports the oldest Node.js it promises', async (t) => {
  t.ok(oldest, `engines.node is a range: ${promised}`)
  const runtime = Object.entries(lock.packages).filter(([path, p]) => path !== '' && p.dev !== true && p.devOptional !== true)
  t.ok(runtime.some(([path]) => path === 'node_modules/undici'), 'the lock lists the runtime packages (undici among them)')
  const unsupported: string[] = []
  for (const [path, p] of runtime) {
    const wanted = nodeRange(p)
    if (wanted !== undefined && !semver.satisfies(oldest as semver.SemVer, wanted)) unsupported.push(`${path.replace(/^.*node_modules\//, '')}@${p.version ?? '?'} wants node ${wanted}`)
  }
  t.same(unsupported, [], `runtime packages that do not run on node ${oldest?.version ?? '?'}`)
  t.equal(nodeRange(lock.packages['']), promised, 'package-lock.json is in step with package.json')
})

t.test('the README promises the same Node.js version as package.json', async (t) => {
  const readme = read('README.md')
  const version = oldest?.version ?? ''
  t.match(readme, `Node.js (>= ${version})`, 'in its first lines')
  t.match(readme, `**Node.js >= ${version}**`, 'in what a fresh machine needs')
})
