// Issue 15 item 6: /config never shows a credential, whatever a header is named or a password
// contains, and an admin listener open to the network is called out at start.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { redactConfig } from '../src/admin/redact.js'

t.test('/config hides every header-rule value and a URL password containing "@" or "/"', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
redis:
  url: "redis://user:Pa@ss/Word-1@127.0.0.1:9"
  timeout: 50ms
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    headers:
      request: { set: { x-upstream-auth: Upstream-Auth-2, x-internal-key: Internal-Key-3 } }
      response: { set: { x-served-by: Node-Name-4 } }
`)
  const text = await (await fetch(`${gw.adminUrl}/config`)).text()
  for (const secret of ['Pa@ss', 'ss/Word', 'Word-1', 'Upstream-Auth-2', 'Internal-Key-3', 'Node-Name-4']) t.notMatch(text, secret, `${secret} is not shown`)
  const config = (JSON.parse(text) as { config: { redis: { url: string }, routes: Array<{ headers: { request: { set: Record<string, string> }, response: { set: Record<string, string> } } }> } }).config
  t.equal(config.redis.url, 'redis://[redacted]@127.0.0.1:9', 'the host of the URL is still shown')
  t.same(config.routes[0]?.headers.request.set, { 'x-upstream-auth': '[redacted]', 'x-internal-key': '[redacted]' }, 'header names are shown, values are not')
  t.same(config.routes[0]?.headers.response.set, { 'x-served-by': '[redacted]' })
})

t.test('/config hides the secret query values of a health check\'s path and the values a route matches headers by', async t => {
  const config = redactConfig({
    upstreams: { backend: { targets: ['http://127.0.0.1:9'], healthCheck: { path: '/healthz?token=Probe-Token-5&x=1' } } },
    routes: [{ name: 'internal', pathPrefix: '/', upstream: 'backend', matchHeaders: { 'x-internal-auth': 'Shared-Secret-6', 'x-version': ['v2', 'v3'], 'x-beta': true } }]
  }) as { upstreams: { backend: { healthCheck: { path: string } } }, routes: Array<{ matchHeaders: Record<string, unknown> }> }
  t.equal(config.upstreams.backend.healthCheck.path, '/healthz?token=[redacted]&x=1', 'the probe path, its token hidden')
  t.same(config.routes[0]?.matchHeaders, { 'x-internal-auth': '[redacted]', 'x-version': '[redacted]', 'x-beta': true }, 'names shown, values hidden, presence kept')
})

t.test('an admin listener on a non-loopback address is warned about at start; a loopback one is not', async t => {
  const upstream = await startUpstream(t)
  const yaml = (admin: string): string => `
listen: 127.0.0.1:0
admin: ${admin}
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`
  const open = await startGateway(t, yaml('0.0.0.0:0'))
  const warning = open.lines.find(l => l.level === 40 && typeof l.msg === 'string' && l.msg.includes('admin listener'))
  t.match(warning, { admin: '0.0.0.0:0', tokenSet: false, msg: /non-loopback address: anyone who can reach it reads \/config, \/metrics, \/events/ })
  // a token guards DELETE /limits alone: the reads stay open, and the warning says so (it named
  // the token alone, and was not logged with one)
  const tokened = await startGateway(t, yaml('{ listen: "0.0.0.0:0", token: "0123456789abcdef0123" }'))
  const stillOpen = tokened.lines.find(l => l.level === 40 && typeof l.msg === 'string' && l.msg.includes('admin listener'))
  t.match(stillOpen, { tokenSet: true, msg: /reads \/config.*\(admin\.token guards DELETE \/limits alone\)/ })
  const scrape = await fetch(`http://127.0.0.1:${tokened.adminPort}/config`)
  t.equal(scrape.status, 200, 'as it says: /config answers without the token')
  const local = await startGateway(t, yaml('127.0.0.1:0'))
  t.equal(local.lines.filter(l => typeof l.msg === 'string' && l.msg.includes('admin listener')).length, 0, 'no warning on loopback')
})

t.test('/config redaction hides credentials in a JWKS or OTLP collector URL too (the loader refuses them, redaction does not rely on it)', async t => {
  const shown = JSON.stringify(redactConfig({
    identity: { jwt: { jwksUrl: 'https://kid:s3cret@idp.example/jwks.json' } },
    tracing: { otlp: 'http://otel:p@ss/w-2@collector:4318' }
  }))
  t.notMatch(shown, /s3cret|p@ss|w-2|kid:|otel:/, 'no user name or password is shown')
  t.match(shown, 'https://[redacted]@idp.example/jwks.json', 'the JWKS host and path are still shown')
  t.match(shown, 'http://[redacted]@collector:4318', 'the collector host is still shown')
})

t.test('/config shows a signed JWKS URL and an OTLP collector URL with their secret query values redacted', async t => {
  const upstream = await startUpstream(t)
  // nothing listens on port 1: the JWKS warm-up and the span exports fail quietly
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { redactQuery: [x-custom] }
identity: { jwt: { jwksUrl: "https://127.0.0.1:1/jwks.json?token=Jwks-Token-1&kid=main&sig=Jwks-Sig-2" } }
tracing: { otlp: "http://127.0.0.1:1/v1/traces?api_key=Otlp-Key-3&access_token=Otlp-Token-4&x-custom=Custom-5" }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const text = await (await fetch(`${gw.adminUrl}/config`)).text()
  for (const secret of ['Jwks-Token-1', 'Jwks-Sig-2', 'Otlp-Key-3', 'Otlp-Token-4', 'Custom-5']) t.notMatch(text, secret, `${secret} is not shown`)
  const config = (JSON.parse(text) as { config: { identity: { jwt: { jwksUrl: string } }, tracing: { otlp: string } } }).config
  t.equal(config.identity.jwt.jwksUrl, 'https://127.0.0.1:1/jwks.json?token=[redacted]&kid=main&sig=[redacted]', 'the JWKS URL is shown, its other parameters as written')
  t.equal(config.tracing.otlp, 'http://127.0.0.1:1/v1/traces?api_key=[redacted]&access_token=[redacted]&x-custom=[redacted]', 'a parameter the access log redacts (log.redactQuery) is redacted here too')
  t.equal(gw.lines.filter(l => JSON.stringify(l).includes('Jwks-Sig-2')).length, 0, 'no log line holds the signature')
})
