// Issue 15 item 12: case, trailing-slash and ";" variants of a route's path fell through to a
// catch-all, and upstreams that fold case or strip path parameters served them as the route.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'
import type { Teardown } from './helpers/teardown.js'

async function setup (t: Teardown, adminRoute: string, extra = ''): Promise<(path: string) => Promise<string>> {
  const admin = await startUpstream(t, 'admin')
  const pub = await startUpstream(t, 'public')
  const gw = await startGateway(t, `
listen: 127.0.0.1:0
admin: 127.0.0.1:0
${extra}
upstreams:
  admin: { targets: [${admin.url}] }
  public: { targets: [${pub.url}] }
routes:
  - ${adminRoute}
  - { name: java, pathPrefix: /app/, allowPathParams: true, upstream: public }
  - { name: all, pathPrefix: /, upstream: public }
`)
  // which upstream answered, or the status when the gateway refused
  return async (path: string) => {
    const reply = await send(`${gw.url}${path}`)
    // a refusal says which: the status and its code
    return reply.status === 200 ? String(reply.json?.name) : `${reply.status} ${String(reply.json?.error)}`
  }
}

t.test('by default: exact case and slash only, and ";" is refused unless the route allows it', async t => {
  const to = await setup(t, '{ name: admin, path: /admin, upstream: admin }')
  t.equal(await to('/admin'), 'admin')
  t.equal(await to('/Admin'), 'public', 'the documented gap: another case is another path')
  t.equal(await to('/admin/'), 'public', 'and so is a trailing slash')
  t.equal(await to('/admin;x=1'), '400 GW_ERR_BAD_PATH', '";" on a route that does not allow it: 400, not the catch-all')
  t.equal(await to('/admin/..;/x'), '400 GW_ERR_BAD_PATH')
  t.equal(await to('/app/login;jsessionid=abc'), 'public', 'a route with allowPathParams takes it')
})

t.test('caseInsensitive and matchTrailingSlash per route', async t => {
  const to = await setup(t, '{ name: admin, path: /admin, caseInsensitive: true, matchTrailingSlash: true, upstream: admin }')
  for (const path of ['/admin', '/Admin', '/ADMIN', '/admin/', '/AdMiN/']) t.equal(await to(path), 'admin', path)
  t.equal(await to('/administrator'), 'public', 'an exact path stays exact')
})

t.test('pathPrefix with a trailing slash and matchTrailingSlash also takes the bare path', async t => {
  const to = await setup(t, '{ name: admin, pathPrefix: /admin/, caseInsensitive: true, matchTrailingSlash: true, upstream: admin }')
  for (const path of ['/admin', '/Admin', '/admin/', '/ADMIN/users']) t.equal(await to(path), 'admin', path)
})

t.test('routing: gateway-wide defaults, overridden per route', async t => {
  const to = await setup(t, '{ name: admin, path: /admin, upstream: admin }', 'routing: { caseInsensitive: true, matchTrailingSlash: true, allowPathParams: true }')
  t.equal(await to('/ADMIN/'), 'admin')
  t.equal(await to('/x;y=1'), 'public', 'allowPathParams gateway-wide')
})
