// Durations and sizes as the config writes them ("250ms", "10mb") turned into numbers. Unit tests
// of src/config/units.ts, which the mutation run (npm run test:mutation) checks.
import t from 'tap'
import { durationOr, parseDuration, parseSize } from '../src/config/units.js'

t.test('durations: each unit, and the number in front of it', async t => {
  t.equal(parseDuration('250ms'), 250)
  t.equal(parseDuration('1s'), 1000)
  t.equal(parseDuration('7s'), 7000)
  t.equal(parseDuration('2m'), 120_000)
  t.equal(parseDuration('3h'), 10_800_000)
  t.equal(parseDuration('0s'), 0)
})

t.test('a malformed duration is an error that quotes it', async t => {
  for (const text of ['', '1', 's', '1 s', '1.5s', '-1s', '1d', '1S', '1sec', ' 1s']) {
    t.throws(() => parseDuration(text), { message: `invalid duration "${text}"` }, JSON.stringify(text))
  }
})

t.test('durationOr: the fallback only when the duration is absent', async t => {
  t.equal(durationOr(undefined, 1234), 1234)
  t.equal(durationOr('2s', 1234), 2000)
  t.throws(() => durationOr('2x', 1234), { message: 'invalid duration "2x"' })
})

t.test('sizes: a number is bytes; units are binary and case-insensitive', async t => {
  t.equal(parseSize(1048576), 1048576)
  t.equal(parseSize(0), 0)
  t.equal(parseSize('100b'), 100)
  t.equal(parseSize('512kb'), 512 * 1024)
  t.equal(parseSize('10mb'), 10 * 1024 * 1024)
  t.equal(parseSize('1gb'), 1024 * 1024 * 1024)
  t.equal(parseSize('10MB'), 10 * 1024 * 1024)
  t.equal(parseSize('2Kb'), 2048)
})

t.test('a malformed size is an error that quotes it', async t => {
  for (const text of ['', 'mb', '10', '10 mb', '1.5mb', '10tb', '-1kb']) {
    t.throws(() => parseSize(text), { message: `invalid size "${text}"` }, JSON.stringify(text))
  }
})
