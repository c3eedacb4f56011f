// Regression: the in-process store decided calendar quotas on its monotonic clock (the wall time
// at process start, then performance.now()), and the deny cache held a quota's refusal on that
// clock too. After an NTP step or a host suspend (CLOCK_MONOTONIC does not count the time
// suspended) the date moved on and the client was still refused, for a period that had ended.
// The wall clock steps as in test/limit-memory-store.test.ts: Date.now() moves, performance.now()
// does not.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'

const HOUR_MS = 3_600_000

t.test('an in-process hourly quota starts over when the wall clock steps past the hour, while a rate limit does not refill', async t => {
  const realNow = Date.now
  // the gateway's wall clock sits at hh:30:00, far from either end of its hour
  let shift = (Math.floor(realNow() / HOUR_MS) + 1) * HOUR_MS - HOUR_MS / 2 - realNow()
  Date.now = () => realNow() + shift
  t.teardown(() => { Date.now = realNow })

  const up = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
identity: { header: x-user }
plans:
  p:
    limits:
      user: { algorithm: token-bucket, limit: 3, window: 1h }
      quota: { limit: 2, period: hour }
defaultPlan: p
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: api, pathPrefix: /, upstream: backend }
`)
  const call = async (): Promise<Awaited<ReturnType<typeof send>>> => await send(`${gw.url}/x`, { headers: { 'x-user': 'alice' } })
  const quotaView = async (): Promise<Record<string, unknown>> => {
    const r = await send(`${gw.adminUrl}/consumers/alice`)
    return (r.json as { quota: Record<string, unknown> }).quota
  }

  const first = await call()
  t.equal(first.status, 200)
  t.match(first.headers.ratelimit, /^"p:quota";r=1;t=(1799|1800)$/, 'the quota is the tightest limit, its hour ends in 30 minutes')
  t.equal((await call()).status, 200)
  const refused = await call()
  t.equal(refused.status, 429, 'the third request of the hour is over the quota')
  t.equal(refused.json?.limit, 'p:quota')
  t.match(refused.headers['retry-after'], /^(1799|1800)$/, 'Retry-After runs to the end of the hour')

  // NTP steps the clock (or the host wakes up) an hour later: the date is in the next hour
  shift += HOUR_MS
  const nextHour = await call()
  t.equal(nextHour.status, 200, 'admitted: the quota of the next hour is whole again')
  t.equal(nextHour.headers['retry-after'], undefined)
  // the rate limit (3 per hour on the monotonic clock) took its third unit: it is the tightest now,
  // with the quota's new hour beside it
  t.match(nextHour.headers.ratelimit, /^"p:user";r=0;t=\d+, "p:quota";r=1;t=(1799|1800)$/, 'RateLimit shows the new hour\'s quota, one of two used')

  const rateLimited = await call()
  t.equal(rateLimited.status, 429, 'the rate limit did not refill: a wall-clock step gives no tokens')
  t.equal(rateLimited.json?.limit, 'p:user')
  const quota = await quotaView()
  t.equal(quota.used, 1, 'the request the rate limit refused took nothing from the quota (all-or-nothing)')
  t.equal(quota.resetsAt, new Date((Math.floor(Date.now() / HOUR_MS) + 1) * HOUR_MS).toISOString(), 'the admin API names the end of the new hour')
  t.equal(up.requests, 3, 'the upstream saw the three admitted requests')
})
