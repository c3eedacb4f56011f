// A key repeated as other YAML: `1` (a number) and "1" (a string) are two keys to YAML, so its
// unique-keys check let them pass, but one key once read: the config's object and the API key
// table kept the later entry, and an API key mapped silently to the second consumer (the key file
// was refused, with a message that blamed an inline key and pointed into gateway.yaml).
import t, { type Test } from 'tap'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { startGateway } from './helpers/gateway.js'
import { ConfigError } from '../src/config/load.js'
import { tempDir } from './helpers/teardown.js'

function config (keys: string, file: string | null): string {
  return `listen: "127.0.0.1:0"
admin: 127.0.0.1:0
identity:
  apiKeys:
    header: x-api-key
    keys: ${keys}${file === null ? '' : `\n    file: ${file}`}
consumers:
  alice: { plan: free }
  bob: { plan: pro }
plans:
  free: { limits: { quota: { limit: 5, period: day } } }
  pro: { limits: { quota: { limit: 50, period: day } } }
upstreams:
  backend: { targets: ["http://127.0.0.1:1"] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
}

async function refusal (t: Test, yaml: string): Promise<string> {
  const err = await startGateway(t, yaml).then(() => null, (e: unknown) => e)
  t.ok(err instanceof ConfigError, 'the start is refused with a ConfigError')
  return (err as Error).message
}

t.test('an inline API key written as a number and as a string is a located error, not the later consumer\'s', async t => {
  const message = await refusal(t, config('{ 1: alice, "1": bob }', null))
  t.match(message, /gateway\.yaml:6:23 identity\.apiKeys\.keys\.<an API key>: written twice in one map \(first at line 6\)/, 'located at the repeat, the key named by its place, not printed')
  t.notMatch(message, /alice|bob|"1"/, 'neither the key nor its consumers')
})

t.test('a consumer written as a number and as a string is a located error', async t => {
  const message = await refusal(t, config('{ k-1: alice }', null).replace('  bob: { plan: pro }\n', '  bob: { plan: pro }\n  7: { plan: free }\n  "7": { plan: pro }\n'))
  t.match(message, /gateway\.yaml:11:3 consumers\.7: written twice in one map \(first at line 10\)/, 'located at the repeat, the key named')
})

t.test('the same in the key file is located in the key file', async t => {
  const file = join(tempDir(t, 'gw-keys'), 'api-keys.yaml')
  writeFileSync(file, 'k-2: alice\n1: alice\n"1": bob\n')
  const message = await refusal(t, config('{ k-1: alice }', file))
  t.equal(message, `${file}:3:1: written twice in one map (first at line 2): one would silently replace the other; keep one`, 'the key file\'s line, no key printed')
})
