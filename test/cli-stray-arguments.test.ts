// The config file is `-c FILE`. An operator who types `gateway validate prod.yaml` (as with
// `nginx -t`-like tools that take the file as an argument) got "gateway.yaml: ok" for the file in
// the current directory and exit 0, prod.yaml unread; `gateway start prod.yaml` served gateway.yaml.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { gateway } from './helpers/cli.js'
import { tempDir } from './helpers/teardown.js'

t.test('a word a command does not take is a usage error naming it, and nothing is read or started', async t => {
  const dir = tempDir(t, 'cli-stray')
  const bad = join(dir, 'prod.yaml')
  writeFileSync(bad, 'routes: 5\n')
  // validate fell back to the repository's valid ./gateway.yaml; start is pointed at a missing
  // file, so that without the check it fails at once instead of serving (reload shares the check)
  for (const command of ['validate', 'start']) {
    const fallback = command === 'validate' ? undefined : join(dir, 'missing.yaml')
    const r = await gateway([command, bad, '--pid-file', join(dir, 'pid')], { GATEWAY_CONFIG: fallback })
    t.equal(r.code, 2, `gateway ${command} FILE: exit 2`)
    t.equal(r.stdout, '', `gateway ${command} FILE: nothing on stdout`)
    t.equal(r.stderr, `gateway ${command}: unexpected argument "${bad}"; a config file is given with -c ${bad} (gateway ${command} --help)\n`)
  }
  const explain = await gateway(['explain', 'GET', 'http://x/api/echo', 'extra'])
  t.equal(explain.code, 2)
  t.equal(explain.stderr, 'gateway explain: unexpected argument "extra" (gateway explain --help)\n')
})

t.test('gateway limits with a client address given without --ip is a usage error, and nothing is asked', async t => {
  // an admin address nothing listens on: without the check this was exit 4 (unreachable), after
  // a reset request meant for 203.0.113.5 had been sent for no client named
  const r = await gateway(['limits', 'reset', '--route', 'login', '203.0.113.5', '--admin', '127.0.0.1:9', '--token', 't'])
  t.equal(r.code, 2)
  t.equal(r.stderr, 'gateway limits: unexpected argument "203.0.113.5" (a client is named with --ip ADDR or --user NAME; gateway limits --help)\n')
})

