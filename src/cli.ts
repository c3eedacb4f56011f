// gateway [start] [-c FILE] | validate | schema | reload | explain | --version | --help
import { parseArgs } from 'node:util'
import { readFileSync, writeFileSync, rmSync } from 'node:fs'
import { loadConfigFile, ConfigError } from './config/load.js'
import { gatewayJsonSchema } from './config/schema.js'
import { checkCompiles } from './config/compile.js'
import { Gateway } from './server.js'
import type { LogLevel } from './log.js'
import { explain } from './explain.js'
import { isWorker, notifyReady, registerWorkerMetrics, runPrimary } from './workers.js'
import { createLogger } from './log.js'

const HELP = `Usage: gateway [command] [options]

Commands:
  start                 run the gateway (default)
  validate              check a config file and exit (0 = valid, 1 = located errors), like nginx -t
  schema                print the JSON Schema of gateway.yaml
  reload                signal a running gateway to re-read its config (needs --pid-file)
  explain METHOD URL    show the route and every limit that would apply to a request

Options:
  -c, --config FILE     config file (default: $GATEWAY_CONFIG or ./gateway.yaml)
      --log-level LEVEL fatal|error|warn|info|debug|trace|silent (overrides log.level)
      --pid-file FILE   write (start) or read (reload) the process id
      --ip ADDR         explain: client address (default 127.0.0.1)
      --user NAME       explain: user identity
      --header K:V      explain: request header (repeatable)
  -v, --version         print the version
  -h, --help            print this help

Signals: SIGHUP reloads the config; SIGTERM/SIGINT drain in-flight requests and exit 0.
`

function version (): string {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
  return pkg.version
}

export async function main (argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      config: { type: 'string', short: 'c' },
      'log-level': { type: 'string' },
      'pid-file': { type: 'string' },
      ip: { type: 'string' },
      user: { type: 'string' },
      header: { type: 'string', multiple: true },
      version: { type: 'boolean', short: 'v' },
      help: { type: 'boolean', short: 'h' }
    }
  })
  if (values.help === true) {
    process.stdout.write(HELP)
    return 0
  }
  if (values.version === true) {
    process.stdout.write(version() + '\n')
    return 0
  }
  const command = positionals[0] ?? 'start'
  const configFile = values.config ?? process.env.GATEWAY_CONFIG ?? 'gateway.yaml'

  switch (command) {
    case 'schema':
      process.stdout.write(JSON.stringify(gatewayJsonSchema(), null, 2) + '\n')
      return 0
    case 'validate':
      try {
        const loaded = await loadConfigFile(configFile)
        await checkCompiles(loaded.config)
        process.stdout.write(`${configFile}: ok (${loaded.config.routes.length} routes, ${Object.keys(loaded.config.upstreams).length} upstreams)\n`)
        return 0
      } catch (err) {
        return reportConfigError(err, configFile)
      }
    case 'reload': {
      const pidFile = values['pid-file']
      if (pidFile === undefined) {
        process.stderr.write('gateway reload: --pid-file FILE is required\n')
        return 2
      }
      const pid = Number(readFileSync(pidFile, 'utf8').trim())
      if (!Number.isInteger(pid) || pid <= 0) {
        process.stderr.write(`gateway reload: ${pidFile} holds no process id\n`)
        return 1
      }
      process.kill(pid, 'SIGHUP')
      process.stdout.write(`sent SIGHUP to ${pid}\n`)
      return 0
    }
    case 'explain':
      try {
        const [method, url] = positionals.slice(1)
        if (method === undefined || url === undefined) {
          process.stderr.write('usage: gateway explain -c FILE METHOD URL [--ip A] [--user U] [--header K:V]\n')
          return 2
        }
        const loaded = await loadConfigFile(configFile)
        process.stdout.write(await explain(loaded.config, { method, url, ip: values.ip ?? '127.0.0.1', user: values.user ?? null, headers: values.header ?? [] }))
        return 0
      } catch (err) {
        return reportConfigError(err)
      }
    case 'start':
      return start(configFile, values['log-level'] as LogLevel | undefined, values['pid-file'])
    default:
      process.stderr.write(`gateway: unknown command "${command}"\n\n${HELP}`)
      return 2
  }
}

function reportConfigError (err: unknown, file?: string): number {
  if (err instanceof ConfigError) process.stderr.write(err.message + '\n')
  else process.stderr.write(`${file !== undefined ? file + ': ' : ''}${(err as Error).message}\n`)
  return 1
}

async function start (configFile: string, logLevel: LogLevel | undefined, pidFile: string | undefined): Promise<number> {
  if (!isWorker()) {
    let loaded
    try {
      loaded = await loadConfigFile(configFile)
    } catch (err) {
      return reportConfigError(err)
    }
    const workers = loaded.config.workers ?? 1
    if (workers > 1) {
      if (pidFile !== undefined) writeFileSync(pidFile, `${process.pid}\n`)
      const logger = createLogger(logLevel ?? loaded.config.log?.level ?? 'info')
      const code = await runPrimary({ configFile, loaded, workers, workerArgs: process.argv.slice(2), logger })
      if (pidFile !== undefined) rmSync(pidFile, { force: true })
      return code
    }
  }
  let gw: Gateway
  try {
    gw = await Gateway.start({ configFile, ...(logLevel !== undefined ? { logLevel } : {}), adminListener: !isWorker() })
  } catch (err) {
    return reportConfigError(err, configFile)
  }
  if (isWorker()) {
    registerWorkerMetrics(gw.metrics.registry)
    notifyReady()
    pidFile = undefined // the primary owns the pid file
  }
  if (pidFile !== undefined) writeFileSync(pidFile, `${process.pid}\n`)
  process.on('SIGHUP', () => { void gw.reload() })
  return new Promise<number>(resolve => {
    const stop = (signal: string): void => {
      gw.logger.info({ signal }, 'shutting down')
      gw.close().then(() => {
        if (pidFile !== undefined) rmSync(pidFile, { force: true })
        // a worker's IPC channel to the primary would keep it alive after the drain
        if (isWorker()) process.disconnect?.()
        resolve(0)
      }, () => resolve(1))
    }
    process.once('SIGTERM', () => stop('SIGTERM'))
    process.once('SIGINT', () => stop('SIGINT'))
  })
}
