// Every check of src/config/load.ts, one inline config per failure with the exact located message
// the operator reads (`file:line:col key.path: message`), and the accepted neighbour of each edge.
// No server: these run under the mutation run too (stryker.config.json, issue 16).
import t from 'tap'
import { createHash } from 'node:crypto'
import { resolve } from 'node:path'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { parseConfigText, loadConfigFile, closestKey, ConfigError, formatProblem, formatKeyPath, type LoadedConfig } from '../src/config/load.js'

const UP = 'upstreams:\n  b: { targets: [http://127.0.0.1:1] }\n'
const ROUTE = 'routes:\n  - { name: a, pathPrefix: /, upstream: b }\n'
const BASE = UP + ROUTE
const ID = 'identity: { header: x-user }\n'

function problems (text: string, env: NodeJS.ProcessEnv = {}): string[] {
  try {
    parseConfigText(text, 'gw.yaml', env)
  } catch (err) {
    if (err instanceof ConfigError) return err.message.split('\n')
    throw err
  }
  throw new Error(`accepted:\n${text}`)
}

function accepted (text: string, env: NodeJS.ProcessEnv = {}, file = 'gw.yaml'): LoadedConfig {
  return parseConfigText(text, file, env)
}

/** A config with one gateway-wide limit. */
const globalLimit = (limit: string): string => `limits:\n  global: ${limit}\n` + BASE

t.test('a problem carries its code, place and key path as data, and formats as file:line:col path: message', async t => {
  const err = (() => {
    try {
      parseConfigText('workers: 0\n' + BASE, 'gw.yaml', {})
    } catch (e) {
      return e
    }
    return null
  })()
  t.ok(err instanceof ConfigError)
  const e = err as ConfigError
  t.equal(e.code, 'GW_ERR_CONFIG_INVALID')
  t.same(e.problems, [{ file: 'gw.yaml', line: 1, column: 10, path: 'workers', message: 'Too small: expected number to be >=1' }])
  t.equal(e.message, 'gw.yaml:1:10 workers: Too small: expected number to be >=1')
  t.equal(formatProblem({ file: 'f.yaml', line: 0, column: 0, path: '', message: 'file not found' }), 'f.yaml:0:0: file not found')
  t.equal(formatKeyPath(['routes', 1, 'limits', 'ip']), 'routes[1].limits.ip')
  t.equal(formatKeyPath([0, 'a', 2, 3]), '[0].a[2][3]')
  t.equal(formatKeyPath([]), '')
})

t.test('a file that cannot be read is a problem at 0:0 without a key path', async t => {
  await t.rejects(loadConfigFile('test/fixtures/config/none.yaml', {}), { message: 'test/fixtures/config/none.yaml:0:0: file not found' })
  await t.rejects(loadConfigFile('test/fixtures/config', {}), { message: 'test/fixtures/config:0:0: is a directory, not a file' })
})

t.test('YAML errors: the first line of the parser\'s message, at its position', async t => {
  t.same(problems('workers: 1\nworkers: 2\n' + BASE), ['gw.yaml:2:1 workers: written twice in one map (first at line 1): one would silently replace the other; keep one'])
})

t.test('the document itself: empty, or not a map', async t => {
  t.same(problems(''), ['gw.yaml:1:1 upstreams: required key is missing', 'gw.yaml:1:1 routes: required key is missing'])
  t.same(problems('- a\n- b\n'), ['gw.yaml:1:1: Invalid input: expected object, received array'])
})

t.test('the file\'s hash is the sha256 of its text; the config has the defaults written in and is frozen', async t => {
  const text = 'workers: 1\n' + BASE
  const loaded = accepted(text)
  t.equal(loaded.file, 'gw.yaml')
  t.equal(loaded.hash, createHash('sha256').update(text).digest('hex'))
  t.equal(loaded.config.listen, '0.0.0.0:8080')
  t.ok(Object.isFrozen(loaded.config))
})

t.test('problemAt locates a later problem at the value, or at its deepest written ancestor', async t => {
  const loaded = accepted(UP + 'routes:\n  - name: a\n    pathPrefix: /x/\n    upstream: b\n')
  t.equal(formatProblem(loaded.problemAt(['routes', 0, 'pathPrefix'], 'bad')), 'gw.yaml:5:17 routes[0].pathPrefix: bad')
  t.equal(formatProblem(loaded.problemAt(['routes', 0, 'headers', 'request'], 'bad')), 'gw.yaml:4:5 routes[0].headers.request: bad')
  t.equal(formatProblem(loaded.problemAt(['routes', 3], 'bad')), 'gw.yaml:4:3 routes[3]: bad')
  t.equal(formatProblem(loaded.problemAt([], 'bad')), 'gw.yaml:1:1: bad')
  // a map key YAML reads as a number is found by its text
  const numbered = accepted('upstreams:\n  1: { targets: [http://127.0.0.1:1] }\nroutes:\n  - { name: a, pathPrefix: /, upstream: "1" }\n')
  t.equal(formatProblem(numbered.problemAt(['upstreams', '1', 'targets'], 'bad')), 'gw.yaml:2:17 upstreams.1.targets: bad')
})

t.test('the API key file is named relative to gateway.yaml', async t => {
  const text = 'identity: { apiKeys: { header: x-api-key, file: keys.yaml } }\n' + BASE
  const loaded = accepted(text, {}, 'conf/gw.yaml')
  const identity = loaded.config.identity
  t.same(identity !== undefined && 'apiKeys' in identity ? identity.apiKeys.file : null, resolve('conf/keys.yaml'))
  const inline = accepted('identity: { apiKeys: { header: x-api-key, keys: { k: alice } } }\n' + BASE, {}, 'conf/gw.yaml').config.identity
  t.same(inline !== undefined && 'apiKeys' in inline ? inline.apiKeys.file : null, undefined)
})

t.test('environment references: defaults, empty values, several in one string, arrays; no structure injected', async t => {
  const redis = (text: string, env: NodeJS.ProcessEnv): unknown => accepted(`redis: ${text}\n` + BASE, env).config.redis
  t.match(redis('{ url: "redis://${H}:${PORT}/0" }', { H: 'h', PORT: '7' }), { url: 'redis://h:7/0' })
  // an empty variable counts as unset, so its default applies
  t.match(redis('{ url: "${R:-redis://d:1}" }', { R: '' }), { url: 'redis://d:1' })
  t.match(redis('{ url: "${R:-redis://d:1}" }', { R: 'redis://e:2' }), { url: 'redis://e:2' })
  t.match(redis('{ url: "redis://h:1", password: "${P:-}" }', {}), { password: '' })
  // not a reference: a name starting with a digit, a "$" without braces
  t.match(redis('{ url: "redis://h:1", password: "${1X}$HOME" }', { HOME: '/root' }), { password: '${1X}$HOME' })
  t.match(redis('{ url: "redis://h:1", password: "${P}" }', { P: 'a\nb: c' }), { password: 'a\nb: c' })
  // "$${" is a literal "${"; "$$" elsewhere stays (a password may hold it)
  t.match(redis('{ url: "redis://h:1", password: "$${P}-$${-$$x-${P}" }', { P: 'p' }), { password: '${P}-${-$$x-p' })
  t.same(accepted('trustedProxies: [10.0.0.1, "${P}"]\n' + BASE, { P: '10.0.0.2' }).config.trustedProxies, ['10.0.0.1', '10.0.0.2'])
  t.same(problems('trustedProxies: [10.0.0.1, "${P}"]\n' + BASE), [
    'gw.yaml:1:28 trustedProxies[1]: environment variable P is not set and has no default (use ${P:-default})'
  ])
  t.same(problems('redis: { url: "${A}/${B}" }\n' + BASE), [
    'gw.yaml:1:15 redis.url: environment variable A is not set and has no default (use ${A:-default})',
    'gw.yaml:1:15 redis.url: environment variable B is not set and has no default (use ${B:-default})'
  ])
})

t.test('environment references in map keys (an API key from the environment)', async t => {
  const keys = (map: string): string => `identity:\n  apiKeys:\n    header: x\n    keys: ${map}\n` + BASE
  const apiKeys = (loaded: LoadedConfig): unknown => {
    const identity = loaded.config.identity
    return identity !== undefined && 'apiKeys' in identity ? identity.apiKeys.keys : null
  }
  t.same(apiKeys(accepted(keys('{ "${K}": bob, "k-${J}": carol }'), { K: 'k1', J: '2' })), { k1: 'bob', 'k-2': 'carol' })
  // a value from the environment is taken literally, even one holding "${"
  t.same(apiKeys(accepted(keys('{ "${K}": bob }'), { K: '${x' })), { '${x': 'bob' })
  t.same(problems(keys('{ "${K}": bob }')), [
    'gw.yaml:4:21 identity.apiKeys.keys.${K}: environment variable K is not set and has no default (use ${K:-default})'
  ])
  // a key that is not one bare reference is hidden whole, its line and column pointing at it: its
  // literal part may be the secret (src/config/load.ts apiKeyIn)
  t.same(problems(keys('{ "${K": alice }')), ['gw.yaml:4:20 identity.apiKeys.keys.<an API key>: "${" in a key is not a complete ${VAR} reference'])
  t.same(problems(keys('{ "${K}-${J": alice }'), { K: 'a' }), ['gw.yaml:4:25 identity.apiKeys.keys.<an API key>: "${" in a key is not a complete ${VAR} reference'])
  // an escaped "$${" is a literal "${" in the key, and the key is still hidden in a problem
  t.same(apiKeys(accepted(keys('{ "k$${x}-${K}": bob }'), { K: 'a' })), { 'k${x}-a': 'bob' })
  // ... and a key from the environment holding "${" is a credential too: neither is shown
  for (const [map, env] of [['{ "k-sec$${ret": 42 }', {}], ['{ "${K}": 42 }', { K: 'k-sec${ret' }]] as const) {
    const shown = problems(keys(map), env)
    t.equal(shown.length, 1)
    t.match(shown[0], /^gw\.yaml:4:\d+ identity\.apiKeys\.keys\.<an API key>: /)
    t.notMatch(shown[0], /sec/)
  }
  t.same(problems(keys('{ k1: alice, "${K}": bob }'), { K: 'k1' }), [
    'gw.yaml:4:32 identity.apiKeys.keys.${K}: key "${K}" is substituted to a key that is already present'
  ])
  // the other order: the written key came second and replaced the substituted one silently
  const reversed = problems(keys('{ "${K}": bob, k-sec-1: alice }'), { K: 'k-sec-1' })
  t.equal(reversed.length, 1)
  t.match(reversed[0], /^gw\.yaml:4:\d+ identity\.apiKeys\.keys\.<an API key>: this key is already present, substituted from a \$\{VAR\} key before it$/)
  t.notMatch(reversed[0], /sec/, 'the key is not shown')
  t.same(problems('upstreams:\n  "${UP}": { targets: [http://127.0.0.1:1] }\n  b: { targets: [http://127.0.0.1:2] }\n' + ROUTE, { UP: 'b' }), [
    'gw.yaml:3:6 upstreams.b: this key is already present, substituted from a ${VAR} key before it'
  ], 'an upstream\'s name alike')
})

t.test('environment references in every other map key: an upstream\'s name, a header rule\'s field; an empty variable is unset', async t => {
  const text = 'upstreams:\n  "${UP}": { targets: [http://127.0.0.1:1] }\nroutes:\n  - { name: a, pathPrefix: /, upstream: backend, headers: { request: { set: { "${H}": v } } } }\n'
  const { config } = accepted(text, { UP: 'backend', H: 'x-from-env' })
  t.same(Object.keys(config.upstreams), ['backend'], 'the upstream named from the environment')
  t.same(config.routes[0]?.headers?.request?.set, { 'x-from-env': 'v' }, 'the header rule\'s field named from the environment')
  t.same(problems(text, { UP: 'backend' }), [
    'gw.yaml:4:87 routes[0].headers.request.set.${H}: environment variable H is not set and has no default (use ${H:-default})'
  ])
  t.same(problems(text, { UP: 'backend', H: '' }), [
    'gw.yaml:4:87 routes[0].headers.request.set.${H}: environment variable H is not set and has no default (use ${H:-default})'
  ], 'set to the empty string: as unset')
})

t.test('an inline API key never appears in a problem: the path and message name "<an API key>", line and column point at it', async t => {
  const keys = (map: string): string => `identity:\n  apiKeys:\n    header: x\n    keys: ${map}\n` + BASE
  t.same(problems(keys('{ k-secret-1: "" }')), ['gw.yaml:4:25 identity.apiKeys.keys.<an API key>: an API key must map to a consumer name'])
  const wrongType = problems(keys('{ k-secret-2: 42 }'))
  t.equal(wrongType.length, 1)
  t.match(wrongType[0], /^gw\.yaml:4:25 identity\.apiKeys\.keys\.<an API key>: /)
  t.notMatch(wrongType[0], /k-secret-2/)
  // from the environment: the path held the substituted value
  const fromEnv = problems(keys('{ "${K}": "" }'), { K: 'k-secret-3' })
  t.equal(fromEnv.length, 1)
  t.notMatch(fromEnv[0], /k-secret-3/)
  t.match(fromEnv[0], /identity\.apiKeys\.keys\.<an API key>: an API key must map to a consumer name/)
  const plans = 'plans:\n  free: { limits: { user: { limit: 1, window: 1s } } }\nconsumers: { bob: { plan: free } }\n'
  const unknownConsumer = problems(keys('{ k-secret-4: carol }') + plans)
  t.equal(unknownConsumer.length, 1)
  t.match(unknownConsumer[0], /identity\.apiKeys\.keys\.<an API key>: API key maps to consumer "carol", which has no entry in consumers/)
  t.notMatch(unknownConsumer[0], /k-secret-4/)
  // a key no header carries as written (node reads header bytes as Latin-1): it could never match
  const nonAscii = problems(keys('{ "ключ-secret-5": alice }'))
  t.same(nonAscii, ['gw.yaml:4:30 identity.apiKeys.keys.<an API key>: an API key must be characters a header carries as written (visible ASCII or Latin-1, spaces and tabs inside): a character above U+00FF could never match'])
})

t.test('ports above 65535 and Redis URLs the client cannot use are located config errors, not a failure at start', async t => {
  t.same(problems('listen: "127.0.0.1:70000"\nupstreams: { b: { targets: ["http://127.0.0.1:1"] } }\nroutes: [{ name: r, pathPrefix: /, upstream: b }]\n'), ['gw.yaml:1:9 listen: the port must be at most 65535'])
  t.same(problems('redis: { cluster: ["redis://h:70000"] }\n' + BASE), ['gw.yaml:1:20 redis.cluster[0]: not a usable URL: a port above 65535, a malformed host, or a bad %-escape in the password'])
  t.same(problems('redis: { url: "redis://:p%zz@h:6379" }\n' + BASE), ['gw.yaml:1:15 redis.url: not a usable URL: a port above 65535, a malformed host, or a bad %-escape in the password'])
  t.same(problems('redis: { sentinels: ["h:99999"], name: m }\n' + BASE), ['gw.yaml:1:22 redis.sentinels[0]: the port must be at most 65535'])
  t.ok(accepted('redis: { cluster: ["redis://:p%40ss@h:6379"] }\n' + BASE), 'a valid escape is fine')
})

t.test('a listen or admin host written as an address must be one: "999.1.1.1" failed at start, not in validate', async t => {
  const up = 'upstreams: { b: { targets: ["http://127.0.0.1:1"] } }\nroutes: [{ name: r, pathPrefix: /, upstream: b }]\n'
  const message = 'the host is not a valid IP address (IPv4 as 4 numbers of 0-255, IPv6 in brackets)'
  t.same(problems('listen: "999.1.1.1:8080"\n' + up), [`gw.yaml:1:9 listen: ${message}`])
  t.same(problems('listen: "1.2.3:8080"\n' + up), [`gw.yaml:1:9 listen: ${message}`])
  t.same(problems('admin: "[::1:2:3:4:5:6:7:8]:9901"\n' + up), [`gw.yaml:1:8 admin: ${message}`])
  t.same(problems('admin: { listen: "10.0.0.256:9901" }\n' + up), [`gw.yaml:1:18 admin.listen: ${message}`])
  for (const good of ['127.0.0.1:0', '[::1]:8080', '[::]:8080', 'localhost:8080', 'gw1.internal:8080', ':8080']) {
    t.ok(accepted(`listen: "${good}"\n` + up), good)
  }
})

t.test('unknown keys are located at the key and name the closest valid key', async t => {
  t.same(problems(UP + 'rotues: []\n'), ['gw.yaml:1:1 routes: required key is missing', 'gw.yaml:3:1 rotues: unknown key "rotues" (did you mean routes?)'])
  t.same(problems(BASE + 'plans:\n  free: { limits: { usr: { limit: 1, window: 1s } } }\n'), [
    'gw.yaml:6:21 plans.free.limits.usr: unknown key "usr" (did you mean user?)'
  ])
  t.same(problems('admin: { lisen: "127.0.0.1:1" }\n' + BASE), ['gw.yaml:1:10 admin.lisen: unknown key "lisen" (did you mean listen?)'])
  t.same(problems('upstreams:\n  b: { targets: [{ url: "http://127.0.0.1:1", wieght: 2 }] }\n' + ROUTE), [
    'gw.yaml:2:47 upstreams.b.targets[0].wieght: unknown key "wieght" (did you mean weight?)'
  ])
  t.same(problems(UP + 'routes:\n  - { name: a, pathprefix: /, upstream: b }\n'), [
    'gw.yaml:4:16 routes[0].pathprefix: unknown key "pathprefix" (did you mean pathPrefix?)'
  ])
  t.same(problems(UP + 'routes:\n  - { name: a, pathPrefix: /, upstream: b, colour: blue }\n'), ['gw.yaml:4:44 routes[0].colour: unknown key "colour"'])
  // a key that came from the environment is not in the text: located at its map
  t.same(problems('routing: { "${K}": true }\n' + BASE, { K: 'caseinsensitive' }), [
    'gw.yaml:1:10 routing.caseinsensitive: unknown key "caseinsensitive" (did you mean caseInsensitive?)'
  ])
  // ... and so is a key below a key that came from the environment: located at the nearest written ancestor
  t.same(problems('"${K}": { caseinsensitive: true }\n' + BASE, { K: 'routing' }), [
    'gw.yaml:1:1 routing.caseinsensitive: unknown key "caseinsensitive" (did you mean caseInsensitive?)'
  ])
  t.same(problems('"${K}": { ip: { limit: 1, window: 1s, limt: 2 } }\n' + BASE, { K: 'limits' }), ['gw.yaml:1:1 limits.ip.limt: unknown key "limt" (did you mean limit?)'])
  t.same(problems('"${K}":\n  - { name: a, pathprefix: /, upstream: b }\n' + UP, { K: 'routes' }), ['gw.yaml:1:1 routes[0].pathprefix: unknown key "pathprefix" (did you mean pathPrefix?)'])
})

t.test('unions (identity, admin, targets): the branch closest to the text speaks', async t => {
  // a key unknown to every branch is reported alone: the missing keys are its consequence
  t.same(problems('identity:\n  apikeys: { header: x-api-key }\n' + BASE), ['gw.yaml:2:3 identity.apikeys: unknown key "apikeys" (did you mean apiKeys?)'])
  // failureLimit is in every branch: its unknown key is the header branch's sole issue, at its own path
  t.same(problems('identity: { header: x, failureLimit: { limit: 1, window: 1s, burts: 2 } }\n' + BASE), [
    'gw.yaml:1:62 identity.failureLimit.burts: unknown key "burts" (did you mean burst?)'
  ])
  t.same(problems('identity: { jwt: { secrt: x } }\n' + BASE), ['gw.yaml:1:20 identity.jwt.secrt: unknown key "secrt" (did you mean secret?)'])
  // fewest issues wins; on a tie, the first branch
  t.same(problems('identity: { jwt: { secret: x, claim: 1 } }\n' + BASE), ['gw.yaml:1:38 identity.jwt.claim: Invalid input: expected string, received number'])
  t.same(problems('identity: {}\n' + BASE), ['gw.yaml:1:11 identity.header: required key is missing'])
  // a branch of the wrong type is never chosen
  t.same(problems('admin: { listen: 9901 }\n' + BASE), ['gw.yaml:1:18 admin.listen: Invalid input: expected string, received number'])
  t.same(problems('upstreams:\n  b: { targets: [ftp://x] }\n' + ROUTE), ['gw.yaml:2:18 upstreams.b.targets[0]: expected an http:// or https:// URL'])
  // a size is a number or a string: each speaks for its own type, wherever its branch is
  const bodySize = (size: string): string => UP + `routes:\n  - { name: a, pathPrefix: /, upstream: b, maxBodySize: ${size} }\n`
  t.same(problems(bodySize('-1')), ['gw.yaml:4:57 routes[0].maxBodySize: Too small: expected number to be >=0'])
  t.same(problems(bodySize('"10 mb"')), ['gw.yaml:4:57 routes[0].maxBodySize: expected a size like 1048576, "512kb", "10mb" or "1gb"'])
  // two forms given, each unknown to the other: the form with fewer issues speaks (apiKeys is whole, header is empty)
  t.same(problems('identity: { header: "", apiKeys: { header: y, keys: { k: a } } }\n' + BASE), [
    'gw.yaml:1:13 identity.header: key "header" belongs to another form of identity: it cannot be combined with the keys beside it'
  ])
  // a form that knows every key written beats forms with fewer issues that do not
  t.same(problems('identity: { apiKeys: { header: 1, keys: 2, file: 3 } }\n' + BASE), [
    'gw.yaml:1:32 identity.apiKeys.header: Invalid input: expected string, received number',
    'gw.yaml:1:41 identity.apiKeys.keys: Invalid input: expected record, received number',
    'gw.yaml:1:50 identity.apiKeys.file: Invalid input: expected string, received number'
  ])
})

t.test('a bare port for listen or admin says which form is meant', async t => {
  t.same(problems('listen: 8080\n' + BASE), ['gw.yaml:1:9 listen: expected "host:port" as a string, e.g. "0.0.0.0:8080" (a bare port does not say which interface)'])
  t.same(problems('admin: 9901\n' + BASE), ['gw.yaml:1:8 admin: expected "host:port" as a string, e.g. "0.0.0.0:9901" (a bare port does not say which interface)'])
  t.same(problems('listen: "8080"\n' + BASE), ['gw.yaml:1:9 listen: expected "host:port", e.g. "0.0.0.0:8080"'])
  t.same(problems('workers: two\n' + BASE), ['gw.yaml:1:10 workers: Invalid input: expected number, received string'])
  t.same(problems('limits:\n  ip:\n' + BASE), ['gw.yaml:2:6 limits.ip: Invalid input: expected object, received null'])
})

t.test('closestKey: same letters ignoring case, or an edit distance within max(2, length / 3)', async t => {
  t.equal(closestKey('PATHPREFIX', ['path', 'pathPrefix']), 'pathPrefix')
  t.equal(closestKey('limt', ['limit']), 'limit')
  t.equal(closestKey('lmt', ['limit']), 'limit', 'distance 2')
  t.equal(closestKey('xyzt', ['limit']), null)
  t.equal(closestKey('ab', ['abcd']), 'abcd', 'two insertions')
  t.equal(closestKey('abcd', ['ab']), 'ab', 'two deletions')
  t.equal(closestKey('abcd', ['a']), null, 'three deletions')
  t.equal(closestKey('abcdefghi', ['abcdefxyz']), 'abcdefxyz', 'length 9 allows distance 3')
  t.equal(closestKey('abcdefgh', ['abcdefxyz']), null, 'length 8 allows distance 2')
  t.equal(closestKey('abcdefghijkl', ['abcdefghwxyz']), 'abcdefghwxyz', 'length 12 allows distance 4')
  t.equal(closestKey('wight', ['weight', 'light']), 'weight', 'the first of two at the same distance')
  t.equal(closestKey('wight', ['wxyzt', 'light']), 'light', 'the nearer one, wherever it is')
  t.equal(closestKey('kitten', ['sitting']), null, 'distance 3')
  t.equal(closestKey('kittens', ['sitting']), null, 'distance 3')
  t.equal(closestKey('kitten', ['sittenx']), 'sittenx', 'distance 2')
  t.equal(closestKey('abc', []), null)
})

t.test('routes: one of path or pathPrefix, stripPrefix a prefix of it', async t => {
  const route = (extra: string): string => UP + `routes:\n  - { name: a, upstream: b${extra} }\n`
  const oneOf = 'gw.yaml:4:5 routes[0]: a route needs exactly one of "path" (exact) or "pathPrefix"'
  t.same(problems(route(', path: /a, pathPrefix: /a')), [oneOf])
  t.same(problems(route('')), [oneOf])
  t.same(problems(route(', stripPrefix: /a')), [oneOf, 'gw.yaml:4:42 routes[0].stripPrefix: "/a" is not a prefix of the route\'s path ""'])
  t.same(problems(route(', path: /ab, stripPrefix: /b')), ['gw.yaml:4:53 routes[0].stripPrefix: "/b" is not a prefix of the route\'s path "/ab"'])
  t.same(problems(route(', pathPrefix: /ab/, stripPrefix: /b')), ['gw.yaml:4:60 routes[0].stripPrefix: "/b" is not a prefix of the route\'s path "/ab/"'])
  t.equal(accepted(route(', pathPrefix: /ab/, stripPrefix: /ab')).config.routes[0]?.stripPrefix, '/ab')
  t.equal(accepted(route(', path: /ab, stripPrefix: /a')).config.routes[0]?.stripPrefix, '/a')
})

t.test('limits: burst, onLimit: delay and maxDelay go together; the limit stage\'s own bounds', async t => {
  // the message's last word trips the skipped-test check, so it is matched up to that word
  const delayOnGcra = problems(globalLimit('{ limit: 5, window: 1s, onLimit: delay, maxDelay: 1s }'))
  t.equal(delayOnGcra.length, 1)
  t.equal(delayOnGcra[0], 'gw.yaml:2:44 limits.global.onLimit: "onLimit: delay" needs algorithm: leaky-bucket (the one algorithm that can hold a request for its slot)')
  t.same(problems(globalLimit('{ algorithm: leaky-bucket, limit: 5, window: 1s, maxDelay: 1s }')), ['gw.yaml:2:70 limits.global.maxDelay: "maxDelay" needs "onLimit: delay"'])
  // a maxDelay that does not apply is not checked against the rate either
  t.same(problems(globalLimit('{ algorithm: leaky-bucket, limit: 1000003, window: 1ms, maxDelay: 596h }')), ['gw.yaml:2:77 limits.global.maxDelay: "maxDelay" needs "onLimit: delay"'])
  t.same(problems(globalLimit('{ algorithm: leaky-bucket, limit: 5, window: 1s, onLimit: delay }')), [
    'gw.yaml:2:11 limits.global.maxDelay: "onLimit: delay" needs "maxDelay" (the longest a request may wait)'
  ])
  t.match(accepted(globalLimit('{ algorithm: leaky-bucket, limit: 5, window: 1s, onLimit: delay, maxDelay: 1s }')).config.limits?.global, { maxDelay: '1s' })
  t.same(problems(globalLimit('{ algorithm: leaky-bucket, limit: 1000003, window: 1ms, onLimit: delay, maxDelay: 596h }')), ['gw.yaml:2:11 limits.global: maxDelay (in ms) is too large for this rate'])
  t.same(problems(globalLimit('{ limit: 5, window: 0s }')), ['gw.yaml:2:31 limits.global.window: must be from 1ms to 312749h (2^50 µs, what the limiter counts exactly)'])
  // a window past 2^50 µs: the message named "windowMs", a key nobody wrote, and no bound
  t.same(problems(globalLimit('{ limit: 5, window: 312750h }')), ['gw.yaml:2:31 limits.global.window: must be from 1ms to 312749h (2^50 µs, what the limiter counts exactly)'])
  t.ok(accepted(globalLimit('{ limit: 5, window: 312749h }')), 'the longest window')
  t.same(problems(globalLimit('{ limit: 2000, window: 1ms }')), ['gw.yaml:2:11 limits.global: gcra allows at most one request per µs (limit <= window (in ms) * 1000)'])
  t.same(problems(globalLimit('{ algorithm: token-bucket, limit: 1, window: 1000h, burst: 1000 }')), [
    'gw.yaml:2:11 limits.global: burst is too large for this rate (burst * window (in ms) * 1000 / gcd(window (in ms) * 1000, limit) > 2^50)'
  ])
  t.ok(accepted(globalLimit('{ algorithm: token-bucket, limit: 1, window: 1000h, burst: 300 }')), 'a burst within the bound')
  t.same(problems(globalLimit('{ algorithm: sliding-window-log, limit: 100000000, window: 1s }')), [
    'gw.yaml:2:11 limits.global: sliding-window-log stores one entry per admitted unit: limit must be <= 10000 (use sliding-window for larger limits)'
  ])
})

t.test('cost: at most the capacity (burst for buckets, else the limit)', async t => {
  t.ok(accepted(globalLimit('{ algorithm: token-bucket, limit: 5, window: 1s, burst: 10, cost: 10 }')))
  t.same(problems(globalLimit('{ algorithm: token-bucket, limit: 5, window: 1s, burst: 10, cost: 11 }')), ['gw.yaml:2:77 limits.global.cost: cost 11 is above the capacity 10: every request would be rejected'])
  t.ok(accepted(globalLimit('{ limit: 5, window: 1s, burst: 10, cost: 10 }')), 'gcra is a bucket, the default algorithm')
  t.ok(accepted(globalLimit('{ limit: 5, window: 1s, cost: 5 }')))
  t.same(problems(globalLimit('{ limit: 5, window: 1s, cost: 6 }')), ['gw.yaml:2:41 limits.global.cost: cost 6 is above the capacity 5: every request would be rejected'])
  t.same(problems(globalLimit('{ algorithm: fixed-window, limit: 5, window: 1s, burst: 10, cost: 6 }')), [
    'gw.yaml:2:67 limits.global.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window',
    'gw.yaml:2:77 limits.global.cost: cost 6 is above the capacity 5: every request would be rejected'
  ])
})

t.test('every limit is checked: per route (api, ip, user), gateway-wide (ip, user), per plan', async t => {
  const fw = '{ algorithm: fixed-window, limit: 1, window: 1s, burst: 2 }'
  t.same(problems(ID + UP + `routes:\n  - name: a\n    pathPrefix: /\n    upstream: b\n    limits:\n      api: ${fw}\n      ip: ${fw}\n      user: ${fw}\n`), [
    'gw.yaml:9:68 routes[0].limits.api.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window',
    'gw.yaml:10:67 routes[0].limits.ip.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window',
    'gw.yaml:11:69 routes[0].limits.user.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window'
  ])
  t.same(problems(`limits:\n  ip: ${fw}\n  user: ${fw}\n` + ID + BASE), [
    'gw.yaml:2:63 limits.ip.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window',
    'gw.yaml:3:65 limits.user.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window'
  ])
  t.same(problems(ID + BASE + `plans:\n  free:\n    limits: { user: ${fw}, quota: { limit: 5, period: day, cost: 6 } }\n    routes: { nope: { user: ${fw} } }\n`), [
    'gw.yaml:8:77 plans.free.limits.user.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window',
    'gw.yaml:9:21 plans.free.routes.nope: unknown route "nope"',
    'gw.yaml:9:85 plans.free.routes.nope.user.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window',
    'gw.yaml:8:120 plans.free.limits.quota.cost: cost 6 is above the quota 5: every request would be rejected'
  ])
  t.ok(accepted(ID + BASE + 'plans: { free: { limits: { quota: { limit: 5, period: day, cost: 5 } } }, pro: { routes: { a: { user: { limit: 1, window: 1s } } } } }\n'))
})

t.test('a user limit, plan, quota or user concurrency needs an identity', async t => {
  const limitMessage = 'gw.yaml:1:1 identity: a "user" limit, plan or quota is configured but no identity: add identity.header, identity.apiKeys or identity.jwt'
  const concurrencyMessage = 'gw.yaml:1:1 identity: a "concurrency.user" limit is configured but no identity: add identity.header, identity.apiKeys or identity.jwt'
  const withLimits = (limits: string): string => UP + `routes:\n  - { name: a, pathPrefix: /, upstream: b, ${limits} }\n`
  t.same(problems('limits: { user: { limit: 1, window: 1s } }\n' + BASE), [limitMessage])
  t.same(problems(withLimits('limits: { user: { limit: 1, window: 1s } }')), [limitMessage])
  t.same(problems(BASE + 'plans: { free: { limits: { quota: { limit: 1, period: day } } } }\n'), [limitMessage])
  t.same(problems(BASE + 'plans: { free: { routes: { a: { user: { limit: 1, window: 1s } } } } }\n'), [limitMessage])
  t.same(problems('concurrency: { user: 1 }\n' + BASE), [concurrencyMessage])
  t.same(problems(withLimits('concurrency: { user: 1 }')), [concurrencyMessage])
  // one route of several is enough
  const firstOfTwo = (extra: string): string => UP + `routes:\n  - { name: a, pathPrefix: /a, upstream: b, ${extra} }\n  - { name: z, pathPrefix: /, upstream: b }\n`
  t.same(problems(firstOfTwo('limits: { user: { limit: 1, window: 1s } }')), [limitMessage])
  t.same(problems(firstOfTwo('concurrency: { user: 1 }')), [concurrencyMessage])
  t.ok(accepted(BASE + 'plans: { free: {} }\n'), 'a plan without limits needs no identity')
  t.ok(accepted('limits: { ip: { limit: 1, window: 1s } }\nconcurrency: { ip: 1 }\n' + withLimits('limits: { api: { limit: 1, window: 1s } }, concurrency: { route: 1 }')))
  t.ok(accepted(ID + 'limits: { user: { limit: 1, window: 1s } }\nconcurrency: { user: 1 }\n' + BASE))
})

t.test('jwt: exactly one key source', async t => {
  const message = 'gw.yaml:1:18 identity.jwt: give exactly one of "secret", "publicKey" or "jwksUrl"'
  t.same(problems('identity: { jwt: { claim: sub } }\n' + BASE), [message])
  t.same(problems('identity: { jwt: { secret: s, jwksUrl: "http://k/" } }\n' + BASE), [message])
  t.same(problems('identity: { jwt: { secret: s, publicKey: p } }\n' + BASE), [message])
  t.ok(accepted('identity: { jwt: { jwksUrl: "http://k/" } }\n' + BASE))
  t.ok(accepted('identity: { jwt: { publicKey: p } }\n' + BASE))
})

t.test('redis: one mode, a sentinel master name, sentinelTls with sentinels and tls, a lease TTL of at least 1 s', async t => {
  const message = 'gw.yaml:1:8 redis: give exactly one of "url", "cluster" or "sentinels"'
  t.same(problems('redis: { password: x }\n' + BASE), [message])
  t.same(problems('redis: { url: "redis://a:1", cluster: ["redis://b:1"] }\n' + BASE), [message])
  t.same(problems('redis: { url: "redis://a:1", sentinels: ["b:1"], name: m }\n' + BASE), [message])
  t.same(problems('redis: { sentinels: ["a:1"] }\n' + BASE), ['gw.yaml:1:8 redis.name: sentinels need the master "name"'])
  t.ok(accepted('redis: { sentinels: ["a:1"], name: m }\n' + BASE))
  t.ok(accepted('redis: { cluster: ["redis://a:1"] }\n' + BASE))
  t.same(problems('redis: { url: "redis://a:1", sentinelTls: true }\n' + BASE), ['gw.yaml:1:43 redis.sentinelTls: sentinelTls is for "sentinels": remove it, or give the sentinels'])
  t.same(problems('redis: { url: "rediss://a:1", sentinelTls: false }\n' + BASE), ['gw.yaml:1:44 redis.sentinelTls: sentinelTls is for "sentinels": remove it, or give the sentinels'])
  t.same(problems('redis: { sentinels: ["a:1"], name: m, sentinelTls: true }\n' + BASE), ['gw.yaml:1:52 redis.sentinelTls: sentinelTls uses the "tls" settings: set tls (true, or { ca, servername, cert, key })'])
  t.same(problems('redis: { sentinels: ["a:1"], name: m, tls: false, sentinelTls: true }\n' + BASE), ['gw.yaml:1:64 redis.sentinelTls: sentinelTls uses the "tls" settings: set tls (true, or { ca, servername, cert, key })'])
  t.ok(accepted('redis: { sentinels: ["a:1"], name: m, tls: true, sentinelTls: true }\n' + BASE))
  t.ok(accepted('redis: { sentinels: ["a:1"], name: m, sentinelTls: false }\n' + BASE))
  t.same(problems('redis: { url: "redis://h:1", leaseTtl: 999ms }\n' + BASE), ['gw.yaml:1:40 redis.leaseTtl: leaseTtl must be at least 1s (leases are renewed every third of it)'])
  t.ok(accepted('redis: { url: "redis://h:1", leaseTtl: 1s }\n' + BASE))
})

t.test('server.headersTimeout longer than server.requestTimeout is named at the key written, not by node:http at start', async t => {
  const message = (headers: string, request: string): string => `headersTimeout (${headers}) must not be longer than requestTimeout (${request}): the headers are part of the request`
  t.same(problems('server: { headersTimeout: 20s, requestTimeout: 10s }\n' + BASE), [`gw.yaml:1:27 server.headersTimeout: ${message('20s', '10s')}`])
  // the default headersTimeout is 10s
  t.same(problems('server: { requestTimeout: 5s }\n' + BASE), [`gw.yaml:1:27 server.requestTimeout: ${message('10s', '5s')}`])
  t.ok(accepted('server: { headersTimeout: 10s, requestTimeout: 10s }\n' + BASE))
  t.ok(accepted('server: { headersTimeout: 20s, requestTimeout: 0s }\n' + BASE), 'requestTimeout 0 is no timeout')
})

t.test('workers > 1 without Redis is refused when any limit is shared', async t => {
  const message = 'gw.yaml:1:10 workers: workers > 1 needs "redis:" for the shared limits: without it each worker would enforce every limit on its own (N times the budget)'
  const route = (extra: string): string => UP + `routes:\n  - { name: a, pathPrefix: /, upstream: b, ${extra} }\n`
  t.same(problems('workers: 2\nconcurrency: { ip: 1 }\n' + BASE), [message])
  t.same(problems('workers: 2\nlimits: { ip: { limit: 1, window: 1s } }\n' + BASE), [message])
  t.same(problems('workers: 2\n' + route('concurrency: { route: 1 }')), [message])
  t.same(problems('workers: 2\n' + route('limits: { ip: { limit: 1, window: 1s } }')), [message])
  t.same(problems('workers: 2\n' + UP + 'routes:\n  - { name: a, pathPrefix: /a, upstream: b, limits: { ip: { limit: 1, window: 1s } } }\n  - { name: z, pathPrefix: /, upstream: b }\n'), [message], 'one route of several')
  t.ok(accepted('workers: 1\nlimits: { ip: { limit: 1, window: 1s } }\n' + BASE))
  t.ok(accepted('workers: 2\n' + BASE))
  t.ok(accepted('workers: 2\nredis: { url: "redis://h:1" }\nlimits: { ip: { limit: 1, window: 1s } }\n' + BASE))
})

t.test('an admin token is visible ASCII (a header could never carry "€" as written)', async t => {
  const text = (token: string): string => `admin: { listen: "127.0.0.1:9901", token: "${token}" }\n` + BASE
  t.same(problems(text('abcdefghijklmnop€€')), ['gw.yaml:1:43 admin.token: expected visible ASCII characters only, spaces inside (a header cannot carry others as written)'])
  t.same(problems(text(' abcdefghijklmnop')), ['gw.yaml:1:43 admin.token: expected visible ASCII characters only, spaces inside (a header cannot carry others as written)'], 'a leading space would be trimmed from the header')
  t.ok(accepted(text('abcdefghijklmnop-_.~+/=')))
  t.ok(accepted(text('correct horse battery staple')), 'spaces inside, as accepted before')
})

t.test('the admin listener needs its own port', async t => {
  const clash = (a: string): string => `gw.yaml:2:8 admin: "${a}" is also the listen address: the admin listener needs its own port`
  const listen = (l: string, a: string): string => `listen: "${l}"\nadmin: "${a}"\n` + BASE
  t.same(problems(listen('127.0.0.1:9000', '127.0.0.1:9000')), [clash('127.0.0.1:9000')])
  t.same(problems('listen: 127.0.0.1:9000\nadmin: { listen: 127.0.0.1:9000 }\n' + BASE), [
    'gw.yaml:2:18 admin.listen: "127.0.0.1:9000" is also the listen address: the admin listener needs its own port'
  ])
  t.same(problems('listen: 127.0.0.1:9901\n' + BASE), ['gw.yaml:1:9 listen: "127.0.0.1:9901" is also the admin address: the admin listener needs its own port'])
  t.same(problems('listen: 127.0.0.1:9901\nadmin: { token: "0123456789abcdef" }\n' + BASE), [
    'gw.yaml:2:8 admin.listen: "127.0.0.1:9901" is also the listen address: the admin listener needs its own port'
  ])
  // a wildcard host binds every interface, on either side
  t.same(problems(listen('0.0.0.0:9000', '127.0.0.1:9000')), [clash('127.0.0.1:9000')])
  t.same(problems(listen('127.0.0.1:9000', '0.0.0.0:9000')), [clash('0.0.0.0:9000')])
  t.same(problems(listen('[::]:9000', '[::1]:9000')), [clash('[::1]:9000')])
  t.same(problems(listen('[::1]:9000', '[::]:9000')), [clash('[::]:9000')])
  t.same(problems(listen(':9000', '127.0.0.1:9000')), [clash('127.0.0.1:9000')])
  t.same(problems(listen('127.0.0.1:9000', ':9000')), [clash(':9000')])
  t.same(problems(listen('[::1]:9000', '[::1]:9000')), [clash('[::1]:9000')])
  t.ok(accepted(listen('[::1]:9000', '[::2]:9000')))
  t.ok(accepted(listen('[::1]:9000', '[::1]:9001')))
  t.ok(accepted(listen('127.0.0.1:9000', '127.0.0.2:9000')))
  t.ok(accepted(listen('0.0.0.0:9000', '0.0.0.0:9001')))
  t.ok(accepted(listen('0.0.0.0:90', '0.0.0.0:9090')), 'the port is the text after the last colon, not a suffix')
  t.ok(accepted(listen('127.0.0.1:0', '127.0.0.1:0')), 'port 0 never collides')
  t.ok(accepted(listen('0.0.0.0:0', '0.0.0.0:0')), 'port 0 never collides')
})

t.test('header rules cannot touch the framing fields or set hop-by-hop ones; an upstream named like an Object property is unknown', async t => {
  const route = (headers: string): string => `upstreams:\n  b: { targets: [http://127.0.0.1:1] }\nroutes:\n  - { name: a, pathPrefix: /, upstream: b, headers: ${headers} }\n`
  t.same(problems(route('{ response: { set: { Content-Length: "5", connection: keep-alive } } }')), [
    'gw.yaml:4:90 routes[0].headers.response.set.Content-Length: content-length frames the message and is written by the gateway from the body it relays: a rule cannot set it',
    'gw.yaml:4:107 routes[0].headers.response.set.connection: connection is hop-by-hop (RFC 9110 §7.6.1): it describes one connection and is never forwarded, so it cannot be set'
  ])
  t.same(problems(route('{ request: { set: { transfer-encoding: chunked, expect: 100-continue, upgrade: h2c }, remove: [content-length, keep-alive] } }')), [
    'gw.yaml:4:92 routes[0].headers.request.set.transfer-encoding: transfer-encoding frames the message and is written by the gateway from the body it relays: a rule cannot set it',
    'gw.yaml:4:109 routes[0].headers.request.set.expect: expect cannot be set: the gateway answers 100-continue itself and never sends Expect upstream',
    'gw.yaml:4:132 routes[0].headers.request.set.upgrade: upgrade is hop-by-hop (RFC 9110 §7.6.1): it describes one connection and is never forwarded, so it cannot be set',
    'gw.yaml:4:148 routes[0].headers.request.remove[0]: content-length frames the message and is written by the gateway from the body it relays: a rule cannot remove it'
  ])
  t.ok(accepted(route('{ request: { set: { host: api.internal }, remove: [keep-alive] }, response: { remove: [server] } }')), 'Host can be set; removing a hop-by-hop field is what happens anyway')
  t.same(problems('upstreams:\n  b: { targets: [http://127.0.0.1:1] }\nroutes:\n  - { name: a, pathPrefix: /, upstream: constructor }\n'), [
    'gw.yaml:4:41 routes[0].upstream: unknown upstream "constructor"'
  ])
})

t.test('trusted proxies: a keyword, an address or a CIDR', async t => {
  t.same(accepted('trustedProxies: [loopback, linklocal, uniquelocal, 10.0.0.1, "::1", 10.0.0.0/8, "fd00::/8"]\n' + BASE).config.trustedProxies,
    ['loopback', 'linklocal', 'uniquelocal', '10.0.0.1', '::1', '10.0.0.0/8', 'fd00::/8'])
  t.same(problems('trustedProxies: [loopback, Loopback, 10.0.0.0/33]\n' + BASE), [
    'gw.yaml:1:28 trustedProxies[1]: "Loopback" is not an IP address, a CIDR (e.g. 10.0.0.0/8, 2001:db8::/32) or one of loopback, linklocal, uniquelocal',
    'gw.yaml:1:38 trustedProxies[2]: "10.0.0.0/33" is not an IP address, a CIDR (e.g. 10.0.0.0/8, 2001:db8::/32) or one of loopback, linklocal, uniquelocal'
  ])
})

t.test('upstream targets are origins', async t => {
  t.same(problems('upstreams:\n  b: { targets: [http://h:1/x, "http://h:1?q", { url: "http://h:1/y" }, "http://a:b:c", "http://h:1/", { url: "http://h:2" }] }\n' + ROUTE), [
    'gw.yaml:2:18 upstreams.b.targets[0]: a target is an origin (scheme, host, port) without a path',
    'gw.yaml:2:32 upstreams.b.targets[1]: a target is an origin (scheme, host, port) without a path',
    'gw.yaml:2:48 upstreams.b.targets[2]: a target is an origin (scheme, host, port) without a path',
    'gw.yaml:2:73 upstreams.b.targets[3]: invalid URL "http://a:b:c"'
  ])
  t.same(problems('upstreams:\n  a: { targets: [http://h:1] }\n  b: { targets: [http://h:1/x] }\n' + ROUTE), [
    'gw.yaml:3:18 upstreams.b.targets[0]: a target is an origin (scheme, host, port) without a path'
  ])
  // nothing listens on port 0: every request to the target failed at connect
  t.same(problems('upstreams:\n  b: { targets: [http://h:0, { url: "http://h:00" }, http://h:1] }\n' + ROUTE), [
    'gw.yaml:2:18 upstreams.b.targets[0]: port 0 is not a port a target can be reached on',
    'gw.yaml:2:37 upstreams.b.targets[1].url: port 0 is not a port a target can be reached on'
  ])
})

t.test('plans and consumers refer to plans that exist; a time zone is an IANA name', async t => {
  t.same(problems(ID + BASE + 'consumers: { alice: { plan: gold } }\n'), ['gw.yaml:6:29 consumers.alice.plan: unknown plan "gold" (no plans are configured)'])
  t.same(problems(ID + BASE + 'consumers: { alice: { plan: gold }, bob: { plan: free } }\nplans: { free: {}, pro: {} }\ndefaultPlan: silver\n'), [
    'gw.yaml:6:29 consumers.alice.plan: unknown plan "gold" (plans: free, pro)',
    'gw.yaml:8:14 defaultPlan: unknown plan "silver" (plans: free, pro)'
  ])
  t.ok(accepted(ID + BASE + 'consumers: { bob: { plan: free } }\nplans: { free: {} }\ndefaultPlan: free\n'))
  t.same(problems(BASE + 'quotaTimezone: Mars/Olympus\n'), ['gw.yaml:5:16 quotaTimezone: unknown time zone "Mars/Olympus" (expected an IANA name such as Europe/Berlin)'])
  t.ok(accepted(BASE + 'quotaTimezone: Europe/Berlin\n'))
})

t.test('API keys: keys or a file, each key to a consumer the plans know', async t => {
  const api = (inner: string, more = ''): string => `identity: { apiKeys: { header: x, ${inner} } }\n${more}` + BASE
  t.same(problems('identity: { apiKeys: { header: x } }\n' + BASE), ['gw.yaml:1:22 identity.apiKeys: give "keys", "file" or both'])
  t.same(problems(api('keys: { k1: "" }')), ['gw.yaml:1:47 identity.apiKeys.keys.<an API key>: an API key must map to a consumer name'])
  const plans = 'consumers: { alice: { plan: free } }\nplans: { free: {} }\n'
  t.same(problems(api('keys: { k1: alice, k2: bob }', plans)), [
    'gw.yaml:1:58 identity.apiKeys.keys.<an API key>: API key maps to consumer "bob", which has no entry in consumers (and there is no defaultPlan)'
  ])
  t.ok(accepted(api('keys: { k1: alice, k2: bob }', plans + 'defaultPlan: free\n')), 'bob gets the default plan')
  t.ok(accepted(api('keys: { k2: bob }')), 'no plans: consumers are names')
  t.same(problems(api('keys: { k1: alice }', 'plans: { free: {} }\n')), [
    'gw.yaml:1:47 identity.apiKeys.keys.<an API key>: API key maps to consumer "alice", which has no entry in consumers (and there is no defaultPlan)'
  ], 'plans but no consumers at all')
  t.ok(accepted(api('keys: { k1: alice }, file: keys.yaml', plans)))
  // Object.hasOwn: a key to "constructor" is not a consumer because every object has one
  t.same(problems(api('keys: { k1: constructor }', plans)), [
    'gw.yaml:1:47 identity.apiKeys.keys.<an API key>: API key maps to consumer "constructor", which has no entry in consumers (and there is no defaultPlan)'
  ])
})

t.test('API keys and consumer names YAML would read as a number or null are refused at the key: quote them', async t => {
  const text = 'identity: { apiKeys: { header: x, keys: { 007123456789: alice, ~: bob, "0099": carol, 42: dave } } }\nconsumers: { 007: { plan: free }, 12: { plan: free } }\nplans: { free: {} }\ndefaultPlan: free\n' + BASE
  t.same(problems(text), [
    'gw.yaml:1:43 identity.apiKeys.keys.<an API key>: this API key: YAML reads it as a number, not as the text written: quote it',
    'gw.yaml:1:64 identity.apiKeys.keys.<an API key>: this API key: YAML reads it as null (an empty key, ~ or null): quote it, or remove the line',
    'gw.yaml:2:14 consumers.7: consumer name: YAML reads it as the number 7, not as the text written: quote it'
  ])
  t.notMatch(problems(text).join('\n'), /7123456789/, 'the key is not printed')
  t.ok(accepted(text.replace('007123456789', '"007123456789"').replace('~:', '"~":').replace('007:', '"007":')))
})

t.test('regression: a key of another form of a union is not "unknown" with itself as the suggestion', async t => {
  // identity takes header, apiKeys or jwt: given two, the second used to read
  // 'unknown key "apiKeys" (did you mean apiKeys?)'
  t.same(problems('identity: { header: x, apiKeys: { header: y, keys: { k: a } } }\n' + BASE), [
    'gw.yaml:1:24 identity.apiKeys: key "apiKeys" belongs to another form of identity: it cannot be combined with the keys beside it'
  ])
  // with an unknown key deeper in every form, the top-level clash is still reported as such
  t.same(problems('identity: { header: x, apiKeys: { header: y, keys: { k: a } }, failureLimit: { limit: 1, window: 1s, burts: 2 } }\n' + BASE), [
    'gw.yaml:1:102 identity.failureLimit.burts: unknown key "burts" (did you mean burst?)',
    'gw.yaml:1:24 identity.apiKeys: key "apiKeys" belongs to another form of identity: it cannot be combined with the keys beside it'
  ])
  t.same(problems('identity: { APIKEYS: { header: y } }\n' + BASE), ['gw.yaml:1:13 identity.APIKEYS: unknown key "APIKEYS" (did you mean apiKeys?)'])
})

t.test('regression: a jwt identity with two wrong values is reported as a jwt identity', async t => {
  // every form ties at two issues; the first (header) used to win: 'identity.header: required key
  // is missing' and 'identity.jwt: unknown key "jwt" (did you mean jwt?)'
  t.same(problems('identity: { jwt: { secret: 1, claim: 2 } }\n' + BASE), [
    'gw.yaml:1:28 identity.jwt.secret: Invalid input: expected string, received number',
    'gw.yaml:1:38 identity.jwt.claim: Invalid input: expected string, received number'
  ])
  t.same(problems('identity: { apiKeys: { header: 1, keys: 2 } }\n' + BASE), [
    'gw.yaml:1:32 identity.apiKeys.header: Invalid input: expected string, received number',
    'gw.yaml:1:41 identity.apiKeys.keys: Invalid input: expected record, received number'
  ])
})

t.test('a problem inside an alias is located at the alias, where the anchored text is reused', async t => {
  t.same(problems('upstreams:\n  a: { targets: &t [http://h:1/x] }\n  b: { targets: *t }\n' + ROUTE), [
    'gw.yaml:2:21 upstreams.a.targets[0]: a target is an origin (scheme, host, port) without a path',
    'gw.yaml:3:17 upstreams.b.targets[0]: a target is an origin (scheme, host, port) without a path'
  ])
  t.same(problems('upstreams:\n  a: &u { targets: [http://h:1], wieght: 1 }\n  b: *u\n' + ROUTE), [
    'gw.yaml:2:34 upstreams.a.wieght: unknown key "wieght"',
    'gw.yaml:3:6 upstreams.b.wieght: unknown key "wieght"'
  ])
})

t.test('identity.failureLimit is checked like every other limit, and cannot be in shadow mode', async t => {
  const failureLimit = (limit: string): string => `identity: { header: x-user, failureLimit: ${limit} }\n` + BASE
  t.same(problems(failureLimit('{ algorithm: sliding-window-log, limit: 20000, window: 1m }')), [
    'gw.yaml:1:43 identity.failureLimit: sliding-window-log stores one entry per admitted unit: limit must be <= 10000 (use sliding-window for larger limits)'
  ])
  t.same(problems(failureLimit('{ limit: 10, window: 0s }')), ['gw.yaml:1:64 identity.failureLimit.window: must be from 1ms to 312749h (2^50 µs, what the limiter counts exactly)'])
  t.same(problems(failureLimit('{ limit: 10, window: 1m, cost: 11 }')), ['gw.yaml:1:74 identity.failureLimit.cost: cost 11 is above the capacity 10: every request would be rejected'])
  t.same(problems(failureLimit('{ algorithm: fixed-window, limit: 10, window: 1m, burst: 20 }')), [
    'gw.yaml:1:100 identity.failureLimit.burst: "burst" applies to gcra, token-bucket and leaky-bucket, not fixed-window'
  ])
  t.same(problems(failureLimit('{ limit: 10, window: 1m, mode: shadow }')), [
    'gw.yaml:1:74 identity.failureLimit.mode: a failure budget cannot be in shadow mode: it is what stops a client guessing credentials, so it is always enforced (remove "mode")'
  ])
  // in each form of identity
  t.same(problems('identity: { apiKeys: { header: x, keys: { k-1: a } }, failureLimit: { limit: 10, window: 0s } }\n' + BASE), [
    'gw.yaml:1:90 identity.failureLimit.window: must be from 1ms to 312749h (2^50 µs, what the limiter counts exactly)'
  ])
  t.same(problems(`identity: { jwt: { secret: "${'s'.repeat(32)}" }, failureLimit: { limit: 10, window: 1m, mode: shadow } }\n` + BASE), [
    'gw.yaml:1:111 identity.failureLimit.mode: a failure budget cannot be in shadow mode: it is what stops a client guessing credentials, so it is always enforced (remove "mode")'
  ])
  t.match(accepted(failureLimit('{ algorithm: sliding-window-log, limit: 10000, window: 1m, cost: 10000, mode: enforce }')).config.identity?.failureLimit, { limit: 10000, mode: 'enforce' })
})

t.test('an upstream target URL holding credentials is refused, and the message does not show them', async t => {
  const found = problems('upstreams:\n  b: { targets: ["http://user:s3cret@127.0.0.1:1", { url: "http://u:pw-2@h:2", weight: 2 }, "http://tok3n@h:3"] }\n' + ROUTE)
  const why = 'a target URL may not hold credentials (user:password@): set an Authorization header with headers.request.set instead'
  t.same(found, [
    `gw.yaml:2:18 upstreams.b.targets[0]: ${why}`,
    `gw.yaml:2:59 upstreams.b.targets[1].url: ${why}`,
    `gw.yaml:2:93 upstreams.b.targets[2]: ${why}`
  ])
  t.notMatch(found.join('\n'), /s3cret|pw-2|tok3n/)
  // an unparsable URL is quoted, without what stands before its "@"
  t.same(problems('upstreams:\n  b: { targets: ["http://u:s3cret@a:b:c"] }\n' + ROUTE), ['gw.yaml:2:18 upstreams.b.targets[0]: invalid URL "http://<credentials>@a:b:c"'])
  // a password holding "/", "?" or "#": the userinfo ends at the last "@", not before them
  const slashed = problems('upstreams:\n  b: { targets: ["https://kid:q9Xz/4Rt+Lm@idp.example/x", "http://u:a?b#c@host:99999"] }\n' + ROUTE)
  t.same(slashed, ['gw.yaml:2:18 upstreams.b.targets[0]: invalid URL "https://<credentials>@idp.example/x"', 'gw.yaml:2:59 upstreams.b.targets[1]: invalid URL "http://<credentials>@host:99999"'])
  t.notMatch(slashed.join('\n'), /q9Xz|4Rt|a\?b/)
})

t.test('a secret written unquoted that YAML reads as a tag or an alias is never quoted in the error', async t => {
  const secrets = ['!NewAdm1nT0kenSecret', '*R3disPassw0rdXYZ']
  const cases = [
    `admin: { listen: 127.0.0.1:9901, token: ${secrets[0] as string} }\n${BASE}`,
    `identity: { jwt: { secret: ${secrets[0] as string} } }\n${BASE}`,
    `redis: { url: "redis://r:6379", password: ${secrets[1] as string} }\n${BASE}`,
    // a route matching a shared secret's value: /config hides matchHeaders values (src/admin/redact.ts)
    `${UP}routes:\n  - { name: a, pathPrefix: /, upstream: b, matchHeaders: { x-internal-auth: ${secrets[0] as string} } }\n`
  ]
  for (const text of cases) {
    const found = problems(text)
    t.equal(found.length, 1, found.join('\n'))
    t.match(found[0], /(unknown tag|an alias) at the start of a secret \(not quoted here/, 'located, and says why the value is not shown')
    t.notMatch(found.join('\n'), /NewAdm1n|R3dis/, 'the secret is not in it')
  }
  // a key that starts with "!" or "*" is YAML's own syntax error, which quotes nothing
  for (const keys of [`\n      ${secrets[0] as string}: alice`, ` { ${secrets[0] as string}: alice }`, `\n      ${secrets[1] as string}: alice`]) {
    const found = problems(`identity:\n  apiKeys:\n    header: x-api-key\n    keys:${keys}\n${BASE}`)
    t.equal(found.length, 1, found.join('\n'))
    t.notMatch(found.join('\n'), /NewAdm1n/)
  }
  // elsewhere the tag and the alias are named, as before
  t.match(problems(`a: !nothing x\n${BASE}`), [/unknown tag !nothing:/])
})

t.test('an unknown key in identity.apiKeys, or beside it, is named by its place: it may be a mis-indented API key', async t => {
  const tooHigh = problems('identity:\n  apiKeys:\n    header: x-api-key\n    keys: { k-live-abc123: alice }\n    k-live-def456: bob\n' + BASE)
  t.same(tooHigh, ['gw.yaml:5:5 identity.apiKeys.<key 3>: unknown key, not quoted as it may be an API key (inline keys go under "keys")'])
  const twoLevels = problems('identity:\n  apiKeys: { header: x-api-key, keys: { k-live-abc123: alice } }\n  k-live-def456: bob\n' + BASE)
  t.same(twoLevels, ['gw.yaml:3:3 identity.<key 2>: unknown key, not quoted as it may be an API key (inline keys go under "keys")'])
  t.notMatch([...tooHigh, ...twoLevels].join('\n'), /k-live/)
  // a typo of a key the form has still gets its suggestion
  t.same(problems('identity:\n  apiKeys: { headr: x-api-key, keys: { k-1: alice } }\n' + BASE), [
    'gw.yaml:2:12 identity.apiKeys.header: required key is missing',
    'gw.yaml:2:14 identity.apiKeys.<key 1>: unknown key, not quoted as it may be an API key (inline keys go under "keys") (did you mean header?)'
  ])
  // the other forms of identity hold no API key: their unknown keys are quoted
  t.same(problems('identity: { header: x-user, k-live-def456: bob }\n' + BASE), ['gw.yaml:1:29 identity.k-live-def456: unknown key "k-live-def456"'])
})

t.test('a duration a timer waits is at most 596h; 0 is refused where it would fire at once', async t => {
  const timerBound = 'at most 596h (2147483647ms, the longest a timer can wait: a longer one would fire after 1ms)'
  const zero = 'must be more than 0: a timer of 0 fires at once'
  t.same(problems('server: { shutdownTimeout: 597h, clientBodyTimeout: 2147483648ms, sendTimeout: 0s, keepAliveTimeout: 35791395m }\n' + BASE), [
    `gw.yaml:1:102 server.keepAliveTimeout: ${timerBound}`,
    `gw.yaml:1:28 server.shutdownTimeout: ${timerBound}`,
    `gw.yaml:1:53 server.clientBodyTimeout: ${timerBound}`,
    `gw.yaml:1:80 server.sendTimeout: ${zero}`
  ])
  t.same(problems('upstreams:\n  b: { targets: [http://h:1], timeouts: { connect: 0s, response: 0ms, idle: 600h, queue: 1000h }, ejectFor: 9999h }\n' + ROUTE), [
    `gw.yaml:2:52 upstreams.b.timeouts.connect: ${zero}`,
    `gw.yaml:2:66 upstreams.b.timeouts.response: ${zero}`,
    `gw.yaml:2:77 upstreams.b.timeouts.idle: ${timerBound}`,
    `gw.yaml:2:90 upstreams.b.timeouts.queue: ${timerBound}`,
    `gw.yaml:2:109 upstreams.b.ejectFor: ${timerBound}`
  ])
  t.same(problems(UP + 'routes:\n  - { name: a, pathPrefix: /, upstream: b, timeouts: { response: 0s } }\n'), [`gw.yaml:4:66 routes[0].timeouts.response: ${zero}`])
  t.same(problems('redis: { url: "redis://h:1", timeout: 0s, leaseTtl: 1000h }\n' + BASE), [
    `gw.yaml:1:39 redis.timeout: ${zero}`,
    `gw.yaml:1:53 redis.leaseTtl: ${timerBound}`
  ])
  t.same(problems(globalLimit('{ algorithm: leaky-bucket, limit: 1, window: 1000h, onLimit: delay, maxDelay: 1000h }')), [`gw.yaml:2:89 limits.global.maxDelay: ${timerBound}`])
  // the longest a timer can wait, in either unit, and 0 where it means "no wait" or "no timeout"
  const edge = accepted('server: { shutdownTimeout: 0s, keepAliveTimeout: 2147483647ms, sendTimeout: 596h }\n' + UP.replace('] }', '], timeouts: { queue: 0s, idle: 0s } }') + ROUTE)
  t.match(edge.config.server, { shutdownTimeout: '0s', keepAliveTimeout: '2147483647ms', sendTimeout: '596h' })
  // limit windows are arithmetic, not timers: longer than a timer can wait is fine
  t.match(accepted(globalLimit('{ algorithm: sliding-window, limit: 10, window: 1000h }')).config.limits?.global, { window: '1000h' })
})

t.test('YAML aliases: one anchor reused on every route loads; nested aliases that multiply, a self-reference or a missing anchor are located errors', async t => {
  let reused = 'limits:\n  ip: &std { limit: 5, window: 1s }\n' + UP + 'routes:\n'
  for (let i = 0; i < 150; i++) reused += `  - { name: r${i}, pathPrefix: /r${i}/, upstream: b, limits: { ip: *std } }\n`
  const loaded = accepted(reused)
  t.equal(loaded.config.routes.length, 150)
  t.match(loaded.config.routes[149]?.limits?.ip, { limit: 5, window: '1s' })
  // "billion laughs": nine levels of nine aliases would expand to 9^9 copies
  let laughs = 'a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n'
  for (const [prev, name] of [['a', 'b'], ['b', 'c'], ['c', 'd'], ['d', 'e'], ['e', 'f'], ['f', 'g'], ['g', 'h'], ['h', 'i']]) laughs += `${name as string}: &${name as string} [${Array(9).fill(`*${prev as string}`).join(', ')}]\n`
  const started = performance.now()
  const refused = problems(laughs + BASE)
  t.ok(performance.now() - started < 1000, 'refused before expanding')
  t.same(refused, ['gw.yaml:4:32: aliases expand to more than 498 copies of one anchor (nested aliases multiply, as in a "billion laughs" document): write fewer levels of aliases'])
  t.same(problems('a: &x [1, *x]\n' + BASE), ['gw.yaml:1:11: alias *x is inside the node anchored &x: the value would contain itself'])
  t.same(problems('a: *none\n' + BASE), ['gw.yaml:1:4: alias *none names no anchor before it (write &none on an earlier node)'])
})

t.test('a JWKS or OTLP collector URL holding credentials is refused at its place, and no message shows them', async t => {
  const jwks = 'a JWKS URL may not hold credentials (user:password@): it would be shown on /config, in logs and in errors; serve the key set where the gateway can read it without them'
  const otlp = 'an OTLP collector URL may not hold credentials (user:password@): it would be shown on /config, in logs and in errors, and an OTLP/HTTP collector takes its credentials in a header (e.g. Authorization), not in the URL'
  const text = 'identity: { jwt: { jwksUrl: "https://kid:s3cret@idp.example/jwks.json" } }\ntracing: { otlp: "http://otel:pw-2@collector:4318" }\n' + BASE
  const found = problems(text)
  t.same(found, [`gw.yaml:1:29 identity.jwt.jwksUrl: ${jwks}`, `gw.yaml:2:18 tracing.otlp: ${otlp}`])
  t.same(problems('tracing: { otlp: "https://tok3n@collector:4318" }\n' + BASE), [`gw.yaml:1:18 tracing.otlp: ${otlp}`], 'a user name alone is a credential too')
  // an unparsable URL is quoted without what stands before its "@"
  const unparsable = problems('identity: { jwt: { jwksUrl: "https://kid:s3cret@idp:99999/jwks" } }\n' + BASE)
  t.same(unparsable, ['gw.yaml:1:29 identity.jwt.jwksUrl: invalid URL "https://<credentials>@idp:99999/jwks"'])
  t.notMatch([...found, ...unparsable].join('\n'), /s3cret|pw-2|tok3n|kid:|otel:/)
  // from a file, as `gateway validate` and a reload read it
  const dir = await mkdtemp(resolve(tmpdir(), 'gw-credentials-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const file = resolve(dir, 'gateway.yaml')
  await writeFile(file, text)
  let loaded = ''
  try {
    await loadConfigFile(file)
  } catch (err) {
    loaded = (err as Error).message
  }
  t.same(loaded.split('\n'), [`${file}:1:29 identity.jwt.jwksUrl: ${jwks}`, `${file}:2:18 tracing.otlp: ${otlp}`], 'loadConfigFile refuses the file with located messages')
  // the same URLs without credentials load
  t.match(accepted('identity: { jwt: { jwksUrl: "https://idp.example/jwks.json" } }\ntracing: { otlp: "http://collector:4318" }\n' + BASE).config.tracing, { otlp: 'http://collector:4318' })
})
