// The Host check (src/router/request-head.ts) scans by hand what a regex matched before: the
// regex stays here as the definition, and both must agree on every string, valid or hostile.
import t from 'tap'
import { isValidHost } from '../src/router/request-head.js'
import { prng } from './helpers/prng.js'

const HOST_RE = /^(?:(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~-]+)(?::([0-9]{0,5}))?)?$/

function byRegex (host: string): boolean {
  const m = HOST_RE.exec(host)
  return m !== null && (m[1] === undefined || m[1] === '' || Number(m[1]) <= 65535)
}

t.test('the Host check accepts exactly what the RFC 3986 regex accepts', async t => {
  const cases: Array<[string, boolean]> = [
    ['', true], ['example.com', true], ['example.com:8080', true], ['example.com:', true], ['a', true],
    ['[::1]', true], ['[::1]:443', true], ['[2001:db8::a.b]', true], ['[2001:db8::x]', false], ['[2001:DB8::1]:65535', true],
    ['example.com:65535', true], ['example.com:65536', false], ['example.com:000080', false], ['example.com:99999', false],
    [':80', false], ['[]', false], ['[::1', false], ['::1', false], ['a@b', false], ['x/y', false], ['host:abc', false],
    ['a b', false], ['exa%6dple.com', false], ['h\u00e9', false], ['[::1]x', false], ['[::1]]', false], ['a:1:2', false],
    ['under_score.~tilde-dash', true], ['[1.2.3.4]', true], ['[g::1]', false]
  ]
  for (const [host, valid] of cases) {
    t.equal(byRegex(host), valid, `the regex: ${JSON.stringify(host)}`)
    t.equal(isValidHost(host), valid, JSON.stringify(host))
  }
  // random strings over the characters that matter at each position
  const alphabet = 'aZ09.-_~:[]@/% \u00e9fF'
  const random = prng(20261127)
  let valid = 0
  let disagreements = 0
  for (let i = 0; i < 20000; i++) {
    const length = Math.floor(random() * 12)
    let host = ''
    for (let j = 0; j < length; j++) host += alphabet[Math.floor(random() * alphabet.length)] as string
    // a valid prefix often, so ports and brackets are reached
    if (random() < 0.5) host = (random() < 0.5 ? '[fe80::1]' : 'api.example') + (random() < 0.7 ? ':' + String(Math.floor(random() * 200000)).slice(0, 1 + Math.floor(random() * 6)) : host)
    const expected = byRegex(host)
    if (expected) valid++
    if (isValidHost(host) !== expected) {
      disagreements++
      t.fail(`${JSON.stringify(host)}: regex ${String(expected)}`)
    }
  }
  t.equal(disagreements, 0, 'no disagreement in 20,000 strings')
  t.ok(valid > 2000, `valid strings were drawn too (${valid})`)
})
