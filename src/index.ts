// The package's entry point: a gateway inside an existing Node process.
//
//   import { startGateway, loadConfig } from 'edge-gateway'
//   const gw = await startGateway({ configFile: 'gateway.yaml' })
//   gw.addresses.listen.port; await gw.reload(); await gw.close()
//
// The same Gateway the CLI runs (src/server.ts): same config file, same reload and drain rules.
// It installs no signal handlers: the embedding process decides what SIGHUP and SIGTERM mean.
import { loadConfigFile, ConfigError, formatProblem, type ConfigProblem, type LoadedConfig } from './config/load.js'
import { checkRuntime } from './runtime.js'
import { Gateway, splitHostPort, type ReloadResult } from './server.js'
import { adminListen } from './config/defaults.js'
import type { GatewayConfig } from './config/schema.js'
import type { ResolvedConfig } from './config/defaults.js'
import type { Logger, LogLevel } from './log.js'

export { ConfigError, formatProblem }
export type { ConfigProblem, GatewayConfig, LoadedConfig, Logger, LogLevel, ReloadResult, ResolvedConfig }

export interface StartOptions {
  /** Path of the gateway.yaml; `reload()` re-reads it. */
  readonly configFile: string
  /** Overrides `log.level` from the file. */
  readonly logLevel?: LogLevel
  /** A pino logger to write to instead of stdout. */
  readonly logger?: Logger
  /** What `${VAR}` in the file resolves against; default process.env. */
  readonly env?: NodeJS.ProcessEnv
}

export interface ListenAddress {
  /** The host the socket is bound to, as configured (0.0.0.0 for every interface). */
  readonly host: string
  /** The bound port (the real one when the file says port 0). */
  readonly port: number
}

/** A running gateway. */
export interface GatewayHandle {
  readonly addresses: { readonly listen: ListenAddress, readonly admin: ListenAddress }
  /** `http(s)://127.0.0.1:PORT` of the public listener and `http://127.0.0.1:PORT` of the admin one. */
  readonly url: string
  readonly adminUrl: string
  /** Generation of the live configuration (1 at start, +1 per accepted reload). */
  readonly generation: number
  /**
   * Re-reads the config file: `{ ok: true, generation }` once the new config serves, or
   * `{ ok: false, error }` with the located problems while the previous config keeps serving.
   */
  reload (): Promise<ReloadResult>
  /** Stops accepting, drains in-flight requests (server.shutdownTimeout), closes Redis and pools. */
  close (): Promise<void>
}

/**
 * Reads and validates a config file as the gateway would: schema, `${VAR}`, references, and every
 * check of compiling the runtime (routes, identity, trusted proxies, header rules, TLS files, the
 * API key file), without opening a connection. Throws ConfigError, whose `problems` are located
 * (`file:line:col key.path`). `config` comes back with every default written in.
 */
export async function loadConfig (file: string, env: NodeJS.ProcessEnv = process.env): Promise<LoadedConfig> {
  const loaded = await loadConfigFile(file, env)
  await checkRuntime(loaded)
  return loaded
}

/** Starts both listeners; throws ConfigError for an invalid file, or the listen error (EADDRINUSE). */
export async function startGateway (options: StartOptions | string): Promise<GatewayHandle> {
  const opts: StartOptions = typeof options === 'string' ? { configFile: options } : options
  const gw = await Gateway.start({
    configFile: opts.configFile,
    ...(opts.logLevel !== undefined ? { logLevel: opts.logLevel } : {}),
    ...(opts.logger !== undefined ? { logger: opts.logger } : {}),
    ...(opts.env !== undefined ? { env: opts.env } : {})
  })
  // the addresses the sockets were bound with: a reload that edits `listen` needs a restart
  const config = (gw.runtime as NonNullable<Gateway['runtime']>).config
  const addresses = Object.freeze({
    listen: Object.freeze({ host: splitHostPort(config.listen).host, port: gw.port }),
    admin: Object.freeze({ host: splitHostPort(adminListen(config)).host, port: gw.adminPort })
  })
  return Object.freeze({
    addresses,
    url: gw.url,
    adminUrl: gw.adminUrl,
    get generation () { return gw.runtime?.generation ?? 0 },
    reload: () => gw.reload(),
    close: () => gw.close()
  })
}
