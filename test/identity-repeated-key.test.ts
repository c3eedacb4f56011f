// An API key header sent twice (a client's key beside one a proxy adds) reaches the gateway joined
// by node with ", ": it is answered 401 saying the header is repeated, not that the key is unknown.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { parseResponses, rawExchange } from './helpers/raw-http.js'

t.test('X-API-Key twice: 401 "API key header repeated", even when both are the same valid key; once: served', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { apiKeys: { header: x-api-key, keys: { k-alice-1: alice } }, required: true }
upstreams:
  backend: { targets: ["${up.url}"] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const ask = async (fields: string): Promise<{ status: number, reason: unknown }> => {
    const [res] = parseResponses(await rawExchange(gw.port, `GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n${fields}\r\n`))
    const body = res?.body ?? ''
    return { status: res?.status ?? 0, reason: body.startsWith('{') ? (JSON.parse(body) as { reason?: unknown }).reason : undefined }
  }
  t.same((await ask('X-API-Key: k-alice-1\r\n')).status, 200, 'one header: served')
  t.same(await ask('X-API-Key: k-alice-1\r\nX-API-Key: k-alice-1\r\n'), { status: 401, reason: 'API key header repeated' }, 'the same key twice')
  t.same(await ask('X-API-Key: k-alice-1\r\nX-API-Key: other\r\n'), { status: 401, reason: 'API key header repeated' }, 'two keys')
  t.same(await ask('X-API-Key: \r\nX-API-Key: \r\n'), { status: 401, reason: 'API key header repeated' }, 'twice empty')
  t.same(await ask('X-API-Key: wrong\r\n'), { status: 401, reason: 'unknown API key' }, 'one unknown key: said as such')
})
