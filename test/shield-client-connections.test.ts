// server.maxConnectionsPerClient: the connections one client address holds at once. The
// process-wide cap (server.maxConnections) keeps the gateway alive through a flood, but one client
// could take every place in it, and every other client was refused until the flood's connections
// timed out. With the cap per client, the flooding client's connections beyond it are closed as
// they arrive and the others are served.
import t from 'tap'
import net from 'node:net'
import { writeFileSync } from 'node:fs'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { parseResponses } from './helpers/raw-http.js'
import type { Teardown } from './helpers/teardown.js'

const yaml = (up: string, server: string, extra = ''): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
server: { ${server} }
${extra}
upstreams:
  backend: { targets: [${up}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`

type Held = net.Socket

/**
 * A keep-alive connection from `from` (a loopback address) that sends `prefix` (a PROXY header) and
 * one request: the socket, held open, once it is answered; 'closed' when the gateway closed it
 * unanswered.
 */
async function connectAs (t: Teardown, port: number, from: string, prefix = ''): Promise<Held | 'closed'> {
  const socket = net.connect({ port, host: '127.0.0.1', localAddress: from })
  socket.on('error', () => {})
  t.teardown(() => socket.destroy())
  let text = ''
  socket.setEncoding('latin1')
  return await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no answer nor close from ${from}: ${JSON.stringify(text)}`)), 10_000)
    socket.on('data', (chunk: string) => {
      text += chunk
      if (parseResponses(text)[0]?.status === 200) { clearTimeout(timer); resolve(socket) }
    })
    socket.once('close', () => { clearTimeout(timer); resolve(text === '' ? 'closed' : socket) })
    socket.once('connect', () => socket.write(`${prefix}GET /a HTTP/1.1\r\nHost: gw\r\n\r\n`))
  })
}

/** `n` connections, one after the other: how many were held and how many closed. */
async function connectMany (t: Teardown, port: number, n: number, from: string, prefix = ''): Promise<{ held: Held[], closed: number }> {
  const held: Held[] = []
  let closed = 0
  for (let i = 0; i < n; i++) {
    const c = await connectAs(t, port, from, prefix)
    if (c === 'closed') closed++
    else held.push(c)
  }
  return { held, closed }
}

async function dropped (adminUrl: string): Promise<{ client: number, all: number }> {
  const text = await (await fetch(`${adminUrl}/metrics`)).text()
  const value = (name: string): number => Number(new RegExp(`^${name} (\\d+)`, 'm').exec(text)?.[1] ?? NaN)
  return { client: value('gateway_client_connections_dropped_total'), all: value('gateway_connections_dropped_total') }
}

async function closedAll (sockets: Held[]): Promise<void> {
  await Promise.all(sockets.map(async s => await new Promise(resolve => { s.once('close', resolve); s.destroy() })))
}

t.test('a client beyond its cap has its new connections closed as they arrive; other clients are served', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, 'maxConnections: 50, maxConnectionsPerClient: 3'))
  const flood = await connectMany(t, gw.port, 5, '127.0.0.2')
  t.same([flood.held.length, flood.closed], [3, 2], '127.0.0.2 holds its 3; the 4th and 5th are closed unanswered')
  t.same(await dropped(gw.adminUrl), { client: 2, all: 0 }, 'counted per client, not as the process-wide cap\'s drops')
  const other = await connectMany(t, gw.port, 3, '127.0.0.3')
  t.same([other.held.length, other.closed], [3, 0], 'another client is served beside it')
  const warned = gw.lines.filter(l => typeof l.msg === 'string' && l.msg.includes('maxConnectionsPerClient'))
  t.equal(warned.length, 1, 'said once for the two (at most every 10 s)')
  t.match(warned[0], { level: 40, peer: '127.0.0.2', client: '127.0.0.2', maxConnectionsPerClient: 3 })
  // a connection that closes gives its place back
  await closedAll(flood.held.slice(0, 2))
  const after = await connectMany(t, gw.port, 3, '127.0.0.2')
  t.same([after.held.length, after.closed], [2, 1], 'two places freed, two taken again')
  t.equal(up.log.length, 3 + 3 + 2, 'every request of a held connection reached the upstream; none of a closed one')
})

t.test('a trusted proxy\'s connections carry many clients: they are not capped', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, 'maxConnectionsPerClient: 2', 'trustedProxies: [127.0.0.4/32]'))
  const proxy = await connectMany(t, gw.port, 6, '127.0.0.4')
  t.same([proxy.held.length, proxy.closed], [6, 0])
  const client = await connectMany(t, gw.port, 3, '127.0.0.5')
  t.same([client.held.length, client.closed], [2, 1], 'a client that is not trusted is capped')
})

t.test('behind proxyProtocol a connection counts for the client its header names; an IPv6 client by its ipv6Prefix', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, 'maxConnectionsPerClient: 2', 'proxyProtocol: { from: [127.0.0.6] }\nipv6Prefix: 64'))
  const header = (client: string, v6 = false): string => `PROXY ${v6 ? 'TCP6' : 'TCP4'} ${client} ${v6 ? '2001:db8:ffff::1' : '10.0.0.1'} 40000 80\r\n`
  const a = await connectMany(t, gw.port, 3, '127.0.0.6', header('203.0.113.7'))
  t.same([a.held.length, a.closed], [2, 1], 'the balancer\'s connections for one client: 2 held, the 3rd closed')
  const b = await connectMany(t, gw.port, 2, '127.0.0.6', header('203.0.113.8'))
  t.same([b.held.length, b.closed], [2, 0], 'through the same balancer, another client has its own 2')
  const first = await connectAs(t, gw.port, '127.0.0.6', header('2001:db8::1', true))
  const second = await connectAs(t, gw.port, '127.0.0.6', header('2001:db8::2', true))
  const sameSite = await connectAs(t, gw.port, '127.0.0.6', header('2001:db8::3:4', true))
  const otherSite = await connectAs(t, gw.port, '127.0.0.6', header('2001:db8:0:1::1', true))
  t.same([first === 'closed', second === 'closed', sameSite, otherSite === 'closed'], [false, false, 'closed', false],
    'three addresses of 2001:db8::/64 are one client (the third closed); 2001:db8:0:1::/64 is another')
  t.same(await dropped(gw.adminUrl), { client: 2, all: 0 })
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.notMatch(text, /^gateway_proxy_protocol_refused_total\{[^}]*\} [1-9]/m, 'a connection closed for its client is no header refusal')
  const warned = gw.lines.find(l => typeof l.msg === 'string' && l.msg.includes('maxConnectionsPerClient'))
  t.match(warned, { peer: '203.0.113.7', client: '203.0.113.7' }, 'the warning names the client, not the balancer')
})

t.test('a reload sets and removes the cap for the connections that come next, counting those already open', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, yaml(up.url, 'maxConnections: 100'))
  const open = await connectMany(t, gw.port, 4, '127.0.0.7')
  t.same([open.held.length, open.closed], [4, 0], 'no cap by default')
  writeFileSync(gw.configFile, yaml(up.url, 'maxConnections: 100, maxConnectionsPerClient: 4'))
  t.equal((await gw.reload()).ok, true)
  t.same((await connectMany(t, gw.port, 1, '127.0.0.7')).closed, 1, 'the 4 opened before the cap count: a 5th is closed')
  await closedAll(open.held.slice(0, 1))
  const one = await connectMany(t, gw.port, 2, '127.0.0.7')
  t.same([one.held.length, one.closed], [1, 1], 'one closed, one place')
  writeFileSync(gw.configFile, yaml(up.url, 'maxConnections: 100'))
  t.equal((await gw.reload()).ok, true)
  const free = await connectMany(t, gw.port, 3, '127.0.0.7')
  t.same([free.held.length, free.closed], [3, 0], 'removed')
})

t.test('maxConnectionsPerClient must be a positive integer: a located error', async t => {
  const up = await startUpstream(t)
  await t.rejects(startGateway(t, yaml(up.url, 'maxConnectionsPerClient: 0')), /server\.maxConnectionsPerClient/)
})
