// The README's performance table is rendered from a committed results file by
// bench/readme-table.js (issue 13): it can never drift from the measured figures by hand editing.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { join, relative } from 'node:path'
// @ts-expect-error plain JavaScript module of the bench, no type declarations
import { newestResults, renderTable, withTable } from '../bench/readme-table.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')

t.test('the README holds exactly the table rendered from the newest results file', async t => {
  const file = newestResults() as string
  const report = JSON.parse(readFileSync(file, 'utf8')) as { date: string, contenders: Array<{ letter: string, summary: { cpuPerReq: { median: number } } | null }> }
  const table = renderTable(report, relative(ROOT, file)) as string
  t.equal(withTable(readme, table), readme, 'README.md matches bench/readme-table.js (run npm run bench:readme after npm run bench)')
  t.match(table, report.date, 'the table names the run\'s date')
  t.match(table, /2 cores|\d+ cores/, 'and the machine\'s cores')
  t.match(table, /load average [\d.]+ \/ [\d.]+ \/ [\d.]+/, 'and its load')
  const e = report.contenders.find(c => c.letter === 'e')
  t.ok(e?.summary, 'the results file measured the fully limited gateway (e)')
})

t.test('--check fails on a README whose figure was edited by hand', async t => {
  const file = newestResults() as string
  const report = JSON.parse(readFileSync(file, 'utf8')) as unknown
  const table = renderTable(report, relative(ROOT, file)) as string
  const edited = withTable(readme, table.replace(/\| \(e\) ([^|]+)\| [\d.]+/, '| (e) $1| 1.00')) as string
  t.not(edited, readme, 'an edited figure is a different README')
  t.doesNotThrow(() => execFileSync(process.execPath, [join(ROOT, 'bench', 'readme-table.js'), '--check'], { cwd: ROOT, stdio: 'pipe' }), 'the committed README passes --check')
})
