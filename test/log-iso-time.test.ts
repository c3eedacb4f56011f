// The access line's time is formatted per second and completed per line (src/log.ts
// createIsoClock): it must read exactly as toISOString would, across seconds, days, years and a
// clock that steps back.
import t from 'tap'
import { createIsoClock } from '../src/log.js'
import { prng } from './helpers/prng.js'

t.test('the access line time reads as toISOString, whatever the sequence of times', async t => {
  const iso = createIsoClock()
  const fixed = [0, 9, 10, 99, 100, 999, 1000, 1001, 59_999, 60_000, 86_399_999, 86_400_000,
    Date.UTC(2026, 11, 31, 23, 59, 59, 999), Date.UTC(2027, 0, 1), Date.UTC(2028, 1, 29, 12, 0, 0, 5), Date.UTC(9999, 11, 31, 23, 59, 59, 999)]
  for (const ms of fixed) t.equal(iso(ms), new Date(ms).toISOString(), `${ms}`)
  const random = prng(1127)
  let wrong = 0
  let ms = Date.UTC(2026, 10, 27, 4, 20, 0)
  for (let i = 0; i < 50_000; i++) {
    // mostly forward by a few ms, sometimes the same ms again, a second ahead or a step back
    const r = random()
    ms += r < 0.2 ? 0 : r < 0.9 ? Math.floor(random() * 7) : r < 0.97 ? 1000 + Math.floor(random() * 3000) : -Math.floor(random() * 7_200_000)
    if (iso(ms) !== new Date(ms).toISOString()) wrong++
  }
  t.equal(wrong, 0, 'no difference in 50,000 times')
  for (let i = 0; i < 5000; i++) {
    const at = Math.floor(random() * Date.UTC(9999, 11, 31))
    if (iso(at) !== new Date(at).toISOString()) wrong++
  }
  t.equal(wrong, 0, 'no difference over random dates from 1970 to 9999')
})
