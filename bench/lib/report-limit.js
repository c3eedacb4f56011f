// The stdout summary of bench/limit.js.
import { fmt } from './summary.js'

/**
 * @param {string[]} header
 * @param {string[][]} rows
 */
function table (header, rows) {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)))
  /** @param {string[]} cells */
  const line = (cells) => cells.map((c, i) => i === 0 ? c.padEnd(/** @type {number} */ (widths[i])) : c.padStart(/** @type {number} */ (widths[i]))).join('  ')
  return [line(header), line(widths.map((w) => '-'.repeat(w))), ...rows.map(line)].join('\n')
}

/**
 * @param {any} report  the object limit.js writes as JSON
 */
export function printLimitReport (report) {
  if (Array.isArray(report.redisStore)) {
    console.log(`\nRedis store from one process, ${report.settings.inflight} decisions in flight (decisions/s), against redis-benchmark replaying the same script call (-c 50 -P 16):\n`)
    const memory = new Map((report.memoryStore ?? []).map((/** @type {any} */ m) => [m.scenario, m]))
    console.log(table(
      ['scenario', 'checks', 'one call per decision', 'batched', 'Redis ceiling calls/s', 'best / ceiling', 'calls/decision', 'cmds in script', 'client µs/decision', 'redis µs/decision', 'in-process decisions/s'],
      report.redisStore.map((/** @type {any} */ r) => {
        // results written before issue 13 compared auto-pipelining off / on instead of batching
        const off = r.store.perRequest ?? r.store.noAutoPipelining
        const on = r.store.batched ?? r.store.autoPipelining
        const ceiling = r.ceiling?.rps
        const best = Math.max(off?.perSecond ?? 0, on?.perSecond ?? 0)
        return [r.scenario, String(r.checks), fmt(off?.perSecond), fmt(on?.perSecond), ceiling ? fmt(ceiling) : (r.ceiling?.skipped ?? '-'),
          ceiling ? fmt(best / ceiling) : '-', fmt(on?.redisCallsPerDecision), fmt(on?.redisCommandsInScriptsPerDecision),
          `${fmt(off?.clientCpuPerDecision)} / ${fmt(on?.clientCpuPerDecision)}`, `${fmt(off?.redisCpuPerDecision)} / ${fmt(on?.redisCpuPerDecision)}`,
          fmt(/** @type {any} */ (memory.get(r.scenario))?.perSecond)]
      })
    ))
    console.log('(calls/decision and cmds in script: batched; client and redis µs/decision: one call per decision / batched)')
  } else if (Array.isArray(report.memoryStore)) {
    console.log('\nIn-process store (decisions/s):\n')
    console.log(table(['scenario', 'decisions/s', 'µs/decision'], report.memoryStore.map((/** @type {any} */ m) => [m.scenario, fmt(m.perSecond), fmt(m.cpuPerDecision)])))
  }
  if (Array.isArray(report.keyMemory)) {
    console.log('\nRedis memory per client (MEMORY USAGE of the keys each client owns):\n')
    console.log(table(['algorithm', 'requests/client', 'keys/client', 'bytes/client'],
      report.keyMemory.map((/** @type {any} */ k) => [k.algorithm, String(k.requestsPerClient), fmt(k.keysPerClient), fmt(k.bytesPerClient)])))
  }
  const rss = report.localLevelRss
  if (rss && !rss.skipped) {
    console.log(`\nGateway RSS, ${rss.clients} distinct client IPs through the local level (maxKeys ${rss.maxKeys}):`)
    console.log(`  start ${fmt(rss.rssAtStartMb)} MB, after ${rss.rssAtMaxKeysClients} clients ${fmt(rss.rssAtMaxKeysMb)} MB, end ${fmt(rss.rssAtEndMb)} MB, peak ${fmt(rss.peakRssMb)} MB; local keys at end ${rss.localKeysAtEnd} (${rss.bounded ? 'bounded' : 'NOT bounded'}); ${rss.requests} requests, ${rss.non2xx} non-2xx, ${fmt(rss.seconds)} s`)
  } else if (rss?.skipped) {
    console.log(`\nGateway RSS: skipped (${rss.skipped})`)
  }
  for (const s of report.skipped ?? []) console.log(`skipped: ${s}`)
}
