// limit-batch.lua answers with one string of comma-separated integers (issue 13): the parser must
// read every integer limit.lua can return exactly, and refuse anything else rather than guess.
import t from 'tap'
import { parseBatchReply, parseIntegerList } from '../src/limit/scripts.js'
import type { LimitCheck } from '../src/limit/types.js'

t.test('integers are read exactly: signs, zero, µs timestamps up to 2^53 - 1', async t => {
  t.same(parseIntegerList('0'), [0])
  t.same(parseIntegerList('7,-1,0,1763925000123,-42'), [7, -1, 0, 1763925000123, -42])
  t.same(parseIntegerList(`${Number.MAX_SAFE_INTEGER},-${Number.MAX_SAFE_INTEGER}`), [Number.MAX_SAFE_INTEGER, -Number.MAX_SAFE_INTEGER])
})

t.test('anything but integers between commas is refused', async t => {
  // junk as the very last byte too: '1a', '12x', '1,2 '
  for (const bad of ['', ',', '1,', ',1', '1,,2', '-', '--1', '1-2', '1.5', '1e3', ' 1', 'a', '1,b', '1a', '12x', '1,2 '] as const) {
    t.throws(() => parseIntegerList(bad), /unexpected reply from limit-batch\.lua/, JSON.stringify(bad))
  }
})

t.test('a batch reply is split per request by each request\'s check count, after the batch\'s time', async t => {
  const checks = (n: number): LimitCheck[] => Array.from({ length: n }, () => ({}) as unknown as LimitCheck)
  const batch = [{ keys: ['a'], checks: checks(1), id: 'r1' }, { keys: ['b', 'c'], checks: checks(2), id: 'r2' }]
  // the time once; r1 allowed (1 check: 6 + 1 values, no receipt in a batch), r2 refused by its second check (2 checks: 6 + 2 values)
  const [r1, r2] = parseBatchReply(Buffer.from('1763925000123,1,4,0,1000,-1,0,4,0,0,250,1000,1,0,3,0'), batch)
  t.same(r1?.decision, { allowed: true, remaining: 4, retryAfterMs: 0, resetMs: 1000, limitingIndex: -1, delayMs: 0, remainings: [4] })
  t.same(r1?.remainings, [4])
  t.same(r1?.receipts, [], 'a batch carries no receipts: nothing batched is refunded')
  t.equal(r1?.nowMs, 1763925000123)
  t.equal(r1?.callId, 'r1', 'each reply names the call id its request was recorded under')
  t.same(r2?.decision, { allowed: false, remaining: 0, retryAfterMs: 250, resetMs: 1000, limitingIndex: 1, delayMs: 0 })
  t.same(r2?.remainings, [3, 0])
  t.same(r2?.receipts, [])
  t.equal(r2?.nowMs, 1763925000123, 'every request of a batch is decided at its one time')
  t.equal(r2?.callId, 'r2')
  // an allowed reply with receipts (limit.lua's own shape) puts the next request out of step
  t.throws(() => parseBatchReply(Buffer.from('1763925000123,1,4,0,1000,-1,0,55,4,0,0,250,1000,1,0,3,0'), batch), /unexpected reply from limit-batch\.lua: allowed is 4/)
  t.throws(() => parseBatchReply(Buffer.from('1763925000123,1,4,0,1000,-1,55,0,4'), batch.slice(0, 1)), /more values than its requests need/)
  // the last value missing, found where it should be
  t.throws(() => parseBatchReply(Buffer.from('1763925000123,1,4,0,1000,-1,0,4,0,0,250,1000,1,0,3'), batch), /unexpected reply from limit-batch\.lua: "1763925000123,/)
  t.throws(() => parseBatchReply(Buffer.from('1763925000123,1,4,0,1000,-1,0,4'), batch), /fewer values than its requests need/)
  t.throws(() => parseBatchReply(Buffer.from('1763925000123,1,4,0,1000,-1,0,4,0,0,250,1000,1,0,3,0,1'), batch), /more values than its requests need/)
  t.throws(() => parseBatchReply(Buffer.from('1763925000123,1,4,0,1000,-1,0,4,0,0,250,1000,1,0,3,0,'), batch), /more values than its requests need/, 'a trailing comma')
  t.throws(() => parseBatchReply(Buffer.from('1763925000123,1,4,0,1000,-1,0,4,0,0,250,1000,1,0,3,0x'), batch), /unexpected reply/, 'junk after the last value')
  // values out of step (a reply whose requests are not where the client expects them): refused, not read as decisions
  t.throws(() => parseBatchReply(Buffer.from('1763925000123,4,1,0,1000,-1,0,4,0,0,250,1000,1,0,3,0'), batch), /allowed is 4/)
  t.throws(() => parseBatchReply(Buffer.from('1763925000123,1,4,0,1000,-1,0,4,0,0,250,1000,1,0,3,x'), batch), /unexpected reply/)
  t.throws(() => parseBatchReply([9, 1], batch), /unexpected reply/)
  // the reply is asked for as bytes: a decoded string means the call was made the wrong way
  t.throws(() => parseBatchReply('1763925000123,1,4,0,1000,-1,0,4,0,0,250,1000,1,0,3,0', batch), /unexpected reply/)
})
