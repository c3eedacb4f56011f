// server.maxConnections: the client connections a process holds at once. A connection beyond the
// cap is closed as it arrives, before a byte is read. Held here rather than by node's own cap
// (net.Server.maxConnections): under workers: N a worker refuses such a connection back to the
// primary, which hands it to the other worker, and back, for as long as both are full
// (lib/internal/cluster/round_robin_handle.js): the flood was held open, never closed, and the
// handle went round the IPC channel in a loop.
import type { Server as NetServer, Socket } from 'node:net'

export interface ConnectionCapHooks {
  /** The cap of the live config, read per connection: a reload applies to the next one. */
  readonly max: () => number
  readonly dropped: (peer: string | undefined) => void
}

export interface ConnectionCap {
  /** Connections held, those still reading a PROXY header among them. */
  readonly open: () => number
}

/**
 * Puts the cap in front of every 'connection' listener `server` has (node's HTTP or TLS layer, the
 * PROXY header's reader, the gateway's own): call it once they are all in place. A connection
 * handed to the server again (a declined upgrade) is counted once.
 */
export function capConnections (server: NetServer, hooks: ConnectionCapHooks): ConnectionCap {
  const listeners = server.listeners('connection') as Array<(socket: Socket) => void>
  server.removeAllListeners('connection')
  const counted = new WeakSet<Socket>()
  let open = 0
  const closed = (): void => { open-- }
  server.on('connection', (socket: Socket) => {
    if (!counted.has(socket)) {
      if (open >= hooks.max()) {
        hooks.dropped(socket.remoteAddress)
        socket.destroy()
        return
      }
      counted.add(socket)
      open++
      socket.once('close', closed)
    }
    for (const listener of listeners) listener.call(server, socket)
  })
  return { open: () => open }
}
