// cutUnlessWritten: the last bytes of an answer whose request has settled still have a send
// deadline. Driven by a real server and a client that reads nothing. (A tail large enough to
// outlast the sockets' buffers while a client reads it slowly cannot be made here: loopback
// buffers take tens of megabytes, and node hands them over in one write.)
import t from 'tap'
import http, { type ServerResponse } from 'node:http'
import net from 'node:net'
import { once } from 'node:events'
import { cutUnlessWritten } from '../src/proxy/send-deadline.js'
import type { Teardown } from './helpers/teardown.js'

/** A server that writes every answer whole at once, 64 MB (more than the sockets' buffers take), guarded for 300 ms. */
async function serve (t: Teardown): Promise<{ port: number, closed: () => Promise<{ ms: number }> }> {
  const ended: Array<Promise<{ ms: number }>> = []
  const server = http.createServer((_req, res: ServerResponse) => {
    const start = Date.now()
    ended.push(new Promise(resolve => res.once('close', () => { resolve({ ms: Date.now() - start }) })))
    // in 64 KiB writes, as the gateway relays an upstream's body, all given before the client reads
    const chunk = Buffer.alloc(64 * 1024, 120)
    for (let i = 0; i < 1023; i++) res.write(chunk)
    res.end(chunk)
    cutUnlessWritten(res, 300)
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => { server.closeAllConnections(); server.close() })
  return { port: (server.address() as net.AddressInfo).port, closed: async () => await (ended.shift() as Promise<{ ms: number }>) }
}

t.test('a client that reads nothing is cut after the deadline', async t => {
  const { port, closed } = await serve(t)
  const socket = net.connect(port, '127.0.0.1')
  socket.on('error', () => {})
  t.teardown(() => socket.destroy())
  socket.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n')
  socket.pause()
  await new Promise(resolve => setTimeout(resolve, 50))
  const end = await closed()
  t.ok(end.ms >= 290 && end.ms < 5000, `closed after ${end.ms} ms, with most of its 64 MB unread`)
})
