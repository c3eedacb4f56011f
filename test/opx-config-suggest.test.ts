// Unknown keys name the key the operator most likely meant, also inside unions (identity,
// upstream targets), where zod alone only says "Invalid input".
import t from 'tap'
import { execFile } from 'node:child_process'
import { childEnv, writeConfig } from './helpers/gateway.js'

function validate (file: string): Promise<{ code: number, stderr: string }> {
  return new Promise(resolve => {
    execFile(process.execPath, ['bin/gateway', 'validate', '-c', file], { env: childEnv() }, (err, _stdout, stderr) => {
      resolve({ code: err === null ? 0 : (err as { code?: number }).code ?? 1, stderr })
    })
  })
}

t.test('unknown keys suggest the closest valid key, in plain objects and in unions', async t => {
  const file = writeConfig(t, `
upstreams:
  b: { targets: [{ url: "http://127.0.0.1:1", wieght: 2 }] }
routes:
  - name: r
    pathprefix: /api
    upstream: b
    limits:
      ip: { limit: 1, windw: 1s }
identity:
  apikeys: { header: x-api-key, keys: { k1: alice } }
`)
  const r = await validate(file)
  t.equal(r.code, 1)
  const lines = r.stderr.trim().split('\n')
  t.ok(lines.includes(`${file}:6:5 routes[0].pathprefix: unknown key "pathprefix" (did you mean pathPrefix?)`), r.stderr)
  t.ok(lines.includes(`${file}:9:23 routes[0].limits.ip.windw: unknown key "windw" (did you mean window?)`), r.stderr)
  t.ok(lines.includes(`${file}:3:47 upstreams.b.targets[0].wieght: unknown key "wieght" (did you mean weight?)`), r.stderr)
  t.ok(lines.includes(`${file}:11:3 identity.apikeys: unknown key "apikeys" (did you mean apiKeys?)`), r.stderr)
  t.notMatch(r.stderr, /Invalid input/, 'no bare union error')
})

t.test('a key far from every valid one gets no suggestion', async t => {
  const file = writeConfig(t, `
upstreams:
  b: { targets: ["http://127.0.0.1:1"] }
routes:
  - { name: r, pathPrefix: /, upstream: b, colour: blue }
`)
  const r = await validate(file)
  t.equal(r.code, 1)
  t.match(r.stderr, /routes\[0\]\.colour: unknown key "colour"\n/)
  t.notMatch(r.stderr, /did you mean/)
})
