// identity.failureLimit compiles into a plan of its own (src/limit/plan.ts compileFailurePlan).
// The config check (test/config-checks.test.ts) refuses a bad one first; the compiler refuses it
// too, so a caller that builds the options itself gets an error at compile time, located by
// src/runtime.ts at identity.failureLimit, rather than a store that refuses every failed credential.
import t from 'tap'
import { compileFailurePlan, type LimitPlanOptions, type LimitRule } from '../src/limit/plan.js'

const RULE: LimitRule = Object.freeze({ algorithm: 'gcra', limit: 10, windowMs: 60_000, burst: 10, maxDelayMs: 0, cost: 1, shadow: false, status: 429, onError: 'local' })

const options = (failureLimit: LimitRule | null): LimitPlanOptions => Object.freeze({
  keyPrefix: 'gw',
  leaseOnError: 'local',
  leaseTtlMs: 10_000,
  quotaTimezone: null,
  global: null,
  ip: null,
  user: null,
  concurrency: { ip: null, user: null },
  plans: new Map(),
  failureLimit
})

t.test('a failure budget the store could not decide is refused when compiled', async t => {
  t.throws(() => compileFailurePlan(options({ ...RULE, windowMs: 0 })), { name: 'RangeError', message: 'windowMs must be an integer >= 1' })
  t.throws(() => compileFailurePlan(options({ ...RULE, algorithm: 'sliding-window-log', limit: 20_000, burst: 20_000 })), {
    message: 'sliding-window-log stores one entry per admitted unit: limit must be <= 10000 (use sliding-window for larger limits)'
  })
  t.throws(() => compileFailurePlan(options({ ...RULE, cost: 11 })), { message: 'cost 11 must be an integer from 1 to the capacity 10' })
  t.throws(() => compileFailurePlan(options({ ...RULE, shadow: true })), {
    message: 'a failure budget cannot be in shadow mode: it is what stops a client guessing credentials, so it is always enforced'
  })
})

t.test('a valid failure budget compiles to one enforced limit; no identity, no plan', async t => {
  const plan = compileFailurePlan(options({ ...RULE, cost: 10 }))
  t.equal(plan.enforced.length, 1)
  t.match(plan.enforced[0], { name: 'identity.failures', cost: 10, shadow: false, policy: '"identity.failures";q=10;w=60' })
  t.equal(compileFailurePlan(options(null)).all.length, 0)
})
