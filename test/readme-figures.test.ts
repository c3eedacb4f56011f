// Figures the README gives operators, read from the constants the code enforces: changing one
// fails here until the README says the new figure. (Each bound's behaviour has its own test.)
import t from 'tap'
import { readFileSync } from 'node:fs'
import { V1_MAX_LENGTH, V2_MAX_LENGTH } from '../src/identify/proxy-protocol.js'
import { MAX_WAITING_SENDS } from '../src/limit/concurrency.js'
import { SKETCH_SIZE } from '../src/admin/live-stats.js'
import { PARSE_OFF_THREAD_CHARS } from '../src/off-thread.js'
import { LOG_BATCH_BYTES, LOG_FLUSH_MS } from '../src/log-sink.js'
import { WORKER_SILENT_MS } from '../src/workers.js'

const README = readFileSync(new URL('../README.md', import.meta.url), 'utf8')

t.test('the README states the bounds the code enforces', async t => {
  t.match(README, `a version 1 line longer than ${V1_MAX_LENGTH} bytes`, 'PROXY v1 line')
  // the version 2 block after its 16-byte fixed header
  t.match(README, `a version 2 block longer than ${(V2_MAX_LENGTH - 16) / 1024} KiB`, 'PROXY v2 block')
  t.match(README, `at most ${MAX_WAITING_SENDS} batches of releases and, apart from them, ${MAX_WAITING_SENDS} renewal rounds`, 'concurrency sends waiting on a stalled Redis')
  t.match(README, `top-k sketch of ${SKETCH_SIZE} counters`, 'the admin page\'s top limited clients')
  t.match(README, `A file of ${PARSE_OFF_THREAD_CHARS / 1024} Ki characters`, 'the size from which a config is parsed on a worker thread')
  t.match(README, `in batches (at least ${LOG_BATCH_BYTES / 1024} KiB, or ${LOG_FLUSH_MS} ms after a batch's first line`, 'the log sink\'s batches')
  t.match(README, `one silent for ${WORKER_SILENT_MS / 1000} s`, 'a worker not answering')
})

t.test('the access line\'s outcome list in the README names every outcome the pipeline logs', async t => {
  const pipeline = readFileSync(new URL('../src/pipeline.ts', import.meta.url), 'utf8')
  const logged = new Set([...pipeline.matchAll(/this\.refuse\([^;\n]*?, '([a-z_]+)'\)|outcome: '([a-z_]+)'/g)].map(m => m[1] ?? m[2]))
  t.ok(logged.size >= 10, `the pipeline's outcomes found (${[...logged].join(', ')})`)
  const listed = /`outcome` when the gateway answered itself \(([^)]*)\)/.exec(README)?.[1] ?? ''
  t.same([...logged].filter(o => !listed.includes(`\`${o}\``)), [], 'each is in the README\'s list')
})
