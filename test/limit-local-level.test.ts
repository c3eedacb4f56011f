// The local level and the deny cache on their own: what they decide, and that reading a lapsed deny
// never deletes the last entry held (lru-cache clears all its maxKeys-long arrays when the last key
// held is deleted, a stall on that request; see deleteUnlessLast in src/limit/lru.ts).
import t from 'tap'
import { DenyCache, LocalLevel } from '../src/limit/local-level.js'

t.test('local level: a token bucket per client, refilled continuously', async (t) => {
  const level = new LocalLevel({ limit: 10, windowMs: 1000, burst: 2, maxKeys: 100 })
  const at = 1_000_000
  t.same([level.take('a', at), level.take('a', at)], [0, 0], 'the burst passes')
  t.equal(level.take('a', at), 100, 'then one token per 100 ms: the wait in ms')
  t.equal(level.take('b', at), 0, 'another client has its own bucket')
  t.equal(level.take('a', at + 100), 0, 'a token back after 100 ms')
  // Idle far beyond a full refill: decides like a fresh bucket, and the key is still held.
  t.same([level.take('a', at + 3_600_000), level.take('a', at + 3_600_000), level.take('a', at + 3_600_000)], [0, 0, 100], 'a whole burst, no more')
  t.equal(level.size, 2, 'no key was dropped')
})

t.test('deny cache: a key stays denied until its time; lapsed, it is deleted unless it is the last one', async (t) => {
  const deny = new DenyCache(100)
  deny.add('k', 1_000)
  t.equal(deny.remaining('k', 900), 100, 'ms left')
  t.equal(deny.remaining('other', 900), 0, 'an unknown key is not denied')
  t.equal(deny.remaining('k', 1_000), 0, 'not denied once its time is reached')
  t.equal(deny.size, 1, 'the lapsed entry was read and kept (it was the only one held)')
  deny.add('k', 2_000)
  t.equal(deny.remaining('k', 1_500), 500, 'and can be denied again')
  deny.forget('k')
  t.equal(deny.remaining('k', 1_500), 0, 'forget lifts a deny')
  deny.add('a', 2_000)
  deny.add('b', 3_000)
  t.equal(deny.remaining('a', 2_500), 0, 'a lapsed')
  t.equal(deny.size, 1, 'and deleted, beside a live deny')
  t.equal(deny.remaining('b', 2_500), 500, 'which is untouched')
})

t.test('deny cache: quiet (every lookup would answer 0) only once the latest deadline added has passed', async (t) => {
  const deny = new DenyCache(100)
  t.equal(deny.quietAt(0), true, 'nothing denied yet')
  deny.add('late', 5_000)
  deny.add('early', 2_000, 1_000_000)
  t.equal(deny.quietAt(4_999), false, 'a deny is live until 5,000')
  t.equal(deny.remaining('late', 4_999), 1, 'the lookup it stands for')
  t.equal(deny.quietAt(5_000), true, 'the latest deadline passed: every deny lapsed')
  t.same([deny.remaining('late', 5_000), deny.remaining('early', 5_000, 0)], [0, 0], 'as the lookups say')
  deny.forget('late')
  deny.add('again', 6_000)
  t.equal(deny.quietAt(5_500), false, 'a new deny makes it live again')
})
