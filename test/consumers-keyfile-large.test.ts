// Large key files and consumer lists: YAML's own check for repeated map keys compares each key
// with every earlier one of its map, so a key file of 20,000 lines took 18 s to parse (200,000:
// hours), and a SIGHUP that read it held every request of the gateway as long. Repeats are found
// in one pass now, with the same located error. Even so, parsing 20,000 lines takes 1 to 2.6 s:
// a key file of 32 KiB or more is parsed on a worker thread (src/off-thread.ts), and the
// gateway answers requests meanwhile.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { spawnGateway, startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import { ConfigError } from '../src/config/load.js'
import { tempDir } from './helpers/teardown.js'

const KEYS = 20_000

function keyLines (n: number): string {
  let text = ''
  for (let i = 0; i < n; i++) text += `key-${i}-abcdefghijklmnop: user${i % 1000}\n`
  return text
}

function config (upstream: string, keyFile: string): string {
  return `listen: "127.0.0.1:0"
admin: 127.0.0.1:0
identity:
  apiKeys:
    header: x-api-key
    keys: { k-inline: alice }
    file: ${keyFile}
  required: true
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
}

t.test('a key file of 20,000 keys is re-read on SIGHUP while requests go on being answered', async t => {
  const up = await startUpstream(t)
  const keyFile = join(tempDir(t, 'gw-keys'), 'api-keys.yaml')
  writeFileSync(keyFile, 'k-old: bob\n')
  const gw = await spawnGateway(t, config(up.url, keyFile))
  const status = async (key: string): Promise<number> => (await send(`${gw.url}/x`, { headers: { 'x-api-key': key } })).status
  t.equal(await status('k-old'), 200, 'the small file is in force')

  writeFileSync(keyFile, 'k-old: bob\n' + keyLines(KEYS))
  const started = performance.now()
  gw.child.kill('SIGHUP')
  const reloaded = gw.waitForLog(l => l.msg === 'configuration reloaded', 30_000)
  let done = false
  void reloaded.then(() => { done = true }, () => { done = true })
  // requests sent while the file is read are answered as they come, not after the reload
  let slowest = 0
  let answered = 0
  while (!done) {
    const sent = performance.now()
    const got = await status('k-inline')
    if (got !== 200) t.equal(got, 200, 'a request during the reload is admitted')
    slowest = Math.max(slowest, performance.now() - sent)
    answered++
  }
  await reloaded
  t.ok(performance.now() - started < 30_000, `the reload took ${Math.round(performance.now() - started)} ms`)
  t.ok(slowest < 5000, `the slowest request during the reload took ${Math.round(slowest)} ms`)
  // parsed on the serving thread, the file held every request: 4 were answered, before and after
  t.ok(answered >= 50, `${answered} requests were answered one after another during the reload`)
  t.equal(await status(`key-${KEYS - 1}-abcdefghijklmnop`), 200, 'the last key of the file works')

  // a repeated key is still a located error, found as fast
  writeFileSync(keyFile, 'k-old: bob\n' + keyLines(KEYS) + 'k-old: carol\n')
  gw.child.kill('SIGHUP')
  const rejected = await gw.waitForLog(l => l.msg === 'reload rejected; the running configuration keeps serving', 10_000)
  t.same(rejected.problems, [`${keyFile}:${KEYS + 2}:1: written twice in one map (first at line 1): one would silently replace the other; keep one`], 'the repeat is located, the key not printed')
  t.equal(await status('k-old'), 200, 'the keys in force keep working')
})

t.test('gateway.yaml with 40,000 consumers starts in seconds', async t => {
  const up = await startUpstream(t)
  let consumers = ''
  for (let i = 0; i < 40_000; i++) consumers += `  user${i}: { plan: ${i % 2 === 0 ? 'free' : 'pro'} }\n`
  const yaml = `listen: "127.0.0.1:0"
admin: 127.0.0.1:0
identity: { header: x-user-id }
consumers:
${consumers}plans:
  free: { limits: { quota: { limit: 5, period: day } } }
  pro: { limits: { quota: { limit: 50, period: day } } }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
  const started = performance.now()
  const gw = await startGateway(t, yaml)
  const ms = performance.now() - started
  t.ok(ms < 20_000, `started in ${Math.round(ms)} ms`)
  const res = await send(`${gw.url}/x`, { headers: { 'x-user-id': 'user39999' } })
  t.equal(res.status, 200, 'the last consumer is admitted')
  t.match(res.headers['ratelimit-policy'], '"pro:quota";q=50', 'on its plan')

  const repeated = yaml.replace('consumers:\n', 'consumers:\n  user1: { plan: free }\n')
  const err = await startGateway(t, repeated).then(() => null, (e: unknown) => e)
  t.ok(err instanceof ConfigError, 'a consumer given twice is refused')
  t.match((err as Error).message, /gateway\.yaml:7:3 consumers\.user1: written twice in one map \(first at line \d+\)/, 'located at the repeat, the consumer named')
})
