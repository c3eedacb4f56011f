// Figures the README gives operators, read from the constants the code enforces: changing one
// fails here until the README says the new figure. (Each bound's behaviour has its own test.)
import t from 'tap'
import { readFileSync } from 'node:fs'
import { V1_MAX_LENGTH, V2_MAX_LENGTH } from '../src/identify/proxy-protocol.js'
import { MAX_WAITING_SENDS } from '../src/limit/concurrency.js'
import { SKETCH_SIZE } from '../src/admin/live-stats.js'
import { PARSE_OFF_THREAD_CHARS } from '../src/off-thread.js'

const README = readFileSync(new URL('../README.md', import.meta.url), 'utf8')

t.test('the README states the bounds the code enforces', async t => {
  t.match(README, `a version 1 line longer than ${V1_MAX_LENGTH} bytes`, 'PROXY v1 line')
  // the version 2 block after its 16-byte fixed header
  t.match(README, `a version 2 block longer than ${(V2_MAX_LENGTH - 16) / 1024} KiB`, 'PROXY v2 block')
  t.match(README, `at most ${MAX_WAITING_SENDS} of these sends`, 'concurrency sends waiting on a stalled Redis')
  t.match(README, `top-k sketch of ${SKETCH_SIZE} counters`, 'the admin page\'s top limited clients')
  t.match(README, `A file of ${PARSE_OFF_THREAD_CHARS / 1024} Ki characters`, 'the size from which a config is parsed on a worker thread')
})
