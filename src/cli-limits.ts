// gateway limits get|reset --route R [--ip A] [--user U]: the admin API's /limits from a shell
// (issue 9), so support can see why a client is limited and unblock it without curl.
import { parseArgs } from 'node:util'
import { loadConfigFile } from './config/load.js'
import { adminListen, adminToken } from './config/defaults.js'
import { isHostPort } from './config/schema.js'
import { adminClientUrl } from './admin/client-url.js'

export const LIMITS_HELP = `Usage: gateway limits get|reset --route NAME [--ip ADDR] [--user NAME] [--plan NAME]
                     [--shared] [-c FILE] [--admin HOST:PORT] [--token TOKEN] [--json]

get    lists every limit a request on that route from that client would meet, with what is left,
       read without consuming anything (GET /limits on the admin listener)
reset  resets them: the Redis keys, and the local level and deny cache on every instance
       (DELETE /limits; needs the admin token: --token, $GATEWAY_ADMIN_TOKEN or the file's admin.token);
       the client's own budgets only, unless --shared: the route's api budget and the global one
       too, which every client shares
The admin address is --admin, else the config file's admin. With admin.reads: token a get needs
the token too (from --token, $GATEWAY_ADMIN_TOKEN, or the file when --admin is not given or -c is).
Exit 0 ok, 1 refused (or an answer that is not the admin API's) or the config file invalid,
2 usage, 4 admin listener unreachable, no answer within 5 s, or a worker's none (workers: N).
`

/** How long the admin listener has to answer, body included. */
const ANSWER_WITHIN_MS = 5000

/** Why fetch gave up, in words: undici's own message is "fetch failed", its reason in `cause`. */
function unreachable (err: unknown): string {
  if ((err as Error).name === 'TimeoutError') return `did not answer within ${ANSWER_WITHIN_MS / 1000} s`
  const cause = (err as { cause?: unknown }).cause
  return `unreachable: ${cause instanceof Error ? cause.message : (err as Error).message}`
}

function parseObject (text: string): Record<string, unknown> | null {
  try {
    const parsed: unknown = JSON.parse(text)
    return parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed) ? parsed as Record<string, unknown> : null
  } catch {
    return null
  }
}

interface LimitView {
  readonly name: string
  readonly dimension: string
  readonly algorithm: string
  readonly limit: number
  readonly remaining: number
  readonly resetMs: number
  readonly retryAfterMs: number
  readonly deniedMs: number
  readonly key: string
  /** "instance": the local level, each process's own */
  readonly scope?: string
  /** workers primary: each worker's reading of the limit */
  readonly perWorker?: readonly unknown[]
}

export async function limitsCommand (argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      config: { type: 'string', short: 'c' },
      admin: { type: 'string' },
      token: { type: 'string' },
      route: { type: 'string' },
      ip: { type: 'string' },
      user: { type: 'string' },
      plan: { type: 'string' },
      shared: { type: 'boolean' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' }
    }
  })
  const action = positionals[0]
  if (values.help === true) {
    process.stdout.write(LIMITS_HELP)
    return 0
  }
  if ((action !== 'get' && action !== 'reset') || values.route === undefined) {
    process.stderr.write(LIMITS_HELP)
    return 2
  }
  // `limits reset --route login 203.0.113.5` (the address without --ip) reset another client's limits
  const stray = positionals[1]
  if (stray !== undefined) {
    process.stderr.write(`gateway limits: unexpected argument "${stray}" (a client is named with --ip ADDR or --user NAME; gateway limits --help)\n`)
    return 2
  }
  if (values.admin !== undefined && !isHostPort(values.admin)) {
    process.stderr.write(`gateway limits: --admin expects HOST:PORT, got "${values.admin}"\n`)
    return 2
  }
  let admin = values.admin
  /** The config file the address came from, when no --admin gave it. */
  let adminFrom: string | undefined
  let token = values.token ?? (process.env.GATEWAY_ADMIN_TOKEN || undefined)
  // a get needs the token too when the gateway's admin.reads is token: taken from a file named with -c
  if (admin === undefined || (token === undefined && (action === 'reset' || values.config !== undefined))) {
    // the file supplies what the options do not (its ${VAR} references substituted as at start)
    const file = values.config ?? (process.env.GATEWAY_CONFIG || 'gateway.yaml')
    let loaded
    try {
      loaded = await loadConfigFile(file)
    } catch (err) {
      // `limits reset --admin H:P` with no token read ./gateway.yaml unasked: on a host without one
      // it answered "gateway: gateway.yaml:0:0: file not found", naming neither the token nor why
      const wanted = admin === undefined ? 'the admin address (--admin HOST:PORT)' : 'the admin token (--token TOKEN, $GATEWAY_ADMIN_TOKEN)'
      process.stderr.write(`gateway limits: ${wanted} was to be read from ${file}, which cannot be loaded:\n${(err as Error).message}\n`)
      return 1
    }
    if (admin === undefined) {
      admin = adminListen(loaded.config)
      adminFrom = file
    }
    token ??= adminToken(loaded.config) ?? undefined
  }
  const query = new URLSearchParams({ route: values.route })
  if (values.ip !== undefined) query.set('ip', values.ip)
  if (values.user !== undefined) query.set('user', values.user)
  if (values.plan !== undefined) query.set('plan', values.plan)
  if (values.shared === true) {
    if (action !== 'reset') {
      process.stderr.write('gateway limits: --shared is for reset (a get lists the shared budgets already)\n')
      return 2
    }
    query.set('shared', 'true')
  }
  const base = adminClientUrl(admin)
  const url = `${base}/limits?${query.toString()}`
  // The body is read inside the same bound as the headers: a listener that sent its headers and
  // then stalled was an AbortError out of res.json(), exit 1 with "The operation was aborted".
  let res: Response
  let text: string
  try {
    res = await fetch(url, {
      method: action === 'get' ? 'GET' : 'DELETE',
      headers: token !== undefined ? { authorization: `Bearer ${token}` } : {},
      signal: AbortSignal.timeout(ANSWER_WITHIN_MS)
    })
    text = await res.text()
  } catch (err) {
    // an address read from a file (port 0 in it: chosen at start, unknown here) was reported
    // with no word of where it came from or how to give another
    const from = adminFrom === undefined ? '' : ` (the admin address of ${adminFrom}: give --admin HOST:PORT)`
    process.stderr.write(`gateway limits: admin listener ${base} ${unreachable(err)}${from}\n`)
    return 4
  }
  // Something other than the gateway's JSON (a proxy's HTML error page, node's bare 431 for a
  // request line too long): res.json() threw "Unexpected token '<'", which named no status.
  const body = parseObject(text)
  const listed = action === 'get' ? body?.limits : body?.reset
  if (body === null || (res.ok && !Array.isArray(listed))) {
    process.stderr.write(`gateway limits ${action}: ${base} answered ${res.status} ${res.statusText}, not the admin API's JSON${text.length === 0 ? ' (empty body)' : `: ${JSON.stringify(text.slice(0, 80))}`}\n`)
    return 1
  }
  // a refusal is an error, on stderr alone: with --json its body went to stdout too, where
  // `gateway limits get --json > state.json` kept it as if it were the client's state
  if (!res.ok) {
    process.stderr.write(`gateway limits ${action}: ${res.status} ${String(body.error)}: ${String(body.message)}\n`)
    // a worker that did not answer the primary in time is no answer, not a refusal: try again
    return body.error === 'GW_ERR_ADMIN_WORKERS_UNAVAILABLE' ? 4 : 1
  }
  if (values.json === true) {
    process.stdout.write(JSON.stringify(body, null, 2) + '\n')
    return 0
  }
  const who = `route ${values.route}${values.ip !== undefined ? `, ip ${values.ip}` : ''}${values.user !== undefined ? `, user ${values.user}` : ''}${body.plan !== null && body.plan !== undefined ? `, plan ${String(body.plan)}` : ''}`
  if (action === 'get') {
    const limits = body.limits as LimitView[]
    process.stdout.write(`${who}: ${limits.length} limit(s)\n`)
    // workers: N without Redis sums `remaining` over the workers, each with its own budget of
    // `limit`: printed against the one limit, a fresh client read "remaining 6/3"
    const summed = body.combined === 'summed'
    const where = typeof body.workers === 'number' ? 'in a worker' : 'here'
    for (const l of limits) {
      const state = l.retryAfterMs !== 0 ? `limited, retry in ${l.retryAfterMs < 0 ? 'never' : `${l.retryAfterMs} ms`}` : 'ok'
      const n = l.perWorker?.length ?? 1
      // the local level is each worker's own, with Redis too
      const budget = summed || (l.scope === 'instance' && l.perWorker !== undefined) ? `${l.remaining}/${l.limit * n} over ${n} worker(s), ${l.limit} each` : `${l.remaining}/${l.limit}`
      process.stdout.write(`  ${l.name} (${l.dimension}, ${l.algorithm}) remaining ${budget}, reset in ${l.resetMs} ms, ${state}${l.deniedMs > 0 ? `, deny-cached ${l.deniedMs} ms ${where}` : ''}  ${l.key}\n`)
    }
    return 0
  }
  const reset = body.reset as Array<{ name: string, key: string }>
  // Redis away: reset only where it could be; exit 0 (the client is freed here), but say so
  const partial = body.complete === false
  const effect = partial ? 'Redis keys not deleted, other instances not told' : `${String(body.keysDeleted)} key(s) deleted, ${String(body.instances)} instance(s) notified`
  process.stdout.write(`${who}: reset ${reset.map(r => r.name).join(', ') || 'nothing'} (${effect})\n`)
  if (partial) process.stderr.write(`gateway limits reset: warning: ${String(body.warning)}\n`)
  return 0
}
