// An Upgrade offer the gateway does not take is ignored, as RFC 9110 §7.8 lets a server do: the
// request is served over HTTP/1.1 as if it had not offered one. The offers met in practice are
// h2c (`curl --http2` and Java's java.net.http.HttpClient send `Upgrade: h2c` on every plain-HTTP
// request, with or without a body) and TLS/1.0; refusing them with 400 failed those clients
// outright. WebSocket is the one protocol the gateway switches to (src/proxy/websocket.ts).
//
// Node hands every request with an Upgrade header to the server's 'upgrade' listener, with the
// connection taken off its HTTP parser (node 20 has no way to choose per request; node 24's
// shouldUpgradeCallback is that choice). So the request head is written again without its
// Upgrade field, put back in front of what the client sent after it (its body, requests pipelined
// behind it) and the connection handed to the server again, which parses it as a new request on a
// fresh parser: bodies, chunked or not, keep-alive and pipelining work as for every request.
import type { IncomingMessage, Server } from 'node:http'
import type { Server as HttpsServer } from 'node:https'
import type { Socket } from 'node:net'
import { TLSSocket } from 'node:tls'

/** Whether the request asks for the one protocol the gateway switches to. */
export function offersWebSocket (req: IncomingMessage): boolean {
  return (req.headers.upgrade ?? '').toLowerCase() === 'websocket'
}

/**
 * The request head as the client sent it, less its Upgrade field. The Connection field keeps its
 * options (keep-alive or close still apply); without an Upgrade field they switch nothing, and the
 * forwarding drops the fields they name (HTTP2-Settings) as hop-by-hop.
 */
export function headWithoutUpgrade (req: IncomingMessage): Buffer {
  let head = `${req.method ?? 'GET'} ${req.url ?? '/'} HTTP/${req.httpVersion}\r\n`
  const raw = req.rawHeaders
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i] as string
    if (name.length === 7 && name.toLowerCase() === 'upgrade') continue
    head += `${name}: ${raw[i + 1] as string}\r\n`
  }
  // node's parser read the fields as latin1: written back byte for byte
  return Buffer.from(head + '\r\n', 'latin1')
}

/**
 * Serves the request as if it had offered no upgrade: `server` parses it again from the
 * connection. `head` is what node read after the request head. Returns false, touching nothing,
 * for a head that cannot be written again as it came: node keeps at most maxHeadersCount fields
 * in rawHeaders but frames the body by all of them, so a Content-Length past the kept ones would
 * be lost and the body read as the next request (smuggling). Such a head has more fields than
 * the gateway takes: the caller answers 431, as the pipeline would.
 */
export function declineUpgrade (server: Server | HttpsServer, req: IncomingMessage, socket: Socket, head: Buffer): boolean {
  // (node's parser keeps 2000 fields when the server sets no count)
  if (req.rawHeaders.length >= 2 * (server.maxHeadersCount ?? 2000)) return false
  // Answers owed before it ended the connection (Connection: close, the drain's last answer):
  // nothing after them is served, as node serves nothing after such an answer.
  if (socket.destroyed || !socket.writable || socket.writableEnded) {
    socket.destroy()
    return true
  }
  // node arms the keep-alive timeout as the answer before this one finishes, and clears it when
  // the next request arrives, in the parser state that the new one does not share: cleared here,
  // or it would cut this request mid-way (node's resetSocketTimeout)
  socket.setTimeout(server.timeout)
  socket.unshift(head.length === 0 ? headWithoutUpgrade(req) : Buffer.concat([headWithoutUpgrade(req), head]))
  // a TLS listener's HTTP layer starts on 'secureConnection', a plain one on 'connection'
  server.emit(socket instanceof TLSSocket ? 'secureConnection' : 'connection', socket)
  return true
}
