// Docker cannot run in CI here, so the compose stack and the image are checked by what they
// reference: every service named exists, every mounted config validates with the environment
// compose gives it, every upstream/Redis host is a service of the stack, and the image's default
// config passes `gateway validate` and listens where `-p` can reach it.
import t from 'tap'
import { readFileSync, existsSync } from 'node:fs'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { parse } from 'yaml'
import { loadConfigFile } from '../src/config/load.js'
import { parseDuration } from '../src/config/units.js'
import { childEnv } from './helpers/gateway.js'

const run = promisify(execFile)

interface Service {
  image?: string
  build?: string
  command?: string[]
  environment?: Record<string, string>
  volumes?: string[]
  ports?: string[]
  depends_on?: string[]
  stop_grace_period?: string
}

const compose = parse(readFileSync('docker-compose.yml', 'utf8'), { merge: true }) as { services: Record<string, Service> }
const services = compose.services
const gateways = Object.entries(services).filter(([, s]) => s.build === '.')

t.test('the stack has Redis, a backend and two gateways built from this repo', async t => {
  t.ok(services.redis?.image?.startsWith('redis:'), 'redis service')
  t.ok(services.backend !== undefined, 'backend service')
  t.equal(gateways.length, 2, 'two gateway services')
})

t.test('every depends_on names a service of the stack', async t => {
  for (const [name, s] of Object.entries(services)) {
    for (const dep of s.depends_on ?? []) t.ok(services[dep] !== undefined, `${name} depends on ${dep}`)
  }
})

t.test('every bind mount names a file of the repo', async t => {
  for (const [name, s] of Object.entries(services)) {
    for (const v of s.volumes ?? []) {
      const source = v.split(':')[0] as string
      t.ok(existsSync(source), `${name}: ${source} exists`)
    }
  }
})

t.test('published host ports never collide (replicas with random ports cannot be reached)', async t => {
  const hostPorts: string[] = []
  for (const [name, s] of Object.entries(services)) {
    for (const p of s.ports ?? []) {
      const parts = p.split(':')
      t.equal(parts.length, 2, `${name} publishes ${p} on a fixed host port`)
      hostPorts.push(parts[0] as string)
    }
  }
  t.equal(new Set(hostPorts).size, hostPorts.length, hostPorts.join(' '))
  for (const [name, s] of gateways) {
    const published = (s.ports ?? []).map(p => p.split(':')[1])
    t.ok(published.includes('8080') && published.includes('9901'), `${name} publishes the proxy and the admin listener`)
  }
})

t.test('each gateway config validates with its compose environment and points at services of the stack', async t => {
  for (const [name, s] of gateways) {
    const mount = (s.volumes ?? []).find(v => v.split(':')[1] === '/app/gateway.yaml')
    t.ok(mount !== undefined, `${name} mounts its config over the image's default`)
    const file = (mount as string).split(':')[0] as string
    // only the compose environment: a variable set on this machine must not hide a missing one
    const { config } = await loadConfigFile(file, { ...(s.environment ?? {}) })
    t.match(config.listen, /^0\.0\.0\.0:8080$/, `${name} listens on all interfaces`)
    t.match(config.admin, /^0\.0\.0\.0:9901$/, `${name}'s admin listener can be scraped`)
    for (const up of Object.values(config.upstreams)) {
      for (const target of up.targets) {
        const host = new URL(typeof target === 'string' ? target : target.url).hostname
        t.ok(services[host] !== undefined, `${name}: upstream host ${host} is a service`)
      }
    }
    const redisHost = new URL(config.redis?.url ?? 'redis://missing').hostname
    t.ok(services[redisHost] !== undefined, `${name}: redis host ${redisHost} is a service`)
    // `docker compose stop` sends SIGKILL after stop_grace_period (10 s unless set): it must outlast
    // the drain, or the requests the drain cuts are never answered nor logged
    const grace = parseDuration(s.stop_grace_period ?? '10s')
    const drain = parseDuration(config.server.shutdownTimeout)
    t.ok(grace >= drain + 2000, `${name}: stop_grace_period ${s.stop_grace_period ?? '10s (unset)'} outlasts server.shutdownTimeout ${config.server.shutdownTimeout} by 2 s`)
  }
})

t.test('the backend listens on all interfaces and serves the mounted echo backend', async t => {
  const b = services.backend as Service
  t.equal(b.environment?.HOST, '0.0.0.0')
  const script = (b.command ?? []).find(a => a.startsWith('/srv/'))
  t.ok((b.volumes ?? []).some(v => v.split(':')[1] === script), `${script} is mounted`)
  t.equal(b.environment?.PORT, '3000')
})

t.test('the image: default config validates, listens on 0.0.0.0, npm is gone', async t => {
  const dockerfile = readFileSync('Dockerfile', 'utf8')
  const copy = /^COPY (\S+) \.\/gateway\.yaml$/m.exec(dockerfile)
  t.ok(copy !== null, 'the Dockerfile copies a default config to /app/gateway.yaml')
  const defaultConfig = (copy as RegExpExecArray)[1] as string
  const { stdout } = await run(process.execPath, ['bin/gateway', 'validate', '-c', defaultConfig], { env: childEnv({ BACKEND_URL: '' }) })
  t.match(stdout, /: ok \(/)
  const { config } = await loadConfigFile(defaultConfig, {})
  t.equal(config.listen, '0.0.0.0:8080')
  t.equal(config.admin, '0.0.0.0:9901')
  t.match(dockerfile, /HEALTHCHECK[^\n]*\n[^\n]*127\.0\.0\.1:9901\/healthz/, 'the health check probes the admin port the config uses')
  const runtime = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '))
  t.match(runtime, /rm -rf [^\n]*\/usr\/local\/bin\/npm/, 'npm is removed from the runtime stage')
  // README (Container): runs as node, node itself is PID 1 (exec form: the signals reach the gateway)
  t.match(runtime, /^USER node$/m, 'runs as the node user')
  t.match(runtime, /^ENTRYPOINT \["node", "bin\/gateway"\]$/m, 'exec form: node is PID 1, no shell between')
  t.match(runtime, /^CMD \["start", "-c", "\/app\/gateway\.yaml"\]$/m)
  const backend = 'http://10.0.0.5:3000'
  const withBackend = (await loadConfigFile(defaultConfig, { BACKEND_URL: backend })).config
  t.same(withBackend.routes.map(r => [r.pathPrefix ?? r.path, r.upstream]), [['/', Object.keys(withBackend.upstreams)[0]]], 'one route: every path')
  t.same(Object.values(withBackend.upstreams).map(u => u.targets.map(x => x.url)), [[backend]], 'to $BACKEND_URL')
  t.equal(withBackend.redis, undefined, 'limits in process (no redis:)')
  // README (Container): no identity header, which would be believed from every client without trustedProxies
  t.equal(withBackend.identity, undefined, 'no identity')
})

/** Whether the builder receives `path`: the last .dockerignore pattern matching it or a parent of it decides. */
function inContext (path: string, patterns: readonly string[]): boolean {
  let included = true
  const parts = path.split('/')
  for (const raw of patterns) {
    const negated = raw.startsWith('!')
    const pattern = (negated ? raw.slice(1) : raw).replace(/^\/+|\/+$/g, '')
    const re = new RegExp('^' + pattern.split('*').map(p => p.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('[^/]*') + '$')
    for (let i = 1; i <= parts.length; i++) {
      if (re.test(parts.slice(0, i).join('/'))) {
        included = negated
        break
      }
    }
  }
  return included
}

t.test('every path the Dockerfile copies exists and is in the build context, which leaves the rest out', async t => {
  const dockerfile = readFileSync('Dockerfile', 'utf8')
  const patterns = readFileSync('.dockerignore', 'utf8').split('\n').map(l => l.trim()).filter(l => l !== '' && !l.startsWith('#'))
  const sources = [...dockerfile.matchAll(/^COPY (?!--)(.+) \S+$/gm)].flatMap(m => (m[1] as string).split(/\s+/))
  t.ok(sources.length >= 8, sources.join(' '))
  for (const source of sources) {
    t.ok(existsSync(source), `${source} exists`)
    t.ok(inContext(source, patterns), `${source} is sent to the builder`)
  }
  // test keys, certificates and Redis data (.tap), reports, npm pack's tarball: never sent
  for (const name of ['.git', 'node_modules', 'dist', 'test', 'bench', '.tap', 'reports', 'coverage', '.stryker-tmp', 'edge-gateway-0.1.0.tgz', '.env', 'docs']) {
    t.notOk(inContext(name, patterns), `${name} is left out of the build context`)
  }
  // the image has every directory the compiled code reads at run time (lua/ and admin-ui/ by path)
  const runtime = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '))
  for (const dir of ['dist', 'bin', 'lua', 'admin-ui']) t.match(runtime, new RegExp(`^COPY (--from=build /app/)?${dir} \\./${dir}$`, 'm'), `the image has ${dir}/`)
})
