/**
 * Signals that come while a start reads and checks its file, before the gateway's own handlers are
 * installed (a file of 20,000 routes takes seconds). Without a handler, SIGHUP's default action
 * ended the process (a logrotate postrotate or a systemd ExecReload during a slow start), and
 * SIGTERM or SIGINT to PID 1 (a container's) were dropped by the kernel, so a `docker stop` during
 * the start waited for its SIGKILL while the gateway went on to serve. Held here, a SIGHUP becomes
 * a reload once started, and a SIGTERM or SIGINT ends the start before anything is opened.
 */
export interface EarlySignals {
  /** The first SIGTERM or SIGINT so far, or null. */
  readonly stop: NodeJS.Signals | null
  /** Lets go of SIGHUP (its handler is installed): whether one came. */
  takeReload (): boolean
  /** Lets go of SIGTERM and SIGINT (their handlers are installed): the first that came, or null. */
  takeStop (): NodeJS.Signals | null
}

export function holdEarlySignals (): EarlySignals {
  let reload = false
  let stop: NodeJS.Signals | null = null
  const onHup = (): void => { reload = true }
  const onStop = (signal: NodeJS.Signals): void => { stop ??= signal }
  process.on('SIGHUP', onHup)
  process.on('SIGTERM', onStop)
  process.on('SIGINT', onStop)
  return {
    get stop () { return stop },
    takeReload () {
      process.off('SIGHUP', onHup)
      return reload
    },
    takeStop () {
      process.off('SIGTERM', onStop)
      process.off('SIGINT', onStop)
      return stop
    }
  }
}
