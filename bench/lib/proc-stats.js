// CPU time and peak memory of a process and its descendants, read from /proc (Linux only).
// Descendants matter for nginx (master + worker) and for any gateway that forks workers.
import { readFileSync, readdirSync } from 'node:fs'
import { execFileSync } from 'node:child_process'

/** Clock ticks per second of utime/stime in /proc/<pid>/stat (USER_HZ, almost always 100). */
export const CLOCK_TICKS = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100
  } catch {
    return 100
  }
})()

/**
 * Fields 3.. of /proc/<pid>/stat. The command name (field 2) is in parentheses and may contain
 * spaces, so the split starts after the last ')'. Returns null when the process is gone.
 * @param {number} pid
 */
function readStatFields (pid) {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return text.slice(text.lastIndexOf(')') + 2).split(' ')
  } catch {
    return null
  }
}

/** @returns {Map<number, number[]>} parent pid → child pids, for every live process. */
function childrenByParent () {
  /** @type {Map<number, number[]>} */
  const map = new Map()
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    const fields = readStatFields(Number(entry))
    if (fields === null) continue
    const ppid = Number(fields[1])
    const list = map.get(ppid)
    if (list) list.push(Number(entry))
    else map.set(ppid, [Number(entry)])
  }
  return map
}

/**
 * The pid and all its live descendants.
 * @param {number} pid
 */
export function processTree (pid) {
  const children = childrenByParent()
  const tree = [pid]
  for (let i = 0; i < tree.length; i++) tree.push(...(children.get(/** @type {number} */ (tree[i])) ?? []))
  return tree
}

/**
 * CPU time in µs (user + system, plus reaped children) summed over the process tree.
 * @param {number} pid
 */
export function treeCpuMicros (pid) {
  let ticks = 0
  for (const p of processTree(pid)) {
    const f = readStatFields(p)
    // utime, stime, cutime, cstime are fields 14-17, i.e. indexes 11-14 of the fields after the name.
    if (f !== null) ticks += Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])
  }
  return ticks * 1e6 / CLOCK_TICKS
}

/**
 * Peak resident set size (VmHWM) in kB, summed over the process tree.
 * @param {number} pid
 */
export function treePeakRssKb (pid) {
  let kb = 0
  for (const p of processTree(pid)) {
    try {
      const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${p}/status`, 'utf8'))
      if (m) kb += Number(m[1])
    } catch { /* exited between listing and reading */ }
  }
  return kb
}

/**
 * Current resident set size (VmRSS) in kB, summed over the process tree.
 * @param {number} pid
 */
export function treeRssKb (pid) {
  let kb = 0
  for (const p of processTree(pid)) {
    try {
      const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${p}/status`, 'utf8'))
      if (m) kb += Number(m[1])
    } catch { /* exited between listing and reading */ }
  }
  return kb
}
