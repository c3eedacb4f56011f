// gateway [start] [-c FILE] | validate | schema | reload | explain | help | --version | --help
import { parseArgs } from 'node:util'
import { isIP } from 'node:net'
import { readFileSync, writeFileSync, rmSync } from 'node:fs'
import { loadConfigFile, ConfigError, formatProblem } from './config/load.js'
import { gatewayJsonSchema, isHostPort } from './config/schema.js'
import { adminListen, adminToken } from './config/defaults.js'
import { checkRuntime, compileOffline } from './runtime.js'
import { Gateway, restartNeededMessage, type ReloadSource } from './server.js'
import type { LogLevel } from './log.js'
import { explain } from './explain.js'
import { LIMITS_HELP, limitsCommand } from './cli-limits.js'
import { adminClientUrl } from './admin/client-url.js'
import { holdEarlySignals } from './start-signals.js'
import { acceptedConfig, followPrimaryReloads, isWorker, withNamedFiles, notifyReady, registerWorkerMetrics, reportApplied, runPrimary } from './workers.js'
import { createLogDestination, createLogger } from './log.js'
import { notTheGateway } from './pid-file.js'
import { serveOnStrayRejections } from './stray-rejections.js'

const HELP = `Usage: gateway [command] [options]

Commands:
  start                 run the gateway (default)
  validate              check a config file and exit (0 = valid, 1 = located errors), like nginx -t
  schema                print the JSON Schema of gateway.yaml
  reload                validate, signal the running gateway, wait for its verdict (needs --pid-file)
  explain METHOD URL    show the route and every limit that would apply to a request
  limits get|reset      show or reset a client's limits on the running gateway (admin API)
  help [COMMAND]        print this help, or one command's

Options:
  -c, --config FILE     config file (default: $GATEWAY_CONFIG; ./gateway.yaml when unset or empty)
      --log-level LEVEL fatal|error|warn|info|debug|trace|silent (overrides log.level)
      --pid-file FILE   write (start) or read (reload) the process id
  -v, --version         print the version
  -h, --help            print this help (gateway COMMAND --help: that command's)

Exit codes: 0 ok, 1 invalid config, reload rejected or admin request refused, 2 usage error,
3 no running gateway (pid file missing or process gone), 4 admin listener unreachable or no
verdict or answer in time. Data goes to stdout; errors and warnings to stderr.
Signals: SIGHUP reloads the config; SIGTERM/SIGINT drain in-flight requests and exit 0.
`

const COMMAND_HELP: Record<string, string> = {
  start: `Usage: gateway start [-c FILE] [--log-level LEVEL] [--pid-file FILE]

Runs the gateway on the config file's listen and admin addresses. SIGHUP reloads the file
(a bad file is rejected and the running config keeps serving); SIGTERM/SIGINT drain and exit 0.
`,
  validate: `Usage: gateway validate [-c FILE]

Checks the file as the gateway would load it (schema, references, \${VAR} substitution).
Exit 0 and a summary when valid; exit 1 and one located error per line when not:
  gateway.yaml:14:7 routes[1].upstream: unknown upstream "backend2"
`,
  schema: `Usage: gateway schema

Prints the JSON Schema of gateway.yaml (what editors use for completion and checks).
`,
  reload: `Usage: gateway reload --pid-file FILE [-c FILE] [--admin HOST:PORT] [--timeout SECONDS]

1. validates the config file (exit 1 with located errors, nothing is signalled),
2. sends SIGHUP to the process in the pid file (exit 3 if missing or gone),
3. waits on the admin listener's /config (default: the file's "admin", or --admin) for the
   running gateway's verdict: exit 0 with the new generation, or exit 1 with the errors it
   reported (its previous config keeps serving). Exit 4 if no verdict within --timeout (10 s).
`,
  explain: `Usage: gateway explain [-c FILE] METHOD URL [--ip ADDR] [--user NAME] [--header K:V]...

Shows the route a request would take and every limit that would apply, without sending it.
  --ip ADDR      client address (default 127.0.0.1)
  --user NAME    user identity
  --header K:V   request header (repeatable)
`,
  // `gateway limits --help` printed it, `gateway help limits` answered: no command "limits"
  limits: LIMITS_HELP,
  help: `Usage: gateway help [COMMAND]
`
}

/** How many words each command takes after its name (explain: METHOD URL). */
const POSITIONALS: ReadonlyMap<string, number> = new Map([['start', 0], ['validate', 0], ['schema', 0], ['reload', 0], ['explain', 2]])

const LOG_LEVELS: readonly LogLevel[] = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']

const EXIT_INVALID = 1
const EXIT_USAGE = 2
const EXIT_NOT_RUNNING = 3
const EXIT_NO_VERDICT = 4

function version (): string {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
  return pkg.version
}

/** Runs one command; every failure is one line on stderr and an exit code, never a stack trace. */
export async function main (argv: string[]): Promise<number> {
  process.stdout.on('error', outputFailed)
  try {
    return await run(argv)
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code
    if (typeof code === 'string' && code.startsWith('ERR_PARSE_ARGS')) {
      process.stderr.write(`gateway: ${(err as Error).message} (gateway --help)\n`)
      return EXIT_USAGE
    }
    process.stderr.write(`gateway: ${(err as Error).message ?? String(err)}\n`)
    return 1
  }
}

/**
 * A write to stdout that fails (a full disk: `gateway schema > /dev/full`) is an 'error' event after
 * the command has returned: unhandled, it was a stack trace and exit 1. A reader that stopped reading
 * (`gateway schema | head -1`, EPIPE) is no failure of the command.
 */
function outputFailed (err: NodeJS.ErrnoException): void {
  if (err.code === 'EPIPE') return
  process.stderr.write(`gateway: cannot write to stdout: ${err.message}\n`)
  process.exitCode = EXIT_INVALID
}

async function run (argv: string[]): Promise<number> {
  // its own options (--route, --token): parsed by src/cli-limits.ts
  if (argv[0] === 'limits') return await limitsCommand(argv.slice(1))
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      config: { type: 'string', short: 'c' },
      'log-level': { type: 'string' },
      'pid-file': { type: 'string' },
      admin: { type: 'string' },
      timeout: { type: 'string' },
      ip: { type: 'string' },
      user: { type: 'string' },
      header: { type: 'string', multiple: true },
      version: { type: 'boolean', short: 'v' },
      help: { type: 'boolean', short: 'h' }
    }
  })
  const command = positionals[0] ?? 'start'
  if (command === 'help' || values.help === true) {
    const topic = command === 'help' ? positionals[1] : positionals[0]
    if (topic === undefined) {
      process.stdout.write(HELP)
      return 0
    }
    const text = COMMAND_HELP[topic]
    if (text === undefined) {
      process.stderr.write(`gateway: no command "${topic}" (gateway help lists them)\n`)
      return EXIT_USAGE
    }
    process.stdout.write(text)
    return 0
  }
  if (values.version === true) {
    process.stdout.write(version() + '\n')
    return 0
  }
  // `gateway validate prod.yaml` validated ./gateway.yaml and said "ok" (the file is -c FILE);
  // `gateway start prod.yaml` served ./gateway.yaml: a word no command takes is a usage error
  const takes = POSITIONALS.get(command)
  const stray = takes === undefined ? undefined : positionals[1 + takes]
  if (stray !== undefined) {
    const hint = takes === 0 && command !== 'schema' ? `; a config file is given with -c ${stray}` : ''
    process.stderr.write(`gateway ${command}: unexpected argument "${stray}"${hint} (gateway ${command} --help)\n`)
    return EXIT_USAGE
  }
  // set but empty (`Environment=GATEWAY_CONFIG=`, compose's `${GATEWAY_CONFIG}` unset on the host)
  // is unset, as `${VAR:-default}` reads it: it was the file "", reported as `:0:0: file not found`
  const configFile = values.config ?? (process.env.GATEWAY_CONFIG || 'gateway.yaml')

  switch (command) {
    case 'schema':
      process.stdout.write(JSON.stringify(gatewayJsonSchema(), null, 2) + '\n')
      return 0
    case 'validate':
      try {
        const loaded = await loadConfigFile(configFile)
        const warnings = await checkRuntime(loaded)
        for (const w of warnings) process.stderr.write(`warning: ${formatProblem(w)}\n`)
        process.stdout.write(`${configFile}: ok (${loaded.config.routes.length} routes, ${Object.keys(loaded.config.upstreams).length} upstreams${warnings.length > 0 ? `, ${warnings.length} warnings` : ''})\n`)
        return 0
      } catch (err) {
        return reportConfigError(err, configFile)
      }
    case 'reload':
      return reload(configFile, values['pid-file'], values.admin, values.timeout)
    case 'explain':
      try {
        const [method, url] = positionals.slice(1)
        if (method === undefined || url === undefined) {
          process.stderr.write(COMMAND_HELP.explain ?? '')
          return EXIT_USAGE
        }
        // both were taken silently: `--ip junk` explained a client "unknown", and `--header
        // x-api-key=k` (no colon) was dropped, the request explained as anonymous
        if (values.ip !== undefined && isIP(values.ip) === 0) {
          process.stderr.write(`gateway explain: --ip expects an IP address, got "${values.ip}"\n`)
          return EXIT_USAGE
        }
        const badHeader = (values.header ?? []).find(h => !(h.indexOf(':') > 0))
        if (badHeader !== undefined) {
          process.stderr.write(`gateway explain: --header expects NAME:VALUE, got "${badHeader}"\n`)
          return EXIT_USAGE
        }
        const loaded = await loadConfigFile(configFile)
        // the runtime the live gateway would compile from this file, so both decide alike
        const { runtime, close } = await compileOffline(loaded)
        try {
          process.stdout.write(await explain(runtime, { method, url, ip: values.ip ?? '127.0.0.1', user: values.user ?? null, headers: values.header ?? [] }))
        } finally {
          await close()
        }
        return 0
      } catch (err) {
        return reportConfigError(err)
      }
    case 'start': {
      const level = values['log-level']
      // pino's own refusal blamed the config file: "gateway.yaml: default level:junk must be included in custom levels"
      if (level !== undefined && !LOG_LEVELS.includes(level as LogLevel)) {
        process.stderr.write(`gateway: --log-level expects one of ${LOG_LEVELS.join(', ')}, got "${level}"\n`)
        return EXIT_USAGE
      }
      return start(configFile, level as LogLevel | undefined, values['pid-file'])
    }
    default:
      process.stderr.write(`gateway: unknown command "${command}"\n\n${HELP}`)
      return EXIT_USAGE
  }
}

function reportConfigError (err: unknown, file?: string): number {
  if (err instanceof ConfigError) process.stderr.write(err.message + '\n')
  else process.stderr.write(`${file !== undefined ? file + ': ' : ''}${(err as Error).message}\n`)
  return EXIT_INVALID
}

interface ReloadView {
  /** The process answering (the primary in workers mode); absent from a gateway older than the field. */
  readonly pid?: number
  readonly generation: number
  /** sha256 of the running config file's text, and that file as the gateway was started with it. */
  readonly hash?: string
  readonly file?: string
  readonly lastReload: { attempt: number, ok: boolean, generation: number, problems: string[], restartNeeded?: string[], workersFailed?: Array<{ pid?: number, problems: string[] }> } | null
  /** A reload running or queued, or (workers: N) a worker still applying it (absent from a gateway older than the field). */
  readonly reloadPending?: boolean
  /** workers: N: the ready workers that do not serve the accepted generation yet. */
  readonly workersApplying?: Array<number | null>
}

async function readReloadView (adminUrl: string, token: string | undefined): Promise<ReloadView> {
  // admin.reads: token asks for it on /config; sent also when reads are open, where it is ignored
  const res = await fetch(`${adminUrl}/config`, { signal: AbortSignal.timeout(2000), headers: token === undefined ? {} : { authorization: `Bearer ${token}` } })
  if (res.status === 401) throw new AnswerError(`${adminUrl}/config answered 401: its reads need the admin token (set $GATEWAY_ADMIN_TOKEN to the running gateway's)`)
  if (!res.ok) throw new AnswerError(`${adminUrl}/config answered ${res.status} ${res.statusText}`)
  const text = await res.text()
  try {
    return JSON.parse(text) as ReloadView
  } catch {
    throw new AnswerError(`${adminUrl}/config answered ${res.status} ${res.statusText}, not the gateway's JSON`)
  }
}

/** Something answered on the admin address, but not with the gateway's view: not "unreachable". */
class AnswerError extends Error {}

// Fire-and-forget SIGHUP left operators guessing: the gateway logs a rejected file and keeps the
// old config, so the CLI validates first, then waits for the running gateway's own verdict.
async function reload (configFile: string, pidFile: string | undefined, adminOption: string | undefined, timeoutOption: string | undefined): Promise<number> {
  if (pidFile === undefined) {
    process.stderr.write('gateway reload: --pid-file FILE is required (gateway reload --help)\n')
    return EXIT_USAGE
  }
  const timeoutMs = timeoutOption === undefined ? 10_000 : Number(timeoutOption) * 1000
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    process.stderr.write(`gateway reload: --timeout expects seconds, got "${timeoutOption}"\n`)
    return EXIT_USAGE
  }
  // a typo here signalled the gateway and then waited on "http://jun:NaN" (--admin junk)
  if (adminOption !== undefined && !isHostPort(adminOption)) {
    process.stderr.write(`gateway reload: --admin expects HOST:PORT, got "${adminOption}"\n`)
    return EXIT_USAGE
  }
  let pidText: string
  try {
    pidText = readFileSync(pidFile, 'utf8')
  } catch (err) {
    const reason = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'not found (is the gateway running with --pid-file?)' : (err as Error).message
    process.stderr.write(`gateway reload: pid file ${pidFile} ${reason}\n`)
    return EXIT_NOT_RUNNING
  }
  const pid = Number(pidText.trim())
  if (!Number.isInteger(pid) || pid <= 0) {
    process.stderr.write(`gateway reload: ${pidFile} holds no process id\n`)
    return EXIT_NOT_RUNNING
  }
  let loaded
  try {
    loaded = await loadConfigFile(configFile)
    await checkRuntime(loaded)
  } catch (err) {
    process.stderr.write(`gateway reload: not signalled, ${configFile} is invalid:\n`)
    return reportConfigError(err, configFile)
  }
  const adminUrl = adminClientUrl(adminOption ?? adminListen(loaded.config))
  const token = process.env.GATEWAY_ADMIN_TOKEN || (adminToken(loaded.config) ?? undefined)
  let before: ReloadView | null = null
  let unread = `the admin listener ${adminUrl} is unreachable: the outcome is unknown (use --admin HOST:PORT)`
  try {
    before = await readReloadView(adminUrl, token)
  } catch (err) {
    // reported below, after the signal: the reload itself does not need the admin listener. An
    // address that answered 500 or an HTML page was reported "unreachable", sending the operator
    // to check a listener that was there.
    if (err instanceof AnswerError) unread = `${err.message}: the outcome is unknown`
    else if ((err as Error).name === 'TimeoutError') unread = `the admin listener ${adminUrl} did not answer /config within 2 s: the outcome is unknown`
  }
  const stale = notTheGateway(pid, pidFile, typeof before?.pid === 'number' ? before.pid : null, adminUrl)
  if (stale !== null) {
    process.stderr.write(`gateway reload: ${stale}\n`)
    return EXIT_NOT_RUNNING
  }
  try {
    process.kill(pid, 'SIGHUP')
  } catch (err) {
    const reason = (err as NodeJS.ErrnoException).code === 'ESRCH' ? `no process ${pid} (stale pid file ${pidFile}?)` : (err as Error).message
    process.stderr.write(`gateway reload: ${reason}\n`)
    return EXIT_NOT_RUNNING
  }
  if (before === null) {
    process.stderr.write(`gateway reload: sent SIGHUP to ${pid}, but ${unread}\n`)
    return EXIT_NO_VERDICT
  }
  const attemptBefore = before.lastReload?.attempt ?? 0
  const deadline = Date.now() + timeoutMs
  let seen: ReloadView | null = null
  while (Date.now() < deadline) {
    await new Promise(resolve => setTimeout(resolve, 100))
    let view: ReloadView
    try {
      view = await readReloadView(adminUrl, token)
    } catch {
      continue
    }
    seen = view
    const last = view.lastReload
    // A reload already running when the signal came is followed by one more that reads the file
    // again: the verdict of the first one is not this file's.
    if (last === null || last.attempt <= attemptBefore || view.reloadPending === true) continue
    // The gateway re-reads its own file: `-c` naming another one was validated here, then reported
    // as reloaded while the gateway ran its file (or the file changed after it was validated here).
    if (last.ok && view.hash !== undefined && view.hash !== loaded.hash) {
      process.stderr.write(`gateway reload: the running gateway reloaded its own file${view.file === undefined ? '' : ` (${view.file})`}, not the text of ${configFile} validated here (another file, or one edited since): generation ${last.generation} runs that file\n`)
      return EXIT_INVALID
    }
    const failed = last.workersFailed ?? []
    if (last.ok && failed.length > 0) {
      const lines = failed.map(f => `worker ${f.pid ?? '?'}: ${f.problems.join('; ')}`)
      process.stderr.write(`gateway reload: generation ${last.generation} was accepted, but ${failed.length} worker(s) could not apply it and serve the config before it:\n${lines.join('\n')}\n`)
      return EXIT_INVALID
    }
    if (last.ok) {
      process.stdout.write(`reloaded: generation ${before.generation} -> ${last.generation} (pid ${pid})\n`)
      const restart = last.restartNeeded ?? []
      if (restart.length > 0) process.stderr.write(`gateway reload: ${restartNeededMessage(restart)}\n`)
      return 0
    }
    process.stderr.write(`gateway reload: the running gateway rejected ${configFile}; generation ${last.generation} keeps serving:\n${last.problems.join('\n')}\n`)
    return EXIT_INVALID
  }
  // accepted, but a worker never answered with it (stopped, its event loop blocked, compiling on)
  const accepted = seen?.lastReload
  const behind = seen?.workersApplying ?? []
  if (accepted != null && accepted.attempt > attemptBefore && accepted.ok && behind.length > 0) {
    process.stderr.write(`gateway reload: generation ${accepted.generation} was accepted, but worker ${behind.map(p => p ?? '?').join(', ')} has not applied it within ${timeoutMs / 1000} s (still compiling, or not answering: see /readyz); the others serve it\n`)
    return EXIT_NO_VERDICT
  }
  process.stderr.write(`gateway reload: sent SIGHUP to ${pid}, no verdict on ${adminUrl} within ${timeoutMs / 1000} s\n`)
  return EXIT_NO_VERDICT
}

/** Writes the process id; false, with one line on stderr, when the file cannot be written. */
function writePidFile (pidFile: string): boolean {
  try {
    writeFileSync(pidFile, `${process.pid}\n`)
    return true
  } catch (err) {
    process.stderr.write(`gateway: cannot write the pid file: ${(err as Error).message}\n`)
    return false
  }
}

/**
 * Reloads `gw`; in a worker, with the config its primary handed over (`source`), and tells the
 * primary what came of it: `gateway reload` waits for every worker's answer.
 */
function applyReload (gw: Gateway, source: ReloadSource | undefined): void {
  const fromPrimary = isWorker() && source !== undefined
  const refuse = (problems: string[]): void => { if (fromPrimary) reportApplied({ refused: { generation: source.generation, problems } }) }
  void gw.reload(source).then(result => {
    if (!fromPrimary) return
    if (result.ok) reportApplied({ serving: result.generation })
    else if (result.leaving === true) reportApplied({ leaving: true })
    else refuse(result.error.split('\n'))
  }, (err: unknown) => {
    // a bug, not the file: still an answer, or the primary would count this worker applying for good
    gw.logger.error({ err: (err as Error).message }, 'reload failed')
    refuse([(err as Error).message])
  })
}

async function start (configFile: string, logLevel: LogLevel | undefined, pidFile: string | undefined): Promise<number> {
  // a worker keeps the defaults until its own handlers below: its primary signals it
  const early = isWorker() ? null : holdEarlySignals()
  if (!isWorker()) {
    let loaded
    try {
      loaded = await loadConfigFile(configFile)
    } catch (err) {
      return reportConfigError(err)
    }
    // stopped while the file was read: nothing was opened, nothing is started
    if (early?.stop != null) return 0
    const workers = loaded.config.workers
    if (workers > 1) {
      // every check a worker makes, before a single one is forked: a file each worker would refuse is one
      // located error and exit 1, as in a single process, not N workers failing in a loop
      try {
        loaded = await withNamedFiles(loaded)
        await checkRuntime(loaded)
      } catch (err) {
        return reportConfigError(err, configFile)
      }
      if (early?.stop != null) return 0
      if (pidFile !== undefined && !writePidFile(pidFile)) return EXIT_INVALID
      // the primary shares stdout with its workers (src/log-sink.ts, sharedFd)
      const logger = createLogger(logLevel ?? loaded.config.log.level, createLogDestination(1, { sharedFd: true }))
      serveOnStrayRejections(logger)
      try {
        return await runPrimary({ configFile, loaded, workers, workerArgs: process.argv.slice(2), logger, logLevelFromFile: logLevel === undefined, early })
      } finally {
        if (pidFile !== undefined) rmSync(pidFile, { force: true })
      }
    }
  }
  // Installed before the start, which can take seconds (a slow Redis): Node's default for SIGHUP
  // ends the process. One that comes during the start reloads once started. A worker reloads
  // with what its primary hands it (followPrimaryReloads), never on its own SIGHUP (one sent to
  // the whole process group reaches it too).
  let gw: Gateway | null = null
  let reloadWhenStarted: { source: ReloadSource | undefined } | null = null
  const reload = (source?: ReloadSource): void => {
    if (gw === null) reloadWhenStarted = { source }
    else applyReload(gw, source)
  }
  process.on('SIGHUP', () => {
    if (!isWorker()) reload()
    else gw?.logger.info({ primary: process.ppid }, 'SIGHUP ignored: a worker reloads with the config its primary checked; signal the primary')
  })
  // one that came while the file was first read: the file may have changed since
  if (early?.takeReload() === true) reload()
  // SIGTERM and SIGINT during the start are held likewise and stop the gateway once started. With
  // no handler yet, PID 1 (the Dockerfile's exec form) does not die of them: the kernel dropped the
  // signal, `docker stop` during a start (a Redis that does not answer holds it 2 s) waited for its
  // SIGKILL, and the gateway served on once started. A worker keeps the default until it has
  // started: its primary stops it. `on`, not `once`: a second signal (the primary relays SIGTERM
  // to a worker that systemd or a Ctrl-C already signalled with its whole process group) must not
  // end the drain with Node's default action.
  let stopNow: ((signal: string) => void) | null = null
  let stopWhenStarted: string | null = null
  const onStop = (signal: string): void => {
    if (stopNow !== null) stopNow(signal)
    else stopWhenStarted ??= signal
  }
  const listenForStop = (): void => {
    process.on('SIGTERM', () => onStop('SIGTERM'))
    process.on('SIGINT', () => onStop('SIGINT'))
  }
  if (!isWorker()) listenForStop()
  const stoppedEarly = early?.takeStop() ?? null
  if (stoppedEarly !== null) return 0
  // the generation a worker starts with: its primary's number (1 for a single process)
  let startGeneration: number
  try {
    // a worker starts with the config its primary last accepted, not the file as edited since
    const initial = await acceptedConfig(configFile)
    startGeneration = initial?.generation ?? 1
    followPrimaryReloads(startGeneration, reload)
    gw = await Gateway.start({ configFile, ...(logLevel !== undefined ? { logLevel } : {}), adminListener: !isWorker(), ...initial?.options })
  } catch (err) {
    const code = reportConfigError(err, configFile)
    // a worker's IPC channel would keep it alive, not ready, for good: it exits, and the primary
    // starts another after a growing pause (a listen address taken until another process lets it
    // go). With its code: a disconnect ended it with 0, and the primary logged a failed start as
    // "code 0". stderr is a pipe or a file here, written synchronously.
    if (isWorker()) process.exit(code)
    return code
  }
  // set by the handlers above while the start was awaited (TypeScript cannot see that)
  const waiting = reloadWhenStarted as { source: ReloadSource | undefined } | null
  if (waiting !== null) applyReload(gw, waiting.source)
  const started = gw
  serveOnStrayRejections(gw.logger)
  if (isWorker()) {
    registerWorkerMetrics(gw.metrics.registry)
    // before its ready message, so the primary never counts it ready with an unknown generation
    reportApplied({ serving: startGeneration })
    notifyReady()
    pidFile = undefined // the primary owns the pid file
  }
  // a pid file that cannot be written (its directory missing, not writable) threw here after the
  // start: exit code 1 and a line on stderr, yet the gateway served on, its SIGTERM drain never
  // installed (SIGTERM killed it mid-request) and `gateway reload` unable to find it
  if (pidFile !== undefined && !writePidFile(pidFile)) {
    await gw.close()
    return EXIT_INVALID
  }
  return new Promise<number>(resolve => {
    let stopping = false
    const stop = (signal: string): void => {
      if (stopping) {
        started.logger.info({ signal }, 'already shutting down')
        return
      }
      stopping = true
      started.logger.info({ signal }, 'shutting down')
      started.close().then(() => {
        if (pidFile !== undefined) rmSync(pidFile, { force: true })
        // a worker's IPC channel to the primary would keep it alive after the drain
        if (isWorker()) process.disconnect?.()
        resolve(0)
      }, () => resolve(1))
    }
    stopNow = stop
    if (isWorker()) listenForStop()
    if (stopWhenStarted !== null) stop(stopWhenStarted)
  })
}
