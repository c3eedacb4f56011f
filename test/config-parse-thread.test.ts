// A long gateway.yaml or API key file is parsed and checked on a worker thread (src/config/load.ts
// loadConfigText, src/identify/api-key-file.ts, src/off-thread.ts): the same config or keys,
// the same located problems, and a reload of a large file no longer holds the serving thread while
// the yaml parser runs (for the key file: test/consumers-keyfile-large.test.ts).
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { ConfigError, PARSE_OFF_THREAD_CHARS, loadConfigText, parseConfigText } from '../src/config/load.js'
import { ApiKeyFileError, parseKeyFileText, readApiKeyFile } from '../src/identify/api-key-file.js'
import { spawnGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

const withRoutes = (upstream: string, n: number, extra = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams: { b: { targets: ["${upstream}"] } }
routes:
  - { name: all, pathPrefix: /, upstream: b }
${Array.from({ length: n }, (_, i) => `  - { name: r${i}, pathPrefix: /r${i}/, upstream: b, limits: { ip: { limit: 10, window: 1s } }${extra} }\n`).join('')}`

const problemsOf = async (load: () => Promise<unknown>): Promise<string[]> => {
  try {
    await load()
  } catch (err) {
    if (err instanceof ConfigError) return err.message.split('\n')
    throw err
  }
  return []
}

t.test('a long text: the same frozen config, hash and located problems as parsed in place', async t => {
  const text = withRoutes('${GW_TEST_UPSTREAM_HOST}:1', 400)
  t.ok(text.length >= PARSE_OFF_THREAD_CHARS, `${text.length} characters: parsed on the thread`)
  const env = { GW_TEST_UPSTREAM_HOST: 'http://10.0.0.9' }
  const off = await loadConfigText(text, 'gw.yaml', env)
  const inPlace = parseConfigText(text, 'gw.yaml', env)
  t.equal(off.config.upstreams.b?.targets[0]?.url, 'http://10.0.0.9:1', '${VAR} from the environment given')
  t.same(off.config, inPlace.config)
  t.equal(off.hash, inPlace.hash)
  t.ok(Object.isFrozen(off.config.routes[7]?.limits), 'frozen as loadConfigFile\'s config is')
  t.same(off.problemAt(['routes', 3, 'upstream'], 'checked later'), inPlace.problemAt(['routes', 3, 'upstream'], 'checked later'), 'a problem found while compiling is located in the text')

  const bad = withRoutes('http://127.0.0.1:1', 400).replace('name: r250,', 'name: r250, limitz: 1,')
  const expected = await problemsOf(async () => parseConfigText(bad, 'gw.yaml'))
  t.match(expected, [/^gw\.yaml:\d+:\d+ routes\[251\]\.limitz: unknown key "limitz"/])
  t.same(await problemsOf(async () => await loadConfigText(bad, 'gw.yaml')), expected, 'the thread\'s problems, located the same')
})

t.test('a long API key file: the same keys and located problems as parsed in place', async t => {
  const consumers = { plans: new Map([['alice', 'free']]), defaultPlan: null, known: new Set(['free']) }
  const lines = Array.from({ length: 2000 }, (_, i) => `key-${i}-abcdefghijklmnop: alice\n`)
  const text = lines.join('')
  t.ok(text.length >= PARSE_OFF_THREAD_CHARS, `${text.length} characters: parsed on the thread`)
  const read = async (): Promise<Buffer> => Buffer.from(text)
  const keys = await readApiKeyFile('keys.yaml', consumers, read)
  t.equal(keys.length, 2000)
  t.same(keys[1999], ['key-1999-abcdefghijklmnop', 'alice'])

  // problems of every kind the thread finds, and one the serving thread finds (an unknown consumer)
  lines[3] = '"spaced ": alice\n'
  lines[500] = 'key-500-x: 12e3\n'
  lines[900] = 'key-900-x: bob\n'
  lines[1500] = '"key-${X}": alice\n'
  const bad = lines.join('')
  const problemsOf = async (parse: () => Promise<unknown>): Promise<string[]> => {
    const err = await parse().then(() => null, (e: unknown) => e)
    return err instanceof ApiKeyFileError ? err.message.split('\n') : [`no ApiKeyFileError: ${String(err)}`]
  }
  const onThread = await problemsOf(async () => await readApiKeyFile('keys.yaml', consumers, async () => Buffer.from(bad)))
  t.match(onThread, [/^keys\.yaml:4:1 \[3\]: an API key must be non-empty/, /^keys\.yaml:501:12 \[500\]: consumer name: /, /^keys\.yaml:901:12 \[900\]: API key maps to consumer "bob"/, /^keys\.yaml:1501:1 \[1500\]: "\$\{" in an API key/])
  t.equal(onThread.length, 4)
  const inPlace = parseKeyFileText(bad, 'keys.yaml').filter(item => 'problem' in item).map(item => 'problem' in item ? `${item.problem.line}:${item.problem.column}` : '')
  t.same(inPlace, ['4:1', '501:12', '1501:1'], 'the problems the thread found are those found in place')
  t.same(await problemsOf(async () => await readApiKeyFile('keys.yaml', consumers, async () => Buffer.from(bad + 'key-0-abcdefghijklmnop: alice\n'))), [`keys.yaml:2001:1: ${'written twice in one map (first at line 1): one would silently replace the other; keep one'}`], 'a whole-file problem from the thread')
})

t.test('a reload of a large file: requests sent while it is parsed are answered at once', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, withRoutes(up.url, 0))
  // 15,000 routes, about 1.5 MB: the yaml parser takes seconds on it
  writeFileSync(gw.file, withRoutes(up.url, 15_000))
  const signalled = performance.now()
  gw.child.kill('SIGHUP')
  await new Promise(resolve => setTimeout(resolve, 300))
  const sent = performance.now()
  const res = await fetch(`${gw.url}/r5/x`)
  const answeredMs = performance.now() - sent
  t.equal(res.status, 200)
  await gw.waitForLog(l => l.msg === 'configuration reloaded', 120_000)
  const reloadMs = performance.now() - signalled
  t.ok(reloadMs > 3000, `the reload took ${Math.round(reloadMs)} ms`)
  t.ok(answeredMs < 1500, `answered in ${Math.round(answeredMs)} ms while the reload ran (parsed in place, it waited for the parser)`)
  t.equal((await fetch(`${gw.url}/r14999/x`)).status, 200, 'the new routes serve once swapped in')
})
