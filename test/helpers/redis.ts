// Real redis-server processes for tests: one server, or a 3-master cluster, on free ports in
// temporary directories inside the repository (.tap/fixtures). Every start takes the test and
// registers stop() as its teardown; stop() may also be called earlier (it is idempotent).
//
// No leaked processes, however the test ends: each redis-server runs under a tiny sh watchdog
// that holds a pipe from this process and SIGKILLs the server when the pipe closes, which the
// kernel does when this process exits for any reason, SIGKILL included.
import { spawn, execFile, execFileSync, type ChildProcess } from 'node:child_process'
import { readFileSync, writeFileSync } from 'node:fs'
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import { connect, createServer } from 'node:net'
import { connect as tlsConnect, type ConnectionOptions } from 'node:tls'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { Redis } from 'ioredis'
import { FIXTURES, type Teardown } from './teardown.js'

export interface RedisServer {
  readonly port: number
  readonly url: string
  /** A plain client (offline queue on: convenient for reading keys in tests); closed by stop(). */
  client(): Redis
  /** SIGKILL the server, to simulate a crash. */
  kill(): Promise<void>
  /** Start it again on the same port (after kill()). */
  restart(): Promise<void>
  /** SIGSTOP the server: its sockets stay open and nothing answers (a frozen host). */
  freeze(): void
  stop(): Promise<void>
}

export interface RedisSentinel {
  readonly port: number
  stop(): Promise<void>
}

/** A sentinel that can be taken down and started again on its port, with its files (and what it learnt) kept. */
export interface RestartableSentinel extends RedisSentinel {
  down(): Promise<void>
  up(): Promise<void>
}

export interface RedisClusterServers {
  readonly ports: number[]
  readonly urls: string[]
  stop(): Promise<void>
}

// The watchdog. `exec 3<&0` keeps the pipe: sh gives background jobs /dev/null as stdin.
const WATCHDOG = [
  'exec 3<&0',
  'redis-server "$@" </dev/null 3<&- &',
  'rpid=$!',
  'echo "$rpid"',
  '( cat <&3 >/dev/null; kill -9 "$rpid" 2>/dev/null ) &',
  'wpid=$!',
  'wait "$rpid"',
  'status=$?',
  'kill "$wpid" 2>/dev/null',
  'exit "$status"'
].join('\n')

const livePids = new Set<number>()
process.once('exit', () => {
  for (const pid of livePids) {
    try { process.kill(pid, 'SIGKILL') } catch { /* already gone */ }
  }
})

interface Running {
  readonly watchdog: ChildProcess
  readonly pid: number
  readonly exited: Promise<void>
}

function launch (args: readonly string[]): Promise<Running> {
  // stderr ignored: sh reports "Killed" for the crashes tests cause; the server logs to a file.
  const watchdog = spawn('sh', ['-c', WATCHDOG, 'sh', ...args], { stdio: ['pipe', 'pipe', 'ignore'] })
  const exited = new Promise<void>((resolve) => watchdog.once('exit', () => resolve()))
  return new Promise((resolve, reject) => {
    let out = ''
    watchdog.once('error', reject)
    watchdog.stdout?.on('data', (d: Buffer) => {
      out += d.toString()
      const line = out.split('\n')[0]
      if (out.includes('\n') && line !== undefined) {
        const pid = Number(line)
        livePids.add(pid)
        void exited.then(() => livePids.delete(pid))
        resolve({ watchdog, pid, exited })
      }
    })
  })
}

async function canBind (port: number): Promise<boolean> {
  return await new Promise((resolve) => {
    const server = createServer()
    server.once('error', () => resolve(false))
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)))
  })
}

/** A port that is free now (and, for cluster nodes, whose bus port +10000 is free too). */
async function freePort (withBus: boolean): Promise<number> {
  for (;;) {
    const port = 20000 + Math.floor(Math.random() * 30000)
    if (await canBind(port) && (!withBus || await canBind(port + 10000))) return port
  }
}

/**
 * Sends one inline command over a raw socket and returns the raw reply ('' on failure); over TLS
 * with `tls` (for a server that has no plain port).
 */
async function rawCommand (port: number, command: string, tls?: ConnectionOptions): Promise<string> {
  return await new Promise((resolve) => {
    const sock = tls === undefined ? connect(port, '127.0.0.1') : tlsConnect({ ...tls, port, host: '127.0.0.1' })
    let data = ''
    const done = (reply: string): void => { sock.destroy(); resolve(reply) }
    sock.setTimeout(1000, () => done(''))
    sock.on('error', () => done(''))
    sock.on(tls === undefined ? 'connect' : 'secureConnect', () => sock.write(`${command}\r\n`))
    sock.on('data', (d: Buffer) => {
      data += d.toString()
      const bulk = /^\$(\d+)\r\n/.exec(data)
      if (bulk !== null) {
        if (data.length >= bulk[0].length + Number(bulk[1]) + 2) done(data.slice(bulk[0].length, bulk[0].length + Number(bulk[1])))
      } else if (data.endsWith('\r\n')) {
        done(data)
      }
    })
  })
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

async function waitFor (what: string, probe: () => Promise<boolean>, timeoutMs: number, gone?: Promise<void>): Promise<void> {
  let exited = false
  void gone?.then(() => { exited = true })
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await probe()) return
    if (exited) throw new Error(`${what}: redis-server exited`)
    await sleep(20)
  }
  throw new Error(`${what}: timed out after ${timeoutMs} ms`)
}

interface Node {
  readonly port: number
  readonly dir: string
  running: Running | null
  start(): Promise<void>
  kill(): Promise<void>
  stop(): Promise<void>
}

/**
 * `tls`: the node serves TLS alone (port 0), on the port it is known by, and is asked over TLS
 * with these settings whether it is up.
 */
async function startNode (extraArgs: (dir: string) => string[], withBus: boolean, config?: string, tls?: ConnectionOptions): Promise<Node> {
  await mkdir(FIXTURES, { recursive: true })
  const dir = await mkdtemp(join(FIXTURES, 'gw-redis-'))
  // A config file comes first on the command line (sentinel mode needs one it can rewrite).
  const leading: string[] = []
  if (config !== undefined) {
    await writeFile(join(dir, 'redis.conf'), config)
    leading.push(join(dir, 'redis.conf'))
  }
  for (let attempt = 1; ; attempt++) {
    const port = await freePort(withBus)
    const ports = tls === undefined ? ['--port', String(port)] : ['--port', '0', '--tls-port', String(port)]
    const args = [...leading, ...ports, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
      '--dir', dir, '--logfile', join(dir, 'redis.log'), ...extraArgs(dir)]
    const node: Node = {
      port,
      dir,
      running: null,
      async start () {
        const running = await launch(args)
        node.running = running
        try {
          // A password-protected server answers -NOAUTH: it is up all the same.
          await waitFor(`redis-server on ${port}`, async () => /^(\+PONG|-NOAUTH)/.test(await rawCommand(port, 'PING', tls)), 10_000, running.exited)
        } catch (err) {
          const log = await readFile(join(dir, 'redis.log'), 'utf8').catch(() => '')
          throw new Error(`${(err as Error).message}\n${log.slice(-2000)}`, { cause: err })
        }
      },
      async kill () {
        const running = node.running
        if (running === null) return
        node.running = null
        try { process.kill(running.pid, 'SIGKILL') } catch { /* already gone */ }
        await running.exited
        running.watchdog.stdin?.end()
      },
      async stop () {
        const running = node.running
        if (running === null) return
        node.running = null
        // a frozen server (freeze) acts on its SIGTERM only once continued
        try { process.kill(running.pid, 'SIGCONT') } catch { /* already gone */ }
        try { process.kill(running.pid, 'SIGTERM') } catch { /* already gone */ }
        const timer = setTimeout(() => {
          try { process.kill(running.pid, 'SIGKILL') } catch { /* already gone */ }
        }, 5000)
        await running.exited
        clearTimeout(timer)
        running.watchdog.stdin?.end()
      }
    }
    try {
      await node.start()
      return node
    } catch (err) {
      // Most likely another test grabbed the port between the probe and redis binding it.
      await node.kill()
      if (attempt >= 5) {
        await rm(dir, { recursive: true, force: true })
        throw err
      }
    }
  }
}

async function stopNode (node: Node): Promise<void> {
  await node.stop()
  await rm(node.dir, { recursive: true, force: true })
}

export interface RedisOptions {
  /** Extra redis-server options, e.g. ['--requirepass', 'secret'] (client() then uses `password`). */
  readonly args?: readonly string[]
  readonly password?: string
}

const isTest = (value: unknown): value is Teardown =>
  typeof value === 'object' && value !== null && typeof (value as Partial<Teardown>).teardown === 'function'

/**
 * A redis-server, stopped at the end of `t`.
 *
 * A gateway test that counts exact admissions through it sets `redis: { ..., timeout: 2s }`: a call
 * past the default 50 ms bound (a loaded CI machine) is decided by the fallback, which charges each
 * instance its share and what Redis may also have counted, so fewer are admitted than the test
 * counts on (the README's "can only under-admit").
 */
export async function startRedis (t: Teardown, options?: RedisOptions): Promise<RedisServer>
/** @deprecated Pass the test, `startRedis(t)`, which registers its own teardown. */
export async function startRedis (options?: RedisOptions): Promise<RedisServer>
export async function startRedis (first?: Teardown | RedisOptions, second?: RedisOptions): Promise<RedisServer> {
  const t = isTest(first) ? first : null
  const options = (isTest(first) ? second : first) ?? {}
  const node = await startNode(() => [...(options.args ?? [])], false)
  const clients: Redis[] = []
  const server: RedisServer = {
    port: node.port,
    url: `redis://127.0.0.1:${node.port}`,
    client () {
      const client = new Redis({ host: '127.0.0.1', port: node.port, maxRetriesPerRequest: 1, ...(options.password !== undefined ? { password: options.password } : {}) })
      // Tests kill the server on purpose: connection errors are expected, not crashes.
      client.on('error', () => {})
      clients.push(client)
      return client
    },
    kill: () => node.kill(),
    freeze () {
      if (node.running !== null) process.kill(node.running.pid, 'SIGSTOP')
    },
    async restart () {
      await node.kill()
      await node.start()
    },
    async stop () {
      for (const c of clients.splice(0)) c.disconnect()
      await node.stop()
      await rm(node.dir, { recursive: true, force: true })
    }
  }
  t?.teardown(() => server.stop())
  return server
}

/**
 * A plain connection to one node (a Cluster master too: it follows no redirection), its errors
 * ignored, closed at the end of `t`.
 */
export function nodeClient (t: Teardown, port: number): Redis {
  const client = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0 })
  client.on('error', () => {})
  t.teardown(() => client.disconnect())
  return client
}

/**
 * Makes `redis` answer BUSY to every other call (a script of another client's running past
 * busy-reply-threshold) until the returned function ends it with SCRIPT KILL.
 */
export async function busyRedis (t: Teardown, redis: Pick<RedisServer, 'client'>): Promise<() => Promise<void>> {
  const control = redis.client()
  await control.config('SET', 'busy-reply-threshold', '20')
  const busy = redis.client()
  t.teardown(() => busy.disconnect())
  const running = busy.eval('while true do end', 0).catch(() => {})
  await waitFor('Redis answers BUSY', async () => await control.ping().then(() => false, (err: Error) => err.message.startsWith('BUSY')), 3000)
  return async () => {
    await control.script('KILL')
    await running
  }
}

/** A Sentinel watching the master on `masterPort` under the name `name` (quorum 1). */
export async function startRedisSentinel (t: Teardown, masterPort: number, name: string, password?: string): Promise<RedisSentinel> {
  const config = `sentinel monitor ${name} 127.0.0.1 ${masterPort} 1\n` + (password !== undefined ? `sentinel auth-pass ${name} ${password}\n` : '')
  const node = await startNode(() => ['--sentinel'], false, config)
  t.teardown(() => stopNode(node))
  await waitFor('sentinel sees its master', async () =>
    (await rawCommand(node.port, `SENTINEL get-master-addr-by-name ${name}`)).includes(String(masterPort)), 10_000, node.running?.exited)
  return { port: node.port, stop: () => stopNode(node) }
}

const execFileAsync = promisify(execFile)

/** Waits until each of three nodes sees the cluster whole: every slot served, every node known. */
async function clusterFormed (nodes: readonly Node[]): Promise<void> {
  for (const n of nodes) {
    await waitFor(`cluster node ${n.port}`, async () => {
      const info = await rawCommand(n.port, 'CLUSTER INFO')
      return info.includes('cluster_state:ok') && info.includes('cluster_known_nodes:3') && info.includes('cluster_slots_ok:16384')
    }, 30_000, n.running?.exited)
  }
}

/**
 * A real cluster: three masters, no replicas, all 16384 slots assigned; stopped at the end of `t`.
 * `args` go to each node's command line (`--enable-debug-command yes`, say).
 */
export async function startRedisCluster (t: Teardown, options?: { args?: string[] }): Promise<RedisClusterServers>
/** @deprecated Pass the test, `startRedisCluster(t)`, which registers its own teardown. */
export async function startRedisCluster (): Promise<RedisClusterServers>
export async function startRedisCluster (t?: Teardown, options: { args?: string[] } = {}): Promise<RedisClusterServers> {
  const nodes: Node[] = []
  const stop = async (): Promise<void> => { await Promise.all(nodes.map(stopNode)) }
  t?.teardown(stop)
  try {
    for (let i = 0; i < 3; i++) {
      nodes.push(await startNode((dir) => ['--cluster-enabled', 'yes', '--cluster-config-file', join(dir, 'nodes.conf'),
        '--cluster-node-timeout', '5000', ...(options.args ?? [])], true))
    }
    await execFileAsync('redis-cli', ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`),
      '--cluster-replicas', '0', '--cluster-yes'], { timeout: 30_000 })
    await clusterFormed(nodes)
  } catch (err) {
    await stop()
    throw err
  }
  const ports = nodes.map((n) => n.port)
  return { ports, urls: ports.map((p) => `redis://127.0.0.1:${p}`), stop }
}

/** A redis-server replicating `masterPort` (for Sentinel failover); `kill()` crashes it. */
export async function startRedisReplica (t: Teardown, masterPort: number): Promise<RedisServer> {
  return await startRedis(t, { args: ['--replicaof', '127.0.0.1', String(masterPort)] })
}

/**
 * A Sentinel that fails over fast (for fault tests): the master is declared down after
 * `downAfterMs` without answers, quorum 1.
 */
export async function startFastSentinel (t: Teardown, masterPort: number, name: string, downAfterMs = 1000): Promise<RestartableSentinel> {
  const config = `sentinel monitor ${name} 127.0.0.1 ${masterPort} 1\n` +
    `sentinel down-after-milliseconds ${name} ${downAfterMs}\n` +
    `sentinel failover-timeout ${name} 10000\n` +
    `sentinel parallel-syncs ${name} 1\n`
  const node = await startNode(() => ['--sentinel'], false, config)
  t.teardown(() => stopNode(node))
  await waitFor('sentinel sees its master', async () =>
    (await rawCommand(node.port, `SENTINEL get-master-addr-by-name ${name}`)).includes(String(masterPort)), 10_000, node.running?.exited)
  return { port: node.port, stop: () => stopNode(node), down: () => node.stop(), up: () => node.start() }
}

export interface ReplicatedCluster extends RedisClusterServers {
  /** Ports of the current masters (from CLUSTER NODES). */
  masters(): Promise<number[]>
  /** SIGKILL the node on `port`. */
  kill(port: number): Promise<void>
  /** The port of the node that holds `slot` as master right now. */
  masterOf(slot: number): Promise<number | null>
}

/** A real cluster of three masters each with one replica (3+3); `nodeTimeoutMs` sets failover speed. */
export async function startReplicatedCluster (t: Teardown, nodeTimeoutMs = 2000): Promise<ReplicatedCluster> {
  const nodes: Node[] = []
  const stop = async (): Promise<void> => { await Promise.all(nodes.map(stopNode)) }
  t.teardown(stop)
  try {
    for (let i = 0; i < 6; i++) {
      nodes.push(await startNode((dir) => ['--cluster-enabled', 'yes', '--cluster-config-file', join(dir, 'nodes.conf'),
        '--cluster-node-timeout', String(nodeTimeoutMs)], true))
    }
    await execFileAsync('redis-cli', ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`),
      '--cluster-replicas', '1', '--cluster-yes'], { timeout: 60_000 })
    for (const n of nodes) {
      await waitFor(`cluster node ${n.port}`, async () => {
        const info = await rawCommand(n.port, 'CLUSTER INFO')
        return info.includes('cluster_state:ok') && info.includes('cluster_known_nodes:6') && info.includes('cluster_slots_ok:16384')
      }, 60_000, n.running?.exited)
    }
    // A replica that never synced refuses to fail over ("data too old"): wait for every link.
    await waitFor('replicas in sync', async () => {
      let synced = 0
      for (const n of nodes) {
        const info = await rawCommand(n.port, 'INFO replication')
        if (info.includes('role:slave') && info.includes('master_link_status:up')) synced++
      }
      return synced === 3
    }, 60_000)
  } catch (err) {
    await stop()
    throw err
  }
  const ports = nodes.map((n) => n.port)
  const alive = (): Node[] => nodes.filter((n) => n.running !== null)
  const clusterNodes = async (): Promise<string> => {
    // rawCommand gives '' when a node is slow to answer (a loaded machine): ask again
    for (let attempt = 0; attempt < 20; attempt++) {
      for (const n of alive()) {
        const reply = await rawCommand(n.port, 'CLUSTER NODES')
        if (reply.includes('myself')) return reply
      }
      await sleep(100)
    }
    return ''
  }
  return {
    ports,
    urls: ports.map((p) => `redis://127.0.0.1:${p}`),
    stop,
    async masters () {
      // masters that serve slots: right after creation, a node's view may still show a replica
      // whose CLUSTER REPLICATE has not reached it by gossip as a master without slots
      return (await clusterNodes()).split('\n')
        .filter((l) => /[ ,]master[ ,]/.test(l) && !/[ ,]fail[ ,?]/.test(l) && l.trim().split(' ').length > 8)
        .map((l) => Number(/:(\d+)@/.exec(l)?.[1]))
    },
    async kill (port) {
      const node = nodes.find((n) => n.port === port)
      await node?.kill()
    },
    async masterOf (slot) {
      for (const line of (await clusterNodes()).split('\n')) {
        if (!/[ ,]master[ ,]/.test(line) || /[ ,]fail[ ,?]/.test(line)) continue
        const ranges = line.split(' ').slice(8)
        for (const r of ranges) {
          const [a, b] = r.split('-').map(Number)
          if (a !== undefined && slot >= a && slot <= (b ?? a)) return Number(/:(\d+)@/.exec(line)?.[1])
        }
      }
      return null
    }
  }
}

/** One command's counts in INFO commandstats since the server started or its last CONFIG RESETSTAT. */
export interface CommandStat {
  /** Executed (a call that failed while running, e.g. "Function not found", is one). */
  readonly calls: number
  /** Refused before running (NOPERM, OOM, a wrong argument count): not in `calls`. */
  readonly rejected: number
  /** Executed and answered with an error. */
  readonly failed: number
}

const NO_STAT: CommandStat = Object.freeze({ calls: 0, rejected: 0, failed: 0 })

/**
 * INFO commandstats by command, named as Redis names them (`fcall`, `function|load`); a command
 * never called reads as zeros. Every test that counts Redis's commands reads them here.
 */
export async function commandStats (client: Redis): Promise<(command: string) => CommandStat> {
  const stats = new Map<string, CommandStat>()
  for (const m of (await client.info('commandstats')).matchAll(/^cmdstat_([^:]+):(.*)$/gm)) {
    const fields = new Map((m[2] ?? '').trim().split(',').map((f) => f.split('=') as [string, string]))
    stats.set(m[1] as string, { calls: Number(fields.get('calls') ?? 0), rejected: Number(fields.get('rejected_calls') ?? 0), failed: Number(fields.get('failed_calls') ?? 0) })
  }
  return (command) => stats.get(command) ?? NO_STAT
}

/** Calls executed so far of the commands named, summed (INFO commandstats). */
export async function commandCalls (client: Redis, ...commands: string[]): Promise<number> {
  const stat = await commandStats(client)
  return commands.reduce((n, command) => n + stat(command).calls, 0)
}

/** Script calls of every kind executed so far: FCALL, and EVALSHA or EVAL (before the function library is loaded, or where it is refused). */
export async function scriptCalls (client: Redis): Promise<number> {
  return await commandCalls(client, 'fcall', 'fcall_ro', 'evalsha', 'evalsha_ro', 'eval', 'eval_ro')
}

/** FCALL's count in INFO commandstats: calls and failed calls (a "Function not found" is one). */
export async function fcallStats (client: Redis): Promise<{ calls: number, failed: number }> {
  const { calls, failed } = (await commandStats(client))('fcall')
  return { calls, failed }
}

/** The function libraries a server holds, by name (FUNCTION LIST). */
export async function functionLibraries (client: Redis): Promise<string[]> {
  const list = await client.call('FUNCTION', 'LIST') as unknown[][]
  // each library is a flat [key, value, ...] array: library_name is its second element
  return list.map((lib) => String(lib[lib.indexOf('library_name') + 1]))
}

/** PEM files for a Redis over TLS: a CA, a server certificate it signed, a client pair it signed. */
export interface RedisTlsCerts {
  readonly ca: string
  readonly serverCert: string
  readonly serverKey: string
  readonly clientCert: string
  readonly clientKey: string
}

/**
 * A private CA named `name` (a test makes two to have a CA that signed nothing the server shows)
 * and certificates it signed: the server's for 127.0.0.1 and localhost, and a client's. EC P-256,
 * one day, made by openssl like the other tests' certificates.
 */
export function makeRedisTlsCerts (dir: string, name = 'ca'): RedisTlsCerts {
  const file = (what: string): string => join(dir, `${name}-${what}.pem`)
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
  const openssl = (args: string[]): void => { execFileSync('openssl', args, { stdio: 'ignore' }) }
  openssl(['req', '-x509', ...ec, '-keyout', file('key'), '-out', file('cert'), '-days', '1', '-subj', `/CN=gateway test ${name}`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'])
  const signed = (who: string, ext: string): void => {
    openssl(['req', ...ec, '-keyout', file(`${who}-key`), '-out', file(`${who}-csr`), '-subj', `/CN=${who}`])
    const extFile = file(`${who}-ext`)
    writeFileSync(extFile, ext)
    openssl(['x509', '-req', '-in', file(`${who}-csr`), '-CA', file('cert'), '-CAkey', file('key'), '-set_serial', String(Date.now()),
      '-days', '1', '-out', file(`${who}-cert`), '-extfile', extFile])
  }
  // clientAuth too: with tls-cluster yes a node shows this certificate when it connects to its peers
  signed('server', 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n')
  signed('client', 'extendedKeyUsage=clientAuth\n')
  return { ca: file('cert'), serverCert: file('server-cert'), serverKey: file('server-key'), clientCert: file('client-cert'), clientKey: file('client-key') }
}

export interface TlsRedisServer extends RedisServer {
  /** The TLS port; `port` is a plain one, for the helper's own readiness checks. */
  readonly tlsPort: number
  readonly tlsUrl: string
  /** A client over TLS that trusts `certs.ca` (and shows the client certificate). */
  tlsClient(): Redis
}

/**
 * A redis-server serving TLS on `tlsPort` with `certs`' server certificate, and plain TCP on
 * `port`. `authClients`: the server asks for a client certificate signed by `certs.ca`.
 */
export async function startTlsRedis (t: Teardown, certs: RedisTlsCerts, authClients = false, args: readonly string[] = []): Promise<TlsRedisServer> {
  const tlsPort = await freePort(false)
  const server = await startRedis(t, {
    args: ['--tls-port', String(tlsPort), '--tls-cert-file', certs.serverCert, '--tls-key-file', certs.serverKey,
      '--tls-ca-cert-file', certs.ca, '--tls-auth-clients', authClients ? 'yes' : 'no', ...args]
  })
  const clients: Redis[] = []
  t.teardown(() => { for (const c of clients.splice(0)) c.disconnect() })
  return {
    ...server,
    tlsPort,
    tlsUrl: `rediss://127.0.0.1:${tlsPort}`,
    tlsClient () {
      const client = new Redis({
        host: '127.0.0.1',
        port: tlsPort,
        maxRetriesPerRequest: 1,
        tls: { ca: readFileSync(certs.ca), cert: readFileSync(certs.clientCert), key: readFileSync(certs.clientKey) }
      })
      client.on('error', () => {})
      clients.push(client)
      return client
    }
  }
}

/**
 * A TLS redis-server replicating the TLS master on `masterTlsPort` over TLS (tls-replication yes):
 * it tells its master its TLS port, which Sentinel then names when it promotes it.
 */
export async function startTlsRedisReplica (t: Teardown, certs: RedisTlsCerts, masterTlsPort: number): Promise<TlsRedisServer> {
  return await startTlsRedis(t, certs, false, ['--tls-replication', 'yes', '--replicaof', '127.0.0.1', String(masterTlsPort)])
}

export interface TlsSentinelOptions {
  /** The sentinel serves TLS alone (port 0, tls-port): `port` is then its TLS port. Default false: plain TCP. */
  readonly tlsOnly?: boolean
  /** down-after-milliseconds; default Sentinel's own (30 s), i.e. no failover within a test. */
  readonly downAfterMs?: number
  /** The sentinel asks its clients for a certificate `certs.ca` signed (tls-auth-clients yes). */
  readonly authClients?: boolean
}

export interface TlsSentinel extends RedisSentinel {
  /** The master address the sentinel names now, `host:port` ('' when it could not be asked). */
  masterAddr(): Promise<string>
  /** The raw reply to one inline command (e.g. `SENTINEL replicas name`), '' when it could not be asked. */
  command(command: string): Promise<string>
}

/**
 * A Sentinel (quorum 1) watching the TLS master on `masterTlsPort` under `name`: it talks TLS to
 * the master and its replicas (tls-replication yes, trusting `certs.ca`) and so names their TLS
 * ports to clients. With `tlsOnly` it answers its own clients over TLS alone, with the server
 * certificate of `certs`; otherwise over plain TCP, the shape the gateway supported first.
 */
export async function startTlsSentinel (t: Teardown, certs: RedisTlsCerts, masterTlsPort: number, name: string, options: TlsSentinelOptions = {}): Promise<TlsSentinel> {
  const config = `sentinel monitor ${name} 127.0.0.1 ${masterTlsPort} 1\n` +
    (options.downAfterMs !== undefined ? `sentinel down-after-milliseconds ${name} ${options.downAfterMs}\nsentinel failover-timeout ${name} 10000\n` : '')
  const tls = options.tlsOnly === true ? { ca: readFileSync(certs.ca), cert: readFileSync(certs.clientCert), key: readFileSync(certs.clientKey) } : undefined
  const node = await startNode(() => ['--sentinel', '--tls-replication', 'yes', '--tls-cert-file', certs.serverCert, '--tls-key-file', certs.serverKey,
    '--tls-ca-cert-file', certs.ca, '--tls-auth-clients', options.authClients === true ? 'yes' : 'no'], false, config, tls)
  t.teardown(() => stopNode(node))
  const masterAddr = async (): Promise<string> => {
    const reply = await rawCommand(node.port, `SENTINEL get-master-addr-by-name ${name}`, tls)
    const parts = reply.split('\r\n').filter((l) => l !== '' && !/^[*$]/.test(l))
    return parts.length === 2 ? `${parts[0]}:${parts[1]}` : ''
  }
  await waitFor('sentinel sees its master', async () => (await masterAddr()).endsWith(`:${masterTlsPort}`), 10_000, node.running?.exited)
  return { port: node.port, masterAddr, command: async (command) => await rawCommand(node.port, command, tls), stop: () => stopNode(node) }
}

export interface TlsRedisCluster {
  /** The nodes' TLS ports: with tls-cluster yes, CLUSTER SLOTS names these to a TLS client. */
  readonly tlsPorts: number[]
  /** A client over TLS to the node on `tlsPort` (trusting `certs.ca`), for reading its keys. */
  tlsClient(tlsPort: number): Redis
  stop(): Promise<void>
}

/**
 * Three masters, no replicas, all slots assigned, each serving TLS (its cluster bus too:
 * tls-cluster yes, on the TLS port + 10000) beside a plain port for the helper's checks.
 */
export async function startTlsRedisCluster (t: Teardown, certs: RedisTlsCerts): Promise<TlsRedisCluster> {
  const nodes: Node[] = []
  const tlsPorts: number[] = []
  const clients: Redis[] = []
  const stop = async (): Promise<void> => {
    for (const c of clients.splice(0)) c.disconnect()
    await Promise.all(nodes.map(stopNode))
  }
  t.teardown(stop)
  try {
    for (let i = 0; i < 3; i++) {
      const tlsPort = await freePort(true)
      nodes.push(await startNode((dir) => ['--tls-port', String(tlsPort), '--tls-cert-file', certs.serverCert, '--tls-key-file', certs.serverKey,
        '--tls-ca-cert-file', certs.ca, '--tls-auth-clients', 'no', '--tls-cluster', 'yes', '--tls-replication', 'yes',
        '--cluster-enabled', 'yes', '--cluster-config-file', join(dir, 'nodes.conf'), '--cluster-node-timeout', '5000'], false))
      tlsPorts.push(tlsPort)
    }
    await execFileAsync('redis-cli', ['--tls', '--cacert', certs.ca, '--cluster', 'create', ...tlsPorts.map((p) => `127.0.0.1:${p}`),
      '--cluster-replicas', '0', '--cluster-yes'], { timeout: 30_000 })
    await clusterFormed(nodes)
  } catch (err) {
    await stop()
    throw err
  }
  return {
    tlsPorts,
    tlsClient (tlsPort) {
      const client = new Redis({ host: '127.0.0.1', port: tlsPort, maxRetriesPerRequest: 1, tls: { ca: readFileSync(certs.ca) } })
      client.on('error', () => {})
      clients.push(client)
      return client
    },
    stop
  }
}
