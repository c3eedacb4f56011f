// `gateway explain` and a live gateway started from the same file agree on who the client is: a
// header value outside ASCII is the user the live gateway reads (UTF-8 bytes read as UTF-8 text),
// and `--user` on an `auth:
// none` route identifies nobody. Split from test/runtime-explain.test.ts (tap's 180 s per file on
// a loaded machine).
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { explainOutput } from './helpers/cli.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import { rawRequest } from './helpers/raw-http.js'

const explain = explainOutput

t.test('a header value outside ASCII is read as the live gateway reads it (its UTF-8 bytes as text): the same user and limit key', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend, limits: { user: { limit: 5, window: 1h } } }
`)
  const file = gw.runtime?.file as string
  const text = explain(file, 'GET', '/x', '--header', 'x-user-id: josé')
  const key = /^limit: +api\.user \[user\] .* key (\S+);/m.exec(text)?.[1]
  // typed here as text, sent by a client as UTF-8 bytes, which node reads one Latin-1 character
  // each ("josÃ©") and the identity header reads back as UTF-8: explain goes the same way
  t.match(text, /^client: .*user josé$/m, text)
  t.match(key, /:josé$/)
  // one request with those bytes: its budget is the one under explain's key
  t.equal((await rawRequest(gw.port, 'GET /x HTTP/1.1\r\nHost: a\r\nx-user-id: josé\r\n')).status, 200)
  const lookup = await send(`${gw.adminUrl}/limits?${new URLSearchParams({ route: 'api', user: 'josé' }).toString()}`)
  t.match(lookup.json?.limits, [{ name: 'api.user', key, remaining: 4 }], 'the live request was charged under that key')
})

t.test('--user on an auth: none route: nobody is identified, as live (explain charged that user\'s limits)', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { header: x-user-id }
limits:
  user: { limit: 2, window: 1h }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: open, pathPrefix: /open/, upstream: backend, auth: none }
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const file = gw.runtime?.file as string
  const text = explain(file, 'GET', '/open/x', '--user', 'bob')
  t.match(text, /^client: .*user \(anonymous\) \(--user bob ignored: auth: none identifies nobody\)$/m, text)
  t.match(text, /^limit: +user \[user\] .* key \(skipped: anonymous request\);/m)
  const statuses: number[] = []
  for (let i = 0; i < 3; i++) statuses.push((await send(`${gw.url}/open/x`, { headers: { 'x-user-id': 'bob' } })).status)
  t.same(statuses, [200, 200, 200], 'live: bob\'s user limit of 2 is not charged there')
  t.match(explain(file, 'GET', '/x', '--user', 'bob'), /^limit: +user \[user\] .* key gw:\*\.user\.\S+:bob;/m, 'on a route that identifies: bob\'s key')
})
