// The load generator: autocannon as a library, in this process, so its CPU is process.cpuUsage().
import autocannon from 'autocannon'

/**
 * @typedef {object} LoadOptions
 * @property {string} url
 * @property {number} connections
 * @property {number} durationS  how long it runs; with `amount`, the longest it may take
 * @property {number} [amount]  stop after this many responses instead of after `durationS`
 * @property {Array<{ method?: string, path?: string, headers?: Record<string, string> }>} requests  cycled per connection
 * @property {number} [overallRate]  requests/s over all connections; unset = as fast as answers come back
 * @property {number} [timeoutS]  seconds a response may take before autocannon counts a timeout (default 10)
 * @property {(ms: number) => void} [onResponseTime]  every response's latency, for merging runs
 */

/**
 * @typedef {object} LoadResult
 * @property {number} requests  completed responses
 * @property {number} seconds   measured duration
 * @property {number} rps
 * @property {number} p50Ms
 * @property {number} p99Ms
 * @property {number} maxMs
 * @property {number} non2xx
 * @property {number} errors
 * @property {number} timeouts
 * @property {Record<string, number>} statusCodes
 */

/**
 * Every response's time, for percentiles to the microsecond. autocannon's histogram records whole
 * milliseconds: at 50 connections a p99 of 3 ms against 7 ms was a ratio anywhere from 1.75 to 2.67.
 */
class ResponseTimes {
  constructor () {
    this.values = new Float64Array(1 << 16)
    this.n = 0
  }

  /** @param {number} ms */
  add (ms) {
    if (this.n === this.values.length) {
      const grown = new Float64Array(this.values.length * 2)
      grown.set(this.values)
      this.values = grown
    }
    this.values[this.n++] = ms
  }

  /** Nearest-rank percentiles (the smallest time at least q of the answers took no longer than); null without answers. */
  percentiles () {
    if (this.n === 0) return null
    const sorted = this.values.subarray(0, this.n).sort()
    /** @param {number} q */
    const rank = (q) => /** @type {number} */ (sorted[Math.max(0, Math.ceil(q * this.n) - 1)])
    return { p50: rank(0.5), p99: rank(0.99), max: /** @type {number} */ (sorted[this.n - 1]) }
  }
}

/**
 * Run one bounded load: autocannon stops itself after `durationS`, and a watchdog stops it
 * (and reports it) if it has not finished 15 s later, so a stuck contender cannot hang the bench.
 * @param {LoadOptions} opts
 * @returns {Promise<LoadResult>}
 */
export function runLoad (opts) {
  return new Promise((resolve, reject) => {
    let watchdogFired = false
    let settled = false
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let watchdog
    const okTimes = new ResponseTimes()
    const instance = autocannon({
      url: opts.url,
      connections: opts.connections,
      duration: opts.durationS,
      pipelining: 1,
      timeout: opts.timeoutS ?? 10,
      requests: opts.requests,
      ...(opts.amount ? { amount: opts.amount } : {}),
      // autocannon's coordinated-omission correction assumes 1/rate ms between requests where the
      // rate is per second, which back-fills samples wildly; paced loads report what was measured.
      ...(opts.overallRate ? { overallRate: Math.round(opts.overallRate), ignoreCoordinatedOmission: true } : {})
    }, (err, result) => {
      settled = true
      clearTimeout(watchdog)
      if (err) return reject(err)
      if (watchdogFired) return reject(new Error(`load on ${opts.url} did not finish within ${opts.durationS + 15} s`))
      const seconds = result.duration
      /** @type {Record<string, number>} */
      const statusCodes = {}
      for (const [code, s] of Object.entries(result.statusCodeStats ?? {})) statusCodes[code] = s.count
      // requests.total counts responses; latency.totalCount does not when a rate is set (it adds
      // coordinated-omission samples).
      const requests = result.requests.total
      const exact = okTimes.percentiles()
      resolve({
        requests,
        seconds,
        rps: requests / seconds,
        p50Ms: exact?.p50 ?? result.latency.p50,
        p99Ms: exact?.p99 ?? result.latency.p99,
        maxMs: exact?.max ?? result.latency.max,
        non2xx: result.non2xx,
        errors: result.errors,
        timeouts: result.timeouts,
        statusCodes
      })
    })
    const onTime = opts.onResponseTime
    if (!settled) {
      instance.on('response', (/** @type {unknown} */ _client, /** @type {number} */ status, /** @type {number} */ _bytes, /** @type {number} */ ms) => {
        // the 2xx answers, as autocannon's own histogram takes them
        if (status >= 200 && status < 300) okTimes.add(ms)
        if (onTime) onTime(ms)
      })
    }
    // Invalid options make autocannon call back synchronously, before there is anything to stop.
    if (!settled) watchdog = setTimeout(() => { watchdogFired = true; instance.stop() }, (opts.durationS + 15) * 1000)
  })
}

/**
 * A rate-bound load spread evenly over time. autocannon paces a rate per connection by sending
 * the whole second's quota back to back and then waiting for the next second, all connections
 * in step: a burst every second. Splitting the load into `parts` instances started 1/parts s
 * apart turns that into `parts` smaller bursts per second. Latency percentiles are computed
 * from every response of every part.
 * @param {LoadOptions & { overallRate: number }} opts
 * @param {number} parts
 * @returns {Promise<LoadResult>}
 */
export async function runPacedLoad (opts, parts) {
  const n = Math.max(1, Math.min(parts, opts.connections))
  /** @type {number[]} */
  const times = []
  const runs = Array.from({ length: n }, async (_, i) => {
    await new Promise((resolve) => setTimeout(resolve, (i * 1000) / n))
    return runLoad({
      ...opts,
      connections: Math.floor(opts.connections / n) + (i < opts.connections % n ? 1 : 0),
      overallRate: opts.overallRate / n,
      onResponseTime: (ms) => times.push(ms)
    })
  })
  const results = await Promise.all(runs)
  times.sort((a, b) => a - b)
  /** @param {number} q */
  const pct = (q) => times.length ? /** @type {number} */ (times[Math.min(times.length - 1, Math.floor(q * times.length))]) : NaN
  /** @type {Record<string, number>} */
  const statusCodes = {}
  for (const r of results) for (const [code, k] of Object.entries(r.statusCodes)) statusCodes[code] = (statusCodes[code] ?? 0) + k
  const sum = (/** @type {(r: LoadResult) => number} */ f) => results.reduce((acc, r) => acc + f(r), 0)
  return {
    requests: sum((r) => r.requests),
    seconds: Math.max(...results.map((r) => r.seconds)),
    rps: sum((r) => r.rps),
    p50Ms: pct(0.5),
    p99Ms: pct(0.99),
    maxMs: times[times.length - 1] ?? NaN,
    non2xx: sum((r) => r.non2xx),
    errors: sum((r) => r.errors),
    timeouts: sum((r) => r.timeouts),
    statusCodes
  }
}

/**
 * Identities the ordinary load cycles through: distinct users so per-user keys are spread.
 * @param {number} n
 * @param {string} path
 */
export function userRequests (n, path) {
  return Array.from({ length: n }, (_, i) => ({ method: 'GET', path, headers: { 'x-user-id': `user-${i}` } }))
}

/**
 * Clients with distinct addresses, given to a gateway that trusts 127.0.0.1 via X-Forwarded-For.
 * @param {number} n
 * @param {string} prefix  user id prefix
 * @param {number} net     second octet, so client groups never share an address
 * @param {string} path
 */
export function clientRequests (n, prefix, net, path) {
  return Array.from({ length: n }, (_, i) => ({
    method: 'GET',
    path,
    headers: { 'x-user-id': `${prefix}-${i}`, 'x-forwarded-for': `10.${net}.${(i >> 8) & 255}.${i & 255}` }
  }))
}
