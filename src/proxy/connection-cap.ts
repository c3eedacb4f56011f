// server.maxConnections: the client connections a process holds at once. A connection beyond the
// cap is closed as it arrives, before a byte is read. Held here rather than by node's own cap
// (net.Server.maxConnections): under workers: N a worker refuses such a connection back to the
// primary, which hands it to the other worker, and back, for as long as both are full
// (lib/internal/cluster/round_robin_handle.js): the flood was held open, never closed, and the
// handle went round the IPC channel in a loop.
//
// server.maxConnectionsPerClient: the same, per client address. The process-wide cap keeps the
// gateway and its upstreams healthy through a flood, but one client could take every place and
// every other client was refused until the flood's connections timed out (headersTimeout).
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
 * Puts `admit` in front of every 'connection' listener `server` has now: a connection it turns
 * down (and closes) reaches none of them. A connection handed to the server again (a declined
 * upgrade) is asked once.
 */
function gateConnections (server: NetServer, admit: (socket: Socket) => boolean): void {
  const listeners = server.listeners('connection') as Array<(socket: Socket) => void>
  server.removeAllListeners('connection')
  const admitted = new WeakSet<Socket>()
  server.on('connection', (socket: Socket) => {
    if (!admitted.has(socket)) {
      if (!admit(socket)) return
      admitted.add(socket)
    }
    for (const listener of listeners) listener.call(server, socket)
  })
}

/**
 * Puts the cap in front of every 'connection' listener `server` has (node's HTTP or TLS layer, the
 * PROXY header's reader, the gateway's own): call it once they are all in place.
 */
export function capConnections (server: NetServer, hooks: ConnectionCapHooks): ConnectionCap {
  let open = 0
  const closed = (): void => { open-- }
  gateConnections(server, (socket) => {
    if (open >= hooks.max()) {
      hooks.dropped(socket.remoteAddress)
      socket.destroy()
      return false
    }
    open++
    socket.once('close', closed)
    return true
  })
  return { open: () => open }
}

export interface ClientCapPolicy {
  /** Connections one client holds at once; null: no cap (they are counted all the same). */
  readonly max: number | null
  /**
   * What the client's connections are counted under (an IPv6 client by its prefix, as the ip
   * limits key it); null for a peer that is not one client (a trusted proxy) and is not capped.
   */
  readonly clientKey: (peer: string | undefined) => string | null
}

export interface ClientCapHooks {
  /** The policy of the live config, read per connection: a reload applies to the next one. */
  readonly policy: () => ClientCapPolicy | null
  readonly dropped: (peer: string | undefined, client: string, max: number) => void
}

/**
 * Puts the cap per client in front of every 'connection' listener `server` has: call it before
 * the PROXY header's reader wraps them, so that a connection is counted under the client the
 * header names, not under the balancer that opened it. Every connection is counted, capped or
 * not, so that a reload that sets the cap finds the connections already open.
 */
export function capConnectionsPerClient (server: NetServer, hooks: ClientCapHooks): void {
  // one entry per client holding a connection: bounded by the connections held (maxConnections)
  const held = new Map<string, number>()
  gateConnections(server, (socket) => {
    const policy = hooks.policy()
    if (policy === null) return true
    const peer = socket.remoteAddress
    const client = policy.clientKey(peer)
    if (client === null) return true
    const count = held.get(client) ?? 0
    if (policy.max !== null && count >= policy.max) {
      hooks.dropped(peer, client, policy.max)
      socket.destroy()
      return false
    }
    held.set(client, count + 1)
    socket.once('close', () => {
      const left = (held.get(client) ?? 1) - 1
      if (left === 0) held.delete(client)
      else held.set(client, left)
    })
    return true
  })
}
