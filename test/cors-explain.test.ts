// `gateway explain` tells a CORS preflight as the gateway answers it (src/pipeline.ts): routed by
// the method it asks for, answered 204 or 403 by the gateway, never forwarded. It said the OPTIONS
// went to the upstream, or 405, where the live gateway answered the preflight itself.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { gateway } from './helpers/cli.js'
import { tempDir } from './helpers/teardown.js'

t.test('explain: a preflight of a cors route, allowed and refused', async t => {
  const file = join(tempDir(t, 'cors-explain'), 'gateway.yaml')
  writeFileSync(file, `upstreams:
  b: { targets: ["http://127.0.0.1:9"] }
routes:
  - name: api
    pathPrefix: /api/
    methods: [GET, POST]
    upstream: b
    cors: { origins: ["https://app.example.com"], headers: [content-type] }
`)
  const explain = async (origin: string, method: string): Promise<string> => {
    const run = await gateway(['explain', '-c', file, 'OPTIONS', '/api/x', '--header', `Origin: ${origin}`, '--header', `Access-Control-Request-Method: ${method}`, '--header', 'Access-Control-Request-Headers: content-type'])
    t.equal(run.code, 0, run.stderr)
    return run.stdout
  }
  t.match(await explain('https://app.example.com', 'POST'), /route: {3}api -> CORS preflight for POST: 204, answered by the gateway \(access-control-allow-origin: https:\/\/app\.example\.com, access-control-allow-methods: POST, access-control-allow-headers: content-type, access-control-max-age: 600\); not forwarded/)
  t.match(await explain('https://evil.example.com', 'POST'), /CORS preflight for POST: 403 GW_ERR_CORS_REJECTED \(the origin "https:\/\/evil\.example\.com" is not allowed/)
  // a method the route does not take: an OPTIONS like any other, which this route does not take
  t.match(await explain('https://app.example.com', 'PUT'), /route: {3}none for OPTIONS -> 405 GW_ERR_METHOD_NOT_ALLOWED/)
})
