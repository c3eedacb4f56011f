// The limit stores of a compiled build and the limit scenarios the store benches drive
// (bench/limit.js for CPU time and decisions/s, bench/instructions.js for Redis instructions).
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

/**
 * @typedef {import('../src/limit/types.js').LimitSpec} LimitSpec
 * @typedef {import('../src/limit/types.js').LimitCheck} LimitCheck
 * @typedef {import('../src/limit/types.js').LimitStore} LimitStore
 */

/** @param {string} dist  a compiled dist/ directory */
export async function loadStores (dist) {
  const files = ['limit/memory-store.js', 'limit/redis-store.js', 'limit/plan.js', 'config/units.js']
  const missing = files.filter((f) => !existsSync(join(dist, f)))
  if (missing.length) return { missing }
  /** @param {string} f */
  const load = (f) => import(pathToFileURL(join(dist, f)).href)
  const [memory, redis, plan, units] = await Promise.all(files.map(load))
  return {
    missing,
    /** @type {(opts: { maxKeys: number }) => LimitStore} */
    createMemoryStore: memory.createMemoryStore,
    /** @type {(opts: { client: import('ioredis').Redis, maxBatch?: number }) => LimitStore} */
    createRedisStore: redis.createRedisStore,
    /**
     * A limit as gateway.yaml writes it, with the defaults src/config/defaults.ts applies
     * (burst = limit, no delay), compiled by the gateway's own plan compiler.
     * @type {(scope: string, dimension: string, limit: { algorithm: string, limit: number, window: string, burst?: number }) => LimitSpec}
     */
    compileLimitSpec: (scope, dimension, l) => plan.compileLimitSpec(scope, dimension,
      { algorithm: l.algorithm, limit: l.limit, windowMs: units.parseDuration(l.window), burst: l.burst ?? l.limit, maxDelayMs: 0 })
  }
}

/**
 * @typedef {object} Scenario
 * @property {string} name
 * @property {Array<{ dimension: string, spec: LimitSpec, perClient: boolean }>} limits
 */

/**
 * One scenario per algorithm (one check per decision, keyed per client), and the four shared
 * dimensions of the full-load bench's contender (e) together (four checks in one decision).
 * Limits are far above what one process can send, so every decision admits and records.
 * @param {NonNullable<Awaited<ReturnType<typeof loadStores>>['compileLimitSpec']>} compileLimitSpec
 * @returns {Scenario[]}
 */
export function scenarios (compileLimitSpec) {
  // The stores refuse gcra above one request per µs and logs above 10,000 entries (the log: 10,000 per
  // 100 ms, 100k decisions/s per client key, never reached from one process).
  const high = { limit: 1_000_000, window: '1s' }
  /** @type {Array<[string, Record<string, unknown>]>} */
  const algorithms = [
    ['gcra', { algorithm: 'gcra', ...high, burst: 1_000_000 }],
    ['token-bucket', { algorithm: 'token-bucket', ...high, burst: 1_000_000 }],
    ['leaky-bucket', { algorithm: 'leaky-bucket', ...high, burst: 1_000_000 }],
    ['sliding-window-log', { algorithm: 'sliding-window-log', limit: 10_000, window: '100ms' }],
    ['sliding-window', { algorithm: 'sliding-window', ...high }],
    ['fixed-window', { algorithm: 'fixed-window', ...high }]
  ]
  return [
    ...algorithms.map(([name, limit]) => ({ name, limits: [{ dimension: 'user', spec: compileLimitSpec('bench', 'user', limit), perClient: true }] })),
    {
      name: 'four dimensions (e)',
      limits: [
        { dimension: 'global', spec: compileLimitSpec('gw', 'global', { algorithm: 'gcra', limit: 1_000_000, window: '1s', burst: 1_000_000 }), perClient: false },
        { dimension: 'api', spec: compileLimitSpec('api', 'api', { algorithm: 'fixed-window', limit: 10_000_000, window: '1s' }), perClient: false },
        { dimension: 'ip', spec: compileLimitSpec('gw', 'ip', { algorithm: 'sliding-window-log', limit: 10_000, window: '100ms' }), perClient: true },
        { dimension: 'user', spec: compileLimitSpec('gw', 'user', { algorithm: 'token-bucket', limit: 100_000_000, window: '1m', burst: 1_000_000 }), perClient: true }
      ]
    }
  ]
}

/**
 * The checks of one decision for client `i`, built once per client so the loop only looks them up.
 * @param {Scenario} s
 * @param {string} prefix
 * @param {number} clients  distinct clients the decisions are spread over (keys per limit)
 */
export function checksByClient (s, prefix, clients) {
  return Array.from({ length: clients }, (_, i) => Object.freeze(s.limits.map((l) => Object.freeze({
    key: `${prefix}:${l.spec.id}:${l.perClient ? `c${i}` : '_'}`,
    spec: l.spec,
    cost: 1
  }))))
}

