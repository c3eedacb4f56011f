// The package as a user gets it: `npm pack`, installed into an empty directory, then the CLI run
// through npx and the library imported by name, with its type declarations checked by tsc.
import t from 'tap'
import { execFile } from 'node:child_process'
import { mkdtempSync, readdirSync, rmSync, writeFileSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { childEnv } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

interface Run { code: number, stdout: string, stderr: string }
const REPO = resolve('.')

function run (cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise(resolve => {
    execFile(cmd, args, { cwd, env: childEnv(env), timeout: 180_000 }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 1, stdout, stderr })
    })
  })
}

const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm'

t.test('npm pack, install into an empty directory, npx gateway validate, import { startGateway, loadConfig }', async t => {
  // Outside the repository on purpose: inside it, Node would resolve the consumer's imports from
  // the repository's node_modules and the test would no longer show the package installs alone.
  const dir = mkdtempSync(join(tmpdir(), 'gw-pack-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  // dist is built by `npm test` (and prepack for a real publish): packing must not rebuild here
  const packed = await run(npm, ['pack', '--ignore-scripts', '--pack-destination', dir], REPO)
  t.equal(packed.code, 0, packed.code === 0 ? 'npm pack' : packed.stderr)
  const tarball = join(dir, packed.stdout.trim().split('\n').at(-1) as string)
  const app = join(dir, 'app')
  await run('mkdir', [app], dir)
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }))
  // From npm's cache when it holds every package; the registry is asked only for what it lacks.
  let installed = await run(npm, ['install', '--offline', '--no-audit', '--no-fund', tarball], app)
  if (installed.code !== 0 && /ENOTCACHED/.test(installed.stderr)) installed = await run(npm, ['install', '--prefer-offline', '--no-audit', '--no-fund', tarball], app)
  t.equal(installed.code, 0, installed.code === 0 ? 'npm install' : installed.stderr)
  const pkg = JSON.parse(readFileSync(join(app, 'node_modules/edge-gateway/package.json'), 'utf8')) as { files: string[] }
  t.ok(pkg.files.includes('dist'))
  // the Lua the Redis store loads by path at run time: every script of the repository's lua/
  t.same(readdirSync(join(app, 'node_modules/edge-gateway/lua')).sort(), readdirSync(join(REPO, 'lua')).sort(), 'lua/ is installed whole')

  const up = await startUpstream(t)
  const yaml = (route: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: silent }
upstreams:
  backend: { targets: ["\${BACKEND_URL}"] }
routes:
  - { name: ${route}, pathPrefix: /, upstream: backend }
`
  writeFileSync(join(app, 'gateway.yaml'), yaml('first'))
  const valid = await run('npx', ['--no-install', 'gateway', 'validate', '-c', 'gateway.yaml'], app, { BACKEND_URL: up.url })
  t.equal(valid.code, 0, valid.stderr)
  t.match(valid.stdout, /gateway\.yaml: ok \(1 routes, 1 upstreams\)/)
  writeFileSync(join(app, 'bad.yaml'), yaml('first').replace('pathPrefix', 'pathprefix'))
  const invalid = await run('npx', ['--no-install', 'gateway', 'validate', '-c', 'bad.yaml'], app, { BACKEND_URL: up.url })
  t.equal(invalid.code, 1)
  t.match(invalid.stderr, /bad\.yaml:7:\d+ routes\[0\]\.pathprefix: unknown key "pathprefix" \(did you mean pathPrefix\?\)/)

  // the library, in an existing process: start, serve, reload (good, then bad), close
  writeFileSync(join(app, 'embed.mjs'), `
import { readFileSync, writeFileSync } from 'node:fs'
import { startGateway, loadConfig, ConfigError } from 'edge-gateway'
const out = {}
const loaded = await loadConfig('gateway.yaml')
out.loadedRoutes = loaded.config.routes.map(r => r.name)
try { await loadConfig('bad.yaml') } catch (err) { out.badIsConfigError = err instanceof ConfigError; out.badProblems = err.problems.length }
// the configs the package ships (README quick start, the image's default, the compose stack's)
out.shipped = []
for (const f of ['gateway.yaml', 'examples/gateway.docker.yaml', 'examples/gateway.compose.yaml']) out.shipped.push((await loadConfig('node_modules/edge-gateway/' + f)).config.routes.length)
const gw = await startGateway({ configFile: 'gateway.yaml' })
out.addresses = gw.addresses
// read from the package's admin-ui/ at run time
out.page = [(await fetch(gw.adminUrl + '/')).status, (await fetch(gw.adminUrl + '/ui/app.js')).status, (await fetch(gw.adminUrl + '/ui/app.css')).status]
const res = await fetch(gw.url + '/hello')
out.status = res.status
out.upstreamSaw = (await res.json()).url
writeFileSync('gateway.yaml', readFileSync('gateway.yaml', 'utf8').replace('name: first', 'name: second'))
out.reload = await gw.reload()
out.generation = gw.generation
out.route = (await (await fetch(gw.adminUrl + '/config')).json()).config.routes[0].name
writeFileSync('gateway.yaml', 'routes: 5\\n')
out.badReload = await gw.reload()
out.stillServes = (await fetch(gw.url + '/x')).status
await gw.close()
out.closed = await fetch(gw.url + '/x').then(() => 'open', () => 'refused')
process.stdout.write(JSON.stringify(out))
`)
  const embedded = await run(process.execPath, ['embed.mjs'], app, { BACKEND_URL: up.url })
  t.equal(embedded.code, 0, embedded.stderr)
  const out = JSON.parse(embedded.stdout) as Record<string, unknown>
  t.match(out, {
    loadedRoutes: ['first'],
    shipped: [4, 1, 3],
    page: [200, 200, 200],
    badIsConfigError: true,
    badProblems: 1,
    addresses: { listen: { host: '127.0.0.1', port: Number }, admin: { host: '127.0.0.1', port: Number } },
    status: 200,
    upstreamSaw: '/hello',
    reload: { ok: true, generation: 2 },
    generation: 2,
    route: 'second',
    badReload: { ok: false, error: /gateway\.yaml:1:\d+ routes: / },
    stillServes: 200,
    closed: 'refused'
  })
  t.not((out.addresses as { listen: { port: number } }).listen.port, 0, 'the bound port, not the configured 0')

  // the declarations: a strict TypeScript consumer type-checks against the installed package
  writeFileSync(join(app, 'consumer.ts'), `
import { startGateway, loadConfig, type GatewayHandle, type ReloadResult } from 'edge-gateway'
const loaded = await loadConfig('gateway.yaml')
const name: string = loaded.config.routes[0]?.name ?? ''
const gw: GatewayHandle = await startGateway({ configFile: 'gateway.yaml', logLevel: 'warn' })
const port: number = gw.addresses.listen.port
const r: ReloadResult = await gw.reload()
if (r.ok) { const g: number = r.generation; console.log(g) } else { const e: string = r.error; console.log(e) }
// @ts-expect-error reload takes no argument
await gw.reload('gateway.yaml')
await gw.close()
console.log(name, port)
`)
  writeFileSync(join(app, 'tsconfig.json'), JSON.stringify({
    compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, skipLibCheck: false, types: ['node'], typeRoots: [join(REPO, 'node_modules/@types')] },
    files: ['consumer.ts']
  }))
  const tsc = await run(process.execPath, [join(REPO, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], app)
  t.equal(tsc.code, 0, tsc.stdout + tsc.stderr)
})
