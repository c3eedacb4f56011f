// The guard's bound on each Redis call (redis.timeout), kept by one timer for all calls in flight
// (src/limit/redis-guard.ts, issue 13): every call still times out on its own deadline, a reload
// that shortens the timeout applies to the next call at once, and an answer that arrived while
// the event loop was stalled counts as an answer, not as a timeout (issue 8: a GC pause must not
// send traffic to the fallback). Real redis-server, the gateway's own client and store.
import t, { type Test } from 'tap'
import { execFileSync } from 'node:child_process'
import { startRedis } from './helpers/redis.js'
import { createRedisStore } from '../src/limit/redis-store.js'
import { createRedisClient, whenReady } from '../src/limit/redis-client.js'
import { RedisGuard } from '../src/limit/redis-guard.js'
import { NOOP_TELEMETRY } from '../src/telemetry.js'
import type { LimitSpec } from '../src/limit/types.js'

const LOCAL = [{ onError: 'local' as const }]
const SPEC: LimitSpec = Object.freeze({ id: 'fw-1000-60000', algorithm: 'fixed-window', limit: 1000, windowMs: 60_000, burst: 1000, maxDelayMs: 0 })

const redis = await startRedis(t)

async function guardOn (t: Test, timeoutMs: number): Promise<{ guard: RedisGuard, timeouts: () => number }> {
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  let timeouts = 0
  const guard = new RedisGuard({
    store: createRedisStore({ client }),
    fallbackMaxKeys: 100,
    timeoutMs,
    // a breaker that never opens: each call below goes to Redis and is timed on its own
    failureThreshold: 1_000_000,
    instances: () => 1,
    telemetry: { ...NOOP_TELEMETRY, redisCall: (_s, ok, kind) => { if (!ok && kind === 'timeout') timeouts++ } },
    onStateChange: () => {}
  })
  t.teardown(() => guard.close())
  return { guard, timeouts: () => timeouts }
}

const check = (key: string): { key: string, spec: LimitSpec, cost: number } => ({ key, spec: SPEC, cost: 1 })

t.test('Redis paused: calls started at different times each time out on their own deadline', async t => {
  const { guard, timeouts } = await guardOn(t, 300)
  const admin = redis.client()
  await admin.call('CLIENT', 'PAUSE', '1500', 'ALL')
  const started = performance.now()
  const settledAfter: number[] = []
  const calls: Array<Promise<unknown>> = []
  for (let i = 0; i < 3; i++) {
    // 0, 150 and 300 ms after the pause began
    if (i > 0) await new Promise((resolve) => setTimeout(resolve, 150))
    const at = performance.now()
    calls.push(guard.decide([check(`deadline-${i}`)], LOCAL, `r${i}`).then((g) => {
      settledAfter[i] = performance.now() - at
      return g.level
    }))
  }
  const levels = await Promise.all(calls)
  t.same(levels, ['fallback', 'fallback', 'fallback'], 'each call went to the fallback')
  t.equal(timeouts(), 3, 'three timeouts counted')
  for (let i = 0; i < 3; i++) {
    // never before its deadline; well before the pause ends (1500 ms) for each of them
    t.ok((settledAfter[i] as number) >= 295, `call ${i} waited its 300 ms (${Math.round(settledAfter[i] as number)} ms)`)
    t.ok((settledAfter[i] as number) < 1000, `call ${i} was not held until the pause ended (${Math.round(settledAfter[i] as number)} ms)`)
  }
  t.ok(performance.now() - started < 1400, 'all three gave up before Redis came back')
})

t.test('a shorter timeout applies to the next call although a call with the longer one is in flight', async t => {
  const { guard } = await guardOn(t, 2000)
  const admin = redis.client()
  await admin.call('CLIENT', 'PAUSE', '2500', 'ALL')
  const long = guard.decide([check('long')], LOCAL, 'long')
  guard.timeoutMs = 100 // what a reload that changes redis.timeout does
  const at = performance.now()
  const short = await guard.decide([check('short')], LOCAL, 'short')
  const waited = performance.now() - at
  t.equal(short.level, 'fallback')
  t.ok(waited < 1000, `the second call gave up after its own 100 ms, not the first call's 2 s (${Math.round(waited)} ms)`)
  t.equal((await long).level, 'fallback')
})

t.test('an answer that arrived while the event loop was stalled is an answer, not a timeout', async t => {
  const { guard, timeouts } = await guardOn(t, 50)
  for (let i = 0; i < 5; i++) {
    const decision = guard.decide([check(`stall-${i}`)], LOCAL, `s${i}`)
    // the store sends the turn's calls once the turn's I/O is done: let it send this one
    await new Promise((resolve) => setImmediate(resolve))
    // This process does not read its sockets for at least 150 ms, three times the timeout (a GC
    // pause, a burst of synchronous work). Meanwhile Redis answers: a PING on a connection of its
    // own, answered during the stall, comes after the call it already holds, so the call's answer
    // is waiting in this process's socket by the end of the stall, however loaded the machine.
    const until = performance.now() + 150
    execFileSync('redis-cli', ['-p', String(redis.port), 'PING'])
    while (performance.now() < until) { /* stalled */ }
    const g = await decision
    t.equal(g.level, 'redis', `call ${i} decided by Redis`)
  }
  t.equal(timeouts(), 0, 'no call counted as timed out')
  t.equal(guard.breaker, 'closed')
})

t.test('a stall in the check phase before the deadline timer\'s expiry: the answer that arrived meanwhile is read first', async t => {
  // The schedule that made the test above flaky on a loaded machine, made deterministic: the
  // deadline timer armed by an earlier call fires in the same timers phase as the timer that
  // makes the next call, after it; the next call is sent and the stall happens in the check phase
  // that follows, before the expiry the deadline timer queued there. Redis answers during the
  // stall, but no I/O phase runs between the stall and that expiry.
  const { guard, timeouts } = await guardOn(t, 50)
  for (let i = 0; i < 3; i++) {
    const first = performance.now()
    const earlier = await guard.decide([check(`phase-a-${i}`)], LOCAL, `a${i}`)
    t.equal(earlier.level, 'redis', `round ${i}: the earlier call decided by Redis`)
    // the earlier call's deadline timer is armed for first + 50 ms
    const decided = new Promise<string>((resolve) => {
      setTimeout(() => {
        const later = guard.decide([check(`phase-b-${i}`)], LOCAL, `b${i}`)
        setImmediate(() => {
          // the store sent the call in the immediate queued before this one: Redis holds it once it answers a PING
          const until = performance.now() + 150
          execFileSync('redis-cli', ['-p', String(redis.port), 'PING'])
          while (performance.now() < until) { /* stalled */ }
        })
        later.then((g) => resolve(g.level), () => resolve('error'))
      }, 20)
      // both timers are due when the loop next runs its timers: ours (20 ms) first, then the guard's (50 ms)
      while (performance.now() < first + 60) { /* busy */ }
    })
    t.equal(await decided, 'redis', `round ${i}: the later call decided by Redis, not timed out`)
  }
  t.equal(timeouts(), 0, 'no call counted as timed out')
})

t.test('an answer that comes after its deadline is not an answer: the breaker the timeouts opened stays open', async t => {
  const client = createRedisClient({ url: redis.url })
  t.teardown(() => client.disconnect())
  await whenReady(client)
  const states: string[] = []
  let answers = 0
  let timeouts = 0
  const guard = new RedisGuard({
    store: createRedisStore({ client }),
    fallbackMaxKeys: 100,
    timeoutMs: 100,
    failureThreshold: 2,
    // no probe within the test: only an answer counted could close the breaker
    openMs: 60_000,
    maxOpenMs: 60_000,
    instances: () => 1,
    telemetry: { ...NOOP_TELEMETRY, redisCall: (_s, ok, kind) => { if (ok) answers++; else if (kind === 'timeout') timeouts++ } },
    onStateChange: (state) => { states.push(state) }
  })
  t.teardown(() => guard.close())
  await client.call('CLIENT', 'PAUSE', '700', 'ALL')
  const levels = await Promise.all([guard.decide([check('late-1')], LOCAL, 'l1'), guard.decide([check('late-2')], LOCAL, 'l2')])
  t.same(levels.map((g) => g.level), ['fallback', 'fallback'], 'both calls timed out to the fallback')
  t.equal(guard.breaker, 'open', 'two timeouts opened the breaker')
  // the same connection answers in order: once this PING is answered, both late answers were read,
  // and their promise chains have run by the next check phase
  await client.ping()
  await new Promise((resolve) => setImmediate(resolve))
  t.equal(timeouts, 2)
  t.equal(answers, 0, 'the late answers were not counted as answers')
  t.equal(guard.breaker, 'open', 'and did not close the breaker')
  t.same(states, ['open'])
})
