// Issue 15 item 11: what a client may claim about itself. Only a trusted proxy (trustedProxies)
// may hand over a request id or the client-address headers upstream frameworks believe.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream, type EchoBody } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'

const FORGED = {
  'x-request-id': 'forged-id-1',
  forwarded: 'for=10.0.0.1;proto=https',
  'x-real-ip': '10.0.0.2',
  'true-client-ip': '10.0.0.3',
  'x-original-url': '/admin/secret',
  'x-rewrite-url': '/admin/other',
  'x-kept': 'end-to-end'
}

function config (upstream: string, trusted: string): string {
  return `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
${trusted}
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`
}

t.test('from an untrusted client: X-Request-Id is generated, Forwarded/X-Real-IP/True-Client-IP/X-Original-URL are removed', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url, ''))
  const reply = await send(`${gw.url}/x`, { headers: FORGED })
  t.equal(reply.status, 200)
  const seen = reply.json as unknown as EchoBody
  t.not(reply.headers['x-request-id'], 'forged-id-1', 'the client-chosen id is not echoed')
  t.match(reply.headers['x-request-id'], /^[0-9a-f-]{36}$/, 'a generated one is')
  t.equal(seen.headers['x-request-id'], reply.headers['x-request-id'], 'and forwarded')
  for (const name of ['forwarded', 'x-real-ip', 'true-client-ip', 'x-original-url', 'x-rewrite-url']) t.equal(seen.headers[name], undefined, `${name} removed`)
  t.equal(seen.headers['x-kept'], 'end-to-end', 'other headers pass')
  const line = gw.lines.find(l => l.msg === 'request' && l.path === '/x')
  t.equal(line?.requestId, reply.headers['x-request-id'], 'the access line has the generated id')
  t.equal(gw.lines.filter(l => l.requestId === 'forged-id-1').length, 0, 'the forged id appears in no log line')
})

t.test('from a trusted proxy: its X-Request-Id and client-address headers are kept', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url, 'trustedProxies: [127.0.0.1]'))
  const reply = await send(`${gw.url}/x`, { headers: FORGED })
  const seen = reply.json as unknown as EchoBody
  t.equal(reply.headers['x-request-id'], 'forged-id-1')
  t.equal(seen.headers['x-request-id'], 'forged-id-1')
  t.equal(seen.headers.forwarded, 'for=10.0.0.1;proto=https')
  t.equal(seen.headers['x-real-ip'], '10.0.0.2')
  t.equal(seen.headers['true-client-ip'], '10.0.0.3')
  t.equal(seen.headers['x-original-url'], '/admin/secret')
})

t.test('header names with "_" are dropped, as nginx does, unless server.underscoresInHeaders passes them', async t => {
  const upstream = await startUpstream(t)
  // CGI, WSGI and PHP read X_Forwarded_For as X-Forwarded-For: passed, these would get past the
  // fields the gateway sets or drops, and past the credentials it reads
  const underscored = { x_forwarded_for: '6.6.6.6', x_real_ip: '6.6.6.6', x_original_url: '/admin', x_api_key: 'k-alice', x_user_id: 'alice', 'x-kept': 'end-to-end' }
  const dropping = await startGateway(t, config(upstream.url, ''))
  const seen = (await send(`${dropping.url}/x`, { headers: underscored })).json as unknown as EchoBody
  t.same(Object.keys(seen.headers).filter(name => name.includes('_')), [], 'no field with "_" reached the upstream')
  t.equal(seen.headers['x-kept'], 'end-to-end', 'other headers pass')
  t.equal(seen.headers['x-forwarded-for'], '127.0.0.1', "the gateway's own X-Forwarded-For")
  const passing = await startGateway(t, config(upstream.url, 'server: { underscoresInHeaders: true }'))
  const passed = (await send(`${passing.url}/x`, { headers: underscored })).json as unknown as EchoBody
  t.equal(passed.headers.x_user_id, 'alice', 'passed when the operator asks')
  t.equal(passed.headers.x_forwarded_for, '6.6.6.6')
})
