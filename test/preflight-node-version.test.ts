// The preflight's Node.js floor is package.json's engines.node. It kept its own copy, 20.18 (major
// and minor): Node 20.18.0 passed it, though the package needs 20.18.1 (undici 7 refuses less).
// The script and a package.json are copied to a directory of the test's own, with a floor one
// patch release above the Node running the test.
import t from 'tap'
import { spawnSync } from 'node:child_process'
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { tempDir, type Teardown } from './helpers/teardown.js'

function preflightWith (t: Teardown, engines: string): { status: number | null, stderr: string } {
  const dir = tempDir(t, 'preflight-node')
  mkdirSync(join(dir, 'scripts'))
  copyFileSync(join('scripts', 'preflight.mjs'), join(dir, 'scripts', 'preflight.mjs'))
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ type: 'module', engines: { node: engines } }))
  const r = spawnSync(process.execPath, [join(dir, 'scripts', 'preflight.mjs'), 'demo'], { encoding: 'utf8' })
  return { status: r.status, stderr: r.stderr }
}

t.test('a Node one patch release below engines.node is too old: exit 4 naming the floor; at the floor, exit 0', async t => {
  const [major, minor, patch] = process.versions.node.split('.').map(Number) as [number, number, number]
  const above = `${major}.${minor}.${patch + 1}`
  const tooOld = preflightWith(t, `>=${above}`)
  t.equal(tooOld.status, 4)
  t.equal(tooOld.stderr, `preflight: Node.js ${process.versions.node} is too old: demo needs Node.js >= ${above} (https://nodejs.org, or your OS packages)\n`)
  const atFloor = preflightWith(t, `>=${process.versions.node}`)
  t.same([atFloor.status, atFloor.stderr], [0, ''])
})

t.test('the repository\'s own floor is its engines.node', async t => {
  const r = spawnSync(process.execPath, [join('scripts', 'preflight.mjs'), 'demo'], { encoding: 'utf8' })
  t.same([r.status, r.stderr], [0, ''])
})
