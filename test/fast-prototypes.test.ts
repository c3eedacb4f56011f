// String methods stay on V8's fast path in the gateway's process. A class that extends a built-in
// (ioredis 6: `class VerbatimString extends String`) turns the built-in's prototype into a
// dictionary object, and V8 leaves it so while the methods are called on primitives: every
// charCodeAt, slice or indexOf of the request path then cost a generic property load (issue 13,
// bench/README.md nineteenth session). src/fast-prototypes.ts puts the prototypes back; this test
// reads their mode with V8's own %HasFastProperties in a child process.
import t from 'tap'
import { spawn } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { childEnv } from './helpers/gateway.js'

const INDEX = JSON.stringify(new URL('../dist/index.js', import.meta.url).href)

interface Report { readonly step: string, readonly slow: readonly string[] }

async function runNatives (t: { teardown: (fn: () => unknown) => void }, file: string): Promise<{ code: number | null, reports: Report[], stderr: string }> {
  // through env(1) without NODE_OPTIONS: tap's own --import would load modules before the script
  const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, '--allow-natives-syntax', file], { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv() })
  t.teardown(() => { child.kill('SIGKILL') })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (c: Buffer) => { stdout += c.toString() })
  child.stderr.on('data', (c: Buffer) => { stderr += c.toString() })
  const code = await new Promise<number | null>(resolve => child.once('exit', resolve))
  const reports = stdout.split('\n').filter(l => l.startsWith('{')).map(l => JSON.parse(l) as Report)
  return { code, reports, stderr }
}

t.test('the built-in prototypes are fast objects in a process that loads the gateway, before and after code that extends String', async t => {
  const dir = t.testdir({
    'gateway.yaml': `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: warn }
upstreams:
  backend: { targets: [http://127.0.0.1:9] }
routes:
  - { name: api, pathPrefix: /api, upstream: backend }
`
  })
  const script = join(dir, 'script.mjs')
  writeFileSync(script, `
    // %HasFastProperties only parses with --allow-natives-syntax, so it lives in a Function
    const fast = new Function('o', 'return %HasFastProperties(o)')
    const BUILTINS = { String, Number, Boolean, Symbol, BigInt, Object, Array, Function, RegExp, Map, Set, Promise, Error, Date }
    const report = (step) => console.log(JSON.stringify({ step, slow: Object.keys(BUILTINS).filter(k => !fast(BUILTINS[k].prototype)) }))
    // an embedding process's own module, loaded before the gateway
    class Before extends String {}
    report('extended before loading')
    const { startGateway } = await import(${INDEX})
    report('gateway loaded')
    class After extends String {}
    class AfterNumber extends Number {}
    report('extended after loading')
    const gw = await startGateway({ configFile: ${JSON.stringify(join(dir, 'gateway.yaml'))} })
    report('started')
    await gw.close()
    void Before; void After; void AfterNumber
  `)
  const { code, reports, stderr } = await runNatives(t, script)
  t.equal(code, 0, `the script ran to its end (stderr: ${stderr.slice(0, 2000)})`)
  const slow = Object.fromEntries(reports.map(r => [r.step, r.slow]))
  // what V8 does to a prototype that is extended: the test can see it
  t.ok(slow['extended before loading']?.includes('String'), 'String.prototype is slow once a class extends String')
  t.same({ loaded: slow['gateway loaded'], after: slow['extended after loading'], started: slow.started }, { loaded: [], after: [], started: [] },
    'every prototype is fast once the gateway is loaded (ioredis extends String as it loads), whatever extends String before or after')
})
