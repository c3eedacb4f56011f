// Issue 13: the limiter resolves a decision counter once and keeps it across the admin page's
// seconds. A counter resolved before a frame is taken must count into the next frames too, and a
// frame lists only the dimensions decided in its own second (a route removed by a reload leaves
// the page), while the Prometheus series keep accumulating.
import t from 'tap'
import { GatewayMetrics } from '../src/admin/metrics.js'
import { LiveTelemetry } from '../src/admin/live-stats.js'

t.test('a resolved counter counts into every later frame; a frame lists only what was decided in its second', async t => {
  const metrics = new GatewayMetrics({ localKeys: () => 0 })
  const live = new LiveTelemetry(metrics)
  const ip = live.decisionCounter('api', 'ip', 'api.ip')
  const user = live.decisionCounter('api', 'user', 'user')

  ip.count('redis', 'allowed')
  ip.count('fallback', 'rejected')
  user.count('redis', 'shadow')
  t.same(live.takeFrame().decisions, { api: { ip: [1, 1, 0, 1], user: [0, 0, 1, 0] } })

  ip.count('redis', 'allowed')
  // the string path counts into the same cells as the resolved counter
  live.limitDecision('api', 'ip', 'api.ip', 'redis', 'allowed')
  t.same(live.takeFrame().decisions, { api: { ip: [2, 0, 0, 0] } }, 'user decided nothing this second: not listed')
  t.same(live.takeFrame().decisions, {}, 'a quiet second lists no route')

  const text = await metrics.registry.metrics()
  t.match(text, /gateway_ratelimit_decisions_total\{route="api",dimension="ip",limit="api.ip",level="redis",result="allowed"\} 3\n/, 'the metric kept counting across frames')
  t.match(text, /gateway_ratelimit_decisions_total\{route="api",dimension="ip",limit="api.ip",level="fallback",result="rejected"\} 1\n/)
  t.match(text, /gateway_ratelimit_decisions_total\{route="api",dimension="user",limit="user",level="redis",result="shadow"\} 1\n/)
  t.notMatch(text, /result="allowed"\} 0\n/, 'a (level, result) never counted has no series')
})
