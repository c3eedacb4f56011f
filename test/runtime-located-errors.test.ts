// Issue 7 item 3: every config error is located. What a stage refuses while the runtime is compiled
// (route table, identity, trusted proxies, header rules, TLS files, the API key file) comes out as
// `file:line:col key.path: message` like the schema's errors, from `gateway validate` (which runs
// every one of those checks, TLS files included, like `nginx -t`) and from a SIGHUP reload, which
// keeps the old config serving and reports the located error in its log and reload history.
import t from 'tap'
import { execFile } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { childEnv, spawnGateway, writeConfig } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { writeSelfSigned } from './helpers/tls.js'

function validate (file: string): Promise<{ code: number, stdout: string, stderr: string }> {
  return new Promise(resolve => {
    execFile(process.execPath, ['bin/gateway', 'validate', '-c', file], { env: childEnv() }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : (err as { code?: number }).code ?? 1, stdout, stderr })
    })
  })
}

function makeCert (dir: string, name: string): { cert: string, key: string } {
  const cert = join(dir, `${name}-cert.pem`)
  const key = join(dir, `${name}-key.pem`)
  writeSelfSigned(cert, key, name)
  return { cert, key }
}

interface Case {
  readonly kind: string
  /** The file's text; `FILE` is the config file's own path, for files next to it. */
  readonly yaml: (upstream: string, dir: string) => string
  /** Written before validating (the API key file, certificates). */
  readonly prepare?: (dir: string) => void
  /** Where and what, after the file name: `:line:col key.path: message`. */
  readonly expect: (dir: string) => RegExp
}

const head = (upstream: string, more = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${more}upstreams:
  backend: { targets: [${upstream}] }
`

const CASES: Case[] = [
  {
    kind: 'route table',
    yaml: up => head(up) + 'routes:\n  - { name: api, pathPrefix: /a/../b/, upstream: backend }\n',
    expect: () => /^gateway\.yaml:6:30 routes\[0\]\.pathPrefix: path "\/a\/\.\.\/b\/" is not in normal form, write "\/b\/"$/
  },
  {
    kind: 'identity',
    yaml: up => head(up, 'identity: { jwt: { secret: too-short } }\n') + 'routes:\n  - { name: api, pathPrefix: /, upstream: backend }\n',
    expect: () => /^gateway\.yaml:3:18 identity\.jwt: jwt\.secret must be at least 32 bytes for HS256 \(RFC 7518 §3\.2\)$/
  },
  {
    kind: 'trusted proxies',
    yaml: up => head(up, 'trustedProxies: [10.0.0.0/8, 10.0.0.0/99]\n') + 'routes:\n  - { name: api, pathPrefix: /, upstream: backend }\n',
    expect: () => /^gateway\.yaml:3:30 trustedProxies\[1\]: "10\.0\.0\.0\/99" is not an IP address, a CIDR/
  },
  {
    kind: 'header rules',
    yaml: up => head(up) + 'routes:\n  - { name: api, pathPrefix: /, upstream: backend, headers: { request: { set: { x-a: "a\\rb" } } } }\n',
    expect: () => /^gateway\.yaml:6:\d+ routes\[0\]\.headers\.request\.set\.x-a: a header value cannot contain CR, LF/
  },
  {
    kind: 'TLS file missing',
    prepare: dir => { makeCert(dir, 'c') },
    yaml: (up, dir) => head(up, `tls: { cert: ${dir}/none.pem, key: ${dir}/c-key.pem }\n`) + 'routes:\n  - { name: api, pathPrefix: /, upstream: backend }\n',
    expect: dir => new RegExp(`^gateway\\.yaml:3:14 tls\\.cert: file not found: ${dir}/none\\.pem$`)
  },
  {
    kind: 'TLS cert and key not a pair',
    prepare: dir => {
      makeCert(dir, 'a')
      makeCert(dir, 'b')
    },
    yaml: (up, dir) => head(up, `tls: { cert: ${dir}/a-cert.pem, key: ${dir}/b-key.pem }\n`) + 'routes:\n  - { name: api, pathPrefix: /, upstream: backend }\n',
    expect: () => /^gateway\.yaml:3:6 tls: cert and key cannot be used together: .*key values mismatch/
  },
  {
    kind: 'identity.failureLimit with a window of 0s',
    yaml: up => head(up, 'identity: { header: x-user, failureLimit: { limit: 10, window: 0s } }\n') + 'routes:\n  - { name: api, pathPrefix: /, upstream: backend }\n',
    expect: () => /^gateway\.yaml:3:64 identity\.failureLimit\.window: must be from 1ms to 312749h \(2\^50 µs, what the limiter counts exactly\)$/
  },
  {
    kind: 'an inline API key written a level too high (never shown)',
    yaml: up => head(up, 'identity:\n  apiKeys:\n    header: x-api-key\n    k-live-def456: bob\n') + 'routes:\n  - { name: api, pathPrefix: /, upstream: backend }\n',
    expect: () => /^gateway\.yaml:6:5 identity\.apiKeys\.<key 2>: unknown key, not quoted as it may be an API key \(inline keys go under "keys"\)$/
  },
  {
    kind: 'YAML aliases that multiply (billion laughs)',
    yaml: up => head(up, 'a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n' + ['b', 'c', 'd', 'e', 'f', 'g', 'h', 'i'].map((n, i) => `${n}: &${n} [${Array(9).fill('*' + 'abcdefghi'[i]).join(', ')}]\n`).join('')) +
      'routes:\n  - { name: api, pathPrefix: /, upstream: backend }\n',
    expect: () => /^gateway\.yaml:6:\d+: aliases expand to more than \d+ copies of one anchor \(nested aliases multiply, as in a "billion laughs" document\): write fewer levels of aliases$/
  },
  {
    kind: 'API key file',
    prepare: dir => writeFileSync(join(dir, 'keys.yaml'), 'k-1: alice\nk-2: ""\n'),
    yaml: up => head(up, 'identity: { apiKeys: { header: x-api-key, file: keys.yaml } }\n') + 'routes:\n  - { name: api, pathPrefix: /, upstream: backend }\n',
    expect: dir => new RegExp(`^${dir}/keys\\.yaml:2:6 \\[1\\]: an API key must map to a consumer name$`)
  }
]

t.test('gateway validate locates every kind of compile error', async t => {
  const up = await startUpstream(t)
  for (const c of CASES) {
    const file = writeConfig(t, '')
    const dir = dirname(file)
    c.prepare?.(dir)
    writeFileSync(file, c.yaml(up.url, dir))
    const r = await validate(file)
    t.equal(r.code, 1, `${c.kind}: exit 1`)
    const lines = r.stderr.trim().split('\n').map(l => l.startsWith(dir + '/') && !l.startsWith(`${dir}/keys.yaml`) ? l.slice(dir.length + 1) : l)
    t.equal(lines.length, 1, `${c.kind}: one problem\n${r.stderr}`)
    t.match(lines[0], c.expect(dir), `${c.kind}: located`)
  }
})

t.test('a SIGHUP reload locates every kind of compile error, and the old config keeps serving', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, head(up.url) + 'routes:\n  - { name: ok, pathPrefix: /, upstream: backend }\n')
  const dir = dirname(gw.file)
  mkdirSync(dir, { recursive: true })
  let rejected = 0
  for (const c of CASES) {
    c.prepare?.(dir)
    writeFileSync(gw.file, c.yaml(up.url, dir))
    process.kill(gw.child.pid as number, 'SIGHUP')
    const seen = rejected
    const line = await gw.waitForLog(l => l.msg === 'reload rejected; the running configuration keeps serving' && gw.logs.filter(x => x.msg === l.msg).indexOf(l) === seen)
    rejected++
    const problems = (line.problems as string[]).map(p => p.startsWith(dir + '/') && !p.startsWith(`${dir}/keys.yaml`) ? p.slice(dir.length + 1) : p)
    t.equal(problems.length, 1, `${c.kind}: one problem`)
    t.match(problems[0], c.expect(dir), `${c.kind}: located in the log`)
    const view = await (await fetch(`${gw.adminUrl}/config`)).json() as { generation: number, lastReload: { ok: boolean, problems: string[] } }
    t.equal(view.lastReload.ok, false, `${c.kind}: the reload history says rejected`)
    t.same(view.lastReload.problems, line.problems, `${c.kind}: the reload history has the same located problem`)
    t.equal(view.generation, 1, `${c.kind}: generation 1 keeps serving`)
    const res = await fetch(`${gw.url}/still`)
    t.equal(res.status, 200, `${c.kind}: requests still pass on the old config`)
    await res.arrayBuffer()
  }
})
