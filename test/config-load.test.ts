// One fixture per config failure, with the exact located message asserted (envoy ratelimit style).
import t from 'tap'
import { readFileSync } from 'node:fs'
import { loadConfigFile, parseConfigText, ConfigError } from '../src/config/load.js'
import { gatewayJsonSchema } from '../src/config/schema.js'

const fixture = (name: string): string => `test/fixtures/config/${name}`

async function problems (file: string, env: NodeJS.ProcessEnv = {}): Promise<string[]> {
  try {
    await loadConfigFile(file, env)
  } catch (err) {
    if (err instanceof ConfigError) return err.message.split('\n')
    throw err
  }
  throw new Error(`${file} was accepted`)
}

t.test('unknown upstream names the route, line and column', async t => {
  t.same(await problems(fixture('unknown-upstream.yaml')), [
    'test/fixtures/config/unknown-upstream.yaml:7:15 routes[0].upstream: unknown upstream "backend2"'
  ])
})

t.test('a typo in a limit key is an error, never a silently disabled limit', async t => {
  const p = await problems(fixture('typo-key.yaml'))
  t.ok(p.includes('test/fixtures/config/typo-key.yaml:5:26 limits.ip.limt: unknown key "limt" (did you mean limit?)'), p.join('\n'))
  t.ok(p.includes('test/fixtures/config/typo-key.yaml:5:7 limits.ip.limit: required key is missing'), 'the missing "limit" is reported too')
})

t.test('a bad duration explains the expected form', async t => {
  t.same(await problems(fixture('bad-duration.yaml')), [
    'test/fixtures/config/bad-duration.yaml:9:58 routes[0].limits.api.window: expected a duration like "250ms", "1s", "1m" or "1h"'
  ])
})

t.test('YAML syntax errors are located', async t => {
  const p = await problems(fixture('bad-yaml.yaml'))
  t.match(p[0], /^test\/fixtures\/config\/bad-yaml\.yaml:\d+:\d+: /)
})

t.test('an unset environment variable without default is an error at its key', async t => {
  t.same(await problems(fixture('missing-env.yaml')), [
    'test/fixtures/config/missing-env.yaml:2:8 redis.url: environment variable GW_TEST_UNSET_VAR is not set and has no default (use ${GW_TEST_UNSET_VAR:-default})'
  ])
})

t.test('environment variables and defaults are substituted in strings', async t => {
  const text = 'redis:\n  url: ${R_URL:-redis://127.0.0.1:6390}\n  password: ${R_PASS}\nupstreams:\n  b: { targets: [http://127.0.0.1:1] }\nroutes:\n  - { name: a, pathPrefix: /, upstream: b }\n'
  const loaded = parseConfigText(text, 'inline.yaml', { R_PASS: 's3cret' })
  t.equal(loaded.config.redis?.url, 'redis://127.0.0.1:6390')
  t.equal(loaded.config.redis?.password, 's3cret')
})

t.test('duplicate route names and burst on a window algorithm', async t => {
  t.same(await problems(fixture('burst-on-window.yaml')), [
    'test/fixtures/config/burst-on-window.yaml:8:11 routes[1].name: duplicate route name "a" (also routes[0])',
    'test/fixtures/config/burst-on-window.yaml:12:69 routes[1].limits.api.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window'
  ])
})

t.test('a zero limit is a configuration error, not "reject everything"', async t => {
  const p = await problems(fixture('zero-limit.yaml'))
  t.equal(p.length, 1)
  t.match(p[0], /^test\/fixtures\/config\/zero-limit\.yaml:5:45 limits\.global\.limit: Too small: expected number to be >0$/)
})

t.test('the shipped gateway.yaml is valid', async t => {
  const loaded = await loadConfigFile('gateway.yaml', {})
  t.ok(loaded.config.routes.length >= 3)
  t.match(loaded.hash, /^[0-9a-f]{64}$/)
})

t.test('gateway.schema.json matches the zod schema (run `npm run schema` after changing it)', async t => {
  const committed = JSON.parse(readFileSync('gateway.schema.json', 'utf8')) as unknown
  t.same(committed, gatewayJsonSchema())
})

t.test('workers without Redis would multiply every shared limit; bad trusted proxy entries are located', async t => {
  t.same(await problems(fixture('workers-without-redis.yaml')), [
    'test/fixtures/config/workers-without-redis.yaml:1:10 workers: workers > 1 needs "redis:" for the shared limits: without it each worker would enforce every limit on its own (N times the budget)',
    'test/fixtures/config/workers-without-redis.yaml:2:30 trustedProxies[1]: "not-an-address" is not an IP address, a CIDR (e.g. 10.0.0.0/8, 2001:db8::/32) or one of loopback, linklocal, uniquelocal'
  ])
})

t.test('README promises: a cost above what the limit can hold and a route named "*" are config errors', async t => {
  t.same(await problems(fixture('cost-above-capacity.yaml')), [
    'test/fixtures/config/cost-above-capacity.yaml:8:78 routes[0].limits.api.cost: cost 6 is above the capacity 5: every request would be rejected'
  ])
  // "*" is the scope of gateway-wide limits: a route of that name would share their keys
  t.same(await problems(fixture('route-named-star.yaml')), [
    'test/fixtures/config/route-named-star.yaml:4:11 routes[0].name: expected a name of letters, digits, "_", "." or "-"'
  ])
})
