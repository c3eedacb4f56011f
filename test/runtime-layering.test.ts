// Issue 7 item 1: the dependency runs one way. src/config reads, validates and applies defaults;
// src/runtime.ts assembles; the stages (router, identify, limit, proxy) import nothing from
// src/config, types included, and src/config imports neither the assembler nor a stage's factory
// of long-lived things (it may call a stage's validator or read a stage's default).
import t from 'tap'
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'

function sources (dir: string): string[] {
  return readdirSync(dir).flatMap(name => {
    const path = join(dir, name)
    return statSync(path).isDirectory() ? sources(path) : path.endsWith('.ts') ? [path] : []
  })
}

/** Every module specifier a file imports or re-exports (static and dynamic). */
function imports (file: string): string[] {
  const text = readFileSync(file, 'utf8')
  return [...text.matchAll(/(?:^|\n)\s*(?:import|export)\s[^'"]*?from\s+'([^']+)'|import\(\s*'([^']+)'\s*\)/g)].map(m => (m[1] ?? m[2]) as string)
}

t.test('the stages import nothing from src/config', async t => {
  for (const stage of ['src/router', 'src/identify', 'src/limit', 'src/proxy']) {
    for (const file of sources(stage)) {
      const fromConfig = imports(file).filter(spec => /(^|\/)config\//.test(spec))
      t.same(fromConfig, [], `${file} imports no config module`)
    }
  }
})

t.test('src/config builds no runtime: it imports neither the assembler nor a long-lived resource', async t => {
  const builders = /runtime|limiter\.js$|redis-|memory-store|local-level|concurrency|heartbeat|forward\.js$|route-table/
  for (const file of sources('src/config')) {
    const found = imports(file).filter(spec => spec.startsWith('.') && builders.test(spec))
    t.same(found, [], `${file} only reads, validates and applies defaults`)
  }
})
