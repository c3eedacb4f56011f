// Issue 10: the concurrency keys are checked like every other key: located messages, unknown keys
// rejected, a user cap without identity and a lease TTL too short to renew refused at load.
import t from 'tap'
import { loadConfigFile, ConfigError } from '../src/config/load.js'
import { routeLimitPlan } from '../src/runtime.js'

async function problems (file: string): Promise<string[]> {
  try {
    await loadConfigFile(file, {})
  } catch (err) {
    if (err instanceof ConfigError) return err.message.split('\n')
    throw err
  }
  throw new Error(`${file} was accepted`)
}

t.test('a typo and a cap of 0 are located errors', async t => {
  t.same(await problems('test/fixtures/config/concurrency-errors.yaml'), [
    'test/fixtures/config/concurrency-errors.yaml:2:24 concurrency.usr: unknown key "usr" (did you mean user?)',
    'test/fixtures/config/concurrency-errors.yaml:9:26 routes[0].concurrency.user: Too small: expected number to be >0'
  ])
})

t.test('a lease TTL below 1 s is refused', async t => {
  const { writeConfig } = await import('./helpers/gateway.js')
  const file = writeConfig(t, `redis: { url: redis://127.0.0.1:6379, leaseTtl: 500ms }
upstreams:
  backend: { targets: [http://127.0.0.1:3000] }
routes:
  - { name: r, pathPrefix: /, upstream: backend, concurrency: { route: 2 } }
`)
  const p = await problems(file)
  t.same(p.map(l => l.slice(l.indexOf(' ') + 1)), ['redis.leaseTtl: leaseTtl must be at least 1s (leases are renewed every third of it)'])
  t.match(p[0], /gateway\.yaml:1:49 /, 'located at the leaseTtl value')
})

t.test('a user cap without identity is refused', async t => {
  t.same(await problems('test/fixtures/config/concurrency-no-identity.yaml'), [
    'test/fixtures/config/concurrency-no-identity.yaml:1:1 identity: a "concurrency.user" limit is configured but no identity: add identity.header, identity.apiKeys or identity.jwt'
  ])
})

t.test('the issue\'s example compiles to leases after the rate limits, keyed without the cap', async t => {
  const { writeConfig } = await import('./helpers/gateway.js')
  const file = writeConfig(t, `concurrency:
  ip: 50
  user: 20
identity: { header: x-user-id }
redis: { url: redis://127.0.0.1:6379 }
upstreams:
  backend: { targets: [http://127.0.0.1:3000] }
routes:
  - name: upload
    pathPrefix: /upload/
    upstream: backend
    limits: { user: { limit: 5, window: 1s } }
    concurrency: { user: 2, route: 200 }
  - name: events
    pathPrefix: /ws/
    websocket: true
    upstream: backend
    concurrency: { user: 5 }
`)
  const { config } = await loadConfigFile(file, {})
  const upload = routeLimitPlan(config, config.routes[0] as (typeof config.routes)[0])
  t.same(upload.enforced.map(l => [l.name, l.concurrency, l.spec.limit]), [
    ['upload.user', false, 5],
    ['concurrency.ip', true, 50],
    ['concurrency.user', true, 20],
    ['upload.concurrency.user', true, 2],
    ['upload.concurrency.route', true, 200]
  ])
  t.equal(upload.enforced[4]?.fixedCheck?.key, 'gw:lease:upload.route:_')
  t.equal(upload.enforced[3]?.keyBase, 'gw:lease:upload.user:')
  t.ok(upload.enforced.filter(l => l.concurrency).every(l => l.spec.windowMs === 10_000 && l.spec.algorithm === 'lease'), 'window = leaseTtl, 10 s by default')
})
