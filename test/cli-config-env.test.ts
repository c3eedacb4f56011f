// GATEWAY_CONFIG set but empty (systemd's `Environment=GATEWAY_CONFIG=`, compose passing a host
// variable that is unset) named the file "": `gateway validate` answered `:0:0: file not found`.
// Empty is unset, as the config's own `${VAR:-default}` reads it: ./gateway.yaml.
import t from 'tap'
import { gateway } from './helpers/cli.js'

t.test('an empty GATEWAY_CONFIG falls back to ./gateway.yaml', async t => {
  const r = await gateway(['validate'], { GATEWAY_CONFIG: '' })
  t.equal(r.code, 0, r.stderr)
  t.match(r.stdout, /^gateway\.yaml: ok \(/)
})
