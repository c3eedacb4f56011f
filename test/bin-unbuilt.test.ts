// bin/gateway in a clone after `npm ci` but before `npm run build` (or `npx gateway` there): the
// compiled CLI it imports is missing. That was Node's resolver error with a ten-line stack, where
// the CLI promises one line on stderr for every failure.
import t from 'tap'
import { copyFileSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { spawnSync } from 'node:child_process'
import { tempDir } from './helpers/teardown.js'
import { childEnv } from './helpers/gateway.js'

t.test('bin/gateway without dist/ says in one line to run npm run build, exit 1', async t => {
  const dir = tempDir(t, 'unbuilt')
  mkdirSync(join(dir, 'bin'))
  for (const f of ['gateway', 'package.json']) copyFileSync(join('bin', f), join(dir, 'bin', f))
  const r = spawnSync(process.execPath, [join(dir, 'bin', 'gateway'), 'validate'], { cwd: dir, env: childEnv(), encoding: 'utf8' })
  t.equal(r.status, 1)
  t.equal(r.stdout, '')
  t.equal(r.stderr, `gateway: ${join(dir, 'dist', 'cli.js')} is missing: run \`npm run build\` first\n`)
})
