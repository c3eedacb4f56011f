import t from 'tap'
import { normalizePath } from '../src/router/normalize-path.js'

t.test('already normal paths are returned as the same string', async (t) => {
  for (const p of ['/', '/api', '/api/', '/api/v1/users/42', '/a.b/c.json', '/x;y=1', '/caf\u00e9', '/a-b_c~d']) {
    const r = normalizePath(p)
    t.same(r, { ok: true, path: p }, p)
  }
})

t.test('normalization (RFC 3986 §6.2.2, §5.2.4)', async (t) => {
  const cases: Array<[string, string]> = [
    ['/api/../admin', '/admin'],
    ['/a/./b', '/a/b'],
    ['/a/b/..', '/a/'],
    ['/a/b/.', '/a/b/'],
    ['/a/..', '/'],
    ['/.', '/'],
    ['//', '/'],
    ['//a//b///c', '/a/b/c'],
    ['/a//', '/a/'],
    ['/a//..', '/'],
    ['/a/../b/../c/', '/c/'],
    ['/%41%62%63', '/Abc'],
    ['/%7e%2D%5f%2E', '/~-_.'],
    // the ends of each unreserved range (RFC 3986 §2.3) decode too
    ['/%30%39%41%5A%61%7a', '/09AZaz'],
    // encoded controls other than NUL are not decoded: they stay encoded, with uppercase hex
    ['/a%0d%0ab', '/a%0D%0Ab'],
    ['/caf%c3%a9', '/caf%C3%A9'],
    ['/a%3ab', '/a%3Ab'],
    ['/%25', '/%25'],
    // Decoding happens once: "%252e" is the literal "%25" followed by "2e".
    ['/%252e%252e/x', '/%252e%252e/x'],
    ['/a/%2e%2e/b', '/b'],
    ['/a/%2E./b', '/b'],
    ['/a/.%2e/b', '/b'],
    ['/a/%2e/b', '/a/b'],
    ['/.well-known/acme', '/.well-known/acme'],
    ['/a/...', '/a/...'],
    ['/a/..b', '/a/..b'],
    ['/a/b..', '/a/b..'],
    ['/a/b;..', '/a/b;..'],
    // Overlong UTF-8 for "." stays an opaque encoded segment here; it is not a dot segment.
    ['/a/%c0%ae%c0%ae/b', '/a/%C0%AE%C0%AE/b']
  ]
  for (const [input, expected] of cases) {
    t.same(normalizePath(input), { ok: true, path: expected }, input)
  }
})

t.test('attack strings are rejected', async (t) => {
  const attacks = [
    'api',
    '',
    '*',
    'http://evil/',
    '/..',
    '/../etc/passwd',
    '/a/../../etc/passwd',
    '/%2e%2e/etc/passwd',
    '/%2E%2E',
    '/a/%2e%2e/%2e%2e/x',
    '/.%2e/x',
    '/%2e./x',
    '/api/..%2fadmin',
    '/api/..%2Fadmin',
    '/api%2f..%2fadmin',
    '/api/..%5cadmin',
    '/api/..%5Cadmin',
    '/api/..\\admin',
    '/api\\admin',
    '/file%00.png',
    '/a%0',
    '/a%',
    '/a%zz',
    '/a%4',
    '/a%4g',
    '/a%g4',
    '/a%%41',
    '/%',
    // ":" follows "9" and "G" follows "F" in ASCII: neither is a hex digit
    '/a%:0',
    '/a%0:',
    // non-ASCII where a hex digit should be, including U+0080 right past the ASCII table
    '/a%\u00801',
    '/a%1\u0080',
    '/a%\u00e91',
    '/a\u0000b',
    '/a\rb',
    '/a\nb',
    '/a\tb',
    '/a b',
    '/a\u007fb',
    '/api/..;/admin',
    '/api/.;/admin',
    '/api/..;jsessionid=1/admin',
    '/api/%2e%2e;/admin',
    '/api/%2e;x/admin',
    '/%u002e%u002e/x',
    '/a/%2e%2e%5c..%5cx',
    // a fragment never belongs in a request target; cut off upstream, "/login#" is "/login"
    '/login#',
    '/login#x',
    '/a/%2e%2e#'
  ]
  for (const p of attacks) {
    const r = normalizePath(p)
    t.equal(r.ok, false, JSON.stringify(p))
    if (!r.ok) t.type(r.reason, 'string')
  }
})

t.test('errors name the cause', async (t) => {
  const reason = (p: string): string => {
    const r = normalizePath(p)
    return r.ok ? 'ok' : r.reason
  }
  t.match(reason('x'), /start with/)
  t.match(reason('/..'), /above the root/)
  t.match(reason('/%zz'), /percent-encoding/)
  t.match(reason('/%2f'), /encoded/)
  t.match(reason('/a\\b'), /backslash/)
  t.match(reason('/a\u0001'), /control/)
  t.equal(reason('/api/ x'), 'space in path (write it as %20)', 'a space is not called a control character')
  t.match(reason('/login#x'), /fragment/)
  t.match(reason('/..;/'), /parameters/)
})

t.test('the result is idempotent and never contains a dot segment or "//"', async (t) => {
  const alphabet = ['/', '.', 'a', '%2e', '%2E', '%41', '%2f', ';', '%c3', '..', '//']
  let seed = 42
  const rand = (n: number): number => {
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed % n
  }
  let checked = 0
  for (let n = 0; n < 5000; n++) {
    let p = '/'
    const parts = 1 + rand(8)
    for (let k = 0; k < parts; k++) p += alphabet[rand(alphabet.length)]
    const r = normalizePath(p)
    if (!r.ok) continue
    checked++
    const again = normalizePath(r.path)
    if (!again.ok || again.path !== r.path) t.fail(`not idempotent: ${p} -> ${r.path} -> ${JSON.stringify(again)}`)
    if (/\/\.\.?(\/|$)/.test(r.path) || r.path.includes('//') || /%2e/i.test(r.path)) t.fail(`not normal: ${p} -> ${r.path}`)
  }
  t.ok(checked > 1000, `checked ${checked} normal outputs`)
})
