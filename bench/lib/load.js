// The load generator: autocannon as a library, in this process, so its CPU is process.cpuUsage().
import autocannon from 'autocannon'

/**
 * @typedef {object} LoadOptions
 * @property {string} url
 * @property {number} connections
 * @property {number} durationS
 * @property {Array<{ method?: string, path?: string, headers?: Record<string, string> }>} requests  cycled per connection
 * @property {number} [overallRate]  requests/s over all connections; unset = as fast as answers come back
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
    const instance = autocannon({
      url: opts.url,
      connections: opts.connections,
      duration: opts.durationS,
      pipelining: 1,
      timeout: 10,
      requests: opts.requests,
      ...(opts.overallRate ? { overallRate: Math.round(opts.overallRate) } : {})
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
      resolve({
        requests,
        seconds,
        rps: requests / seconds,
        p50Ms: result.latency.p50,
        p99Ms: result.latency.p99,
        maxMs: result.latency.max,
        non2xx: result.non2xx,
        errors: result.errors,
        timeouts: result.timeouts,
        statusCodes
      })
    })
    // Invalid options make autocannon call back synchronously, before there is anything to stop.
    if (!settled) watchdog = setTimeout(() => { watchdogFired = true; instance.stop() }, (opts.durationS + 15) * 1000)
  })
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
