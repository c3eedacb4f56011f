// Who calls a function, from a callgrind dump: calls and inclusive instructions per caller. Made
// for V8's builtins (Builtins_LoadIC, the generic property load): callgrind names JIT code by
// address only, so with the map node writes under --perf-basic-prof (`bench/instructions.js
// --keep --perf-map` keeps it beside the dumps) each caller gets the JavaScript function it is in.
//
//   node bench/callgrind-callers.js <dump> <callee> [--perf-map FILE] [--per N] [--top 25]
//   node bench/callgrind-callers.js <dump> --self [--perf-map FILE] [--per N] [--top 25]
//
// --self lists functions by their own instructions instead (JIT code named by the map), the
// table callgrind_annotate gives for everything but JavaScript.
// <callee> is matched exactly against callgrind's function names; --per divides the figures by
// N (the requests counted) to give them per request.
import { readFileSync } from 'node:fs'
import { parseArgs } from 'node:util'

const { values: flags, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    'perf-map': { type: 'string' },
    per: { type: 'string', default: '1' },
    top: { type: 'string', default: '25' },
    self: { type: 'boolean', default: false }
  }
})
const [dumpFile, callee] = positionals
const selfMode = flags.self === true
if (dumpFile === undefined || (callee === undefined && !selfMode)) {
  console.error('usage: node bench/callgrind-callers.js <dump> <callee> [--perf-map FILE] [--per N] [--top 25]')
  process.exit(2)
}
const per = Number(flags.per)

/** @type {{ start: bigint, end: bigint, name: string }[]} */
const ranges = []
if (flags['perf-map'] !== undefined) {
  for (const line of readFileSync(flags['perf-map'], 'utf8').split('\n')) {
    const m = /^([0-9a-f]+) ([0-9a-f]+) (.*)$/.exec(line)
    if (m === null) continue
    const start = BigInt(`0x${m[1]}`)
    ranges.push({ start, end: start + BigInt(`0x${m[2]}`), name: m[3] ?? '' })
  }
  ranges.sort((a, b) => (a.start < b.start ? -1 : a.start > b.start ? 1 : 0))
}

/** The JIT function an address lies in; the latest map entry wins where code space was reused. */
function jitName (address) {
  const a = BigInt(address)
  let found = null
  for (const r of ranges) {
    if (r.start > a) break
    if (a < r.end) found = r.name
  }
  return found
}

// callgrind's name compression: "fn=(12) name" the first time, "fn=(12)" after
/** @type {Map<string, string>} */
const names = new Map()
function nameOf (spec) {
  const m = /^\((\d+)\)(?: (.*))?$/.exec(spec)
  if (m === null) return spec
  if (m[2] !== undefined) names.set(m[1] ?? '', m[2])
  return names.get(m[1] ?? '') ?? spec
}

/** @type {Map<string, { calls: number, inclusive: number }>} */
const callers = new Map()
/** @type {Map<string, number>} */
const selfCost = new Map()
let fn = ''
let target = ''
let pendingCalls = -1
for (const line of readFileSync(dumpFile, 'utf8').split('\n')) {
  if (pendingCalls >= 0) {
    // the line after calls= is "<position> <inclusive cost>"
    const cost = Number(line.split(' ')[1] ?? 0)
    if (target === callee) {
      const entry = callers.get(fn) ?? { calls: 0, inclusive: 0 }
      entry.calls += pendingCalls
      entry.inclusive += cost
      callers.set(fn, entry)
    }
    pendingCalls = -1
    continue
  }
  if (line.startsWith('fn=')) fn = nameOf(line.slice(3))
  else if (line.startsWith('cfn=')) target = nameOf(line.slice(4))
  else if (line.startsWith('calls=')) pendingCalls = Number(line.slice(6).split(' ')[0])
  else if (selfMode && /^[-+*0-9]/.test(line)) selfCost.set(fn, (selfCost.get(fn) ?? 0) + Number(line.split(' ')[1] ?? 0))
}

if (selfMode) {
  /** @type {Map<string, number>} */
  const byFunction = new Map()
  for (const [f, cost] of selfCost) {
    const name = /^0x[0-9a-f]+$/i.test(f) ? (jitName(f) ?? f) : f
    byFunction.set(name, (byFunction.get(name) ?? 0) + cost)
  }
  const rows = [...byFunction].sort((a, b) => b[1] - a[1])
  const total = rows.reduce((s, [, c]) => s + c, 0)
  console.log(`${(total / per).toFixed(0)} instructions${per === 1 ? '' : ' per request'} in ${rows.length} functions`)
  for (const [name, cost] of rows.slice(0, Number(flags.top))) console.log(`${(cost / per).toFixed(1)}\t${name}`)
  process.exit(0)
}

/** @type {Map<string, { calls: number, inclusive: number, sites: number }>} */
const byName = new Map()
for (const [caller, c] of callers) {
  const name = /^0x[0-9a-f]+$/i.test(caller) ? (jitName(caller) ?? caller) : caller
  const entry = byName.get(name) ?? { calls: 0, inclusive: 0, sites: 0 }
  entry.calls += c.calls
  entry.inclusive += c.inclusive
  entry.sites++
  byName.set(name, entry)
}
const rows = [...byName].sort((a, b) => b[1].inclusive - a[1].inclusive)
const total = rows.reduce((s, [, c]) => s + c.inclusive, 0)
console.log(`${callee}: ${(total / per).toFixed(0)} instructions${per === 1 ? '' : ' per request'} from ${rows.length} callers`)
console.log('inclusive\tcalls\tcaller')
for (const [name, c] of rows.slice(0, Number(flags.top))) {
  console.log(`${(c.inclusive / per).toFixed(1)}\t${(c.calls / per).toFixed(2)}\t${name}`)
}
