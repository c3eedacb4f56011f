// Counters read from the gateway's own /metrics around each run, so a run that quietly fell back
// from Redis to the local store (redis.onError: local) shows up in the report instead of as a
// suspiciously cheap figure.
import { request } from 'undici'

/**
 * Prometheus text → { 'name{labels}': value }, for the few families the bench reads.
 * @param {string} adminUrl  e.g. http://127.0.0.1:9901
 */
export async function scrapeGatewayMetrics (adminUrl) {
  const res = await request(`${adminUrl}/metrics`, { headersTimeout: 2000, bodyTimeout: 2000 })
  const text = await res.body.text()
  /** @type {Record<string, number>} */
  const samples = {}
  for (const line of text.split('\n')) {
    if (!line.startsWith('gateway_redis_errors_total') && !line.startsWith('gateway_ratelimit_decisions_total') &&
      !line.startsWith('gateway_redis_breaker_state') && !line.startsWith('gateway_ratelimit_local_keys') &&
      !line.startsWith('nodejs_gc_duration_seconds_sum')) continue
    const i = line.lastIndexOf(' ')
    samples[line.slice(0, i)] = Number(line.slice(i + 1))
  }
  return samples
}

/**
 * What happened between two scrapes: Redis errors, GC pause seconds, decisions by level and result, breaker state.
 * @param {Record<string, number>} before
 * @param {Record<string, number>} after
 */
export function gatewayMetricsBetween (before, after) {
  let redisErrors = 0
  // the gateway's own garbage-collection pauses (prom-client's default metrics), every kind
  let gcSeconds = 0
  /** @type {Record<string, number>} */
  const decisions = {}
  for (const [key, value] of Object.entries(after)) {
    const d = value - (before[key] ?? 0)
    if (key.startsWith('gateway_redis_errors_total')) redisErrors += d
    if (key.startsWith('nodejs_gc_duration_seconds_sum')) gcSeconds += d
    if (key.startsWith('gateway_ratelimit_decisions_total') && d > 0) {
      const level = /level="([^"]*)"/.exec(key)?.[1] ?? '?'
      const result = /result="([^"]*)"/.exec(key)?.[1] ?? '?'
      decisions[`${level}:${result}`] = (decisions[`${level}:${result}`] ?? 0) + d
    }
  }
  return {
    redisErrors,
    gcSeconds,
    decisions,
    breakerState: after.gateway_redis_breaker_state ?? null,
    localKeys: after.gateway_ratelimit_local_keys ?? null
  }
}
