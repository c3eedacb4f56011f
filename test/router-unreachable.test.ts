// Routes no request can reach are reported, not refused (a file that loaded before still loads):
// `gateway validate` prints each as a located warning, a start and a reload log them. Routes are
// tried in file order, the first match wins (src/router/route-table.ts unreachableRoutes).
import t from 'tap'
import { unreachableRoutes, type RoutePattern } from '../src/router/route-table.js'
import { spawnGateway, writeConfig } from './helpers/gateway.js'
import { gateway } from './helpers/cli.js'

const unreachable = (...routes: Array<Omit<RoutePattern, 'name'>>): number[] =>
  unreachableRoutes(routes.map((r, i) => ({ name: `r${i}`, ...r }))).map(u => u.index)

t.test('a route whose every request an earlier route takes is reported; one that takes some of its own is not', async t => {
  t.same(unreachable({ pathPrefix: '/' }, { pathPrefix: '/api/' }), [1], 'a catch-all first')
  t.same(unreachable({}, { path: '/x' }), [1], 'a route without a path takes every path')
  t.same(unreachable({ pathPrefix: '/api/' }, { pathPrefix: '/api/' }), [1], 'the same prefix twice')
  t.same(unreachable({ pathPrefix: '/api' }, { path: '/api/users' }), [1], 'an exact path under an earlier prefix')
  t.same(unreachable({ path: '/a' }, { path: '/a' }), [1], 'the same path twice')
  t.same(unreachable({ pathPrefix: '/api/' }, { pathPrefix: '/api' }), [], 'the later prefix is wider')
  t.same(unreachable({ pathPrefix: '/api/', methods: ['GET'] }, { pathPrefix: '/api/' }), [], 'the earlier takes GET alone')
  t.same(unreachable({ pathPrefix: '/api/' }, { pathPrefix: '/api/', methods: ['POST'] }), [1], 'every method first, then POST')
  t.same(unreachable({ pathPrefix: '/api/', methods: ['GET', 'POST'] }, { pathPrefix: '/api/v1/', methods: ['POST'] }), [1])
  t.same(unreachable({ pathPrefix: '/', host: 'a.example' }, { pathPrefix: '/' }), [], 'the earlier is one host\'s')
  t.same(unreachable({ pathPrefix: '/' }, { pathPrefix: '/', host: 'a.example' }), [1], 'every host first')
  t.same(unreachable({ pathPrefix: '/Admin/' }, { pathPrefix: '/Admin/', caseInsensitive: true }), [], 'the later folds case: it takes /admin/ too')
  t.same(unreachable({ pathPrefix: '/admin/', caseInsensitive: true }, { pathPrefix: '/ADMIN/x' }), [1], 'the earlier folds case')
  t.same(unreachable({ pathPrefix: '/admin/' }, { pathPrefix: '/admin/', matchTrailingSlash: true }), [], 'the later takes /admin as well')
  t.same(unreachable({ pathPrefix: '/admin/', matchTrailingSlash: true }, { path: '/admin' }), [1], '/admin is the earlier\'s trailing-slash variant')
  t.same(unreachable({ path: '/a', matchTrailingSlash: true }, { path: '/a/' }), [1])
  t.same(unreachable({ path: '/a' }, { path: '/a/' }), [])
  t.same(unreachable({ path: '/search?q=1' }), [0], 'a path holding a query never matches')
  const canary = { name: 'x-canary', present: true, values: ['1'] }
  t.same(unreachable({ pathPrefix: '/api/', matchHeaders: [canary] }, { pathPrefix: '/api/' }), [], 'the earlier needs a header')
  t.same(unreachable({ pathPrefix: '/api/' }, { pathPrefix: '/api/', matchHeaders: [canary] }), [1], 'every request first, then those with the header')
  t.same(unreachable({ pathPrefix: '/api/', matchHeaders: [canary] }, { pathPrefix: '/api/v1/', matchHeaders: [canary, { name: 'x-b', present: false, values: null }] }), [1], 'the later needs as much and more')
  t.same(unreachable({ pathPrefix: '/api/', matchHeaders: [{ ...canary, values: ['1', '2'] }] }, { pathPrefix: '/api/', matchHeaders: [canary] }), [1], 'the later\'s values are among the earlier\'s')
  t.same(unreachable({ pathPrefix: '/api/', matchHeaders: [canary] }, { pathPrefix: '/api/', matchHeaders: [{ ...canary, values: ['1', '2'] }] }), [], 'the later takes x-canary: 2 too')
  t.same(unreachable({ pathPrefix: '/api/', matchHeaders: [{ ...canary, values: null }] }, { pathPrefix: '/api/', matchHeaders: [canary] }), [1], 'present with any value takes every value')
  t.same(unreachable({ pathPrefix: '/api/', matchHeaders: [{ ...canary, present: false, values: null }] }, { pathPrefix: '/api/', matchHeaders: [canary] }), [], 'absent, then present')
})

const yaml = `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: ["http://127.0.0.1:1"] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
  - { name: api, pathPrefix: /api/, upstream: backend }
`

t.test('gateway validate prints a located warning and exits 0; a start logs it', async t => {
  const file = writeConfig(t, yaml)
  const r = await gateway(['validate', '-c', file])
  t.equal(r.code, 0, r.stderr)
  t.match(r.stdout, /: ok \(2 routes, 1 upstreams, 1 warnings\)/)
  t.equal(r.stderr, `warning: ${file}:7:30 routes[1].pathPrefix: never matches: routes[0] (all) comes first and takes every request it would (the first route that matches wins: put the narrower route first)\n`)
  const gw = await spawnGateway(t, yaml)
  const line = await gw.waitForLog(l => l.msg === 'configuration loaded with routes that can never match')
  t.match(line.warnings, [/routes\[1\]\.pathPrefix: never matches/])
})
