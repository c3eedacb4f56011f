// The access line formats its time and duration by hand (src/log.ts createIsoClock, millisJson):
// each must read exactly as toISOString and String() would, across seconds, days, years, a clock
// that steps back, and every magnitude of duration.
import t from 'tap'
import { createIsoClock, millisJson } from '../src/log.js'
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

t.test('the access line duration reads as String() of the number, for every whole number of microseconds', async t => {
  const fixed = [0, 0.001, 0.01, 0.1, 0.005, 0.05, 0.5, 1, 1.2, 1.23, 1.234, 1.007, 1.07, 1.7, 10.05, 999.999, 1000, 86_400_000.001, 1e12 + 0.001]
  for (const ms of fixed) t.equal(millisJson(ms), String(ms), String(ms))
  const random = prng(271127)
  let wrong = 0
  for (let i = 0; i < 100_000; i++) {
    // durations as request-record.ts makes them: Math.round(seconds * 1e6) / 1e3, from µs to days
    const ms = Math.round(random() * 10 ** Math.floor(random() * 11)) / 1e3
    if (millisJson(ms) !== String(ms)) wrong++
  }
  t.equal(wrong, 0, 'no difference in 100,000 durations')
  // not a whole number of microseconds, or not a finite number: numberJson's answer
  t.equal(millisJson(1.0005), '1.0005')
  t.equal(millisJson(-2.5), '-2.5')
  t.equal(millisJson(Number.NaN), 'null')
  t.equal(millisJson(Infinity), 'null')
})

t.test('lines other than the access line hide credentials at the paths the README lists', async t => {
  const { createLogger } = await import('../src/log.js')
  const { Writable } = await import('node:stream')
  const lines: Array<Record<string, unknown>> = []
  const sink = new Writable({
    write (chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString().split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>)
      cb()
    }
  })
  const logger = createLogger('info', sink)
  logger.info({
    headers: { authorization: 'Bearer s3cret', cookie: 'sid=s3cret', 'x-api-key': 's3cret', 'proxy-authorization': 'Basic s3cret', accept: '*/*' },
    redis: { password: 's3cret', url: 'redis://127.0.0.1:6379' },
    password: 's3cret',
    secret: 's3cret',
    token: 's3cret'
  }, 'a line with credentials')
  await new Promise(resolve => setImmediate(resolve))
  const line = lines.find(l => l.msg === 'a line with credentials')
  t.same(line?.headers, { authorization: '[redacted]', cookie: '[redacted]', 'x-api-key': '[redacted]', 'proxy-authorization': '[redacted]', accept: '*/*' })
  t.same(line?.redis, { password: '[redacted]', url: 'redis://127.0.0.1:6379' })
  t.same([line?.password, line?.secret, line?.token], ['[redacted]', '[redacted]', '[redacted]'])
  t.notOk(JSON.stringify(lines).includes('s3cret'), 'the secret appears nowhere')
})
