// tls.redirectHttp: a plain-HTTP listener that sends every request to the same host and path over
// HTTPS, with a 308 (the method and body kept), and a located error or a 400 where it cannot.
import t from 'tap'
import https from 'node:https'
import net from 'node:net'
import { once } from 'node:events'
import { writeFileSync } from 'node:fs'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { parseResponses, rawExchange } from './helpers/raw-http.js'
import type { Teardown } from './helpers/teardown.js'
import { selfSignedCertificate } from './helpers/tls.js'
import { twoWorkers, until } from './helpers/workers.js'
import { httpsLocation } from '../src/proxy/https-redirect.js'

const certificate = (t: Teardown): { cert: string, key: string } => selfSignedCertificate(t, 'gw-redirect', 'a.test')

const yaml = (up: string, tls: { cert: string, key: string }, redirect: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
tls: { cert: ${tls.cert}, key: ${tls.key}, redirectHttp: ${redirect} }
upstreams:
  backend: { targets: [${up}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

t.test('the Location: the request\'s host without its port, the HTTPS port unless 443, the target as sent', async t => {
  t.equal(httpsLocation('Example.COM:8080', '/a/b?c=1&d=%2F', 8443), 'https://example.com:8443/a/b?c=1&d=%2F')
  t.equal(httpsLocation('example.com', '/', 443), 'https://example.com/')
  t.equal(httpsLocation('[2001:DB8::1]:80', '/x', 443), 'https://[2001:db8::1]/x')
  t.equal(httpsLocation('10.0.0.1', '/x', 8443), 'https://10.0.0.1:8443/x')
  t.equal(httpsLocation('ignored.test', 'http://Other.test:81/y?z', 443), 'https://other.test/y?z', 'an absolute-form target names the host')
  t.equal(httpsLocation('ignored.test', 'http://other.test', 443), 'https://other.test/')
  t.equal(httpsLocation('ignored.test', 'http://other.test?x=1', 443), 'https://other.test/?x=1', 'no path before the query: the root')
  t.equal(httpsLocation('a.test.', '/', 443), 'https://a.test./', 'a fully qualified name, its trailing dot kept')
  t.equal(httpsLocation('a_b.test', '/', 443), 'https://a_b.test/', 'an underscore, as nginx takes it')
  for (const [host, target] of [[undefined, '/'], ['', '/'], ['evil.test/x', '/'], ['evil.test@other', '/'], ['a b', '/'], ['-a.test', '/'], ['a.test', '*'], ['a.test', 'https://b.test/'], ['a.test', undefined]] as const) {
    t.equal(httpsLocation(host, target, 443), null, `no Location for Host ${JSON.stringify(host)} and target ${JSON.stringify(target)}`)
  }
})

t.test('every request on the plain listener gets a 308 to HTTPS, which serves it', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, certificate(t), '{ listen: "127.0.0.1:0" }'))
  t.ok(gw.redirectPort > 0 && gw.redirectPort !== gw.port)
  const [get] = parseResponses(await rawExchange(gw.redirectPort, 'GET /a/b?c=1 HTTP/1.1\r\nHost: A.test:80\r\nConnection: close\r\n\r\n'))
  t.same([get?.status, get?.headers.location, get?.headers['content-length'], get?.body], [308, `https://a.test:${gw.port}/a/b?c=1`, '0', ''])
  const [post] = parseResponses(await rawExchange(gw.redirectPort, 'POST /form HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello'))
  t.same([post?.status, post?.headers.location, post?.headers.connection], [308, `https://a.test:${gw.port}/form`, 'close'], 'a POST too: 308 keeps its method and body, which is not read: the connection closes')
  const [noHost] = parseResponses(await rawExchange(gw.redirectPort, 'GET / HTTP/1.0\r\n\r\n'))
  t.same([noHost?.status, noHost?.json?.error, noHost?.json?.reason], [400, 'GW_ERR_BAD_REQUEST', 'the request names no host to redirect to over HTTPS (tls.redirectHttp)'])
  t.equal(up.requests, 0, 'nothing reached the upstream over plain HTTP')
  // the Location, followed, is served by the TLS listener
  const location = new URL(get?.headers.location as string)
  const status = await new Promise<number>((resolve, reject) => {
    https.get({ host: '127.0.0.1', port: Number(location.port), path: location.pathname + location.search, headers: { host: location.host }, rejectUnauthorized: false }, res => {
      res.resume()
      resolve(res.statusCode ?? 0)
    }).on('error', reject)
  })
  t.equal(status, 200)
  t.same(up.log, ['/a/b?c=1'])
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(metrics, /^gateway_https_redirects_total 2$/m, 'the two redirects counted, not the 400')
  // README (Admin endpoints): /config leaves redirectHttp.port absent: the listener's own port, whatever port it was given
  const shown = await (await fetch(`${gw.adminUrl}/config`)).json() as { config: { tls: { redirectHttp: Record<string, unknown> } } }
  t.same(shown.config.tls.redirectHttp, { listen: '127.0.0.1:0' }, '/config: no port written in')
})

t.test('redirectHttp.port: the port clients reach the TLS listener on (443 behind a port mapping)', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, certificate(t), '{ listen: "127.0.0.1:0", port: 443 }'))
  const [reply] = parseResponses(await rawExchange(gw.redirectPort, 'GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n'))
  t.equal(reply?.headers.location, 'https://a.test/x')
})

t.test('a reload changes the port clients are sent to', async t => {
  const up = await startUpstream(t)
  const tls = certificate(t)
  const gw = await startGateway(t, yaml(up.url, tls, '{ listen: "127.0.0.1:0" }'))
  writeFileSync(gw.configFile, yaml(up.url, tls, '{ listen: "127.0.0.1:0", port: 443 }'))
  const reload = await gw.reload()
  t.same(reload.ok ? reload.restartNeeded : reload.error, [])
  const [reply] = parseResponses(await rawExchange(gw.redirectPort, 'GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n'))
  t.equal(reply?.headers.location, 'https://a.test/x')
})

t.test('its address needs its own port, and a reload cannot move it', async t => {
  const up = await startUpstream(t)
  const tls = certificate(t)
  await t.rejects(startGateway(t, yaml(up.url, tls, '{ listen: "127.0.0.1:18443" }').replace('listen: 127.0.0.1:0', 'listen: 127.0.0.1:18443')),
    /tls\.redirectHttp\.listen: "127\.0\.0\.1:18443" is also the listen address/)
  const gw = await startGateway(t, yaml(up.url, tls, '{ listen: "127.0.0.1:0" }'))
  writeFileSync(gw.configFile, yaml(up.url, tls, '{ listen: "127.0.0.1:1" }'))
  const reload = await gw.reload()
  t.same(reload.ok ? reload.restartNeeded : reload.error, ['tls.redirectHttp.listen'])
  const [reply] = parseResponses(await rawExchange(gw.redirectPort, 'GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n'))
  t.equal(reply?.status, 308, 'the listener bound at start serves on')
})

t.test('workers: 2 (bin/gateway): each worker answers on the one redirect port; the primary sums the count', async t => {
  const up = await startUpstream(t)
  const r = await twoWorkers(t, yaml(up.url, certificate(t), '{ listen: "127.0.0.1:0" }').replace('admin: 127.0.0.1:0\n', 'admin: 127.0.0.1:0\nworkers: 2\n'))
  const started = r.gw.logs.filter(l => l.msg === 'gateway started')
  const addresses = [...new Set(started.map(l => l.redirectHttp))]
  t.equal(addresses.length, 1, `one redirect address for both workers: ${JSON.stringify(addresses)}`)
  const redirectPort = Number(new URL(addresses[0] as string).port)
  const replies = await Promise.all(Array.from({ length: 10 }, async () => parseResponses(await rawExchange(redirectPort, 'GET /w HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n'))[0]))
  t.same(new Set(replies.map(reply => reply?.headers.location)), new Set([`https://a.test:${started[0]?.port as number}/w`]))
  await until('the primary sums both workers\' redirects', async () => /^gateway_https_redirects_total 10$/m.test(await (await fetch(`${r.adminUrl}/metrics`)).text()), 10_000)
  t.pass('10 redirects counted')
})

t.test('its connections are capped by server.maxConnections, counted apart from the TLS listener\'s', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, certificate(t), '{ listen: "127.0.0.1:0" }').replace('admin: 127.0.0.1:0\n', 'admin: 127.0.0.1:0\nserver: { maxConnections: 3 }\n'))
  const sockets = Array.from({ length: 5 }, () => {
    const s = net.connect(gw.redirectPort, '127.0.0.1')
    s.on('error', () => {})
    t.teardown(() => s.destroy())
    return s
  })
  let closed = 0
  for (const s of sockets) s.on('close', () => { closed++ })
  await Promise.all(sockets.map(async s => await once(s, 'connect')))
  let seen = -1
  while (seen !== closed) {
    seen = closed
    await new Promise(resolve => setTimeout(resolve, 300))
  }
  t.equal(closed, 2, 'three held, two closed as they arrived')
  const tlsStatus = await new Promise<number>((resolve, reject) => {
    https.get({ host: '127.0.0.1', port: gw.port, path: '/tls', rejectUnauthorized: false }, res => { res.resume(); resolve(res.statusCode ?? 0) }).on('error', reject)
  })
  t.equal(tlsStatus, 200, 'the TLS listener has its own three')
})

t.test('draining, the redirect listener stops accepting with the TLS one: a client is not sent to a listener already closed', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, certificate(t), '{ listen: "127.0.0.1:0" }').replace('admin: 127.0.0.1:0\n', 'admin: 127.0.0.1:0\nserver: { shutdownTimeout: 10s }\n'))
  const [before] = parseResponses(await rawExchange(gw.redirectPort, 'GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n'))
  t.equal(before?.status, 308)
  // a request in flight holds the drain open
  const inflight = new Promise<number>((resolve) => {
    https.get({ host: '127.0.0.1', port: gw.port, path: '/slow?ms=1500', rejectUnauthorized: false }, res => { res.resume(); res.on('end', () => resolve(res.statusCode ?? 0)) }).on('error', () => resolve(0))
  })
  await until('the slow request reached the upstream', () => up.requests > 0, 5000)
  const closing = gw.close()
  const connects = async (port: number): Promise<boolean> => await new Promise(resolve => {
    const s = net.connect(port, '127.0.0.1')
    s.on('connect', () => { s.destroy(); resolve(true) })
    s.on('error', () => resolve(false))
  })
  await until('the TLS listener refuses', async () => !(await connects(gw.port)), 5000)
  t.equal(await connects(gw.redirectPort), false, 'the redirect listener refuses as the TLS one does')
  t.equal(await inflight, 200, 'the request in flight is answered')
  await closing
})
