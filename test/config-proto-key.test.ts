// A consumer (or an inline API key) named "__proto__": zod's records drop that key, so the
// consumer's entry vanished without a word and its API keys got defaultPlan instead of its plan
// (`consumers: { __proto__: { plan: pro } }` was served as free). It is a located error now.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { ConfigError } from '../src/config/load.js'

function config (keys: string, consumers: string): string {
  return `listen: "127.0.0.1:0"
admin: 127.0.0.1:0
identity:
  apiKeys: { header: x-api-key, keys: ${keys} }
consumers:
${consumers}defaultPlan: free
plans:
  free: { limits: { quota: { limit: 5, period: day } } }
  pro: { limits: { quota: { limit: 50, period: day } } }
upstreams:
  backend: { targets: ["http://127.0.0.1:1"] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
}

t.test('a consumer named __proto__ is a located error, not a consumer on defaultPlan', async t => {
  const err = await startGateway(t, config('{ k-p: __proto__ }', '  __proto__: { plan: pro }\n')).then(() => null, (e: unknown) => e)
  t.ok(err instanceof ConfigError, 'the start is refused')
  t.match((err as Error).message, /gateway\.yaml:6:3 consumers\.__proto__: consumer name: "__proto__" is reserved/)
})

t.test('an inline API key __proto__ is a located error, and not printed', async t => {
  const err = await startGateway(t, config('{ __proto__: alice }', '  alice: { plan: pro }\n')).then(() => null, (e: unknown) => e)
  t.ok(err instanceof ConfigError, 'the start is refused')
  t.match((err as Error).message, /gateway\.yaml:4:41 identity\.apiKeys\.keys\.<an API key>: this API key: .* is reserved/)
  t.notMatch((err as Error).message, '__proto__', 'the key is not printed')
})
