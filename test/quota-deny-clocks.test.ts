// Regression: the deny cache held a calendar quota's refusal on Date.now() alone (so that a host
// suspend, which CLOCK_MONOTONIC does not count, could not stretch it: test/quota-wall-clock.test.ts).
// But in front of Redis the refusal's length comes from Redis TIME, not from this host's clock:
// when this host's wall clock stepped back by D after the refusal, the client stayed refused from
// the cache D longer than Redis refused it, past the Retry-After the store had given. A quota's
// entry is now held on both clocks and ends at the earlier deadline.
//
// Both clocks of the gateway's process are stubbed: Date.now() as in test/quota-wall-clock.test.ts,
// performance.now() the same way. Redis runs on the real clock.
import t, { type Test } from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { startRedis } from './helpers/redis.js'
import { send } from './helpers/ratelimit.js'

const HOUR_MS = 3_600_000

interface Clocks {
  /** ms added to the real Date.now() */
  wall: number
  /** ms added to the real performance.now() */
  mono: number
}

function stubClocks (t: Test): Clocks {
  const clocks: Clocks = { wall: 0, mono: 0 }
  const realDateNow = Date.now
  const realPerfNow = performance.now
  Date.now = () => realDateNow() + clocks.wall
  performance.now = () => realPerfNow.call(performance) + clocks.mono
  t.teardown(() => {
    Date.now = realDateNow
    performance.now = realPerfNow
  })
  return clocks
}

/** gateway_ratelimit_decisions_total of the quota at `level` with `result`, 0 when not listed. */
async function quotaDecisions (adminUrl: string, level: string, result: string): Promise<number> {
  const text = await (await fetch(`${adminUrl}/metrics`)).text()
  const re = new RegExp(`^gateway_ratelimit_decisions_total\\{route="api",dimension="quota",limit="p:quota",level="${level}",result="${result}"\\} (\\d+)$`, 'm')
  const m = re.exec(text)
  return m === null ? 0 : Number(m[1])
}

function config (upUrl: string, period: string, redisUrl?: string): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
${redisUrl !== undefined ? `redis: { url: ${redisUrl} }\n` : ''}identity: { header: x-user }
plans:
  p:
    limits:
      quota: { limit: 2, period: ${period} }
defaultPlan: p
upstreams:
  backend: { targets: [${upUrl}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`
}

t.test('in front of Redis, a step back of the gateway\'s wall clock does not hold a quota refusal past the Retry-After Redis gave', async t => {
  const redis = await startRedis(t)
  const up = await startUpstream(t)
  // a day: Redis's period ends at the next UTC midnight of the real clock, which cannot be
  // stubbed; a run that starts less than a minute before it waits until it has passed, so the
  // quota's refusals all fall in one day
  const toMidnightMs = 86_400_000 - Date.now() % 86_400_000
  if (toMidnightMs < 60_000) await new Promise(resolve => setTimeout(resolve, toMidnightMs + 1000))
  const gw = await startGateway(t, config(up.url, 'day', redis.url))
  const clocks = stubClocks(t)
  const call = async (): Promise<Awaited<ReturnType<typeof send>>> => await send(`${gw.url}/x`, { headers: { 'x-user': 'alice' } })

  t.equal((await call()).status, 200)
  t.equal((await call()).status, 200)
  const refused = await call()
  t.equal(refused.status, 429, 'the third request of the day is over the quota')
  t.equal(refused.json?.limit, 'p:quota')
  const retryS = Number(refused.headers['retry-after'])
  t.ok(retryS > 0 && retryS <= 86_400, `Redis refuses until its midnight (Retry-After ${retryS})`)
  t.equal(await quotaDecisions(gw.adminUrl, 'redis', 'rejected'), 1, 'decided by Redis')

  const cached = await call()
  t.equal(cached.status, 429)
  t.equal(await quotaDecisions(gw.adminUrl, 'local', 'rejected'), 1, 'the next refusal comes from the deny cache, without a Redis call')

  // NTP steps this host's clock back two hours; by the monotonic clock the refusal's Retry-After
  // has passed. Redis's clock did not step.
  clocks.wall -= 2 * HOUR_MS
  clocks.mono += retryS * 1000 + 1000
  const after = await call()
  t.equal(after.status, 429, 'Redis still refuses: its day has not ended')
  t.equal(await quotaDecisions(gw.adminUrl, 'redis', 'rejected'), 2, 'the request reached Redis: the deny entry ended with its Retry-After')
  t.equal(await quotaDecisions(gw.adminUrl, 'local', 'rejected'), 1, 'and was not answered from the deny cache')
  const afterS = Number(after.headers['retry-after'])
  t.ok(afterS <= retryS && afterS >= retryS - 5, `Retry-After ${afterS} s: Redis's wait (${retryS} s at the refusal), not two hours more`)
  t.equal(up.requests, 2)
})

t.test('in process, a quota refusal held in the deny cache ends with its Retry-After on the monotonic clock when the wall clock steps back', async t => {
  const clocks = stubClocks(t)
  // the gateway's wall clock sits at hh:30:00, far from either end of its hour
  clocks.wall = (Math.floor(Date.now() / HOUR_MS) + 1) * HOUR_MS - HOUR_MS / 2 - Date.now()
  const up = await startUpstream(t)
  const gw = await startGateway(t, config(up.url, 'hour'))
  const call = async (): Promise<Awaited<ReturnType<typeof send>>> => await send(`${gw.url}/x`, { headers: { 'x-user': 'alice' } })

  t.equal((await call()).status, 200)
  t.equal((await call()).status, 200)
  const refused = await call()
  t.equal(refused.status, 429)
  t.match(refused.headers['retry-after'], /^(1799|1800)$/, 'Retry-After runs to the end of the hour')
  t.equal(await quotaDecisions(gw.adminUrl, 'memory', 'rejected'), 1, 'decided by the store')
  t.equal((await call()).status, 429)
  t.equal(await quotaDecisions(gw.adminUrl, 'local', 'rejected'), 1, 'then by the deny cache')

  clocks.wall -= 2 * HOUR_MS
  clocks.mono += 1_801_000
  const after = await call()
  // the in-process store keeps counting in the later period it holds (calendar-quota.ts): it
  // refuses until that period's end on the stepped-back clock, 2 h 30 min away
  t.equal(after.status, 429)
  t.equal(await quotaDecisions(gw.adminUrl, 'memory', 'rejected'), 2, 'the store decided again: the deny entry ended with its Retry-After')
  t.equal(await quotaDecisions(gw.adminUrl, 'local', 'rejected'), 1, 'not the deny cache')
  t.match(after.headers['retry-after'], /^(8999|9000)$/, 'the store\'s wait to the end of the period it counts in')
  t.equal(up.requests, 2)
})
