// `gateway validate` (bin/gateway as a real process) on a file whose JWKS and OTLP collector URLs
// hold credentials: refused with located messages, and the password is printed nowhere.
import t from 'tap'
import { spawnSync } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { resolve } from 'node:path'

t.test('gateway validate refuses credentials in jwksUrl and tracing.otlp without printing them', async t => {
  const dir = await mkdtemp(resolve(tmpdir(), 'gw-validate-credentials-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const file = resolve(dir, 'gateway.yaml')
  await writeFile(file, `identity: { jwt: { jwksUrl: "https://kid:s3cret@idp.example/jwks.json" } }
tracing: { otlp: "http://otel:pw-2@collector:4318" }
upstreams:
  b: { targets: [http://127.0.0.1:1] }
routes:
  - { name: a, pathPrefix: /, upstream: b }
`)
  const r = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', file], { encoding: 'utf8' })
  const out = r.stdout + r.stderr
  t.not(r.status, 0, 'gateway validate exits with a failure')
  t.match(out, `${file}:1:29 identity.jwt.jwksUrl: a JWKS URL may not hold credentials (user:password@)`)
  t.match(out, `${file}:2:18 tracing.otlp: an OTLP collector URL may not hold credentials (user:password@)`)
  t.match(out, 'an OTLP/HTTP collector takes its credentials in a header (e.g. Authorization), not in the URL')
  t.notMatch(out, /s3cret|pw-2/, 'the passwords are printed nowhere')
})
