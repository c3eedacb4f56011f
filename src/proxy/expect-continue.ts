// Expect: 100-continue (RFC 9110 §10.1.1) is answered when the gateway starts to read the body,
// not as soon as the head arrives (node's default). A request refused before that (a limit's 429,
// a 401, a 413 by Content-Length, a 404) is refused before its client sends the body: curl asks
// so for a file upload and a large post, and the gateway then neither receives nor reads
// gigabytes it will not forward. nginx answers 100 as late.
import type { IncomingMessage, ServerResponse } from 'node:http'
import { hasRequestBody } from './request-body.js'

/** Requests whose client waits for 100 Continue before it sends the body. */
const held = new WeakSet<IncomingMessage>()

/**
 * The server's 'checkContinue': the request goes on like every other, its 100 held back. A final
 * answer without a 100 closes the connection (node's ServerResponse): the body may still come (a
 * client gives up waiting after a second) or never, so the next bytes are not known to be a head.
 */
export function holdContinue (req: IncomingMessage, res: ServerResponse): void {
  // no body: answered at once as node would, so that the connection stays open for the requests
  // behind it
  if (hasRequestBody(req.headers)) held.add(req)
  else res.writeContinue()
}

/** The body is about to be read: the client may send it now. */
export function sendContinue (req: IncomingMessage, res: ServerResponse): void {
  if (held.delete(req) && !res.headersSent) res.writeContinue()
}
