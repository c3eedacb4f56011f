// bin/gateway as a real process: SIGHUP reload (valid, invalid, with requests in flight),
// SIGTERM drain, `validate`, `schema`, `reload`, and TLS termination with a certificate re-read on SIGHUP.
import t from 'tap'
import http, { createServer, type Server } from 'node:http'
import { writeFileSync, readFileSync } from 'node:fs'
import { execFileSync, spawnSync } from 'node:child_process'
import { join } from 'node:path'
import { tempDir } from './helpers/teardown.js'
import { writeSelfSigned } from './helpers/tls.js'
import { request as httpsRequest } from 'node:https'
import type { AddressInfo } from 'node:net'
import { childEnv, spawnGateway } from './helpers/gateway.js'

/** An upstream that answers `<name>` after `?delay=ms`. */
async function upstream (name: string): Promise<{ server: Server, url: string }> {
  const server = createServer((req, res) => {
    const delay = Number(new URL(req.url ?? '/', 'http://x').searchParams.get('delay') ?? 0)
    setTimeout(() => res.end(name), delay).unref() // a hung request must not keep the test process alive
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }
}

const config = (target: string, extra = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
server: { shutdownTimeout: 5s }
upstreams:
  backend: { targets: [${target}] }
routes:
  - name: all
    pathPrefix: /
    upstream: backend
${extra}`

t.test('SIGHUP: a valid file swaps in, an invalid one keeps the old config serving, in-flight requests finish', async t => {
  const a = await upstream('A')
  const b = await upstream('B')
  t.teardown(() => { a.server.close(); b.server.close() })
  const gw = await spawnGateway(t, config(a.url))
  t.equal(await (await fetch(`${gw.url}/x`)).text(), 'A')
  const before = await (await fetch(`${gw.adminUrl}/config`)).json() as { generation: number, hash: string }
  t.equal(before.generation, 1)

  // a slow request in flight across the reload finishes on the runtime it started with
  const inflight = fetch(`${gw.url}/slow?delay=1500`).then(r => r.text())
  await new Promise(resolve => setTimeout(resolve, 200))
  writeFileSync(gw.file, config(b.url))
  gw.child.kill('SIGHUP')
  await gw.waitForLog(l => l.msg === 'configuration reloaded')
  t.equal(await (await fetch(`${gw.url}/x`)).text(), 'B', 'new requests use the new config')
  t.equal(await inflight, 'A', 'the in-flight request finished on the old upstream')
  const after = await (await fetch(`${gw.adminUrl}/config`)).json() as { generation: number, hash: string }
  t.equal(after.generation, 2)
  t.not(after.hash, before.hash)

  writeFileSync(gw.file, config(a.url).replace('upstream: backend', 'upstream: backend2'))
  // SIGHUP directly: `gateway reload` validates first and would never send this file
  gw.child.kill('SIGHUP')
  const rejected = await gw.waitForLog(l => l.msg === 'reload rejected; the running configuration keeps serving')
  t.match(String((rejected.problems as string[])[0]), /gateway\.yaml:10:15 routes\[0\]\.upstream: unknown upstream "backend2"/)
  t.equal(await (await fetch(`${gw.url}/x`)).text(), 'B', 'the old config keeps serving')
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(metrics, /gateway_config_reloads_total\{result="success"\} 1/)
  t.match(metrics, /gateway_config_reloads_total\{result="failure"\} 1/)
})

t.test('SIGTERM drains in-flight requests, then exits 0', async t => {
  const a = await upstream('A')
  t.teardown(() => a.server.close())
  const gw = await spawnGateway(t, config(a.url))
  const inflight = fetch(`${gw.url}/slow?delay=1500`).then(async r => ({ status: r.status, body: await r.text() }))
  await new Promise(resolve => setTimeout(resolve, 200))
  gw.child.kill('SIGTERM')
  await gw.waitForLog(l => l.msg === 'shutting down')
  // mid-drain, while the slow request is still in flight: a new connection is refused
  const during = await new Promise<string>(resolve => {
    const req = http.get({ host: '127.0.0.1', port: gw.port, path: '/x', agent: false }, res => { res.resume(); resolve(`answered ${res.statusCode}`) })
    req.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message))
  })
  t.equal(gw.child.exitCode, null, 'the gateway was still draining when the new connection was tried')
  t.equal(during, 'ECONNREFUSED', 'a new connection during the drain is refused')
  t.same(await inflight, { status: 200, body: 'A' }, 'the in-flight request completed')
  t.equal(await gw.exited, 0)
  await t.rejects(fetch(`${gw.url}/x`), 'no longer accepting')
})

t.test('SIGINT drains as SIGTERM does, and a second signal during the drain does not cut it', async t => {
  const a = await upstream('A')
  t.teardown(() => a.server.close())
  for (const [first, second] of [['SIGINT', 'SIGINT'], ['SIGTERM', 'SIGTERM'], ['SIGTERM', 'SIGINT']] as const) {
    const gw = await spawnGateway(t, config(a.url))
    const inflight = fetch(`${gw.url}/slow?delay=1500`).then(async r => ({ status: r.status, body: await r.text() }))
    await new Promise(resolve => setTimeout(resolve, 200))
    gw.child.kill(first)
    await gw.waitForLog(l => l.msg === 'shutting down')
    // as a Ctrl-C after systemd's stop, or a second docker stop: Node's default action would end the process at once
    gw.child.kill(second)
    t.same(await inflight, { status: 200, body: 'A' }, `${first}, then ${second}: the in-flight request completed`)
    t.equal(await gw.exited, 0)
  }
})

t.test('server.shutdownTimeout bounds the drain: a request that outlives it is cut and the gateway exits', async t => {
  const a = await upstream('A')
  t.teardown(() => { a.server.closeAllConnections(); a.server.close() })
  const gw = await spawnGateway(t, config(a.url).replace('shutdownTimeout: 5s', 'shutdownTimeout: 1s'))
  const hung = new Promise<string>(resolve => {
    const req = http.get({ host: '127.0.0.1', port: gw.port, path: '/slow?delay=60000', agent: false }, res => { res.resume(); res.on('end', () => resolve(`answered ${res.statusCode}`)); res.on('error', () => resolve('cut')) })
    req.on('error', () => resolve('cut'))
  })
  await new Promise(resolve => setTimeout(resolve, 300))
  const signalled = Date.now()
  gw.child.kill('SIGTERM')
  const code = await gw.exited
  const tookMs = Date.now() - signalled
  t.equal(code, 0)
  // 1 s of drain; the upstream would answer after 60 s. 15 s leaves a loaded machine room.
  t.ok(tookMs < 15_000, `exited ${tookMs} ms after SIGTERM, not when the 60 s request would have finished`)
  t.equal(await hung, 'cut', 'the request that outlived the drain was cut')
})

t.test('gateway validate prints located errors and exits 1; exits 0 on a valid file', async t => {
  const bad = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', 'test/fixtures/config/unknown-upstream.yaml'], { encoding: 'utf8', env: childEnv() })
  t.equal(bad.status, 1)
  t.equal(bad.stderr.trim(), 'test/fixtures/config/unknown-upstream.yaml:7:15 routes[0].upstream: unknown upstream "backend2"')
  const good = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', 'gateway.yaml'], { encoding: 'utf8', env: childEnv() })
  t.equal(good.status, 0, good.stderr)
  t.match(good.stdout, /gateway\.yaml: ok/)
  const start = spawnSync(process.execPath, ['bin/gateway', '-c', 'test/fixtures/config/typo-key.yaml'], { encoding: 'utf8', env: childEnv() })
  t.equal(start.status, 1, 'start refuses an invalid file')
  t.match(start.stderr, /limits\.ip\.limt: unknown key "limt"/)
})

t.test('gateway schema prints the committed JSON Schema; --version and --help', async t => {
  const out = execFileSync(process.execPath, ['bin/gateway', 'schema'], { encoding: 'utf8', env: childEnv() })
  t.same(JSON.parse(out), JSON.parse(readFileSync('gateway.schema.json', 'utf8')))
  const pkg = JSON.parse(readFileSync('package.json', 'utf8')) as { version: string }
  t.equal(execFileSync(process.execPath, ['bin/gateway', '--version'], { encoding: 'utf8', env: childEnv() }).trim(), pkg.version)
  t.match(execFileSync(process.execPath, ['bin/gateway', '--help'], { encoding: 'utf8', env: childEnv() }), /validate/)
})

function makeCert (dir: string, cn: string): { cert: string, key: string } {
  const cert = join(dir, 'cert.pem')
  const key = join(dir, 'key.pem')
  writeSelfSigned(cert, key, cn)
  return { cert, key }
}

function peerCn (port: number): Promise<{ cn: string, body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpsRequest({ host: '127.0.0.1', port, path: '/', rejectUnauthorized: false, agent: false }, res => {
      const cn = String((res.socket as import('node:tls').TLSSocket).getPeerCertificate().subject.CN)
      let body = ''
      res.on('data', (c: Buffer) => { body += c.toString() })
      res.on('end', () => resolve({ cn, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

t.test('TLS termination; a renewed certificate is picked up by SIGHUP', async t => {
  const a = createServer((req, res) => res.end(String(req.headers['x-forwarded-proto'])))
  await new Promise<void>(resolve => a.listen(0, '127.0.0.1', resolve))
  t.teardown(() => a.close())
  const dir = tempDir(t, 'gw-tls')
  const first = makeCert(dir, 'first.test')
  const yaml = config(`http://127.0.0.1:${(a.address() as AddressInfo).port}`, `tls: { cert: ${first.cert}, key: ${first.key} }\n`)
  const gw = await spawnGateway(t, yaml)
  t.same(await peerCn(gw.port), { cn: 'first.test', body: 'https' }, 'X-Forwarded-Proto is https')
  makeCert(dir, 'second.test') // overwrites the same files, as a renewal would
  gw.child.kill('SIGHUP')
  await gw.waitForLog(l => l.msg === 'configuration reloaded')
  t.equal((await peerCn(gw.port)).cn, 'second.test')
  // Turning TLS off needs a restart: the reload says so and the port keeps TLS. log.level applies at once.
  writeFileSync(gw.file, config(`http://127.0.0.1:${(a.address() as AddressInfo).port}`).replace('log: { level: info }', 'log: { level: warn }'))
  gw.child.kill('SIGHUP')
  const warned = await gw.waitForLog(l => Array.isArray(l.settings))
  t.same(warned.settings, ['tls (on or off)'], 'the reload names what needs a restart')
  const accessLines = (): number => gw.logs.filter(l => l.msg === 'request').length
  const before = accessLines()
  t.equal((await peerCn(gw.port)).cn, 'second.test', 'still TLS until a restart')
  // the sink flushes every 100 ms: a line at info would be here well within this
  await new Promise(resolve => setTimeout(resolve, 500))
  t.equal(accessLines(), before, 'log.level warn took effect: no access line')
})

t.test('regression: a request admitted before a reload but held (delay slot) still reaches its upstream after the pool is removed', async t => {
  const a = await upstream('A')
  const b = await upstream('B')
  t.teardown(() => { a.server.close(); b.server.close() })
  // leaky-bucket delay mode: the 2nd request is held ~1 s for its slot, across the reload
  const held = (target: string): string => config(target).replace('    upstream: backend\n', '    upstream: backend\n    limits: { api: { algorithm: leaky-bucket, limit: 1, window: 1s, burst: 5, onLimit: delay, maxDelay: 5s } }\n')
  const gw = await spawnGateway(t, held(a.url))
  t.equal(await (await fetch(`${gw.url}/x`)).text(), 'A')
  const waiting = fetch(`${gw.url}/x`).then(async r => ({ status: r.status, body: await r.text() }))
  await new Promise(resolve => setTimeout(resolve, 150))
  writeFileSync(gw.file, held(b.url).replace('backend', 'other').replace('upstream: backend', 'upstream: other'))
  gw.child.kill('SIGHUP')
  await gw.waitForLog(l => l.msg === 'configuration reloaded')
  t.same(await waiting, { status: 200, body: 'A' }, 'the held request was served by the old pool, not cut with a 502')
})

t.test('gateway validate also runs the compile-time checks (identity keys)', async t => {
  const file = join(tempDir(t, 'gw-validate'), 'gateway.yaml')
  writeFileSync(file, config('http://127.0.0.1:1', 'identity: { jwt: { secret: short } }\n'))
  const r = spawnSync(process.execPath, ['bin/gateway', 'validate', '-c', file], { encoding: 'utf8', env: childEnv() })
  t.equal(r.status, 1)
  t.match(r.stderr, /jwt\.secret must be at least 32 bytes/)
})
