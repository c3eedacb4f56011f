// Issue 15 item 13: a header rule that node:http would refuse to send (CR/LF in a value, a name
// that is not a token) made every request on its route fail; `gateway validate` now rejects it,
// located, and a running gateway keeps its config when such a file is reloaded.
import t from 'tap'
import { execFile } from 'node:child_process'
import { childEnv, startGateway, writeConfig } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { writeFileSync } from 'node:fs'

function validate (file: string): Promise<{ code: number, stderr: string, stdout: string }> {
  return new Promise(resolve => {
    execFile(process.execPath, ['bin/gateway', 'validate', '-c', file], { env: childEnv() }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : (err as { code?: number }).code ?? 1, stdout, stderr })
    })
  })
}

const BAD = `upstreams:
  backend: { targets: [http://127.0.0.1:1] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    headers:
      request: { set: { x-a: "ok\\r\\nInjected: yes", "bad name": v, x-b: "tab\\tis fine" }, remove: ["x y"] }
      response: { set: { x-c: "lf\\nhere" } }
`

t.test('gateway validate: CR/LF in a header-rule value or an invalid header name is a located error', async t => {
  const file = writeConfig(t, BAD)
  const r = await validate(file)
  t.equal(r.code, 1)
  const lines = r.stderr.trim().split('\n')
  t.match(lines, [
    new RegExp(`^${file}:8:30 routes\\[0\\]\\.headers\\.request\\.set\\.x-a: a header value cannot contain CR, LF`),
    new RegExp(`^${file}:8:\\d+ routes\\[0\\]\\.headers\\.request\\.set\\.bad name: expected a header name`),
    new RegExp(`^${file}:8:\\d+ routes\\[0\\]\\.headers\\.request\\.remove\\[0\\]: expected a header name`),
    new RegExp(`^${file}:9:\\d+ routes\\[0\\]\\.headers\\.response\\.set\\.x-c: a header value cannot contain CR, LF`)
  ])
  t.equal(lines.length, 4, 'the tab is accepted')
})

t.test('a reload to such a file is rejected and the running config keeps serving', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend, headers: { request: { set: { x-env: prod } } } }
`)
  const runtime = gw.runtime
  if (runtime === null) throw new Error('no runtime')
  writeFileSync(runtime.file, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend, headers: { request: { set: { x-env: "prod\\r\\nx-injected: 1" } } } }
`)
  const result = await gw.reload()
  t.equal(result.ok, false)
  const res = await fetch(`${gw.url}/x`)
  t.equal(res.status, 200, 'requests still pass on the old config')
  const seen = await res.json() as { headers: Record<string, string> }
  t.equal(seen.headers['x-env'], 'prod')
  t.equal(seen.headers['x-injected'], undefined)
})
