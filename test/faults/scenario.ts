// The fault scenario of issue 8, scaled to run in seconds: two gateway instances, `users` users
// each sending `rps` requests a second (alternating between the instances) against a `user`
// sliding-window-log of `limit` per `windowMs`, `onError: local`, everything on loopback. The
// whole run fits in one window, so "admitted per user" is what the limit bounds. A fault runs
// alongside; it reports when Redis was reachable again so recovery can be timed from /readyz.
import { startGateway } from '../helpers/gateway.js'
import { startUpstream } from '../helpers/upstream.js'
import { awayFromWindowEdge } from '../helpers/window-edge.js'

type Teardown = Parameters<typeof startGateway>[0]

export interface Scenario {
  /** The `redis:` mapping of gateway.yaml (without timeout/onError). */
  readonly redis: string
  /** The `user` limit's algorithm (default sliding-window-log). */
  readonly algorithm?: 'sliding-window-log' | 'fixed-window'
  readonly users?: number
  readonly rps?: number
  readonly limit?: number
  readonly windowMs?: number
  /** How long requests are sent (within one window). */
  readonly durationMs?: number
  /**
   * Runs alongside the traffic; resolves to the ms (Date.now) Redis was reachable again, or null.
   * `sent()` is how many requests each user has sent so far.
   */
  readonly fault: (at: (ms: number) => Promise<void>, sent: () => number[]) => Promise<number | null>
}

export interface Outcome {
  readonly limit: number
  readonly admittedPerUser: number[]
  readonly maxRatio: number
  readonly fiveHundreds: number
  readonly requests: number
  /** ms from Redis reachable to both instances' breakers closed again (null if not measured). */
  readonly recoveryMs: number | null
  /** Times a breaker opened again after that recovery (a later, separate timeout). */
  readonly reopenedAfter: number
  /** Breaker transitions seen by polling /readyz (both instances). */
  readonly fallbackPolls: number
  /** Each instance's breaker warnings, ms relative to Redis reachable again: why a recovery was slow. */
  readonly breakerLog: string[]
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

export async function runScenario (t: Teardown, s: Scenario): Promise<Outcome> {
  const users = s.users ?? 6
  const rps = s.rps ?? 20
  const limit = s.limit ?? 60
  const windowMs = s.windowMs ?? 30_000
  const durationMs = s.durationMs ?? 12_000
  const up = await startUpstream(t)
  const yaml = `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
redis: { ${s.redis}, timeout: 50ms, onError: local }
identity: { header: x-user-id }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - name: r
    pathPrefix: /
    upstream: backend
    limits:
      user: { algorithm: ${s.algorithm ?? 'sliding-window-log'}, limit: ${limit}, window: ${windowMs}ms }
`
  const gateways = [await startGateway(t, yaml), await startGateway(t, yaml)]
  // Both instances announce themselves before the traffic starts.
  await sleep(2500)
  // A fixed window is aligned on the epoch: the whole run inside one, or the budget starts afresh.
  if (s.algorithm === 'fixed-window') await awayFromWindowEdge(windowMs, durationMs + 3000)
  const run = Math.random().toString(36).slice(2, 8)
  const admitted = new Array<number>(users).fill(0)
  const sent = new Array<number>(users).fill(0)
  let fiveHundreds = 0
  let requests = 0
  const start = Date.now()
  const at = async (ms: number): Promise<void> => { await sleep(Math.max(0, start + ms - Date.now())) }

  let stop = false
  // what each instance's /readyz said, in order: when it was on Redis (closed) and when not
  const polls: Array<Array<{ at: number, closed: boolean }>> = [[], []]
  let fallbackPolls = 0
  const poller = (async () => {
    while (!stop) {
      await Promise.all(gateways.map(async (g, i) => {
        try {
          const body = await (await fetch(`${g.adminUrl}/readyz`)).json() as { redis: { breaker: string } }
          const closed = body.redis.breaker === 'closed'
          if (!closed) fallbackPolls++
          polls[i]?.push({ at: Date.now(), closed })
        } catch { /* admin busy: next poll */ }
      }))
      await sleep(50)
    }
  })()

  const faultDone = s.fault(at, () => [...sent])
  const senders = Array.from({ length: users }, async (_, u) => {
    const interval = 1000 / rps
    for (let i = 0; ; i++) {
      const due = start + u * (interval / users) + i * interval
      if (due - start >= durationMs) break
      await sleep(Math.max(0, due - Date.now()))
      const gw = gateways[i % 2] as { url: string }
      requests++
      sent[u] = (sent[u] ?? 0) + 1
      // Not awaited in order: a request held up by a slow Redis must not delay the next one.
      void fetch(`${gw.url}/x`, { headers: { 'x-user-id': `u${u}-${run}` } }).then(async (r) => {
        await r.arrayBuffer()
        if (r.status === 200) admitted[u] = (admitted[u] ?? 0) + 1
        else if (r.status >= 500) fiveHundreds++
      }, () => { fiveHundreds++ })
    }
  })
  let reachableAt: number | null
  try {
    await Promise.all(senders)
    reachableAt = await faultDone
    await sleep(1500)
  } finally {
    stop = true
    await poller
  }
  // Recovery: from Redis reachable to the first poll at which both instances are back on Redis.
  // A breaker that opens again later met a new fault (a call past the 50 ms timeout on this
  // loaded machine): counted apart, as reopenedAfter.
  let recoveryMs: number | null = null
  let reopenedAfter = 0
  if (reachableAt !== null) {
    const back = polls.map((p) => p.find((x) => x.at >= reachableAt && x.closed)?.at)
    if (back.every((b) => b !== undefined)) {
      const at = Math.max(...(back as number[]))
      recoveryMs = at - reachableAt
      for (const p of polls) for (let k = 1; k < p.length; k++) if ((p[k] as { at: number }).at > at && !(p[k] as { closed: boolean }).closed && (p[k - 1] as { closed: boolean }).closed) reopenedAfter++
    }
  }
  const breakerLog = gateways.flatMap((g, i) => g.lines
    .filter((l) => typeof l.breaker === 'string')
    .map((l) => `instance ${i} at ${reachableAt === null ? '?' : Date.parse(String(l.time)) - reachableAt} ms: ${String(l.breaker)} (${String(l.reason)})`))
  return { limit, admittedPerUser: admitted, maxRatio: Math.max(...admitted) / limit, fiveHundreds, requests, recoveryMs, reopenedAfter, fallbackPolls, breakerLog }
}

/** One line for the test log and the README table. */
export function report (name: string, o: Outcome): string {
  return `${name}: admitted per user ${Math.min(...o.admittedPerUser)}-${Math.max(...o.admittedPerUser)} of ${o.limit} (max ${o.maxRatio.toFixed(2)}x), ` +
    `${o.fiveHundreds} 5xx of ${o.requests}` +
    (o.recoveryMs !== null ? `, breakers closed ${o.recoveryMs} ms after Redis was reachable (opened again ${o.reopenedAfter} times later)` : '')
}
