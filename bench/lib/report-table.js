// The stdout report: one row per contender (CPU per request first), then the ratios, then the flood.
import { fmt, fmtSpread } from './summary.js'

/**
 * @param {string[]} header
 * @param {string[][]} rows
 */
function table (header, rows) {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)))
  /** @param {string[]} cells */
  const line = (cells) => cells.map((cell, i) => i < 2 ? cell.padEnd(/** @type {number} */ (widths[i])) : cell.padStart(/** @type {number} */ (widths[i]))).join('  ').trimEnd()
  return [line(header), line(widths.map((w) => '-'.repeat(w))), ...rows.map(line)].join('\n')
}

/**
 * @typedef {import('./summary.js').Spread} Spread
 * @typedef {{ id: string, letter: string, label: string, skipped: string | null, notes: string[], summary: Record<string, Spread | null> | null }} ContenderReport
 * @typedef {{ name: string, skipped?: string, cpuPerReq?: Spread | null, totalServerCpuPerReq?: Spread | null, rps?: Spread | null, positionsApart?: number }} RatioReport
 */

/**
 * @param {{ settings: { rounds: number, durationS: number, connections: number, floodRate: number }, contenders: ContenderReport[], ratios: RatioReport[], differences?: Array<{ name: string, skipped?: string, cpuPerReq?: Spread }> }} report
 */
export function printReport (report) {
  const { settings } = report
  console.log(`\nMedians over ${settings.rounds} rounds of ${settings.durationS} s, [min-max]; ${settings.connections} connections.`)
  console.log('CPU µs/req: the contender process tree only; server total adds upstream and redis-server.\n')
  const measured = report.contenders.filter((c) => c.summary)
  console.log(table(
    ['', 'contender', 'CPU µs/req', 'server µs/req', 'req/s', 'p50 ms', 'p99 ms', 'peak RSS MB', 'Redis calls/req', 'load-gen µs/req', 'load-gen core%', 'non-2xx'],
    measured.map((c) => {
      const s = /** @type {Record<string, Spread | null>} */ (c.summary)
      return [`(${c.letter})`, c.label, fmtSpread(s.cpuPerReq), fmt(s.totalServerCpuPerReq?.median), fmtSpread(s.rps), fmt(s.p50Ms?.median), fmtSpread(s.p99Ms),
        fmt(s.peakRssMb?.max), fmt(s.redisCallsPerReq?.median), fmt(s.loadgenCpuPerReq?.median), fmt(s.loadgenCorePct?.median), fmt(s.non2xx?.max)]
    })
  ))

  console.log('\nRatios, each pair from the same round (median [min-max] over rounds):\n')
  const ratios = report.ratios.filter((r) => !r.skipped)
  if (ratios.length) {
    console.log(table(
      ['ratio', '', 'CPU/req', 'server CPU/req', 'req/s', 'positions apart'],
      ratios.map((r) => [r.name, '', fmtSpread(r.cpuPerReq), fmtSpread(r.totalServerCpuPerReq), fmtSpread(r.rps), String(r.positionsApart ?? '-')])
    ))
  }
  for (const r of report.ratios) if (r.skipped) console.log(`${r.name}: not measured (${r.skipped.split('\n')[0]})`)
  // from each gateway's own nodejs_gc_duration_seconds: what a request path that makes V8 promote its objects costs
  const gc = measured.filter((c) => c.summary?.gatewayGcPauseUsPerReq)
  if (gc.length > 0) console.log(`\ngateway GC pause, µs/req: ${gc.map((c) => `(${c.letter}) ${fmtSpread(/** @type {Spread} */ (c.summary?.gatewayGcPauseUsPerReq))}`).join(', ')}`)
  for (const d of report.differences ?? []) {
    console.log(d.skipped ? `${d.name}: not measured (${String(d.skipped).split('\n')[0]})` : `${d.name}: ${fmtSpread(d.cpuPerReq)}`)
  }

  const flood = report.contenders.find((c) => c.id === 'flood' && c.summary)
  if (flood) {
    const s = /** @type {Record<string, Spread | null>} */ (flood.summary)
    const f = (/** @type {string} */ k) => s[`flood.${k}`]
    console.log('\nFlood (g): well-behaved clients alone, then beside the abusive client\n')
    console.log(table(['', 'figure', 'value'], [
      ['', 'offered req/s: well-behaved / abusive', `${fmt(report.settings.floodRate * 0.1)} / ${fmt(report.settings.floodRate * 0.9)}`],
      ['', 'well-behaved req/s alone', fmtSpread(f('goodAloneRps'))],
      ['', 'well-behaved req/s in flood', fmtSpread(f('goodRps'))],
      ['', 'well-behaved throughput kept', fmtSpread(f('goodThroughputKept'))],
      ['', 'well-behaved p99 ms alone / in flood', `${fmt(f('goodAloneP99Ms')?.median)} / ${fmt(f('goodP99Ms')?.median)}`],
      ['', 'well-behaved non-2xx in flood', fmt(f('goodNon2xx')?.max)],
      ['', 'abusive req/s', fmtSpread(f('abusiveRps'))],
      ['', 'abusive share of requests', fmtSpread(f('abusiveShare'))],
      ['', 'abusive rejected (429) per run', fmtSpread(f('abusiveRejected'))],
      ['', 'abusive p50 / p99 ms', `${fmt(f('abusiveP50Ms')?.median)} / ${fmt(f('abusiveP99Ms')?.median)}`],
      ['', 'CPU µs per rejected request', fmtSpread(f('rejectionCpuPerReq'))],
      ['', 'CPU µs per admitted request', fmtSpread(f('goodAloneCpuPerReq'))],
      ['', 'rejections decided without Redis (local level, deny cache)', fmtSpread(f('rejectedWithoutRedisShare'))],
      ['', 'saturation, abusive alone unpaced: req/s, share refused', `${fmtSpread(f('saturationRps'))}, ${fmtSpread(f('saturationRejectedShare'))}`],
      ['', 'saturation: CPU µs per request (nearly all refused)', fmtSpread(f('saturationCpuPerReq'))],
      ['', 'saturation: Redis calls per request', fmtSpread(f('saturationRedisCallsPerReq'))],
      ['', 'Node floor: node:http answering the same 429, CPU µs per request', fmtSpread(f('floorCpuPerReq'))],
      ['', 'saturation / Node floor', fmtSpread(f('saturationToFloor'))]
    ]))
  }

  for (const c of measured) {
    const errors = c.summary?.gatewayRedisErrors?.max ?? 0
    const share = c.summary?.gatewayFallbackShare?.max ?? 0
    if (errors > 0) console.log(`\nWARNING (${c.letter}) ${c.id}: up to ${errors} failed or late Redis calls per run; up to ${fmt(share * 100)}% of shared-level decisions fell back to the in-process store`)
  }

  const notes = report.contenders.filter((c) => c.skipped || c.notes.length)
  if (notes.length) {
    console.log('')
    for (const c of notes) {
      if (c.skipped) console.log(`(${c.letter}) ${c.id} skipped: ${c.skipped.split('\n').slice(0, 4).join(' | ')}`)
      for (const n of c.notes) console.log(`(${c.letter}) ${c.id}: ${n}`)
    }
  }
}
