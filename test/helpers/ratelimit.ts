// Client-side tools for the rate-limit HTTP tests (test/ratelimit-*.test.ts): send requests and
// keep what a client observes, read Prometheus counters and Redis command statistics.
import { request, type IncomingHttpHeaders } from 'node:http'
import type { Redis } from 'ioredis'
import { commandCalls } from './redis.js'

export interface Reply {
  readonly status: number
  readonly headers: IncomingHttpHeaders
  readonly text: string
  /** The parsed JSON body, or null when the body is not JSON. */
  readonly json: Record<string, unknown> | null
}

export interface SendOptions {
  readonly method?: string
  /** An array value sends the field once per element (a repeated header). */
  readonly headers?: Record<string, string | readonly string[]>
  /** Local address to connect from (e.g. '::1' with an [::1] gateway). */
  readonly localAddress?: string
}

/**
 * One HTTP/1.1 request on a fresh connection (no agent): a burst of n requests is n concurrent
 * connections, as n clients would open, with nothing queued client-side.
 */
export function send (url: string, options: SendOptions = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request(url, {
      method: options.method ?? 'GET',
      headers: (options.headers ?? {}) as Record<string, string | string[]>,
      agent: false,
      ...(options.localAddress !== undefined ? { localAddress: options.localAddress } : {})
    }, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (c: Buffer) => chunks.push(c))
      res.on('error', reject)
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString()
        let json: Record<string, unknown> | null = null
        try {
          const parsed: unknown = JSON.parse(text)
          if (parsed !== null && typeof parsed === 'object') json = parsed as Record<string, unknown>
        } catch { /* not JSON */ }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json })
      })
    })
    req.on('error', reject)
    req.end()
  })
}

/** `n` requests at once; answers in request order. */
export function burst (n: number, url: string, options: SendOptions | ((i: number) => SendOptions) = {}): Promise<Reply[]> {
  return Promise.all(Array.from({ length: n }, (_, i) => send(url, typeof options === 'function' ? options(i) : options)))
}

/** How many replies had each status, e.g. { 200: 50, 429: 150 }. */
export function statusCounts (replies: readonly Reply[]): Record<number, number> {
  const counts: Record<number, number> = {}
  for (const r of replies) counts[r.status] = (counts[r.status] ?? 0) + 1
  return counts
}

export const count = (replies: readonly Reply[], status: number): number => replies.filter(r => r.status === status).length

export const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

/**
 * Sum of the samples of Prometheus counter/gauge `name` whose labels include `labels`
 * (0 when there is none yet).
 */
export async function metric (adminUrl: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  return metricIn(await (await fetch(`${adminUrl}/metrics`)).text(), name, labels)
}

/** The sum of the samples of `name` with `labels` in a /metrics text already fetched. */
export function metricIn (text: string, name: string, labels: Record<string, string> = {}): number {
  let sum = 0
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
    if (m === null || m[1] !== name) continue
    const have = new Map<string, string>()
    for (const pair of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) have.set(pair[1] as string, pair[2] as string)
    if (Object.entries(labels).every(([k, v]) => have.get(k) === v)) sum += Number(m[3])
  }
  return sum
}

/**
 * Limit calls Redis has executed so far (INFO commandstats): FCALL of the gateway's function
 * library, or EVALSHA of its scripts until the library is loaded or where the server refuses it
 * (src/limit/redis-functions.ts). Every limiter decision is one of them once the script is loaded
 * on the connection (the first EVALSHA there is an EVAL); the instance heartbeat uses EVAL, so it
 * does not move this count.
 */
export async function limitCalls (client: Redis): Promise<number> {
  return await commandCalls(client, 'evalsha', 'fcall')
}

/** Waits until `now % windowMs` is at `offsetMs` (windows aligned to the Unix epoch, as fixed windows are). */
export async function atWindowOffset (windowMs: number, offsetMs: number): Promise<void> {
  const now = Date.now()
  const into = now % windowMs
  await sleep(into <= offsetMs ? offsetMs - into : windowMs - into + offsetMs)
}

/** Waits until `offsetMs` into the next epoch-aligned window (never the current one). */
export async function inNextWindow (windowMs: number, offsetMs: number): Promise<void> {
  const target = (Math.floor(Date.now() / windowMs) + 1) * windowMs + offsetMs
  // timers may fire a little early: poll the last stretch
  while (Date.now() < target) await sleep(Math.max(1, target - Date.now()))
}

/** Polls `probe` until it returns true, or fails after `timeoutMs`. */
export async function eventually (what: string, probe: () => Promise<boolean>, timeoutMs = 10_000, everyMs = 50): Promise<void> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await probe()) return
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`)
    await sleep(everyMs)
  }
}

/** The shape every limited response must have; null when it does, else what is wrong. */
export function limitedShapeProblem (r: Reply, expected: { status?: number, dimension: string, limit: string }): string | null {
  if (r.status !== (expected.status ?? 429)) return `status ${r.status}`
  const body = r.json
  if (body === null) return `body is not JSON: ${r.text}`
  if (body.error !== 'rate_limited') return `error ${String(body.error)}`
  if (body.dimension !== expected.dimension) return `dimension ${String(body.dimension)}`
  if (body.limit !== expected.limit) return `limit ${String(body.limit)}`
  if (typeof body.retryAfterMs !== 'number' || body.retryAfterMs <= 0) return `retryAfterMs ${String(body.retryAfterMs)}`
  if (typeof body.requestId !== 'string' || body.requestId === '') return 'no requestId'
  const retryAfter = r.headers['retry-after']
  if (retryAfter === undefined || !/^\d+$/.test(retryAfter) || Number(retryAfter) < 1) return `Retry-After ${String(retryAfter)}`
  if (Number(retryAfter) !== Math.max(1, Math.ceil(body.retryAfterMs / 1000))) return `Retry-After ${retryAfter} for retryAfterMs ${body.retryAfterMs}`
  return null
}
