// `gateway limits` facing an admin address that does not give the admin API's JSON answer: a
// proxy's HTML error page, node's bare 431 for a request line too long, a listener that stalls
// after its headers, nothing listening. Each is one line on stderr naming what answered, and an
// exit code from the documented table; stdout stays empty for the script reading it.
import t from 'tap'
import { startHttpServer, startUpstream, refusingUrl } from './helpers/upstream.js'
import { spawnGateway } from './helpers/gateway.js'
import { gateway, oneRoute } from './helpers/cli.js'

const addr = (url: string): string => url.slice('http://'.length)

t.test('an answer that is not the admin API\'s JSON names its status; a stall is exit 4', async t => {
  const html = await startHttpServer(t, (_req, res) => {
    res.writeHead(502, { 'content-type': 'text/html' })
    res.end('<html><body>Bad Gateway</body></html>')
  })
  // headers at once, then nothing: the 5 s bound covered the headers alone, and the stalled body
  // was an exit 1 "The operation was aborted due to timeout"
  const stalled = await startHttpServer(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.write('{"route":')
  })
  const proxied = await gateway(['limits', 'get', '--route', 'api', '--admin', addr(html.url)])
  t.equal(proxied.code, 1, proxied.stderr)
  t.equal(proxied.stderr, `gateway limits get: ${html.url} answered 502 Bad Gateway, not the admin API's JSON: "<html><body>Bad Gateway</body></html>"\n`)
  t.equal(proxied.stdout, '')
  const stall = await gateway(['limits', 'reset', '--route', 'api', '--admin', addr(stalled.url), '--token', 't'])
  t.equal(stall.code, 4, stall.stderr)
  t.equal(stall.stderr, `gateway limits: admin listener ${stalled.url} did not answer within 5 s\n`)
  const refusing = await refusingUrl()
  const refused = await gateway(['limits', 'get', '--route', 'api', '--admin', addr(refusing)])
  t.equal(refused.code, 4, refused.stderr)
  t.equal(refused.stderr, `gateway limits: admin listener ${refusing} unreachable: connect ECONNREFUSED ${addr(refusing)}\n`, 'the reason, where it said "fetch failed"')
})

t.test('a --user too long for the admin listener\'s request line: its 414 named, not "Unexpected end of JSON input"; a --json refusal on stderr alone', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'api'))
  const r = await gateway(['limits', 'get', '--route', 'api', '--user', 'u'.repeat(20_000), '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(r.code, 1, r.stderr)
  // the admin listener answers it in JSON (it was node's bare 431, which the CLI named as not the API's JSON)
  t.equal(r.stderr, 'gateway limits get: 414 GW_ERR_URI_TOO_LONG: the request target is too long (server.maxHeaderSize)\n')
  t.equal(r.stdout, '')
  // the gateway's refusal with --json: stdout kept the error body, read as the client's state
  const unknown = await gateway(['limits', 'get', '--route', 'nope', '--json', '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(unknown.code, 1, unknown.stderr)
  t.equal(unknown.stderr, 'gateway limits get: 400 GW_ERR_BAD_REQUEST: unknown route "nope"\n')
  t.equal(unknown.stdout, '', 'nothing on stdout')
  const listed = await gateway(['limits', 'get', '--route', 'api', '--ip', '127.0.0.1', '--json', '--admin', `127.0.0.1:${gw.adminPort}`])
  t.equal(listed.code, 0, listed.stderr)
  t.match(JSON.parse(listed.stdout), { route: 'api', ip: '127.0.0.1', limits: [] }, 'an answer that is data: stdout')
})

t.test('a config file read for what the options leave out: the error says what was wanted from it, located; an address from it is named as such', async t => {
  const refusing = (await refusingUrl()).slice('http://'.length)
  const dir = t.testdir({ 'bad.yaml': 'admin: { listen: 127.0.0.1:9, tokn: x }\nupstreams: { b: { targets: ["http://127.0.0.1:1"] } }\nroutes:\n  - { name: api, pathPrefix: /, upstream: b }\n', 'port0.yaml': 'admin: 127.0.0.1:0\nupstreams: { b: { targets: ["http://127.0.0.1:1"] } }\nroutes:\n  - { name: api, pathPrefix: /, upstream: b }\n', 'gone.yaml': `admin: ${refusing}\nupstreams: { b: { targets: ["http://127.0.0.1:1"] } }\nroutes:\n  - { name: api, pathPrefix: /, upstream: b }\n` })
  // --admin given, no token for a reset: the default file was read unasked, and its absence was
  // all it said ("gateway: gateway.yaml:0:0: file not found")
  const noToken = await gateway(['limits', 'reset', '--route', 'api', '--admin', '127.0.0.1:9'], { GATEWAY_CONFIG: `${dir}/missing.yaml`, GATEWAY_ADMIN_TOKEN: '' })
  t.equal(noToken.code, 1, noToken.stderr)
  t.equal(noToken.stderr, `gateway limits: the admin token (--token TOKEN, $GATEWAY_ADMIN_TOKEN) was to be read from ${dir}/missing.yaml, which cannot be loaded:\n${dir}/missing.yaml:0:0: file not found\n`)
  const invalid = await gateway(['limits', 'get', '--route', 'api', '-c', `${dir}/bad.yaml`], { GATEWAY_ADMIN_TOKEN: '' })
  t.equal(invalid.code, 1, invalid.stderr)
  t.equal(invalid.stderr, `gateway limits: the admin address (--admin HOST:PORT) was to be read from ${dir}/bad.yaml, which cannot be loaded:\n${dir}/bad.yaml:1:31 admin.tokn: unknown key "tokn" (did you mean token?)\n`)
  t.equal(noToken.stdout + invalid.stdout, '')
  // an address from the file that nothing answers on (port 0: chosen at start, unknown here) said
  // "unreachable" with no word of where the address came from
  const port0 = await gateway(['limits', 'get', '--route', 'api', '-c', `${dir}/port0.yaml`], { GATEWAY_ADMIN_TOKEN: '' })
  t.equal(port0.code, 4, port0.stderr)
  t.match(port0.stderr, new RegExp(`^gateway limits: admin listener http://127\\.0\\.0\\.1:0 unreachable: .* \\(the admin address of ${dir}/port0\\.yaml: give --admin HOST:PORT\\)\n$`))
  const gone = await gateway(['limits', 'get', '--route', 'api', '-c', `${dir}/gone.yaml`], { GATEWAY_ADMIN_TOKEN: '' })
  t.equal(gone.code, 4, gone.stderr)
  t.equal(gone.stderr, `gateway limits: admin listener http://${refusing} unreachable: connect ECONNREFUSED ${refusing} (the admin address of ${dir}/gone.yaml: give --admin HOST:PORT)\n`)
})
