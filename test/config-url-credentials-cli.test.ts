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

t.test('gateway validate accepts signed jwksUrl and tracing.otlp URLs, and quotes an unparsable one with its secret query values redacted', async t => {
  const dir = await mkdtemp(resolve(tmpdir(), 'gw-validate-query-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const signed = resolve(dir, 'signed.yaml')
  await writeFile(signed, `identity: { jwt: { jwksUrl: "https://idp.example/jwks.json?sig=Jwks-Sig-1&se=2030-01-01" } }
tracing: { otlp: "http://collector:4318/v1/traces?api_key=Otlp-Key-2" }
upstreams:
  b: { targets: [http://127.0.0.1:1] }
routes:
  - { name: a, pathPrefix: /, upstream: b }
`)
  const ok = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', signed], { encoding: 'utf8' })
  t.equal(ok.status, 0, `a signed URL is legitimate: ${ok.stdout}${ok.stderr}`)
  t.notMatch(ok.stdout + ok.stderr, /Jwks-Sig-1|Otlp-Key-2/, 'the secrets are printed nowhere')

  // port 99999 passes the schema's pattern and fails to parse: the message quotes the URL
  const broken = resolve(dir, 'broken.yaml')
  await writeFile(broken, `identity: { jwt: { jwksUrl: "https://idp.example:99999/jwks.json?token=Jwks-Token-3&kid=main" } }
tracing: { otlp: "http://collector:99999/?access_token=Otlp-Token-4" }
upstreams:
  b: { targets: [http://127.0.0.1:1] }
routes:
  - { name: a, pathPrefix: /, upstream: b }
`)
  const r = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', broken], { encoding: 'utf8' })
  const out = r.stdout + r.stderr
  t.equal(r.status, 1, 'gateway validate exits 1')
  t.match(out, `${broken}:1:29 identity.jwt.jwksUrl: invalid URL "https://idp.example:99999/jwks.json?token=[redacted]&kid=main"`)
  t.match(out, `${broken}:2:18 tracing.otlp: invalid URL "http://collector:99999/?access_token=[redacted]"`)
  t.notMatch(out, /Jwks-Token-3|Otlp-Token-4/, 'the secrets are printed nowhere')
})
