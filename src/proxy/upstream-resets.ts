// A reset of an upstream connection is a broken response, never its end. undici reads an
// ECONNRESET that comes while a response without Content-Length or chunked framing is read to
// the connection's close as the body's end (client-h1.js: on macOS a whole body can be followed by
// a reset), so a document cut by a reset went to the client as a whole one, its chunked answer
// closed with the last chunk, logged 200, no error counted and no failure toward the target's
// ejection. nginx takes such a reset as an upstream error ("recv() failed (104: Connection reset
// by peer) while reading upstream") and cuts the client's answer.
import type { Socket } from 'node:net'

/** The code an upstream socket's ECONNRESET is given, which undici's body-end rule does not know. */
export const UPSTREAM_RESET_CODE = 'GW_UPSTREAM_ECONNRESET'

/**
 * Renames `socket`'s ECONNRESET before undici's own error listener sees it (this one is added
 * first, by the connector): undici then fails the request with it, and classifyUpstreamError
 * counts it a `reset`, the kind of every code it does not list. Its message still says ECONNRESET.
 */
export function resetIsNoEnd (socket: Socket): void {
  socket.on('error', renameReset)
}

function renameReset (err: NodeJS.ErrnoException): void {
  if (err.code === 'ECONNRESET') err.code = UPSTREAM_RESET_CODE
}
