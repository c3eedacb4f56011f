// npm run bench:readme: writes the README's performance table from a committed results file of
// `npm run bench` (the newest bench/results/<date>.json, or the file given), between the markers
// <!-- bench-table:begin --> and <!-- bench-table:end -->, so the figures are never hand-copied.
// test/bench-readme.test.ts checks that the README holds exactly what this renders.
//   node bench/readme-table.js [results.json] [--check]
import { readFileSync, readdirSync, writeFileSync } from 'node:fs'
import { join, relative, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { describePlacement } from './lib/processes.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const BEGIN = '<!-- bench-table:begin -->'
const END = '<!-- bench-table:end -->'

/** The newest full-load results file (bench/results/YYYY-MM-DD.json). */
export function newestResults () {
  const files = readdirSync(join(ROOT, 'bench', 'results')).filter((f) => /^\d{4}-\d{2}-\d{2}\.json$/.test(f)).sort()
  if (files.length === 0) throw new Error('no bench/results/<date>.json: run npm run bench first')
  return join(ROOT, 'bench', 'results', /** @type {string} */ (files[files.length - 1]))
}

/** @param {number | undefined | null} n */
function num (n) {
  if (n === undefined || n === null || !Number.isFinite(n)) return '-'
  const a = Math.abs(n)
  if (a >= 100) return String(Math.round(n))
  if (a >= 10) return n.toFixed(1)
  if (a >= 1) return n.toFixed(2)
  return n.toFixed(3)
}

/** @param {{ median: number, min: number, max: number } | undefined} s */
function spread (s) {
  return s === undefined ? '-' : `${num(s.median)} [${num(s.min)}-${num(s.max)}]`
}

/**
 * The markdown the README holds between its markers, from one results report.
 * @param {any} report
 * @param {string} file  the results file, as named in the text
 */
export function renderTable (report, file) {
  const m = report.machine
  const load = (/** @type {number[] | undefined} */ l) => (l ? l.map((x) => x.toFixed(1)).join(' / ') : '?')
  const lines = [
    `From \`${file}\` (${report.date}, commit ${m.gitCommit ?? '?'}): ${m.cpuCount} cores (${m.cpuModel}), node ${m.node}, load average ${load(m.loadavgAtStart)} at the start and ${load(m.loadavgAtEnd)} at the end (1/5/15 min), ${describePlacement(m.placement)}. Medians of ${report.settings.rounds} rounds of ${report.settings.durationS} s at ${report.settings.connections} connections, [min-max] over rounds.`,
    '',
    '| contender | CPU µs/req | req/s | p99 ms | Redis calls/req |',
    '|---|---|---|---|---|'
  ]
  for (const c of report.contenders) {
    if (!c.summary) continue
    const s = c.summary
    lines.push(`| (${c.letter}) ${c.label} | ${spread(s.cpuPerReq)} | ${num(s.rps?.median)} | ${num(s.p99Ms?.median)} | ${num(s.redisCallsPerReq?.median)} |`)
  }
  lines.push('', 'Ratios of CPU per request, each pair measured in the same round:', '', '| ratio | CPU/req | p99 |', '|---|---|---|')
  for (const r of report.ratios) {
    if (r.skipped) continue
    lines.push(`| ${r.name} | ${spread(r.cpuPerReq)} | ${r.p99Ms ? spread(r.p99Ms) : '-'} |`)
  }
  for (const d of report.differences ?? []) {
    if (!d.skipped) lines.push('', `${d.name}: ${spread(d.cpuPerReq)}.`)
  }
  return lines.join('\n')
}

/** @param {string} readme @param {string} table */
export function withTable (readme, table) {
  const a = readme.indexOf(BEGIN)
  const b = readme.indexOf(END)
  if (a === -1 || b < a) throw new Error(`README.md has no ${BEGIN} ... ${END} section`)
  return `${readme.slice(0, a + BEGIN.length)}\n${table}\n${readme.slice(b)}`
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2)
  const file = args.find((a) => !a.startsWith('--')) ?? newestResults()
  const report = JSON.parse(readFileSync(file, 'utf8'))
  const readmePath = join(ROOT, 'README.md')
  const readme = readFileSync(readmePath, 'utf8')
  const next = withTable(readme, renderTable(report, relative(ROOT, resolve(file))))
  if (args.includes('--check')) {
    if (next !== readme) { console.error('README.md performance table differs from bench/readme-table.js output: run npm run bench:readme'); process.exit(1) }
  } else {
    writeFileSync(readmePath, next)
    console.log(`README.md: performance table from ${file}`)
  }
}
