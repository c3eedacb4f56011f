// A hand-written SVG chart of one run: req/s and CPU µs per request per contender, medians with
// min-max whiskers. No dependency: the file is plain text the next run can be diffed against.
import { fmt } from './summary.js'

/** @param {string} s */
const esc = (s) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;')

/** @param {string} id */
function colour (id) {
  if (id === 'nginx') return '#3f8f4f'
  if (id === 'direct' || id === 'bare') return '#7a7a7a'
  return '#2f6db5'
}

/**
 * @typedef {import('./summary.js').Spread} Spread
 * @param {{ date: string, machine: { cpuModel: string, cpuCount: number, node: string, nginx: string | null },
 *           settings: { rounds: number, durationS: number, connections: number },
 *           contenders: Array<{ id: string, letter: string, label: string, summary: Record<string, Spread | null> | null }> }} report
 */
export function renderSvg (report) {
  const rows = report.contenders.filter((c) => c.summary)
  const labelW = 300
  const panelW = 300
  const gap = 80
  const rowH = 30
  const top = 86
  const width = labelW + 2 * panelW + gap + 110
  const height = top + rows.length * rowH + 50
  const s = (/** @type {typeof rows[number]} */ c) => /** @type {Record<string, Spread | null>} */ (c.summary)
  const maxRps = Math.max(1, ...rows.map((c) => s(c).rps?.max ?? 0))
  const maxCpu = Math.max(1, ...rows.map((c) => Math.max(s(c).cpuPerReq?.max ?? 0, s(c).totalServerCpuPerReq?.median ?? 0)))
  const x0 = labelW
  const x1 = labelW + panelW + gap
  const out = []
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, sans-serif" font-size="12">`)
  out.push(`<rect width="100%" height="100%" fill="#fff"/>`)
  out.push(`<text x="10" y="22" font-size="16" font-weight="bold">Gateway benchmark ${esc(report.date)}</text>`)
  out.push(`<text x="10" y="40" fill="#555">${esc(`${report.machine.cpuCount} x ${report.machine.cpuModel}, node ${report.machine.node}, ${report.machine.nginx ?? 'no nginx'}; ${report.settings.connections} connections, ${report.settings.rounds} rounds x ${report.settings.durationS} s; medians, whiskers = min-max`)}</text>`)
  out.push(`<text x="${x0}" y="${top - 14}" font-weight="bold">requests/s</text>`)
  out.push(`<text x="${x1}" y="${top - 14}" font-weight="bold">CPU µs per request (dark: contender, light: + upstream + redis)</text>`)
  rows.forEach((c, i) => {
    const y = top + i * rowH
    const sum = s(c)
    out.push(`<text x="${labelW - 10}" y="${y + 16}" text-anchor="end">${esc(`(${c.letter}) ${c.label}`)}</text>`)
    const rps = sum.rps
    if (rps) {
      const w = (rps.median / maxRps) * panelW
      out.push(`<rect x="${x0}" y="${y + 4}" width="${w.toFixed(1)}" height="${rowH - 10}" fill="${colour(c.id)}"/>`)
      out.push(whisker(x0, panelW / maxRps, rps, y + rowH / 2))
      out.push(`<text x="${(x0 + (rps.max / maxRps) * panelW + 4).toFixed(1)}" y="${y + 16}" fill="#222">${fmt(rps.median)}</text>`)
    }
    const cpu = sum.cpuPerReq
    if (cpu) {
      const total = sum.totalServerCpuPerReq?.median ?? cpu.median
      const wTotal = (total / maxCpu) * panelW
      const w = (cpu.median / maxCpu) * panelW
      out.push(`<rect x="${x1}" y="${y + 4}" width="${wTotal.toFixed(1)}" height="${rowH - 10}" fill="${colour(c.id)}" fill-opacity="0.3"/>`)
      out.push(`<rect x="${x1}" y="${y + 4}" width="${w.toFixed(1)}" height="${rowH - 10}" fill="${colour(c.id)}"/>`)
      out.push(whisker(x1, panelW / maxCpu, cpu, y + rowH / 2))
      out.push(`<text x="${(x1 + Math.max(wTotal, (cpu.max / maxCpu) * panelW) + 4).toFixed(1)}" y="${y + 16}" fill="#222">${fmt(cpu.median)}${total !== cpu.median ? ` (${fmt(total)})` : ''}</text>`)
    }
  })
  const axisY = top + rows.length * rowH + 4
  out.push(`<line x1="${x0}" y1="${top}" x2="${x0}" y2="${axisY}" stroke="#999"/>`)
  out.push(`<line x1="${x1}" y1="${top}" x2="${x1}" y2="${axisY}" stroke="#999"/>`)
  out.push(`<text x="10" y="${height - 14}" fill="#555">grey: baselines (upstream direct, bare undici proxy), blue: gateway, green: nginx. Figures in bench/results/${esc(report.date)}.json</text>`)
  out.push('</svg>')
  return out.join('\n') + '\n'
}

/**
 * A min-max whisker across a bar.
 * @param {number} x0
 * @param {number} scale  px per unit
 * @param {Spread} s
 * @param {number} y
 */
function whisker (x0, scale, s, y) {
  if (s.min === s.max) return ''
  const a = (x0 + s.min * scale).toFixed(1)
  const b = (x0 + s.max * scale).toFixed(1)
  return `<path d="M${a} ${y - 5}v10M${a} ${y}H${b}M${b} ${y - 5}v10" stroke="#111" fill="none"/>`
}
