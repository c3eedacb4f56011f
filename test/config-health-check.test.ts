// upstreams.<name>.healthCheck in gateway.yaml: every check is a located problem
// (`file:line:col key.path: message`), the defaults are written into the resolved config, and
// `gateway validate` stays offline: it sends no probe.
import t from 'tap'
import http from 'node:http'
import { once } from 'node:events'
import type { AddressInfo } from 'node:net'
import { parseConfigText, ConfigError } from '../src/config/load.js'
import { checkRuntime } from '../src/runtime.js'
import { sleep } from './helpers/ratelimit.js'

const ROUTE = 'routes:\n  - { name: a, pathPrefix: /, upstream: b }\n'
const withCheck = (check: string): string => `upstreams:\n  b:\n    targets: [http://127.0.0.1:1]\n    healthCheck: ${check}\n` + ROUTE

function problems (text: string): string[] {
  try {
    parseConfigText(text, 'gw.yaml', {})
  } catch (err) {
    if (err instanceof ConfigError) return err.message.split('\n')
    throw err
  }
  throw new Error(`accepted:\n${text}`)
}

t.test('the defaults are written into the resolved config', async t => {
  t.same(parseConfigText(withCheck('{ path: /healthz }'), 'gw.yaml', {}).config.upstreams.b?.healthCheck,
    { path: '/healthz', interval: '5s', timeout: '2s', unhealthyAfter: 2, healthyAfter: 2, expectStatus: ['200-399'] })
  t.same(parseConfigText(withCheck('{ path: "/healthz?deep=1", interval: 1s, host: api.internal:8443, expectStatus: 204 }'), 'gw.yaml', {}).config.upstreams.b?.healthCheck,
    { path: '/healthz?deep=1', interval: '1s', timeout: '500ms', unhealthyAfter: 2, healthyAfter: 2, host: 'api.internal:8443', expectStatus: [204] },
    'an interval of 1s: the default timeout is half of it, so a probe ends before the next')
  t.same(parseConfigText(withCheck('{ path: /h, expectStatus: [200, "300-399"] }'), 'gw.yaml', {}).config.upstreams.b?.healthCheck?.expectStatus, [200, '300-399'])
  t.equal(parseConfigText('upstreams:\n  b: { targets: [http://127.0.0.1:1] }\n' + ROUTE, 'gw.yaml', {}).config.upstreams.b?.healthCheck, undefined, 'absent: no checks')
})

t.test('a path is required, starts with "/", is normalized, and its query holds no space', async t => {
  t.same(problems(withCheck('{ interval: 1s }')), ['gw.yaml:4:18 upstreams.b.healthCheck.path: required key is missing'])
  t.same(problems(withCheck('{ path: healthz }')), ['gw.yaml:4:26 upstreams.b.healthCheck.path: expected a path starting with "/", e.g. /healthz'])
  t.same(problems(withCheck('{ path: /a/../healthz }')), ['gw.yaml:4:26 upstreams.b.healthCheck.path: not a normalized path: write /healthz'])
  t.same(problems(withCheck('{ path: "/a//b" }')), ['gw.yaml:4:26 upstreams.b.healthCheck.path: not a normalized path: write /a/b'])
  t.same(problems(withCheck('{ path: "/a%2fb" }')), ['gw.yaml:4:26 upstreams.b.healthCheck.path: not a valid path: encoded "/", "\\" or NUL in path'])
  t.same(problems(withCheck('{ path: "/h?x=1 2" }')), ['gw.yaml:4:26 upstreams.b.healthCheck.path: the query cannot hold a space, a control character or "#"'])
  t.same(problems(withCheck('{ path: "/h#frag" }')), ['gw.yaml:4:26 upstreams.b.healthCheck.path: not a valid path: fragment ("#") in request target'])
})

t.test('runs of at least 1, a timeout below the interval, status ranges in order, a host name, no unknown key', async t => {
  t.same(problems(withCheck('{ path: /h, unhealthyAfter: 0, healthyAfter: 0 }')), [
    'gw.yaml:4:46 upstreams.b.healthCheck.unhealthyAfter: Too small: expected number to be >=1',
    'gw.yaml:4:63 upstreams.b.healthCheck.healthyAfter: Too small: expected number to be >=1'
  ])
  t.same(problems(withCheck('{ path: /h, timeout: 5s }')), ['gw.yaml:4:39 upstreams.b.healthCheck.timeout: must be less than the interval (5s): a probe ends before the next one of its target starts'])
  t.same(problems(withCheck('{ path: /h, interval: 1s, timeout: 1s }')), ['gw.yaml:4:53 upstreams.b.healthCheck.timeout: must be less than the interval (1s): a probe ends before the next one of its target starts'])
  t.same(problems(withCheck('{ path: /h, interval: 0ms }')), ['gw.yaml:4:40 upstreams.b.healthCheck.interval: must be more than 0: a timer of 0 fires at once'])
  t.same(problems(withCheck('{ path: /h, expectStatus: "399-200" }')), ['gw.yaml:4:44 upstreams.b.healthCheck.expectStatus: a range goes from the lower status to the higher'])
  t.same(problems(withCheck('{ path: /h, expectStatus: [200, 600, "2xx"] }')), [
    'gw.yaml:4:50 upstreams.b.healthCheck.expectStatus[1]: Too big: expected number to be <=599',
    'gw.yaml:4:55 upstreams.b.healthCheck.expectStatus[2]: expected a status (204) or a range of statuses ("200-399")'
  ])
  t.same(problems(withCheck('{ path: /h, host: "a b" }')), ['gw.yaml:4:36 upstreams.b.healthCheck.host: expected a host name, optionally with ":port"'])
  t.same(problems(withCheck('{ path: /h, intervall: 1s }')), ['gw.yaml:4:30 upstreams.b.healthCheck.intervall: unknown key "intervall" (did you mean interval?)'])
  t.equal(parseConfigText(withCheck('{ path: /h, interval: 999ms, timeout: 998ms }'), 'gw.yaml', {}).config.upstreams.b?.healthCheck?.timeout, '998ms', 'a timeout just below the interval is accepted')
  t.equal(parseConfigText(withCheck('{ path: /h, unhealthyAfter: 1, healthyAfter: 1 }'), 'gw.yaml', {}).config.upstreams.b?.healthCheck?.healthyAfter, 1, 'runs of 1 are accepted')
})

t.test('gateway validate (checkRuntime) sends no probe', async t => {
  let probes = 0
  const server = http.createServer((_req, res) => { probes++; res.end('ok') })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => new Promise<void>(resolve => server.close(() => resolve())))
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const text = `upstreams:\n  b:\n    targets: [${url}]\n    healthCheck: { path: /healthz, interval: 50ms }\n` + ROUTE
  await checkRuntime(parseConfigText(text, 'gw.yaml', {}))
  await sleep(300)
  t.equal(probes, 0)
})

t.test('a reload rejected late in its compile sends no probe to the upstream it would have added; the one accepted after it does', async t => {
  const { startGateway } = await import('./helpers/gateway.js')
  const { writeFileSync } = await import('node:fs')
  let probes = 0
  const server = http.createServer((_req, res) => { probes++; res.end('ok') })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => new Promise<void>(resolve => { server.closeAllConnections(); server.close(() => resolve()) }))
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const base = `listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstreams:\n  b: { targets: ["http://127.0.0.1:1"] }\n`
  const gw = await startGateway(t, base + 'routes:\n  - { name: a, pathPrefix: /, upstream: b }\n')
  // the probed upstream is compiled, then a route's header rule that its cors writes is refused,
  // found once every upstream's pool is made
  const probed = `  p:\n    targets: [${url}]\n    healthCheck: { path: /healthz, interval: 50ms }\n`
  const routes = (rule: string): string => `routes:\n  - { name: a, pathPrefix: /, upstream: p, cors: { origins: ["https://app.example"] }${rule} }\n`
  writeFileSync(gw.configFile, base + probed + routes(', headers: { response: { set: { access-control-allow-origin: "*" } } }'))
  const rejected = await gw.reload()
  t.match(rejected, { ok: false, error: /access-control-allow-origin is written by the route's cors/ }, 'rejected in the compile')
  await sleep(400)
  t.equal(probes, 0, 'no probe from the rejected file')
  writeFileSync(gw.configFile, base + probed + routes(''))
  t.match(await gw.reload(), { ok: true })
  // the first probe goes within a tenth of the interval; 15 s for a loaded machine
  for (let i = 0; i < 750 && probes === 0; i++) await sleep(20)
  t.ok(probes > 0, 'the accepted file\'s probes start')
})
