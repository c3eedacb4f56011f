// A pid file outlives a gateway killed with SIGKILL or by the OOM killer, and the kernel hands its
// process id to the next process that starts. SIGHUP ends most processes: `gateway reload` with
// such a file would kill whatever now holds the id (a database, an operator's shell). These
// checks tell a reused id from the gateway that wrote the file.
import { readFileSync, statSync } from 'node:fs'

// USER_HZ: the unit of /proc/<pid>/stat times, fixed at 100 by the kernel's ABI on every
// architecture Node runs on (sysconf(_SC_CLK_TCK)).
const TICKS_PER_SECOND = 100
// The pid file is written after the process started, so its start is never later than the file.
// The margin absorbs rounding (ticks, whole-second boot time) and a small clock step.
const START_MARGIN_MS = 2000

/** When process `pid` started (ms since the epoch), from /proc; null where /proc cannot tell. */
export function processStartMs (pid: number, proc = '/proc'): number | null {
  try {
    const bootLine = /^btime (\d+)$/m.exec(readFileSync(`${proc}/stat`, 'latin1'))
    const stat = readFileSync(`${proc}/${pid}/stat`, 'latin1')
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so count from the last ")"
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const ticks = Number(fields[19]) // field 22, starttime: clock ticks after boot
    if (bootLine === null || !Number.isFinite(ticks)) return null
    return Number(bootLine[1]) * 1000 + ticks * 1000 / TICKS_PER_SECOND
  } catch {
    return null
  }
}

/**
 * Why process `pid`, named by `pidFile`, is not the gateway that wrote it, or null when nothing
 * says so. `adminPid` is the process id the gateway's admin listener reports (null: unreachable).
 */
export function notTheGateway (pid: number, pidFile: string, adminPid: number | null, adminUrl: string): string | null {
  if (adminPid !== null && adminPid !== pid) return `pid file ${pidFile} names process ${pid}, but the gateway answering on ${adminUrl} is process ${adminPid}: not signalled (stale pid file?)`
  let written: number
  try {
    written = statSync(pidFile).mtimeMs
  } catch {
    return null
  }
  const started = processStartMs(pid)
  if (started !== null && started > written + START_MARGIN_MS) return `process ${pid} started after ${pidFile} was written, so it is not the gateway that wrote it (a reused process id): not signalled`
  return null
}
