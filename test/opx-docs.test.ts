// The README is a contract: every block marked `<!-- runnable -->` runs (YAML validates, console
// sessions print exactly what they show), the 429 example matches a real 429, every metric and
// config key it names exists, and the claims about /config and ${VAR} hold.
import t from 'tap'
import { readFileSync, symlinkSync, writeFileSync } from 'node:fs'
import { execFile } from 'node:child_process'
import { join, resolve } from 'node:path'
import { tempDir } from './helpers/teardown.js'
import { childEnv, startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { startRedis } from './helpers/redis.js'
import { parseConfigText, ConfigError } from '../src/config/load.js'
import { ERRORS, errorBodyCode, type ErrorCode } from '../src/errors.js'

const README = readFileSync('README.md', 'utf8')

interface Block { lang: string, body: string, line: number }

function marked (marker: RegExp): Block[] {
  const out: Block[] = []
  const re = /<!-- ([^>]*) -->\n```(\w*)\n([\s\S]*?)```/g
  for (const m of README.matchAll(re)) {
    if (!marker.test(m[1] as string)) continue
    out.push({ lang: m[2] as string, body: m[3] as string, line: README.slice(0, m.index).split('\n').length + 1 })
  }
  return out
}

function sh (command: string, path: string): Promise<string> {
  return new Promise(resolve => {
    // stderr into the same stream, in order, as a terminal shows it
    execFile('sh', ['-c', `${command} 2>&1`], { env: childEnv({ PATH: path }) }, (_err, stdout) => resolve(stdout))
  })
}

t.test('every runnable README block runs as shown', async t => {
  const blocks = marked(/^runnable$/)
  t.ok(blocks.length >= 3, `${blocks.length} runnable blocks`)
  const dir = tempDir(t, 'gw-docs')
  // `gateway` on PATH, as after `npm install -g` or inside `npx`
  symlinkSync(resolve('bin/gateway'), join(dir, 'gateway'))
  const path = `${dir}:${process.env.PATH ?? ''}`
  for (const block of blocks) {
    if (block.lang === 'yaml') {
      const file = join(dir, `readme-${block.line}.yaml`)
      writeFileSync(file, block.body)
      const out = await sh(`gateway validate -c ${file}`, path)
      t.match(out, /: ok \(/, `README.md:${block.line}: the YAML block is a valid config\n${out}`)
    } else if (block.lang === 'console') {
      // `$ command` lines, each followed by exactly the output it prints
      const sessions = block.body.split(/^\$ /m).slice(1)
      t.ok(sessions.length > 0, `README.md:${block.line}: has commands`)
      for (const session of sessions) {
        const [command, ...expected] = session.replace(/\n$/, '').split('\n')
        const out = await sh(command as string, path)
        t.equal(out.replace(/\n$/, ''), expected.join('\n'), `README.md:${block.line}: $ ${command as string}`)
      }
    } else {
      t.fail(`README.md:${block.line}: a runnable block must be yaml or console, not "${block.lang}"`)
    }
  }
})

t.test('the README 429 example has the headers and exactly the body fields of a real 429', async t => {
  const [example] = marked(/^checked: a real 429/)
  t.ok(example !== undefined, 'the example is marked')
  const lines = (example as Block).body.trim().split('\n')
  const body = JSON.parse(lines.at(-1) as string) as Record<string, unknown>
  const headers = lines.slice(1, -1).map(l => (l.split(':')[0] as string).toLowerCase())
  t.ok(Number.isInteger(body.retryAfterMs), 'the example shows retryAfterMs as an integer')

  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
limits:
  ip: { limit: 1, window: 1m }
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  t.equal((await fetch(`${gw.url}/x`)).status, 200)
  const res = await fetch(`${gw.url}/x`)
  t.equal(res.status, 429)
  for (const h of headers) t.ok(res.headers.has(h), `a real 429 has ${h}`)
  const real = await res.json() as Record<string, unknown>
  t.same(Object.keys(real).sort(), Object.keys(body).sort(), 'the same body fields')
  for (const [k, v] of Object.entries(body)) t.equal(typeof real[k], typeof v, `${k} has the example's type`)
  t.ok(Number.isInteger(real.retryAfterMs), 'retryAfterMs is an integer')
  t.equal(real.limit, body.limit, 'limit names the limit as in the example')
})

t.test('every error code a client or an admin caller can get is a row of the README\'s Errors table, with its status', async t => {
  // thrown while a config is compiled, and reported as a located config error, never as a body
  const notAnswered = new Set<ErrorCode>(['GW_ERR_CONFIG_INVALID'])
  const table = README.slice(README.indexOf('### Errors'), README.indexOf('## Forwarding'))
  for (const code of Object.keys(ERRORS) as ErrorCode[]) {
    if (notAnswered.has(code)) continue
    const row = table.split('\n').find(l => l.startsWith(`| \`${errorBodyCode(code)}\` |`))
    t.ok(row !== undefined, `${errorBodyCode(code)} has a row`)
    if (row === undefined) continue
    const statuses: string[] = (row.split('|')[2] ?? '').match(/\d{3}/g) ?? []
    t.ok(statuses.includes(String(ERRORS[code].status)), `${errorBodyCode(code)}: the row names ${ERRORS[code].status} (${statuses.join(', ')})`)
  }
})

t.test('every metric the README names is on /metrics; every config key is documented', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const exposition = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  const exposed = new Set([...exposition.matchAll(/^# TYPE (\S+)/gm)].map(m => m[1]))
  const named = new Set([...README.matchAll(/`(gateway_[a-z_]+)/g)].map(m => m[1] as string))
  t.ok(named.size >= 15, `${named.size} metrics named`)
  // the workers primary's own lines, asserted on its /metrics by test/workers-lifecycle.test.ts
  const primaryOnly = new Set(['gateway_workers_scraped'])
  for (const name of named) if (!primaryOnly.has(name)) t.ok(exposed.has(name), `${name} (README) is on /metrics`)

  const schema = JSON.parse(readFileSync('gateway.schema.json', 'utf8')) as unknown
  const keys = new Set<string>()
  const walk = (n: unknown): void => {
    if (Array.isArray(n)) return n.forEach(walk)
    if (n === null || typeof n !== 'object') return
    const props = (n as { properties?: Record<string, unknown> }).properties
    if (props !== undefined) for (const k of Object.keys(props)) keys.add(k)
    for (const v of Object.values(n)) walk(v)
  }
  walk(schema)
  keys.delete('$schema')
  for (const key of keys) {
    // as a YAML key (`key:`) in a block or inline map, or in backticks in the text
    const documented = new RegExp(`(^|[\\s{,\\-\`])${key}:( |$)|\`([\\w.]+\\.)?${key}\``, 'm').test(README)
    t.ok(documented, `config key "${key}" is documented in README.md`)
  }
})

t.test('/config shows the config in force: defaults written in, secrets redacted', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { jwt: { secret: "0123456789abcdef0123456789abcdef" } }
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    limits:
      ip: { limit: 5, window: 1s }
`)
  const body = await (await fetch(`${gw.adminUrl}/config`)).json() as { config: Record<string, any> } // eslint-disable-line @typescript-eslint/no-explicit-any
  const c = body.config
  t.match(c.server, { headersTimeout: '10s', requestTimeout: '5m', keepAliveTimeout: '5s', shutdownTimeout: '10s', maxHeaderSize: 16384 })
  t.match(c.upstreams.backend, { targets: [{ url: up.url, weight: 1 }], timeouts: { connect: '2s', response: '30s', idle: '1m' }, ejectFor: '10s', consecutiveFailures: 5, maxConnections: 256 })
  t.match(c.routes[0].limits.ip, { limit: 5, window: '1s', algorithm: 'gcra', burst: 5, cost: 1, mode: 'enforce', status: 429, onError: 'local' })
  t.match(c.routes[0], { websocket: false, timeouts: { response: '30s' } })
  t.match(c.identity, { jwt: { secret: '[redacted]', claim: 'sub', header: 'authorization' }, required: false, failureLimit: { limit: 10, window: '1m' } })
  t.match(c.log, { level: 'info', redactQuery: ['token', 'key', 'api_key', 'password', 'secret', 'signature'] })
  t.equal(c.ipv6Prefix, 64)
})

t.test('/config writes in the defaults a runtime stage applied beyond the file: PROXY protocol, CORS, a static answer\'s type, admin reads, route auth, Redis, upstream queue, compression', async t => {
  const up = await startUpstream(t)
  const redis = await startRedis(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0, token: t0ken-for-the-test }
proxyProtocol: { from: [10.0.0.0/8] }
redis: { url: "${redis.url}" }
identity: { header: x-user }
compression: {}
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - { name: gone, path: /gone, respond: { status: 410, body: retired } }
  - { name: empty, path: /empty, respond: { status: 204 } }
  - name: api
    pathPrefix: /
    upstream: backend
    cors: { origins: ["https://app.example"] }
`)
  const body = await (await fetch(`${gw.adminUrl}/config`)).json() as { config: Record<string, any> } // eslint-disable-line @typescript-eslint/no-explicit-any
  const c = body.config
  t.same(c.proxyProtocol, { from: ['10.0.0.0/8'], timeout: '5s' }, 'proxyProtocol.timeout')
  t.same(c.routes[2].cors, { origins: ['https://app.example'], exposeHeaders: [], credentials: false, maxAge: '10m' }, 'cors: exposeHeaders, credentials, maxAge (methods and headers absent: the preflight\'s are mirrored)')
  t.same(c.routes[0].respond, { status: 410, body: 'retired', contentType: 'text/plain; charset=utf-8' }, 'an answer with a body: its type')
  t.same(c.routes[1].respond, { status: 204 }, 'an answer without a body is sent without a type')
  t.same([c.admin.reads, c.admin.token], ['open', '[redacted]'], 'admin.reads')
  t.same(c.routes.map((r: { auth?: string }) => r.auth), ['optional', 'optional', 'optional'], 'each route\'s auth: identity.required\'s')
  t.match(c.redis, { timeout: '50ms', onError: 'local', keyPrefix: 'gw', expectedInstances: 1, autoPipelining: false })
  t.match(c.upstreams.backend, { timeouts: { queue: '10s' }, maxPending: 1024 })
  t.same(c.compression, { encodings: ['br', 'gzip'], minSize: 1024, types: c.compression.types, gzipLevel: 5, maxConcurrent: 256, brotliQuality: 4 })
  t.ok(c.compression.types.includes('application/json'), 'the compressed types listed')
  t.equal(c.quotaTimezone, undefined, 'quotaTimezone stays absent: written as UTC, it would name other quota keys (README)')
  t.match(c.redis, { tls: false, sentinelTls: false })
  t.match(c.server, { bufferBodies: 1024 * 1024, bufferBodiesTotal: 64 * 1024 * 1024, clientBodyTimeout: '1m', sendTimeout: '1m', websocketIdleTimeout: '5m', maxWebSockets: 10_000, maxConnectionsPerClient: null })
})

t.test('/config: the admin address and the local level\'s defaults (README, Configuration reference)', async t => {
  const { config } = parseConfigText('local: { limit: 7, window: 1s }\nupstreams: { b: { targets: [http://127.0.0.1:1] } }\nroutes:\n  - { name: a, pathPrefix: /, upstream: b }\n', 'gw.yaml', {})
  t.equal(config.admin, '127.0.0.1:9901', 'admin: loopback, 9901')
  t.same([config.local?.burst, config.local?.maxKeys], [7, 100_000], 'local: burst = limit, maxKeys 100000')
})

t.test('${VAR} is substituted in string values and API-key map keys, never into numbers', async t => {
  const yaml = `
upstreams:
  backend: { targets: ["\${BACKEND:-http://127.0.0.1:3000}"] }
identity:
  apiKeys: { header: x-api-key, keys: { "\${API_KEY}": alice } }
routes:
  - { name: api, pathPrefix: /, upstream: backend, limits: { ip: { limit: LIMIT_HERE, window: 1m } } }
`
  const ok = parseConfigText(yaml.replace('LIMIT_HERE', '5'), 'g.yaml', { API_KEY: 'k1' })
  // the loaded config has its defaults applied: a target is written as { url, weight }
  t.same((ok.config.upstreams.backend?.targets[0]), { url: 'http://127.0.0.1:3000', weight: 1 }, 'a string value takes the default')
  const identity = ok.config.identity as { apiKeys: { keys: Record<string, string> } }
  t.same(Object.keys(identity.apiKeys.keys), ['k1'], 'an API key from the environment (issue 9)')
  const err = (() => {
    try { parseConfigText(yaml.replace('LIMIT_HERE', '"${LIMIT:-5}"'), 'g.yaml', { API_KEY: 'k1' }); return null } catch (e) { return e }
  })()
  t.ok(err instanceof ConfigError, 'a number from a variable is rejected')
  t.match((err as ConfigError).message, /^g\.yaml:7:\d+ routes\[0\]\.limits\.ip\.limit: .*expected number, received string/m)
})
