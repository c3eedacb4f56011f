// The admin page's live data: frames from one or more processes (src/admin/live-stats.ts) are
// summed into one summary per second, kept for 5 minutes, and pushed to the page's subscribers
// as Server-Sent Events. Everything is bounded: 300 summaries, 60 seconds of rejected-client
// sketches, at most `maxSubscribers` open streams, and a subscriber that stops reading is dropped
// rather than buffered for.
import type { ServerResponse } from 'node:http'
import {
  LATENCY_BUCKETS, SKETCH_SIZE, SpaceSaving, bucketUpperMs,
  type DecisionCounts, type LiveFrame
} from './live-stats.js'

export const HISTORY_SECONDS = 300
/** The head of every event stream, and of a HEAD request's answer for one. */
export const EVENT_STREAM_HEAD: Readonly<Record<string, string>> = Object.freeze({
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-store',
  'x-accel-buffering': 'no'
})
const TOP_WINDOW_SECONDS = 60
const TOP_SHOWN = 10
// A stream whose socket holds more than this unsent is a reader that stopped: drop it.
const MAX_UNSENT_BYTES = 256 * 1024

export interface RouteSummary {
  /** Requests answered in that second. */
  rps: number
  /** Latency percentiles in ms (upper edge of the histogram bucket; null without requests). */
  p50: number | null
  p99: number | null
  s4: number
  s5: number
}

export interface SecondSummary {
  /** Unix time in ms at the end of the second. */
  t: number
  routes: Record<string, RouteSummary>
  decisions: Record<string, Record<string, DecisionCounts>>
}

export interface LiveUpdate extends SecondSummary {
  /** The clients rejected most in the last minute, most first. */
  top: Array<[string, number]>
  /** The gateway's health as /readyz and the reload history tell it. */
  health: unknown
}

class Pending {
  routes = new Map<string, { n: number, s4: number, s5: number, lat: Float64Array }>()
  decisions = new Map<string, Map<string, DecisionCounts>>()
  readonly rejected = new SpaceSaving(SKETCH_SIZE)
}

function percentile (lat: Float64Array, n: number, q: number): number | null {
  if (n === 0) return null
  const rank = Math.max(1, Math.ceil(q * n))
  let seen = 0
  for (let i = 0; i < LATENCY_BUCKETS; i++) {
    seen += lat[i] as number
    if (seen >= rank) return Math.round(bucketUpperMs(i) * 1000) / 1000
  }
  return Math.round(bucketUpperMs(LATENCY_BUCKETS - 1) * 1000) / 1000
}

export class LiveFeed {
  private pending = new Pending()
  private readonly history: SecondSummary[] = []
  private readonly minute: Array<Array<[string, number]>> = []
  /** Each stream with the size of the history written to it at subscribe (see broadcast). */
  private readonly subscribers = new Map<ServerResponse, number>()
  private timer: NodeJS.Timeout | null = null

  /**
   * @param collect called at each tick before publishing: takes this process's frame (single
   *   process) or nothing (the workers primary, whose frames arrive by IPC).
   * @param health what the page shows as health, read once per second.
   */
  constructor (
    private readonly collect: () => LiveFrame | null,
    private readonly health: () => unknown,
    readonly maxSubscribers = 16
  ) {}

  start (): void {
    if (this.timer !== null) return
    this.timer = setInterval(() => this.tick(), 1000)
    this.timer.unref()
  }

  stop (): void {
    if (this.timer !== null) clearInterval(this.timer)
    this.timer = null
    this.endStreams()
  }

  /**
   * Ends every open stream, the feed going on. A reload that changes who may read (`admin.reads`,
   * the token) calls it: a stream is authorized once, when it opens, and one opened before kept
   * getting every update (the limited users with them) after its reader lost the right. The page
   * opens its stream again, and is asked for the token then.
   */
  endStreams (): void {
    for (const res of this.subscribers.keys()) res.end()
    this.subscribers.clear()
  }

  /** Adds a frame (this process's or a worker's) to the second being summed. */
  ingest (frame: LiveFrame): void {
    const p = this.pending
    for (const [name, r] of Object.entries(frame.routes)) {
      let acc = p.routes.get(name)
      if (acc === undefined) p.routes.set(name, acc = { n: 0, s4: 0, s5: 0, lat: new Float64Array(LATENCY_BUCKETS) })
      acc.n += r.n
      acc.s4 += r.s4
      acc.s5 += r.s5
      for (const [i, c] of r.lat) if (i >= 0 && i < LATENCY_BUCKETS) acc.lat[i] = (acc.lat[i] as number) + c
    }
    for (const [route, byDimension] of Object.entries(frame.decisions)) {
      let mine = p.decisions.get(route)
      if (mine === undefined) p.decisions.set(route, mine = new Map())
      for (const [dimension, c] of Object.entries(byDimension)) {
        const d = mine.get(dimension)
        if (d === undefined) mine.set(dimension, [c[0], c[1], c[2], c[3]])
        else for (let i = 0; i < 4; i++) d[i] = (d[i] as number) + (c[i] as number)
      }
    }
    for (const [key, count] of frame.rejected) p.rejected.add(key, count)
  }

  /** Closes the current second: one summary into the history, one event to every subscriber. */
  tick (now = Date.now()): LiveUpdate {
    const own = this.collect()
    if (own !== null) this.ingest(own)
    const p = this.pending
    this.pending = new Pending()
    const routes: Record<string, RouteSummary> = {}
    for (const [name, r] of p.routes) {
      routes[name] = { rps: r.n, p50: percentile(r.lat, r.n, 0.5), p99: percentile(r.lat, r.n, 0.99), s4: r.s4, s5: r.s5 }
    }
    const decisions: Record<string, Record<string, DecisionCounts>> = {}
    for (const [route, byDimension] of p.decisions) decisions[route] = Object.fromEntries(byDimension)
    const summary: SecondSummary = { t: now, routes, decisions }
    this.history.push(summary)
    if (this.history.length > HISTORY_SECONDS) this.history.shift()
    this.minute.push(p.rejected.top())
    if (this.minute.length > TOP_WINDOW_SECONDS) this.minute.shift()
    const update: LiveUpdate = { ...summary, top: this.topRejected(), health: this.health() }
    if (this.subscribers.size > 0) this.broadcast('update', update)
    return update
  }

  /** The clients rejected most over the last minute (sums of the per-second sketches). */
  topRejected (): Array<[string, number]> {
    const sums = new Map<string, number>()
    for (const second of this.minute) for (const [key, count] of second) sums.set(key, (sums.get(key) ?? 0) + count)
    return [...sums].sort((a, b) => b[1] - a[1]).slice(0, TOP_SHOWN)
  }

  get subscriberCount (): number { return this.subscribers.size }

  /**
   * Starts an event stream on `res`: the 5-minute history at once, then one `update` per second.
   * Nothing is written when it is refused: 'full' (the subscriber limit), or 'pipelined' (behind
   * another request on its connection, an earlier stream: forever. Such a response is never
   * written to its socket and never closes: subscribed, it would buffer every update for good).
   */
  subscribe (res: ServerResponse): 'subscribed' | 'full' | 'pipelined' {
    if (res.socket === null) return 'pipelined'
    if (this.subscribers.size >= this.maxSubscribers) return 'full'
    res.writeHead(200, EVENT_STREAM_HEAD)
    res.socket?.setNoDelay(true)
    res.on('close', () => this.subscribers.delete(res))
    const history = `event: history\ndata: ${JSON.stringify({ history: this.history, top: this.topRejected(), health: this.health() })}\n\n`
    this.subscribers.set(res, Buffer.byteLength(history))
    res.write(history)
    return 'subscribed'
  }

  private broadcast (event: string, data: unknown): void {
    const text = `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`
    for (const [res, historyBytes] of this.subscribers) {
      // the response's own queue too (outputData), not only the socket's. The history is 5
      // minutes of every route with traffic (a megabyte with a few dozen routes): a reader that
      // has not taken it all by the first update is slow, not gone, and was cut at each update
      // (then reconnected and cut again, the page never updating over a slow link)
      if (res.writableLength > MAX_UNSENT_BYTES + historyBytes) {
        this.subscribers.delete(res)
        res.destroy()
        continue
      }
      res.write(text)
    }
  }
}
