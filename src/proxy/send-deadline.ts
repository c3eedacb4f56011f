// server.sendTimeout after the upstream is done: the request settles when the upstream's last
// byte is handed to node:http (or to the encoder), and its send timer goes with it. What was
// still waiting for the client (the encoder's output, the chunks over the socket's buffer) had
// no timer then: a client that stopped reading at that point held its connection, and its
// encoder, for good.
import type { ServerResponse } from 'node:http'

/**
 * Closes `res` once the bytes it holds for the client have not moved for `sendTimeoutMs`, as the
 * send timeout does while the upstream still sends. Checked when the time is up, not per write:
 * held bytes that changed (some written, more given by an encoder once the client took some) are
 * progress, and so is an empty buffer (an encoder still at work is no fault of the client's).
 */
export function cutUnlessWritten (res: ServerResponse, sendTimeoutMs: number): void {
  if (res.writableFinished) return
  // pipelined behind an answer still going out: its bytes cannot move before its turn, which is
  // no fault of its client's (the deadline starts when the connection is its)
  if (res.socket === null) {
    res.once('socket', () => { cutUnlessWritten(res, sendTimeoutMs) })
    return
  }
  let held = res.writableLength
  const timer = setTimeout(() => {
    const now = res.writableLength
    if (now === 0 || now !== held) {
      held = now
      timer.refresh()
      return
    }
    res.destroy()
  }, sendTimeoutMs)
  const done = (): void => { clearTimeout(timer) }
  res.once('finish', done)
  res.once('close', done)
}
