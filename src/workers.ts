// `workers: N` (node:cluster): N worker processes share the public listener and the Redis budget.
// The primary only supervises: it checks the file on SIGHUP and hands it to the workers, relays
// SIGTERM, restarts a crashed worker, and serves the admin listener with metrics aggregated over
// all workers (prom-client AggregatorRegistry) and the admin API answered by every worker over
// IPC (src/admin/limits-over-workers.ts).
import cluster, { type Worker } from 'node:cluster'
import { readFileBounded } from './read-bounded.js'
import { createHash } from 'node:crypto'
import { AggregatorRegistry } from 'prom-client'
import { ConfigError, hasSharedLimits, loadConfigFile, loadConfigText, namedFiles, readNamedFiles, reloadProblems, type LoadedConfig, type NamedFiles } from './config/load.js'
import { checkRuntime, defaultMaxConnections } from './runtime.js'
import { redactConfig } from './admin/redact.js'
import { ADMIN_PATHS, answeringSafely, json, misdirectedAdminRequest, refusedAdminMethod, refusedRead, warnOpenAdmin } from './admin/admin-server.js'
import { ERRORS, errorBody } from './errors.js'
import { adminError, serveLimitsApi, type AdminAnswer, type LimitsOps } from './admin/limits-api.js'
import { createWorkersLimitsOps, type AdminOp, type WorkerAnswer } from './admin/limits-over-workers.js'
import { handleDashboard, type RouteView } from './admin/dashboard.js'
import { LiveFeed } from './admin/live-feed.js'
import { configServerSettings, createShieldedAdminServer } from './admin/admin-shield.js'
import type { LiveFrame } from './admin/live-stats.js'
import type { EarlySignals } from './start-signals.js'
import type { Logger } from './log.js'
import { RELOAD_HISTORY, isLoopback, restartNeededMessage, settingsNeedingRestart, splitHostPort, type GatewayOptions, type ReloadOutcome, type ReloadSource } from './server.js'
import { adminListen, adminReadToken, adminToken, type ResolvedConfig } from './config/defaults.js'
import type { TargetCheckView } from './proxy/upstream-pool.js'

export const WORKER_ADMIN_ENV = 'GATEWAY_WORKER'

/** What a worker sends the primary once a second for the admin page. */
interface LiveMessage {
  readonly type: 'gateway:live'
  readonly frame: LiveFrame
  readonly health: Record<string, unknown>
  /** The worker's compiled routes, sent when its generation changed (and on its first frame). */
  readonly routes?: { generation: number, local: unknown, routes: RouteView[] }
}

const isLiveMessage = (msg: unknown): msg is LiveMessage =>
  typeof msg === 'object' && msg !== null && (msg as { type?: unknown }).type === 'gateway:live'

/** The primary asks a worker one admin API operation (src/admin/limits-api.ts LimitsOps). */
interface AdminRequest {
  readonly type: 'gateway:admin'
  readonly id: number
  readonly op: AdminOp
  /** The query string (lookup, reset) or the consumer's name. */
  readonly arg: string
  /** Who asked (the token's id), for the worker's reset log line. */
  readonly by: string
}

interface AdminReply {
  readonly type: 'gateway:admin-reply'
  readonly id: number
  readonly answer: AdminAnswer
}

/**
 * A starting worker asks the primary for the text of the file the primary last accepted, and
 * compiles that instead of the file on disk: a worker that replaces a crashed one serves the same
 * generation as its siblings, even when the file was edited since (and not reloaded), valid or not.
 *
 * Handed over IPC rather than as a snapshot file: the text may hold inline API keys, and a file
 * would outlive a primary killed with SIGKILL; over the channel nothing is written to disk, and
 * a text of the size of a config is well within what the channel carries (an environment
 * variable would not be: Linux caps each at 128 KiB).
 *
 * What is handed over is the YAML text alone. The worker substitutes `${VAR}` from its own
 * environment, which is the primary's (cluster.fork inherits it), so the values are those the
 * primary checked. Files the config names (the API key file, TLS certificate and key) are read
 * from disk by the worker as they are when it starts, as a reload would read them.
 */
interface ConfigAsk { readonly type: 'gateway:config-ask' }
interface ConfigGiven {
  readonly type: 'gateway:config'
  /** null: the primary holds no text (read apart from its check, the file differed): read the file. */
  readonly text: string | null
  /** The files the text names, as the primary read them for its check (withNamedFiles). */
  readonly files: NamedFiles
  /** The primary's generation of that text: a replacement counts on from its siblings' number. */
  readonly generation: number
  /**
   * To a starting worker: the config the primary started with. A reload that changed `listen` or
   * turned TLS on or off is not applied until a restart: a replacement binds where its siblings do.
   */
  readonly startedWith?: ResolvedConfig
  /**
   * To a starting worker whose start config had TLS: the certificate and key its siblings serve,
   * base64, those of the last accepted config with TLS. A reload that turned TLS off leaves them
   * serving until a restart; a replacement given no certificate served plain HTTP beside them.
   */
  readonly servedTls?: { readonly cert: string, readonly key: string }
}

/** The certificate and key `loaded` names, from the files read with it; undefined without TLS. */
function tlsFilesOf (loaded: LoadedConfig): ConfigGiven['servedTls'] {
  const tls = loaded.config.tls
  const cert = tls === undefined ? undefined : loaded.files?.[tls.cert]
  const key = tls === undefined ? undefined : loaded.files?.[tls.key]
  return cert === undefined || key === undefined ? undefined : { cert, key }
}

/**
 * A worker tells the primary which generation it serves: once started, and after each config the
 * primary handed it, applied or not. The primary's reload is pending until every ready worker
 * serves its generation or has refused it, so `gateway reload` reports a config in force on every
 * worker, not one still compiling in them.
 */
interface AppliedMessage {
  readonly type: 'gateway:applied'
  /** The generation the worker serves now (absent after a refusal). */
  readonly serving?: number
  /** The primary's generation the worker could not apply, and why. */
  readonly refused?: { readonly generation: number, readonly problems: readonly string[] }
  /**
   * The worker is shutting down (signalled on its own): it will serve no config again, and the
   * replacement the primary starts gets the current one.
   */
  readonly leaving?: true
}

const isAppliedMessage = (msg: unknown): msg is AppliedMessage =>
  typeof msg === 'object' && msg !== null && (msg as { type?: unknown }).type === 'gateway:applied'

/** In a worker: reports to the primary what a start or a reload it handed over came to. */
export function reportApplied (report: Omit<AppliedMessage, 'type'>): void {
  const msg: AppliedMessage = { type: 'gateway:applied', ...report }
  // the channel may be closing (shutdown): the primary then counts this worker out anyway
  process.send?.(msg, undefined, undefined, () => {})
}

const isConfigAsk = (msg: unknown): msg is ConfigAsk =>
  typeof msg === 'object' && msg !== null && (msg as { type?: unknown }).type === 'gateway:config-ask'
const isConfigGiven = (msg: unknown): msg is ConfigGiven =>
  typeof msg === 'object' && msg !== null && (msg as { type?: unknown }).type === 'gateway:config'

/** How long a starting worker waits for the primary's text before it reads the file itself. */
const CONFIG_ASK_TIMEOUT_MS = 10_000

/**
 * Loads the file as loadConfigFile does, keeping its text for the workers. A read that fails is
 * worded by loadConfigFile (the same located "file not found"); if that second read succeeds,
 * no text is kept and a worker started next reads the file.
 */
async function loadWithText (file: string): Promise<{ loaded: LoadedConfig, text: string | null }> {
  let text: string
  try {
    text = (await readFileBounded(file)).toString('utf8')
  } catch {
    return { loaded: await withNamedFiles(await loadConfigFile(file)), text: null }
  }
  return { loaded: await withNamedFiles(await loadConfigText(text, file)), text }
}

/**
 * `loaded` with the files it names read now (the API key file, TLS certificate and key): the
 * primary checks those copies and hands them to its workers with the text, so a worker that
 * replaces a crashed one starts with the files its siblings serve, not with one broken since.
 */
export async function withNamedFiles (loaded: LoadedConfig): Promise<LoadedConfig> {
  return { ...loaded, files: await readNamedFiles(namedFiles(loaded.config)) }
}

const isAdminRequest = (msg: unknown): msg is AdminRequest =>
  typeof msg === 'object' && msg !== null && (msg as { type?: unknown }).type === 'gateway:admin'
const isAdminReply = (msg: unknown): msg is AdminReply =>
  typeof msg === 'object' && msg !== null && (msg as { type?: unknown }).type === 'gateway:admin-reply'

/**
 * How long the primary waits for each worker's admin answer. Above the workers' own bound on
 * Redis (1 s per call, a reset makes two: src/limit/limit-admin.ts), so a slow Redis is reported
 * as the store's failure and only a stuck or dying worker as GW_ERR_ADMIN_WORKERS_UNAVAILABLE.
 */
export const ADMIN_IPC_TIMEOUT_MS = 3000

/**
 * A ready worker whose live frames (one a second, from a timer on its event loop) stopped this
 * long is not answering: a loop blocked by a bug or a runaway regex, a process stopped (SIGSTOP,
 * a debugger). The connections the primary hands it wait unanswered, so /readyz says not ready
 * until it answers again. Five seconds: a loaded machine delays a frame by far less.
 */
export const WORKER_SILENT_MS = 5000

/** The primary's side of the admin IPC: requests out, replies matched by id, a bounded wait. */
class WorkerAdminClient {
  private nextId = 1
  private readonly pending = new Map<number, { readonly worker: Worker, readonly settle: (a: WorkerAnswer) => void }>()

  constructor (private readonly timeoutMs: number) {}

  async ask (workers: readonly Worker[], op: AdminOp, arg: string, by: string): Promise<WorkerAnswer[]> {
    return await Promise.all(workers.map(async (worker) => await new Promise<WorkerAnswer>((resolve) => {
      const id = this.nextId++
      const pid = worker.process.pid ?? 0
      const timer = setTimeout(() => settle({ pid, answer: null, reason: `no answer within ${this.timeoutMs} ms` }), this.timeoutMs)
      const settle = (a: WorkerAnswer): void => {
        if (!this.pending.delete(id)) return
        clearTimeout(timer)
        resolve(a)
      }
      this.pending.set(id, { worker, settle })
      const request: AdminRequest = { type: 'gateway:admin', id, op, arg, by }
      try {
        worker.send(request, (err: Error | null) => { if (err !== null) settle({ pid, answer: null, reason: `not sent: ${err.message}` }) })
      } catch (err) {
        settle({ pid, answer: null, reason: `not sent: ${(err as Error).message}` })
      }
    })))
  }

  reply (worker: Worker, msg: AdminReply): void {
    const p = this.pending.get(msg.id)
    if (p?.worker === worker) p.settle({ pid: worker.process.pid ?? 0, answer: msg.answer })
  }

  /** A worker exited: what it was asked will not be answered. */
  gone (worker: Worker): void {
    for (const p of [...this.pending.values()]) if (p.worker === worker) p.settle({ pid: worker.process.pid ?? 0, answer: null, reason: 'the worker exited' })
  }
}

/** One worker's registry as getMetricsAsJSON gives it, as AggregatorRegistry.aggregate reads it. */
export type MetricsJson = ReadonlyArray<{ readonly name: string, readonly help: string, readonly type: string, readonly aggregator: string, readonly values: readonly object[] }>

/** Counters and histograms: the families whose sum over the workers must never go down. */
const cumulative = (m: MetricsJson): MetricsJson => m.filter(f => f.type === 'counter' || f.type === 'histogram')

/**
 * What the primary's /metrics sums. A Prometheus counter must not go down (rate() reads a drop as
 * a reset to 0 and counts the whole remaining value as new), so a worker's counters do not leave
 * the sum with the worker: one that exited is kept at the last values scraped from it (folded into
 * `retired`, its gauges dropped), and one that does not answer a scrape counts at its last
 * answer's. Without this, a crashed worker took its counts out of every counter sum.
 */
class ScrapedCounters {
  private retired: MetricsJson = []
  private readonly last = new Map<number, MetricsJson>()

  /** False for an answer read after its worker exited: retire() already kept the one before. */
  answered (worker: Worker, metrics: MetricsJson): boolean {
    if (worker.isDead()) return false
    this.last.set(worker.id, metrics)
    return true
  }

  retire (id: number): void {
    const gone = this.last.get(id)
    if (gone === undefined) return
    this.last.delete(id)
    this.retired = AggregatorRegistry.aggregate([this.retired, cumulative(gone)]).getMetricsAsArray()
      .map(m => ({ name: m.name, help: m.help, type: String(m.type), aggregator: m.aggregator, values: (m as unknown as { values: object[] }).values }))
  }

  /** The snapshots to sum for a scrape: the workers that answered it whole, the others' counters. */
  parts (answered: ReadonlySet<number>): MetricsJson[] {
    return [this.retired, ...[...this.last].map(([id, metrics]) => answered.has(id) ? metrics : cumulative(metrics))]
  }
}

const RELOADS = 'gateway_config_reloads_total'

/**
 * gateway_config_reloads_total in workers mode is the primary's: a file the primary rejects
 * reaches no worker, so the workers' sum never counted a rejected reload (the example alert
 * GatewayReloadFailed could not fire), and each accepted one was counted once per worker. The
 * workers' failures stay in (a worker that could not apply an accepted file), their successes go.
 */
function withoutReloadSuccesses (part: MetricsJson): MetricsJson {
  return part.map(f => f.name !== RELOADS ? f : { ...f, values: f.values.filter(v => (v as { labels?: { result?: unknown } }).labels?.result !== 'success') })
}

const BREAKER = 'gateway_redis_breaker_state'
// 0 closed, 1 open, 2 half-open: the worst is open, then half-open
const BREAKER_RANK = [0, 2, 1]

/**
 * The workers' breaker states as one, the worst of them: open over half-open over closed. Summed
 * by prom-client's "max", one worker open and another half-open (probing) read as half-open.
 */
export function worstBreaker (parts: readonly MetricsJson[]): MetricsJson[] {
  let worst: number | null = null
  const out = parts.map(part => part.filter(f => {
    if (f.name !== BREAKER) return true
    for (const v of f.values) {
      const state = (v as { value?: unknown }).value
      if (typeof state === 'number' && (worst === null || (BREAKER_RANK[state] ?? 0) > (BREAKER_RANK[worst] ?? 0))) worst = state
    }
    return false
  }))
  if (worst !== null) out.push([{ name: BREAKER, help: 'Redis circuit breaker: 0 closed, 1 open, 2 half-open', type: 'gauge', aggregator: 'max', values: [{ value: worst, labels: {} }] }])
  return out
}

function reloadsFamily (counted: { readonly success: number, readonly failure: number }): MetricsJson {
  return [{
    name: RELOADS,
    help: 'Configuration reloads by result',
    type: 'counter',
    aggregator: 'sum',
    values: [{ value: counted.success, labels: { result: 'success' } }, { value: counted.failure, labels: { result: 'failure' } }]
  }]
}

interface TargetHealth { url: string, healthy: boolean, ejectedForMs: number, consecutiveFailures: number, check?: TargetCheckView }

/**
 * The workers' health (src/admin/admin-server.ts healthOf, one per worker) as one. Passive health
 * is per process: each worker ejects a target on the failures it sees itself, so a target is shown
 * ejected while any worker leaves it out, as gateway_upstream_target_healthy is their lowest (the
 * page showed the view of whichever worker reported last, so an ejection by another never showed).
 * Each worker probes with its own health checks too: a target's `check` is that of a worker whose
 * probes hold it out, if any. A worker on the Redis fallback makes the whole degraded. The rest is the newest report's.
 */
function mergeHealth (all: ReadonlyArray<Record<string, unknown>>): Record<string, unknown> {
  const upstreams = new Map<string, TargetHealth[]>()
  for (const h of all) {
    for (const [name, targets] of Object.entries((h.upstreams ?? {}) as Record<string, readonly TargetHealth[]>)) {
      let merged = upstreams.get(name)
      if (merged === undefined) upstreams.set(name, merged = [])
      for (const t of targets) {
        const m = merged.find(x => x.url === t.url)
        if (m === undefined) {
          merged.push({ url: t.url, healthy: t.healthy, ejectedForMs: t.ejectedForMs, consecutiveFailures: t.consecutiveFailures, ...(t.check !== undefined ? { check: t.check } : {}) })
          continue
        }
        if (t.check !== undefined && (m.check === undefined || (m.check.healthy && !t.check.healthy))) m.check = t.check
        m.healthy &&= t.healthy
        m.ejectedForMs = Math.max(m.ejectedForMs, t.ejectedForMs)
        m.consecutiveFailures = Math.max(m.consecutiveFailures, t.consecutiveFailures)
      }
    }
  }
  const degraded = all.find(h => h.status === 'degraded')
  return { ...all[all.length - 1], upstreams: Object.fromEntries(upstreams), ...(degraded !== undefined ? { status: 'degraded', redis: degraded.redis } : {}) }
}

interface PrimaryOptions {
  readonly configFile: string
  readonly loaded: LoadedConfig
  readonly workers: number
  readonly workerArgs: readonly string[]
  readonly logger: Logger
  /** No --log-level was given: a reload applies the file's log.level. */
  readonly logLevelFromFile: boolean
  /** The signals held while the start read the file, let go as the primary's handlers are installed. */
  readonly early?: EarlySignals | null
}

/** Runs the primary until SIGTERM/SIGINT; resolves with the exit code. */
export async function runPrimary (options: PrimaryOptions): Promise<number> {
  const { logger, workers } = options
  let loaded = options.loaded
  // The text of the accepted file, handed to each worker as it starts (ConfigAsk above). The
  // caller loaded the file before: read again, it is kept when it is the same text (same hash).
  const startText = await readFileBounded(options.configFile).then(b => b.toString('utf8'), () => null)
  let acceptedText = startText !== null && createHash('sha256').update(startText).digest('hex') === loaded.hash ? startText : null
  let acceptedFiles = loaded.files ?? {}
  let servedTls = tlsFilesOf(loaded)
  let shuttingDown = false
  // The primary's verdict on each SIGHUP, for /config and `gateway reload`: the file checked as
  // each worker checks it (schema and compile, offline), so a file the workers reject is never
  // shown as the config in force. Installed first: Node's default for SIGHUP ends the process.
  let generation = 1
  let lastReload: ReloadOutcome | null = null
  // the admin page's reload history: the primary's verdicts (a rejected file reaches no worker)
  const reloadHistory: ReloadOutcome[] = []
  let checking: Promise<void> = Promise.resolve()
  // checks signalled and not yet decided: /config's reloadPending
  let checksPending = 0
  // gateway_config_reloads_total on /metrics: the primary's verdicts, one per SIGHUP (reloadsFamily)
  const reloadsCounted = { success: 0, failure: 0 }
  // by worker id: the generation it serves (AppliedMessage), and its refusal of the current one
  const servingOf = new Map<number, number>()
  const refusedBy = new Map<number, { pid: number | undefined, problems: readonly string[] }>()
  const leaving = new Set<number>()
  // on the verdict that accepted the generation in force, though a rejected file came after it
  const markWorkersFailed = (failed: NonNullable<ReloadOutcome['workersFailed']>): void => {
    const at = reloadHistory.findLastIndex(r => r.ok && r.generation === generation)
    const accepted = reloadHistory[at]
    if (accepted === undefined) return
    const next = { ...accepted, workersFailed: failed }
    reloadHistory[at] = next
    if (lastReload === accepted) lastReload = next
  }
  // the accepted config as a running worker takes it (a starting one gets more: the config-ask below)
  const inForce = (): ConfigGiven => ({ type: 'gateway:config', text: acceptedText, files: acceptedFiles, generation })
  const handOver = (w: Worker, given: ConfigGiven): void => {
    w.send(given, (err: Error | null) => { if (err !== null) logger.warn({ worker: w.process.pid, generation: given.generation, err: err.message }, 'could not hand the accepted config to a worker') })
  }
  // The workers do not read the file on SIGHUP: each reading it on its own signal folded the
  // signals that came during its reload into one, so after a burst their generation numbers fell
  // behind the primary's. The primary reads and checks the file once per SIGHUP and hands an
  // accepted text to every worker with its generation; a rejected one reaches no worker.
  const onSighup = (): void => {
    checksPending++
    checking = checking.then(async () => {
      let outcome: Pick<ReloadOutcome, 'ok' | 'problems' | 'restartNeeded'>
      try {
        const { loaded: next, text } = await loadWithText(options.configFile)
        // `workers` needs a restart: the workers running are the ones the limits are shared by, so
        // a file setting workers: 1 and dropping redis: let each of them enforce every limit alone
        if (workers > 1 && next.config.redis === undefined && hasSharedLimits(next.config)) {
          throw new ConfigError([next.problemAt(['workers'], `this gateway runs ${workers} workers until a restart ("workers" needs one): without "redis:" each of them would enforce every limit on its own (${workers} times the budget); keep redis: until the restart`)])
        }
        await checkRuntime(next)
        // who may read changed: the streams authorized under the old rules end (LiveFeed.endStreams)
        if (adminReadToken(loaded.config) !== adminReadToken(next.config)) feed.endStreams()
        loaded = next
        acceptedText = text
        acceptedFiles = next.files ?? {}
        servedTls = tlsFilesOf(next) ?? servedTls
        generation++
        refusedBy.clear()
        const given = inForce()
        for (const w of Object.values(cluster.workers ?? {})) if (w !== undefined && !w.isDead()) handOver(w, given)
        const restartNeeded = settingsNeedingRestart(options.loaded.config, next.config)
        if (restartNeeded.length > 0) logger.warn({ settings: restartNeeded }, restartNeededMessage(restartNeeded))
        // the primary's own lines (worker exits, this warning) follow the file's level too
        if (options.logLevelFromFile) logger.level = next.config.log.level
        outcome = { ok: true, problems: [], restartNeeded }
        reloadsCounted.success++
      } catch (err) {
        outcome = { ok: false, problems: reloadProblems(err) }
        reloadsCounted.failure++
        logger.error({ problems: outcome.problems, generation }, 'reload rejected; the running configuration keeps serving')
      }
      lastReload = { attempt: (lastReload?.attempt ?? 0) + 1, generation, at: new Date().toISOString(), ...outcome }
      reloadHistory.push(lastReload)
      if (reloadHistory.length > RELOAD_HISTORY) reloadHistory.shift()
      checksPending--
    })
  }
  process.on('SIGHUP', onSighup)
  // one that came while the start read the file: the file may have changed since
  if (options.early?.takeReload() === true) onSighup()
  const ready = new Set<number>()
  // when each worker's last live frame came; a ready worker silent for WORKER_SILENT_MS is not answering
  const frameAt = new Map<number, number>()
  const silenceOf = (id: number, now: number): number => now - (frameAt.get(id) ?? now)
  const pidOf = (id: number): number | undefined => cluster.workers?.[id]?.process.pid
  const silentWorkers = (): Array<{ pid: number | undefined, silentMs: number }> => {
    const now = performance.now()
    return [...ready].filter(id => silenceOf(id, now) >= WORKER_SILENT_MS).map(id => ({ pid: pidOf(id), silentMs: Math.round(silenceOf(id, now)) }))
  }
  // ready workers that answer: what /readyz and the page count
  const answering = (): number => ready.size - silentWorkers().length
  const warnedSilent = new Set<number>()
  const silenceWatch = setInterval(() => {
    const now = performance.now()
    for (const id of ready) {
      const silentMs = silenceOf(id, now)
      if (silentMs >= WORKER_SILENT_MS && !warnedSilent.has(id)) {
        warnedSilent.add(id)
        logger.warn({ worker: pidOf(id), silentMs: Math.round(silentMs) }, 'worker not answering (its event loop is blocked or the process is stopped): /readyz is 503 until it answers again')
      } else if (silentMs < WORKER_SILENT_MS && warnedSilent.delete(id)) {
        logger.info({ worker: pidOf(id) }, 'worker answering again')
      }
    }
  }, 1000)
  silenceWatch.unref()
  // The admin page in workers mode: every worker's frame summed, health merged over the workers
  // (mergeHealth), but readiness and the reloads as the primary knows them: a worker's history
  // lacked every rejected reload, and its last frame said "ready" after every worker had exited
  const healthOfWorkers = new Map<number, Record<string, unknown>>()
  const workerHealth = (): Record<string, unknown> => mergeHealth([...healthOfWorkers.values()])
  let routesView: LiveMessage['routes'] | null = null
  const feed = new LiveFeed(() => null, () => {
    const health = workerHealth()
    const up = answering()
    return {
      ...health,
      status: shuttingDown ? 'shutting_down' : up < workers ? 'not_ready' : health.status ?? 'not_ready',
      workers,
      workersReady: up,
      reloads: reloadHistory
    }
  })
  feed.start()
  cluster.setupPrimary({ args: [...options.workerArgs], silent: false })
  const adminIpc = new WorkerAdminClient(ADMIN_IPC_TIMEOUT_MS)
  const scraped = new ScrapedCounters()
  const readyWorkers = (): Worker[] => [...ready].map(id => cluster.workers?.[id]).filter((w): w is Worker => w !== undefined && !w.isDead())
  // ready workers still compiling the accepted generation (neither serving nor refusing it)
  const applying = (): Worker[] => readyWorkers().filter(w => (servingOf.get(w.id) ?? 0) < generation && !refusedBy.has(w.id) && !leaving.has(w.id))
  // Same paths, methods and token rules as a single process; the answers come from every worker.
  const limitsApi = serveLimitsApi({
    ops: createWorkersLimitsOps(async (op, arg, by) => await adminIpc.ask(readyWorkers(), op, arg, by), () => loaded.config.redis !== undefined, ADMIN_IPC_TIMEOUT_MS),
    notReady: () => shuttingDown ? 'the gateway is shutting down' : ready.size === 0 ? `no worker is ready yet (workers: ${workers})` : null,
    adminToken: () => adminToken(loaded.config),
    logger
  }, json)

  // failed starts and crashes in a row, for the pause before the next replacement
  let restarts = 0
  const fork = (): Worker => {
    const w = cluster.fork({ [WORKER_ADMIN_ENV]: '1' })
    w.on('message', (msg: unknown) => {
      if (msg === 'gateway:ready') {
        ready.add(w.id)
        // a worker that started ends the row of failed starts: the next crash, weeks later, is
        // replaced after the shortest pause (the count never fell, so after 6 each waited 5 s)
        restarts = 0
      }
      else if (isLiveMessage(msg)) {
        frameAt.set(w.id, performance.now())
        feed.ingest(msg.frame)
        // newest last: the merged health's generation and config hash are the newest frame's
        healthOfWorkers.delete(w.id)
        healthOfWorkers.set(w.id, msg.health)
        if (msg.routes !== undefined) routesView = msg.routes
      } else if (isAppliedMessage(msg)) {
        if (msg.leaving === true) leaving.add(w.id)
        if (msg.serving !== undefined) {
          servingOf.set(w.id, Math.max(msg.serving, servingOf.get(w.id) ?? 0))
          // Behind: a hand-over that came while it started was not listened for yet (acceptedConfig
          // parses before followPrimaryReloads), or it started without the primary's text. Given
          // again; one it already has is skipped (followPrimaryReloads).
          if (msg.serving < generation && !w.isDead()) handOver(w, inForce())
        }
        // a refusal of a generation since replaced matters no more: the worker has the newer one
        if (msg.refused !== undefined && msg.refused.generation === generation) {
          refusedBy.set(w.id, { pid: w.process.pid, problems: msg.refused.problems })
          logger.error({ worker: w.process.pid, generation, problems: msg.refused.problems }, 'a worker could not apply the accepted config; it serves the one before')
          markWorkersFailed([...refusedBy.values()])
        }
      } else if (isAdminReply(msg)) adminIpc.reply(w, msg)
      else if (isConfigAsk(msg)) {
        // after the SIGHUP being checked, if one is: a worker forked after that check's hand-over
        // would not get it, and must start with its verdict
        void checking.then(() => { if (!w.isDead()) handOver(w, { ...inForce(), startedWith: options.loaded.config, ...(servedTls !== undefined ? { servedTls } : {}) }) })
      }
    })
    return w
  }
  cluster.on('exit', (w, code, signal) => {
    ready.delete(w.id)
    servingOf.delete(w.id)
    refusedBy.delete(w.id)
    leaving.delete(w.id)
    frameAt.delete(w.id)
    warnedSilent.delete(w.id)
    adminIpc.gone(w)
    scraped.retire(w.id)
    healthOfWorkers.delete(w.id)
    if (shuttingDown) return
    // a crashed worker is replaced, with a growing pause so a crash loop does not spin the CPU
    restarts++
    const restartInMs = restartPauseMs(restarts)
    logger.error({ worker: w.process.pid, code, signal, restartInMs }, 'worker exited; starting a new one')
    setTimeout(() => { if (!shuttingDown) fork() }, restartInMs).unref()
  })

  const adminAddress = adminListen(loaded.config)
  const { host, port } = splitHostPort(adminAddress)
  const boundToLoopback = isLoopback(host)
  // capped and timed as a single process's admin listener is, with the config the primary accepted last
  const admin = createShieldedAdminServer(answeringSafely((req, res) => {
    if (misdirectedAdminRequest(req, res, boundToLoopback)) return
    const path = (req.url ?? '/').split('?')[0]
    if (refusedRead(req, res, path ?? '/', adminReadToken(loaded.config), logger)) return
    if (limitsApi(req, res)) return
    // the same rule as a single process's admin listener (src/admin/admin-server.ts)
    if (refusedAdminMethod(req, res, path ?? '/')) return
    if (path === '/healthz') return json(res, 200, { status: 'ok' })
    if (path === '/readyz') {
      // the Redis state and the targets' passive health as the workers see them (mergeHealth)
      const { status, redis, upstreams } = workerHealth()
      const silent = silentWorkers()
      const up = ready.size - silent.length
      return json(res, up === workers && !shuttingDown ? 200 : 503, { status: shuttingDown ? 'shutting_down' : up === workers ? (status === 'degraded' ? 'degraded' : 'ready') : 'not_ready', workers, ready: up, ...(silent.length > 0 ? { notAnswering: silent } : {}), redis: redis ?? null, upstreams: upstreams ?? {} })
    }
    if (path === '/config') {
      const shown = redactConfig(loaded.config) as { server: { maxConnections: number | null } }
      // the number each worker took (they inherit the primary's open-file limit), as a single process shows it
      shown.server.maxConnections = loaded.config.server.maxConnections ?? defaultMaxConnections()
      const behind = applying().map(w => w.process.pid)
      return json(res, 200, { pid: process.pid, generation, hash: loaded.hash, file: loaded.file, workers, lastReload, reloadPending: checksPending > 0 || behind.length > 0, workersApplying: behind, config: shown })
    }
    if (path === '/metrics') {
      const asked = readyWorkers()
      adminIpc.ask(asked, 'metrics', '', '-').then(async (answers) => {
        // the workers that answered, summed; one starting, hung or exiting is left out of the
        // gauges and counted, rather than failing the whole scrape (prom-client's clusterMetrics
        // waited 5 s for every worker, answered 500, and kept the answers it had for good). Its
        // counters stay in at their last values (ScrapedCounters), so no sum goes backwards
        const answered = new Set<number>()
        answers.forEach((a, i) => {
          const w = asked[i]
          if (a.answer?.status === 200 && w !== undefined && scraped.answered(w, a.answer.body.metrics as MetricsJson)) answered.add(w.id)
        })
        const text = await AggregatorRegistry.aggregate([...worstBreaker(scraped.parts(answered).map(withoutReloadSuccesses)), reloadsFamily(reloadsCounted)]).metrics()
        res.writeHead(200, { 'content-type': AggregatorRegistry.PROMETHEUS_CONTENT_TYPE })
        res.end(text + workersGauge(workers, answered.size))
      }).catch((err: unknown) => json(res, ERRORS.GW_ERR_METRICS_FAILED.status, errorBody('GW_ERR_METRICS_FAILED', String(err))))
      return
    }
    if (path === '/routes') {
      if (routesView === null) return json(res, ERRORS.GW_ERR_NOT_READY.status, errorBody('GW_ERR_NOT_READY', 'no worker has reported yet'))
      return json(res, 200, routesView)
    }
    if (handleDashboard(req, res, path ?? '/', feed, () => null, json)) return
    json(res, ERRORS.GW_ERR_NOT_FOUND.status, errorBody('GW_ERR_NOT_FOUND', ADMIN_PATHS))
  }), { settings: () => configServerSettings(loaded.config), logger })
  await new Promise<void>((resolve, reject) => {
    admin.once('error', reject)
    admin.listen(port, host, () => resolve())
  })
  const adminPort = (admin.address() as { port: number }).port
  // Forked once the admin listener is bound: a taken admin port fails the start (exit 1) before
  // a worker serves, instead of leaving workers that no signal handler would drain.
  // a SIGTERM or SIGINT while the admin listener was being bound: nothing is forked
  if (options.early?.stop != null) {
    admin.close()
    feed.stop()
    clearInterval(silenceWatch)
    return 0
  }
  for (let i = 0; i < workers; i++) fork()
  if (!isLoopback(host)) warnOpenAdmin(logger, adminAddress, loaded.config)
  logger.info({ workers, adminPort, primary: process.pid }, 'gateway primary started')

  return new Promise<number>(resolve => {
    const stop = (signal: NodeJS.Signals): void => {
      if (shuttingDown) return
      shuttingDown = true
      logger.info({ signal }, 'shutting down workers')
      const done = (): void => { feed.stop(); clearInterval(silenceWatch); admin.close(); resolve(0) }
      const liveWorkers = (): Worker[] => Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined && !w.isDead())
      // cluster.workers drops a worker once it has exited: done when none is left
      cluster.on('exit', () => { if (liveWorkers().length === 0) done() })
      const alive = liveWorkers()
      if (alive.length === 0) return done()
      for (const w of alive) w.process.kill('SIGTERM')
    }
    // `on`: a second signal (systemd signals the whole control group) must not end the primary
    // with Node's default action while its workers drain
    process.on('SIGTERM', () => stop('SIGTERM'))
    process.on('SIGINT', () => stop('SIGINT'))
    const stoppedEarly = options.early?.takeStop() ?? null
    if (stoppedEarly !== null) stop(stoppedEarly)
  })
}

/**
 * The pause before the nth start in a row of a worker that exits (1-based): 200 ms doubling to
 * 5 s. Capped: a crash loop (a file broken until an operator fixes it) left uncapped kept the
 * fleet down for minutes after the fix.
 */
export function restartPauseMs (restarts: number): number {
  return Math.min(5000, 100 * 2 ** Math.min(restarts, 6))
}

/** In a worker: the registry the primary's /metrics asks for (answerAdminRequests, op metrics). */
let workerRegistry: import('prom-client').Registry | null = null

export function registerWorkerMetrics (registry: import('prom-client').Registry): void {
  workerRegistry = registry
}

/** The primary's own lines: how many workers the scrape summed, of how many. */
function workersGauge (workers: number, answered: number): string {
  return '# HELP gateway_workers Worker processes configured (workers: N)\n# TYPE gateway_workers gauge\n' +
    `gateway_workers ${workers}\n` +
    '# HELP gateway_workers_scraped Workers whose metrics this scrape sums (one starting or not answering within 3 s is left out)\n# TYPE gateway_workers_scraped gauge\n' +
    `gateway_workers_scraped ${answered}\n`
}

async function metricsAnswer (): Promise<AdminAnswer> {
  if (workerRegistry === null) return adminError('GW_ERR_NOT_READY', 'this worker has not started')
  return { status: 200, body: { metrics: await workerRegistry.getMetricsAsJSON() } }
}

export const isWorker = (): boolean => cluster.isWorker

/**
 * In a worker, before it starts: the config the primary last accepted (ConfigAsk above), located
 * under the real file's name, so its errors and /config name that file and a later SIGHUP reads
 * it. undefined outside a worker, or when the primary has no text to give: then the worker reads
 * the file, as a single process does.
 */
export async function acceptedConfig (file: string): Promise<{ generation: number, options: WorkerStart } | undefined> {
  if (!cluster.isWorker || process.send === undefined) return undefined
  const given = await new Promise<ConfigGiven | null>((resolve) => {
    const done = (value: ConfigGiven | null): void => {
      clearTimeout(timer)
      process.off('message', onMessage)
      resolve(value)
    }
    const onMessage = (msg: unknown): void => { if (isConfigGiven(msg)) done(msg) }
    const timer = setTimeout(() => done(null), CONFIG_ASK_TIMEOUT_MS)
    process.on('message', onMessage)
    const ask: ConfigAsk = { type: 'gateway:config-ask' }
    process.send?.(ask, undefined, undefined, (err: Error | null) => { if (err !== null) done(null) })
  })
  if (given === null || given.text === null) return undefined
  const { generation, startedWith, servedTls } = given
  const initial = { ...await loadConfigText(given.text, file), files: given.files }
  return {
    generation,
    options: {
      initial,
      initialGeneration: generation,
      ...(startedWith !== undefined ? { startedWith } : {}),
      ...(servedTls !== undefined ? { servedTls: { cert: Buffer.from(servedTls.cert, 'base64'), key: Buffer.from(servedTls.key, 'base64') } } : {})
    }
  }
}

/** What a worker starts its Gateway with, from its primary (acceptedConfig). */
export type WorkerStart = Pick<GatewayOptions, 'initial' | 'initialGeneration' | 'startedWith' | 'servedTls'>

/**
 * In a worker: the configs its primary accepts on each SIGHUP, handed to `apply` in order. The
 * one the worker started with (`startGeneration`) and older ones are skipped: a worker forked
 * during a check gets its verdict both as its start and as a reload. Returns the function that
 * stops it.
 */
export function followPrimaryReloads (startGeneration: number, apply: (source: ReloadSource) => void): () => void {
  if (!cluster.isWorker) return () => {}
  let newest = startGeneration
  const onMessage = (msg: unknown): void => {
    if (!isConfigGiven(msg) || msg.generation <= newest) return
    newest = msg.generation
    apply({ text: msg.text, files: msg.files, generation: msg.generation })
  }
  process.on('message', onMessage)
  return () => { process.off('message', onMessage) }
}
export const notifyReady = (): void => { process.send?.('gateway:ready') }

/**
 * In a worker: sends this process's live frame to the primary once a second (with the compiled
 * routes whenever the generation changed). Returns the function that stops it.
 */
export function sendLiveFrames (takeFrame: () => LiveFrame, health: () => Record<string, unknown>, routes: () => LiveMessage['routes'] | null): () => void {
  if (process.send === undefined) return () => {}
  let sentGeneration = -1
  const send = (): void => {
    const view = routes()
    const withRoutes = view !== null && view !== undefined && view.generation !== sentGeneration
    if (withRoutes) sentGeneration = view.generation
    const msg: LiveMessage = { type: 'gateway:live', frame: takeFrame(), health: health(), ...(withRoutes ? { routes: view } : {}) }
    process.send?.(msg)
  }
  // A first frame at once, ahead of the worker's ready message on the same channel: once /readyz
  // says ready, the primary's /routes has the routes (an admin page opened then showed none).
  send()
  const timer = setInterval(send, 1000)
  timer.unref()
  return () => clearInterval(timer)
}

/**
 * In a worker: answers the primary's admin API requests from this process's stores. Returns the
 * function that stops it.
 */
export function answerAdminRequests (ops: LimitsOps): () => void {
  if (process.send === undefined) return () => {}
  const onMessage = (msg: unknown): void => {
    if (!isAdminRequest(msg)) return
    const pending = msg.op === 'lookup' ? ops.lookup(msg.arg) : msg.op === 'reset' ? ops.reset(msg.arg, msg.by) : msg.op === 'metrics' ? metricsAnswer() : ops.consumer(msg.arg)
    pending.catch((err: unknown): AdminAnswer => adminError('GW_ERR_LIMITER_UNAVAILABLE', `the limit store did not answer: ${(err as Error).message}`)).then((answer) => {
      const reply: AdminReply = { type: 'gateway:admin-reply', id: msg.id, answer }
      // the channel may be closing (shutdown): the primary's wait is bounded anyway
      process.send?.(reply, undefined, undefined, () => {})
    }, () => {})
  }
  process.on('message', onMessage)
  return () => { process.off('message', onMessage) }
}
