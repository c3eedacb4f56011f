import type { Logger } from './log.js'

// Node ends a process on a promise rejected with no handler. For a gateway that cut every request
// and tunnel in flight (under `workers: N`, a worker's, replaced after a pause) for a call whose
// failure nothing was waiting on: the one found so far was ioredis resubscribing a connection the
// gateway had already closed. Such a rejection is logged with its stack and counted
// (`gateway_stray_rejections_total`, for an alert), and the process serves on: its listeners,
// timers and every other request are untouched by it. A thrown exception keeps Node's default
// (the process ends): the code that threw stopped between two of its own steps.

let strayRejections = 0
let installed = false

/** Installs the process-wide handler once; later calls keep the first logger. */
export function serveOnStrayRejections (logger: Logger): void {
  if (installed) return
  installed = true
  process.on('unhandledRejection', (reason: unknown) => {
    strayRejections++
    logger.error({ code: 'GW_ERR_STRAY_REJECTION', err: reason }, 'a promise was rejected with no handler; serving on')
  })
}

/** Rejections the handler has taken in this process. */
export function strayRejectionCount (): number {
  return strayRejections
}
