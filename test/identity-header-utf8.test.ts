// A user named in an identity header in UTF-8 (as auth layers send it) is that user: the consumer
// of that name in the config, the user the admin API and a JWT claim name, the user of the access
// line. node reads a header's bytes as Latin-1, so "zoë" arrived as "zoÃ«": no consumer matched
// it, and `gateway limits get --user zoë` read another user's budget.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream, type EchoBody } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import { textOfHeader } from '../src/identify/identity.js'

const TOKEN = 'admin-token-0123456789abcdef'

/** A header value as it goes on the wire: fetch sends each character of the string as one byte. */
const wire = (text: string): string => Buffer.from(text, 'utf8').toString('latin1')

t.test('textOfHeader: UTF-8 bytes read as UTF-8, other bytes left as Latin-1, ASCII as is', async t => {
  t.equal(textOfHeader(wire('zoë')), 'zoë')
  t.equal(textOfHeader(wire('用户-7')), '用户-7')
  // their last byte is 0xA0, which read as Latin-1 is U+00A0, a space to trim()
  for (const name of ['voilà', '小张', 'Р']) t.equal(textOfHeader(wire(name)), name)
  t.equal(textOfHeader('zo\u00eb'), 'zo\u00eb', 'one byte 0xEB is no UTF-8: the Latin-1 ë')
  t.equal(textOfHeader('\u00c3('), '\u00c3(', 'a broken sequence stays as it came')
  const ascii = 'user-42'
  t.equal(textOfHeader(ascii), ascii)
})

t.test('a consumer named in UTF-8 gets its plan; the admin API and the access line name the same user', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0, token: "${TOKEN}" }
identity: { header: x-user-id }
consumers:
  zoë: { plan: gold }
  voilà: { plan: gold }
plans:
  gold:
    limits:
      user: { algorithm: fixed-window, limit: 3, window: 1h }
limits:
  user: { algorithm: fixed-window, limit: 1, window: 1h }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const replies = []
  for (let i = 0; i < 4; i++) replies.push(await send(`${gw.url}/x`, { headers: { 'x-user-id': wire('zoë') } }))
  t.same(replies.map(r => r.status), [200, 200, 200, 429], 'the gold plan\'s 3, not the default 1')
  const line = gw.lines.find(l => l.msg === 'request')
  t.equal(line?.user, 'zoë', 'the access line names the user as text')
  t.equal((replies[0]?.json as EchoBody | undefined)?.headers['x-user-id'], wire('zoë'), 'the header reaches the upstream byte for byte')
  const limits = await send(`${gw.adminUrl}/limits?route=api&user=${encodeURIComponent('zoë')}`)
  t.match(limits.json, { limits: [{ name: 'gold:user', remaining: 0 }] }, 'GET /limits?user=zoë reads the budget the requests spent')
  const reset = await send(`${gw.adminUrl}/limits?route=api&user=${encodeURIComponent('zoë')}`, { method: 'DELETE', headers: { authorization: `Bearer ${TOKEN}` } })
  t.equal(reset.status, 200)
  t.equal((await send(`${gw.url}/x`, { headers: { 'x-user-id': wire('zoë') } })).status, 200, 'and DELETE gives it back')
  const consumer = await send(`${gw.adminUrl}/consumers/${encodeURIComponent('zoë')}`)
  t.match(consumer.json, { consumer: 'zoë', plan: 'gold' })
  // a name whose UTF-8 ends in byte 0xA0 (U+00A0 to trim() when read as Latin-1): cut before it
  // was decoded, "voilà" was "voilÃ", without its plan and sharing the budget of a user "voilÃ"
  const voila = []
  for (let i = 0; i < 4; i++) voila.push((await send(`${gw.url}/x`, { headers: { 'x-user-id': wire('voilà') } })).status)
  t.same(voila, [200, 200, 200, 429], 'voilà: its gold plan')
  t.equal((await send(`${gw.url}/x`, { headers: { 'x-user-id': wire('voilÃ') } })).status, 200, 'voilÃ: another user, with a budget of its own')
  // Unicode spaces around a name are part of it: trim() made "zoë" of these, with her plan and
  // her budget (node strips only spaces and tabs around a value, as it must)
  const left = async (): Promise<unknown> => ((await send(`${gw.adminUrl}/limits?route=api&user=${encodeURIComponent('zoë')}`)).json as { limits: Array<{ remaining: number }> }).limits[0]?.remaining
  const before = await left()
  for (const other of ['zoë\u00a0', '\ufeffzoë', 'zoë\u3000']) {
    t.equal((await send(`${gw.url}/x`, { headers: { 'x-user-id': wire(other) } })).status, 200, `${JSON.stringify(other)}: a user of its own`)
  }
  t.equal(await left(), before, 'none of them spent zoë\'s budget')
  t.equal((await send(`${gw.url}/x`, { headers: { 'x-user-id': ` ${wire('zoë')}\t` } })).status, 200)
  t.equal(await left(), (before as number) - 1, 'spaces and tabs around her name: zoë')
  // bytes that are no UTF-8 name another user: the Latin-1 reading of them, on the default plan
  t.same([await send(`${gw.url}/x`, { headers: { 'x-user-id': 'zo\u00ebx' } }), await send(`${gw.url}/x`, { headers: { 'x-user-id': 'zo\u00ebx' } })].map(r => r.status), [200, 429])
})
