// Connection floods for the connection caps' tests: connections that send nothing.
import net from 'node:net'
import type { Teardown } from './teardown.js'

/**
 * `n` connections to `port` that send nothing; resolves once each is held (connected, then 300 ms
 * without a close anywhere) or closed. Each reads what it gets: a 408 left unread would hide the
 * close behind it.
 */
export async function flood (t: Teardown, port: number, n: number): Promise<{ sockets: net.Socket[], closed: () => number }> {
  const sockets: net.Socket[] = []
  let closed = 0
  for (let i = 0; i < n; i++) {
    const s = net.connect(port, '127.0.0.1')
    s.on('error', () => {})
    s.on('close', () => { closed++ })
    s.resume()
    sockets.push(s)
  }
  t.teardown(() => { for (const s of sockets) s.destroy() })
  await Promise.all(sockets.map(async s => await new Promise(resolve => { s.once('connect', resolve); s.once('close', resolve) })))
  // a connection over a cap is closed by the gateway as it is accepted: wait until closes stop coming
  let seen = -1
  while (seen !== closed) {
    seen = closed
    await new Promise(resolve => setTimeout(resolve, 300))
  }
  return { sockets, closed: () => closed }
}
