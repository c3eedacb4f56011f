// identity.apiKeys.file (issue 9): more "key: consumer" lines outside gateway.yaml, re-read on
// SIGHUP by a real `bin/gateway` process; a bad file is a located error and the old keys keep working.
import t, { type Test } from 'tap'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { spawnGateway, startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import { ConfigError } from '../src/config/load.js'
import { tempDir } from './helpers/teardown.js'

function config (upstream: string, keyFile: string): string {
  return `listen: "127.0.0.1:0"
admin: 127.0.0.1:0
identity:
  apiKeys:
    header: x-api-key
    keys: { k-inline: alice }
    file: ${keyFile}
  required: true
consumers:
  alice: { plan: pro }
  bob: { plan: free }
plans:
  free: { limits: { user: { algorithm: sliding-window-log, limit: 1, window: 1h } } }
  pro: { limits: { user: { algorithm: sliding-window-log, limit: 5, window: 1h } } }
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
}

/** Starts a gateway that must refuse `yaml`: the ConfigError it throws. */
async function startRefused (t: Test, yaml: string): Promise<ConfigError> {
  const err = await startGateway(t, yaml).then(() => null, (e: unknown) => e)
  t.ok(err instanceof ConfigError, 'the start is refused with a ConfigError')
  return err as ConfigError
}

t.test('the key file is re-read on SIGHUP; a bad one is rejected with its location and the old keys keep working', async t => {
  const up = await startUpstream(t)
  const dir = tempDir(t, 'gw-keys')
  const keyFile = join(dir, 'api-keys.yaml')
  writeFileSync(keyFile, 'k-bob-1: bob\n')
  const gw = await spawnGateway(t, config(up.url, keyFile))
  const status = async (key: string): Promise<number> => (await send(`${gw.url}/x`, { headers: { 'x-api-key': key } })).status
  t.equal(await status('k-bob-1'), 200, 'a key from the file')
  t.equal(await status('k-bob-1'), 429, 'bob is on free (1 an hour): the file\'s consumer has its plan')
  t.equal(await status('k-inline'), 200, 'inline keys work beside the file')
  t.equal(await status('k-bob-2'), 401, 'not in the file yet')

  writeFileSync(keyFile, 'k-bob-2: bob\nk-alice-2: alice\n')
  gw.child.kill('SIGHUP')
  await gw.waitForLog(l => l.msg === 'configuration reloaded')
  t.equal(await status('k-alice-2'), 200, 'a key added to the file works after SIGHUP')
  t.equal(await status('k-bob-1'), 401, 'a key removed from the file is refused after SIGHUP')

  writeFileSync(keyFile, 'k-alice-3: alice\nk-zoe: zoe\n')
  gw.child.kill('SIGHUP')
  const rejected = await gw.waitForLog(l => l.msg === 'reload rejected; the running configuration keeps serving')
  t.same(rejected.problems, [`${keyFile}:2:8 [1]: API key maps to consumer "zoe", which has no entry in consumers (and there is no defaultPlan)`], 'located in the key file, the key itself not printed')
  t.equal(await status('k-alice-2'), 200, 'the previous keys keep working')
  t.equal(await status('k-alice-3'), 401, 'nothing of the bad file was taken')
})

t.test('a missing or malformed key file stops the start with a located error', async t => {
  const up = await startUpstream(t)
  const dir = tempDir(t, 'gw-keys')
  const missing = join(dir, 'nope.yaml')
  await t.rejects(startGateway(t, config(up.url, missing)), new ConfigError([{ file: missing, line: 0, column: 0, path: '', message: 'API key file not found' }]))
  const bad = join(dir, 'bad.yaml')
  writeFileSync(bad, 'k-1: alice\nk-1: bob\n')
  const err = await startRefused(t, config(up.url, bad))
  t.match(err.message, new RegExp(`^${bad.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:2:1: written twice in one map \\(first at line 1\\)`))
  const empty = join(dir, 'empty.yaml')
  writeFileSync(empty, 'k-1:\n')
  const err2 = await startRefused(t, config(up.url, empty))
  t.match(err2.message, `${empty}:1:5 [0]: an API key must map to a consumer name`)
})

t.test('a key with a character no header carries as written is refused, located, without printing it', async t => {
  const up = await startUpstream(t)
  const file = join(tempDir(t, 'gw-keys'), 'keys.yaml')
  // node reads a header's bytes as Latin-1: a key with a character above U+00FF never matched,
  // nor one with a control character; Latin-1 and a tab inside do (a header carries them)
  writeFileSync(file, 'k-ok: alice\n"ключ-0001": alice\n"bell\\x07key": alice\n"clé-0002": alice\n"tab\\tkey": alice\n')
  const err = await startRefused(t, config(up.url, file))
  t.same(err.problems.map(p => `${p.line}:${p.column} ${p.path}: ${p.message}`), [2, 3].map(line =>
    `${line}:1 [${line - 1}]: an API key must be characters a header carries as written (visible ASCII or Latin-1, spaces and tabs inside): a character above U+00FF could never match`))
  t.notMatch(err.message, /ключ/, 'the keys are not printed')
  writeFileSync(file, 'k-ok: alice\n"clé-0002": alice\n"tab\\tkey": alice\n')
  const gw = await startGateway(t, config(up.url, file))
  t.equal((await send(`${gw.url}/x`, { headers: { 'x-api-key': 'clé-0002' } })).status, 200, 'a Latin-1 key matches the bytes a client sends')
  t.equal((await send(`${gw.url}/x`, { headers: { 'x-api-key': 'tab\tkey' } })).status, 200, 'so does one with a tab inside')
})

t.test('a key the YAML reads as null or a number is refused, located, without printing it (": eve" made "null" a key)', async t => {
  const up = await startUpstream(t)
  const dir = tempDir(t, 'gw-keys')
  const file = join(dir, 'keys.yaml')
  // the line an empty shell variable writes, a key YAML reads as 7123456789, one it reads as 1000,
  // and a consumer name it reads as 7
  writeFileSync(file, ': alice\n007123456789: alice\n1e3: bob\nk-ok: 007\n')
  const err = await startRefused(t, config(up.url, file))
  t.same(err.problems.map(p => `${p.line}:${p.column} ${p.path}: ${p.message}`), [
    '1:1 [0]: this API key: YAML reads it as null (an empty key, ~ or null): quote it, or remove the line',
    '2:1 [1]: this API key: YAML reads it as a number, not as the text written: quote it',
    '3:1 [2]: this API key: YAML reads it as a number, not as the text written: quote it',
    '4:7 [3]: consumer name: YAML reads it as the number 7, not as the text written: quote it'
  ])
  t.notMatch(err.message, /7123456789|1000/, 'the keys are not printed')
  // quoted, they are the text written; a number written as YAML reads it is that text
  writeFileSync(file, '"007123456789": alice\n123456: bob\n')
  const gw = await startGateway(t, config(up.url, file))
  const status = async (key: string): Promise<number> => (await send(`${gw.url}/x`, { headers: { 'x-api-key': key } })).status
  t.equal(await status('007123456789'), 200)
  t.equal(await status('7123456789'), 401)
  t.equal(await status('123456'), 200)
  t.equal(await status('null'), 401)
})

t.test('a key both inline and in the file for another consumer is a config error; for the same one it is accepted', async t => {
  const up = await startUpstream(t)
  const dir = tempDir(t, 'gw-keys')
  const file = join(dir, 'keys.yaml')
  writeFileSync(file, 'k-other: bob\nk-inline: bob\n')
  const err = await startRefused(t, config(up.url, file))
  t.match(err.message, 'an API key is given twice: in identity.apiKeys.keys for consumer "alice" and in the key file (entry [1]) for "bob"')
  writeFileSync(file, 'k-inline: alice\n')
  const gw = await startGateway(t, config(up.url, file))
  t.equal((await send(`${gw.url}/x`, { headers: { 'x-api-key': 'k-inline' } })).status, 200)
})

t.test('a consumer name over 256 characters in the key file is located at its entry', async t => {
  const up = await startUpstream(t)
  const file = join(tempDir(t, 'gw-keys'), 'api-keys.yaml')
  writeFileSync(file, `k-bob-1: bob\nk-long: ${'u'.repeat(257)}\n`)
  // with a defaultPlan, so that the name's length is the one problem
  const err = await startRefused(t, config(up.url, file).replace('plans:', 'defaultPlan: free\nplans:'))
  t.equal(err.message, `${file}:2:9 [1]: a consumer name has at most 256 characters`, 'the key file\'s line and entry, as its other problems')
})

t.test('an inline key\'s consumer name over 256 characters is located at the key, not printed', async t => {
  const up = await startUpstream(t)
  const file = join(tempDir(t, 'gw-keys'), 'api-keys.yaml')
  writeFileSync(file, 'k-bob-1: bob\n')
  const yaml = config(up.url, file).replace('plans:', 'defaultPlan: free\nplans:').replace('keys: { k-inline: alice }', `keys: { k-inline: alice, k-long: ${'u'.repeat(257)} }`)
  const err = await startRefused(t, yaml)
  t.match(err.message, /gateway\.yaml:6:38 identity\.apiKeys\.keys\.<an API key>: a consumer name has at most 256 characters$/)
})
