// A TCP relay in front of a TLS server that breaks one connection the way a network or a broken
// peer can: once the connection has gone quiet, it writes the client a TLS record the client
// cannot decrypt, and resets the connection when the client answers (its alert). Used against a
// TLS Redis (test/redis-tls-socket-errors.test.ts) and an https upstream (test/proxy-https-upstream.test.ts).
import { createServer, connect, type Socket } from 'node:net'
import { once } from 'node:events'
import type { Teardown } from './teardown.js'

// TLS 1.3 application data, 32 bytes the client cannot decrypt
export const BOGUS_RECORD = Buffer.from([0x17, 0x03, 0x03, 0x00, 0x20, ...Buffer.alloc(32, 7)])

export interface HostileRelay { port: number, connections: number, resets: number, reset: Promise<void> }

/**
 * Forwards to `targetPort`; the first connection that stays quiet for `quietMs` is written the
 * bogus record, and reset (RST) as soon as the client sends anything after it.
 */
export async function hostileRelay (t: Teardown, targetPort: number, quietMs = 150): Promise<HostileRelay> {
  let hostileLeft = 1
  let resolveReset: () => void = () => {}
  const relay: HostileRelay = { port: 0, connections: 0, resets: 0, reset: new Promise(resolve => { resolveReset = resolve }) }
  const sockets = new Set<Socket>()
  const server = createServer((client) => {
    relay.connections++
    const target = connect(targetPort, '127.0.0.1')
    for (const s of [client, target]) {
      sockets.add(s)
      s.on('error', () => {})
      s.on('close', () => sockets.delete(s))
    }
    let injected = false
    let quiet: NodeJS.Timeout | undefined
    const rearm = (): void => {
      clearTimeout(quiet)
      if (hostileLeft === 0 || injected) return
      quiet = setTimeout(() => {
        if (hostileLeft === 0) return
        hostileLeft--
        injected = true
        client.write(BOGUS_RECORD)
      }, quietMs)
    }
    target.on('data', (d: Buffer) => { client.write(d); rearm() })
    client.on('data', (d: Buffer) => {
      if (injected) {
        client.resetAndDestroy()
        target.destroy()
        relay.resets++
        resolveReset()
        return
      }
      target.write(d)
      rearm()
    })
    client.on('close', () => { clearTimeout(quiet); target.destroy() })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  relay.port = (server.address() as { port: number }).port
  t.teardown(async () => {
    for (const s of sockets) s.destroy()
    server.close()
  })
  return relay
}

