// `gateway validate` (bin/gateway as a real process) on files that YAML reads otherwise than they
// look: each was accepted, and the gateway would have run something the operator did not write.
import t, { type Test } from 'tap'
import { spawnSync } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { dirname, resolve } from 'node:path'

const ROUTES = `upstreams:
  b: { targets: [http://127.0.0.1:1] }
routes:
  - { name: a, pathPrefix: /, upstream: b }
`

async function validate (t: Test, text: string | Buffer): Promise<{ status: number | null, out: string, file: string }> {
  const dir = await mkdtemp(resolve(tmpdir(), 'gw-yaml-edges-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const file = resolve(dir, 'gateway.yaml')
  await writeFile(file, text)
  const r = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', file], { encoding: 'utf8' })
  return { status: r.status, out: r.stdout + r.stderr, file }
}

t.test('a custom tag (!env NAME) is a located error, not the literal text as an admin token', async t => {
  const r = await validate(t, `admin: { listen: 127.0.0.1:9901, token: !env GATEWAY_ADMIN_TOKEN }\n${ROUTES}`)
  t.equal(r.status, 1, r.out)
  // a secret's place: the tag is not quoted, as a secret written unquoted that starts with "!" reads as one
  t.equal(r.out, `${r.file}:1:46 admin.token: unknown tag at the start of a secret (not quoted here; quote a secret that starts with "!"): it would be dropped and the text after it taken as written (write \${VAR} for a value from the environment)\n`)
  const fn = await validate(t, `upstreams:\n  b: { targets: [http://127.0.0.1:1] }\nroutes:\n  - { name: !!js/function a, pathPrefix: /, upstream: b }\n`)
  t.equal(fn.status, 1, fn.out)
  t.match(fn.out, `${fn.file}:4:27 routes[0].name: unknown tag !!js/function:`)
  const core = await validate(t, `workers: !!int 1\n${ROUTES.replace('upstream: b', 'upstream: !!str b')}`)
  t.equal(core.status, 0, `the core schema's own tags still read: ${core.out}`)
})

t.test('local.window of 0 (a level that never limited) or past 2^50 µs (Retry-After: 3.6e+26) is a located error', async t => {
  for (const window of ['0s', '99999999999999999999999h']) {
    const r = await validate(t, `local: { limit: 1, window: ${window} }\n${ROUTES}`)
    t.equal(r.status, 1, r.out)
    t.equal(r.out, `${r.file}:1:28 local.window: must be from 1ms to 312749h (2^50 µs, the longest window a limit takes): 0 would refill the bucket at once, so the level would never limit\n`)
  }
  const ok = await validate(t, `local: { limit: 1, window: 312749h }\n${ROUTES}`)
  t.equal(ok.status, 0, ok.out)
})

t.test('a "__proto__" key is an unknown key, not a prototype the schema reads keys through', async t => {
  // before: accepted, and the gateway ran with workers: 4
  const r = await validate(t, `__proto__: { workers: 4 }\n${ROUTES}`)
  t.equal(r.status, 1, r.out)
  t.equal(r.out, `${r.file}:1:1 __proto__: unknown key "__proto__"\n`)
})

t.test('bytes that are not UTF-8 are a located error, not a jwt.secret silently changed to U+FFFD', async t => {
  const latin1 = Buffer.concat([Buffer.from('identity: { jwt: { secret: "caf'), Buffer.from([0xe9]), Buffer.from(`-0123456789abcdef0123456789abcdef" } }\n${ROUTES}`)])
  const r = await validate(t, latin1)
  t.equal(r.status, 1, r.out)
  t.equal(r.out, `${r.file}:1:32: the file is not UTF-8 here (bytes read as U+FFFD, the replacement character): save it as UTF-8\n`)
  const utf8 = await validate(t, `identity: { jwt: { secret: "café-0123456789abcdef0123456789abcdef" } }\n${ROUTES}`)
  t.equal(utf8.status, 0, utf8.out)
})

t.test('listen without a port is one problem, not also "the port must be at most 65535"', async t => {
  const r = await validate(t, `listen: localhost\n${ROUTES}`)
  t.equal(r.status, 1, r.out)
  t.equal(r.out, `${r.file}:1:9 listen: expected "host:port", e.g. "0.0.0.0:8080"\n`)
})

t.test('a custom tag in the API key file is a located error, not the key "PROD_KEY_VARIABLE_1"', async t => {
  const r = await validate(t, `identity: { apiKeys: { header: x-api-key, file: keys.yaml } }\n${ROUTES}`)
  t.equal(r.status, 1, 'keys.yaml is not written yet')
  const keys = resolve(dirname(r.file), 'keys.yaml')
  await writeFile(keys, '!env PROD_KEY_VARIABLE_1: alice\n')
  const again = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', r.file], { encoding: 'utf8' })
  t.equal(again.status, 1, again.stdout)
  t.equal(again.stderr, `${keys}:1:6 [0]: unknown tag !env: it would be dropped and the text after it taken as written (this file substitutes nothing)\n`)
})

t.test('a list as a key (? [a, b]) is located, without a Node warning on stderr', async t => {
  const r = await validate(t, `listen: 127.0.0.1:8080\n? [a, b]\n: 1\n${ROUTES}`)
  t.equal(r.status, 1, r.out)
  t.equal(r.out, `${r.file}:2:3: a key must be a name, not a list or a map\n`)
})
