// `workers: N`: the primary's /metrics shows the workers' worst Redis breaker state (src/workers.ts
// worstBreaker). By prom-client's "max", one worker open (1) and another half-open (2, probing)
// read as half-open. The workers' registries as they send them over IPC (getMetricsAsJSON).
import t from 'tap'
import { AggregatorRegistry } from 'prom-client'
import { worstBreaker, type MetricsJson } from '../src/workers.js'

const worker = (state: number, requests: number): MetricsJson => [
  { name: 'gateway_redis_breaker_state', help: 'Redis circuit breaker: 0 closed, 1 open, 2 half-open', type: 'gauge', aggregator: 'max', values: [{ value: state, labels: {} }] },
  { name: 'gateway_requests_total', help: 'requests', type: 'counter', aggregator: 'sum', values: [{ value: requests, labels: { route: 'api' } }] }
]

const scraped = async (parts: MetricsJson[]): Promise<string> => await AggregatorRegistry.aggregate(worstBreaker(parts)).metrics()

t.test('the primary shows the worst breaker state of its workers: open, then half-open, then closed', async t => {
  t.match(await scraped([worker(1, 3), worker(2, 4)]), /^gateway_redis_breaker_state 1$/m, 'one open, one half-open: open (max said half-open)')
  t.match(await scraped([worker(2, 3), worker(1, 4)]), /^gateway_redis_breaker_state 1$/m, 'in either order')
  t.match(await scraped([worker(0, 3), worker(2, 4)]), /^gateway_redis_breaker_state 2$/m, 'one closed, one half-open: half-open')
  t.match(await scraped([worker(0, 3), worker(0, 4)]), /^gateway_redis_breaker_state 0$/m, 'all closed')
  const text = await scraped([worker(1, 3), worker(2, 4)])
  t.equal(text.match(/^gateway_redis_breaker_state /gm)?.length, 1, 'one series')
  t.match(text, /^gateway_requests_total\{route="api"\} 7$/m, 'the other families summed as before')
})
