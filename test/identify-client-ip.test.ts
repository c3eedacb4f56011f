import t from 'tap'
import { compileClientIpResolver, looksLikeMisconfiguredProxy } from '../src/identify/client-ip.js'

const LB = '10.0.0.5'

t.test('no trusted proxies: the socket address, whatever XFF says', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: [], ipv6Prefix: 64 })
  t.same(resolve('203.0.113.7', undefined), { ip: '203.0.113.7', key: '203.0.113.7' })
  t.same(resolve('203.0.113.7', '1.1.1.1'), { ip: '203.0.113.7', key: '203.0.113.7' }, 'spoofed XFF ignored')
  t.same(resolve('::ffff:203.0.113.7', '1.1.1.1'), { ip: '203.0.113.7', key: '203.0.113.7' }, 'IPv4-mapped is IPv4')
  t.same(resolve(undefined, '1.1.1.1'), { ip: 'unknown', key: 'unknown' })
  t.same(resolve('not-an-ip', undefined), { ip: 'unknown', key: 'unknown' })
})

t.test('a client behind a trusted proxy', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: ['10.0.0.0/8'], ipv6Prefix: 64 })
  t.equal(resolve(LB, '198.51.100.9').ip, '198.51.100.9')
  t.equal(resolve(`::ffff:${LB}`, '198.51.100.9').ip, '198.51.100.9', 'mapped peer is trusted as IPv4')
  t.equal(resolve(LB, ' 198.51.100.9 ').ip, '198.51.100.9', 'whitespace around entries')
  t.equal(resolve(LB, undefined).ip, LB, 'trusted peer without XFF is the client')
  t.equal(resolve('203.0.113.7', '198.51.100.9').ip, '203.0.113.7', 'untrusted peer: XFF ignored')
})

t.test('spoofing: the client prepends its own XFF', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: ['10.0.0.0/8'], ipv6Prefix: 64 })
  // The client sent "XFF: 1.2.3.4" and the LB appended the address it saw.
  t.equal(resolve(LB, '1.2.3.4, 198.51.100.9').ip, '198.51.100.9')
  t.equal(resolve(LB, '10.0.0.1, 198.51.100.9').ip, '198.51.100.9', 'claiming to be a trusted proxy does not help')
  t.equal(resolve(LB, 'garbage, 198.51.100.9').ip, '198.51.100.9')
  t.equal(resolve(LB, ['1.2.3.4', '198.51.100.9']).ip, '198.51.100.9', 'array form walks right to left too')
  t.equal(resolve(LB, ['1.2.3.4, 5.6.7.8', '10.0.0.9, 198.51.100.9']).ip, '198.51.100.9')
})

t.test('chains through several trusted proxies', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: ['10.0.0.0/8', '192.0.2.1', 'fd00::/8'], ipv6Prefix: 64 })
  t.equal(resolve(LB, '198.51.100.9, 192.0.2.1, 10.1.1.1').ip, '198.51.100.9')
  t.equal(resolve(LB, '1.1.1.1, 198.51.100.9, 192.0.2.1, 10.1.1.1').ip, '198.51.100.9')
  t.equal(resolve(LB, ['198.51.100.9', '192.0.2.1', '10.1.1.1']).ip, '198.51.100.9')
  t.equal(resolve(LB, '2001:db8::1, fd00::2, ::ffff:10.2.2.2').ip, '2001:db8::1', 'mixed families')
  t.equal(resolve(LB, '10.1.1.1, 10.2.2.2').ip, '10.1.1.1', 'all trusted: the left-most entry')
})

t.test('garbage stops the walk at the hop that sent it', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: ['10.0.0.0/8'], ipv6Prefix: 64 })
  t.equal(resolve(LB, 'unknown').ip, LB)
  t.equal(resolve(LB, '198.51.100.9, unknown, 10.1.1.1').ip, '10.1.1.1')
  t.equal(resolve(LB, '198.51.100.9,,10.1.1.1').ip, '10.1.1.1', 'empty entry')
  t.equal(resolve(LB, '').ip, LB)
  t.equal(resolve(LB, '198.51.100.9, 0x7f.1').ip, LB, 'non dotted-quad IPv4 forms are garbage')
  t.equal(resolve(LB, '198.51.100.9, 2130706433').ip, LB)
  t.equal(resolve(LB, '198.51.100.9, 010.0.0.1').ip, LB, 'leading zeros (octal in some parsers) are garbage')
  t.equal(resolve(LB, 'fe80::1%eth0').ip, LB, 'zone ids are garbage')
  t.equal(resolve(LB, '1.2.3.4:99999').ip, LB, 'port out of range')
  t.equal(resolve(LB, '1.2.3.4:').ip, LB)
  t.equal(resolve(LB, '[2001:db8::1').ip, LB)
})

t.test('ports appended by load balancers are tolerated', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: ['10.0.0.0/8'], ipv6Prefix: 64 })
  t.equal(resolve(LB, '198.51.100.9:51234').ip, '198.51.100.9')
  t.equal(resolve(LB, '[2001:db8::1]:443').ip, '2001:db8::1')
  t.equal(resolve(LB, '[2001:db8::1]').ip, '2001:db8::1')
})

t.test('IPv6 clients are grouped by prefix', async (t) => {
  const r64 = compileClientIpResolver({ trustedProxies: [], ipv6Prefix: 64 })
  t.same(r64('2001:db8:1:2:aaaa:bbbb:cccc:dddd', undefined), { ip: '2001:db8:1:2:aaaa:bbbb:cccc:dddd', key: '2001:db8:1:2::/64' })
  t.equal(r64('2001:0DB8:0001:0002::1', undefined).key, '2001:db8:1:2::/64', 'same /64 in another notation')
  t.equal(r64('2001:0DB8:0001:0002::1', undefined).ip, '2001:db8:1:2::1', 'canonical (RFC 5952) text')
  t.not(r64('2001:db8:1:3::1', undefined).key, r64('2001:db8:1:2::1', undefined).key, 'other /64, other key')
  const r56 = compileClientIpResolver({ trustedProxies: [], ipv6Prefix: 56 })
  t.equal(r56('2001:db8:1:2ff::1', undefined).key, '2001:db8:1:200::/56')
  const r128 = compileClientIpResolver({ trustedProxies: [], ipv6Prefix: 128 })
  t.equal(r128('2001:db8::1', undefined).key, '2001:db8::1/128')
  const rDefault = compileClientIpResolver({ trustedProxies: [] })
  t.equal(rDefault('2001:db8:1:2::1', undefined).key, '2001:db8:1:2::/64', 'default prefix is 64')
  t.equal(r64('fe80::1%eth0', undefined).ip, 'fe80::1', 'socket zone id dropped')
})

t.test('invalid options are config errors', async (t) => {
  t.throws(() => compileClientIpResolver({ trustedProxies: ['10.0.0.0/33'], ipv6Prefix: 64 }), { code: 'GW_ERR_CONFIG_INVALID', message: /trustedProxies/ })
  t.throws(() => compileClientIpResolver({ trustedProxies: ['not-an-ip'], ipv6Prefix: 64 }), { code: 'GW_ERR_CONFIG_INVALID' })
  t.throws(() => compileClientIpResolver({ trustedProxies: [], ipv6Prefix: 0 }), { code: 'GW_ERR_CONFIG_INVALID', message: /ipv6Prefix/ })
  t.throws(() => compileClientIpResolver({ trustedProxies: [], ipv6Prefix: 64.5 }), { code: 'GW_ERR_CONFIG_INVALID' })
  t.doesNotThrow(() => compileClientIpResolver({ trustedProxies: ['loopback', 'uniquelocal', '2001:db8::/32'], ipv6Prefix: 64 }))
})

t.test('looksLikeMisconfiguredProxy', async (t) => {
  t.equal(looksLikeMisconfiguredProxy('10.0.0.5', '1.2.3.4', []), true, 'private peer with XFF')
  t.equal(looksLikeMisconfiguredProxy('::ffff:127.0.0.1', '1.2.3.4', []), true, 'loopback (mapped)')
  t.equal(looksLikeMisconfiguredProxy('::1', '1.2.3.4', []), true)
  t.equal(looksLikeMisconfiguredProxy('169.254.1.1', '1.2.3.4', []), true, 'link-local')
  t.equal(looksLikeMisconfiguredProxy('fd12::1', '1.2.3.4', []), true, 'unique local')
  t.equal(looksLikeMisconfiguredProxy('10.0.0.5', undefined, []), false, 'no XFF')
  t.equal(looksLikeMisconfiguredProxy('203.0.113.7', '1.2.3.4', []), false, 'public peer')
  t.equal(looksLikeMisconfiguredProxy('10.0.0.5', '1.2.3.4', ['10.0.0.0/8']), false, 'proxies configured')
  t.equal(looksLikeMisconfiguredProxy(undefined, '1.2.3.4', []), false)
  t.equal(looksLikeMisconfiguredProxy('10.0.0.5', '1.2.3.4'), true, 'trustedProxies defaults to none')
})

t.test('memoized answers equal fresh answers', async (t) => {
  const opts = { trustedProxies: ['10.0.0.0/8', 'fd00::/8'], ipv6Prefix: 48 }
  const cached = compileClientIpResolver(opts)
  const inputs: Array<[string | undefined, string | string[] | undefined]> = [
    ['10.0.0.5', '198.51.100.9'],
    ['10.0.0.5', '1.2.3.4, 10.9.9.9'],
    ['203.0.113.7', '198.51.100.9'],
    ['::ffff:10.0.0.5', '2001:db8:aa:bb::1'],
    ['fd00::1', ['2001:db8:cc::1', 'fd00::2']],
    ['2001:db8:1::1', undefined],
    ['10.0.0.5', 'x'.repeat(300)],
    ['10.0.0.5', undefined]
  ]
  for (let round = 0; round < 3; round++) {
    for (const [addr, xff] of inputs) {
      t.same(cached(addr, xff), compileClientIpResolver(opts)(addr, xff), `round ${round}: ${addr} ${String(xff).slice(0, 40)}`)
    }
  }
  t.equal(cached('fd00::1', ['2001:db8:cc::1', 'fd00::2']).key, '2001:db8:cc::/48')
})

// From the mutation run's survivors (docs/mutation.md).
t.test('port suffixes: the edges of what a load balancer appends', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: ['10.0.0.0/8'], ipv6Prefix: 64 })
  for (const port of ['1', '9', '80', '65535']) t.equal(resolve(LB, `198.51.100.9:${port}`).ip, '198.51.100.9', `port ${port}`)
  for (const garbage of ['198.51.100.9:1a', '198.51.100.9:0000001', '[::1]x', '[::1]x1', '[::1]:']) t.equal(resolve(LB, garbage).ip, LB, garbage)
})

t.test('a walk through trusted hops only ends at the left-most entry', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: ['10.0.0.0/8'], ipv6Prefix: 64 })
  t.equal(resolve(LB, '10.0.0.2, 10.0.0.3').ip, '10.0.0.2')
  t.equal(resolve(LB, ['10.0.0.2', '10.0.0.3']).ip, '10.0.0.2', 'as repeated header lines')
})

t.test('cached chains never answer for another peer or another chain', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: ['10.0.0.0/8'], ipv6Prefix: 64 })
  t.equal(resolve('10.0.0.1', '1.2.3.4').ip, '1.2.3.4')
  t.equal(resolve('10.0.0.11', '.2.3.4').ip, '10.0.0.11', 'peer and chain glued together would read the same')
  t.equal(resolve(LB, ['1.2.3.4', '5.6.7.8']).ip, '5.6.7.8')
  t.equal(resolve(LB, '1.2.3.45.6.7.8').ip, LB, 'header lines glued together would read the same')
})

t.test('peers that are not addresses, and IPv4-mapped peers in other spellings', async (t) => {
  const resolve = compileClientIpResolver({ trustedProxies: ['10.0.0.0/8'], ipv6Prefix: 64 })
  t.same(resolve('not-an-ip', '1.2.3.4'), { ip: 'unknown', key: 'unknown' }, 'with trusted proxies and XFF too')
  t.same(resolve('::ffff:0102:0304', undefined), { ip: '1.2.3.4', key: '1.2.3.4' }, 'hex form of a mapped address')
  t.equal(looksLikeMisconfiguredProxy('not-an-ip', '1.2.3.4', []), false)
})

t.test('ipv6Prefix bounds, and the cause of a trustedProxies error', async (t) => {
  t.doesNotThrow(() => compileClientIpResolver({ trustedProxies: [], ipv6Prefix: 1 }))
  t.doesNotThrow(() => compileClientIpResolver({ trustedProxies: [], ipv6Prefix: 128 }))
  t.throws(() => compileClientIpResolver({ trustedProxies: [], ipv6Prefix: 129 }), { code: 'GW_ERR_CONFIG_INVALID', message: /ipv6Prefix/ })
  try {
    compileClientIpResolver({ trustedProxies: ['not-an-ip'], ipv6Prefix: 64 })
    t.fail('not thrown')
  } catch (err) {
    t.type((err as Error).cause, Error, 'proxy-addr\'s own error kept as the cause')
  }
})
