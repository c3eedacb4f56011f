// Issue 13 moved the request path's metrics from prom-client's Counter/Histogram children into
// plain cells that prom-client only reads on a scrape. /metrics must not change: the fixtures
// under test/fixtures/metrics/ are what the prom-client-only implementation (commit 72c58d8)
// printed for the same calls, in one process and summed by AggregatorRegistry over two workers
// (with the counters added since, each in its place).
import t from 'tap'
import { readFileSync } from 'node:fs'
import { AggregatorRegistry } from 'prom-client'
import { GatewayMetrics } from '../src/admin/metrics.js'

const fixture = (name: string): string => readFileSync(new URL(`fixtures/metrics/${name}`, import.meta.url), 'utf8')

function drive (m: GatewayMetrics): void {
  m.inflight('api', 1); m.inflight('api', -1); m.inflight('ws', 1)
  m.websocketsOpen('ws', 1)
  for (const s of [0.0005, 0.001, 0.003, 0.2, 11, 0.0025]) m.request('api', 'GET', 200, s)
  m.request('api', 'POST', 429, 0.0001); m.request('-', '-', 404, 0)
  m.upstreamResponse('backend', 0.004); m.upstreamResponse('backend', 0.001)
  m.upstreamError('backend', 'refused'); m.upstreamError('backend', 'refused'); m.upstreamError('b2', 'timeout')
  // the limiter's way (a counter resolved once) and the by-name way count into the same series
  const ip = m.decisionCounter('api', 'ip', 'ip')
  ip.count('redis', 'allowed'); m.limitDecision('api', 'ip', 'ip', 'redis', 'allowed')
  m.decisionCounter('api', 'ip', 'api.ip').count('fallback', 'rejected'); m.limitDecision('api', 'local', 'local', 'local', 'rejected')
  m.limitDecision('api', 'user', 'user', 'memory', 'shadow')
  m.redisCall(0.0003, true, null); m.redisCall(0.2, false, 'timeout'); m.redisCall(0.00001, false, null)
  m.concurrencyRejected('api', 'ip', 'redis'); m.concurrencyRejected('api', 'route', 'local')
  m.healthCheck('backend', 'http://x', 'pass'); m.healthCheck('backend', 'http://x', 'fail'); m.healthCheck('backend', 'http://x', 'fail')
  m.proxyProtocolRefused('missing'); m.proxyProtocolRefused('timeout'); m.proxyProtocolRefused('missing')
  m.connectionDropped(); m.connectionDropped()
  m.tlsHandshakeTimedOut(); m.tlsHandshakeTimedOut()
  m.clientConnectionDropped()
  m.httpsRedirected(); m.httpsRedirected(); m.httpsRedirected()
  m.upstreamRetry('backend', 'reset'); m.upstreamRetry('backend', 'status_503'); m.upstreamRetry('backend', 'reset'); m.upstreamRetryOverBudget('backend')
  m.upstreamEjection('backend', 'http://x', 'refused'); m.breakerState(1); m.reload('success'); m.generation.set(3)
}

// the process_* and nodejs_* series of collectDefaultMetrics differ from run to run
const gatewayLines = (text: string): string => text.split('\n').filter(l => l.includes('gateway_')).join('\n') + '\n'

t.test('/metrics of one process is what prom-client alone printed', async t => {
  const m = new GatewayMetrics({ localKeys: () => 7, inflight: () => 2, targets: () => [{ upstream: 'backend', target: 'http://x', healthy: false }], pending: () => [{ upstream: 'backend', pending: 3 }], logDropped: () => 0, connections: () => 5, encoders: () => 4 })
  drive(m)
  t.equal(gatewayLines(await m.registry.metrics()), fixture('one-process.txt'))
  t.equal(gatewayLines(await m.registry.metrics()), fixture('one-process.txt'), 'a second scrape prints the same')
})

t.test('two workers summed by the primary (AggregatorRegistry) are what prom-client alone gave', async t => {
  const a = new GatewayMetrics({ localKeys: () => 7, inflight: () => 2, targets: () => [{ upstream: 'backend', target: 'http://x', healthy: false }], pending: () => [{ upstream: 'backend', pending: 3 }], logDropped: () => 0, connections: () => 5, encoders: () => 4 })
  const b = new GatewayMetrics({ localKeys: () => 1 })
  drive(a)
  drive(b)
  const summed = AggregatorRegistry.aggregate([await a.registry.getMetricsAsJSON(), await b.registry.getMetricsAsJSON()])
  t.equal(gatewayLines(await summed.metrics()), fixture('aggregated-two-workers.txt'))
})
