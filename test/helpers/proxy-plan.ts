// Upstream pools and forward plans for tests that drive src/proxy directly (no config file):
// the same defaults everywhere, overridden per test.
import { UpstreamPool, type UpstreamConfig } from '../../src/proxy/upstream-pool.js'
import { createForwardPlan, type ForwardPlan, type ForwardPlanOptions } from '../../src/proxy/forward.js'
import type { Teardown } from './teardown.js'

export const TEST_UPSTREAM: Omit<UpstreamConfig, 'targets'> = Object.freeze({
  name: 'test',
  connectTimeoutMs: 2000,
  responseTimeoutMs: 5000,
  ejectMs: 10_000,
  maxConnectionsPerTarget: 16,
  keepAliveTimeoutMs: 4000
})

/** A pool over `targets` (URLs, or `{ url, weight }`), destroyed at the test's teardown. */
export function testPool (t: Teardown, targets: ReadonlyArray<string | { url: string, weight?: number }>, over: Partial<UpstreamConfig> = {}): UpstreamPool {
  const pool = new UpstreamPool({
    ...TEST_UPSTREAM,
    targets: targets.map(target => typeof target === 'string' ? { url: target, weight: 1 } : { url: target.url, weight: target.weight ?? 1 }),
    ...over
  })
  t.teardown(() => pool.destroy())
  return pool
}

/** A plan that forwards as is to `pool`: no prefix strip, no header rules, no body limit. */
export function testPlan (pool: UpstreamPool, over: Partial<ForwardPlanOptions> = {}): ForwardPlan {
  return createForwardPlan({
    pool,
    stripPrefix: null,
    responseTimeoutMs: pool.config.responseTimeoutMs,
    maxBodySize: Infinity,
    requestHeaders: { set: [], remove: [] },
    responseHeaders: { set: [], remove: [] },
    ...over
  })
}
