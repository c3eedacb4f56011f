import { Cluster, type Redis } from 'ioredis'
import { CHARGE_SCRIPT, FUNCTION_LIBRARY, LIMIT_BATCH_SCRIPT, LIMIT_SCRIPT, REFUND_SCRIPT, functionName, type FunctionEntry } from './scripts.js'

// How the store calls its Lua: the function library (FCALL) where the server takes it, the same
// code as scripts (EVALSHA) until then and wherever it does not.
//
// A script's whole chunk runs on every EVALSHA: the library's helpers, the algorithms the call
// names and the limits it parses are made again each time, which for one call of one check was
// about half of Redis's instructions (bench/README.md, twenty-third session). A function library
// is loaded once and keeps them (src/limit/scripts.ts, FUNCTION_LIBRARY).
//
// - The library is loaded in the background (FUNCTION LOAD, on every master of a Cluster); calls
//   go by EVALSHA until it is in.
// - A server that refuses FUNCTION LOAD or FCALL (Redis before 7.0, an ACL user without `function`
//   or `fcall`, also after the library was in) is called by EVALSHA for good: nothing is tried
//   again, so its ACL log does not fill up.
// - Over maxmemory a call is sent again by EVALSHA, which Redis refuses only at a write: a
//   rejection is still answered, as it was before functions.
// - A server that lost the library (restarted empty, FUNCTION FLUSH, a new Cluster master) answers
//   "Function not found": that call is sent again by EVALSHA and the library loaded again, as
//   ioredis recovers a script from NOSCRIPT. A request never fails for it.
// - The library is loaded on each connection's 'ready' (a server restarted empty has lost it).
//   Another failure (a connection lost while loading) is tried again on a call LOAD_RETRY_MS later.

/** The store's script calls (the batcher's are a subset: src/limit/redis-batch.ts). */
export interface ScriptCommands {
  gatewayLimit(numKeys: number, ...keysAndArgs: Array<string | number>): Promise<unknown>
  /** limit-batch.lua with its reply as bytes */
  gatewayLimitBatchBuffer(numKeys: number, ...keysAndArgs: Array<string | number>): Promise<unknown>
  gatewayLimitRefund(numKeys: number, ...keysAndArgs: Array<string | number>): Promise<unknown>
  gatewayLimitCharge(numKeys: number, ...keysAndArgs: Array<string | number>): Promise<unknown>
}

type Call = (numKeys: number, ...keysAndArgs: Array<string | number>) => Promise<unknown>

const LOAD_RETRY_MS = 5000

const messageOf = (err: unknown): string => err instanceof Error ? err.message : String(err)
// Redis's own words: 7.0 "ERR Function not found"; before 7.0 "ERR unknown command 'FUNCTION'"
const isNotFound = (err: unknown): boolean => messageOf(err).startsWith('ERR Function not found')
const isRefusal = (err: unknown): boolean => /^NOPERM|unknown command|unknown subcommand|Error registering functions/.test(messageOf(err))
// Over maxmemory (noeviction) a function that may write is refused whole, where a script is refused
// only at its first write: a rejection, which writes nothing, is still answered by the script.
const isOutOfMemory = (err: unknown): boolean => messageOf(err).startsWith('OOM ')

async function loadLibrary (client: Redis | Cluster): Promise<void> {
  const nodes = client instanceof Cluster ? client.nodes('master') : [client]
  if (nodes.length === 0) throw new Error('no Redis Cluster master known yet')
  await Promise.all(nodes.map(async (node) => {
    try {
      await node.call('FUNCTION', 'LOAD', FUNCTION_LIBRARY)
    } catch (err) {
      // the same code, loaded by another instance of this version or by an earlier run
      if (!messageOf(err).includes('already exists')) throw err
    }
  }))
}

/**
 * `onRefused` hears once that the server refused the library (its error), so an operator can tell
 * why Redis runs the scripts instead.
 */
export function createScriptCommands (client: Redis | Cluster, onRefused?: (reason: unknown) => void): ScriptCommands {
  // defineCommand sends EVALSHA and falls back to EVAL on NOSCRIPT, per connection
  client.defineCommand('gatewayLimit', { lua: LIMIT_SCRIPT })
  client.defineCommand('gatewayLimitBatch', { lua: LIMIT_BATCH_SCRIPT })
  client.defineCommand('gatewayLimitRefund', { lua: REFUND_SCRIPT })
  client.defineCommand('gatewayLimitCharge', { lua: CHARGE_SCRIPT })
  const scripts = client as unknown as ScriptCommands

  let loaded = false
  let loading = false
  let refused = false
  let retryAt = 0
  // for good: told once, and every call from then on goes by script
  const refuse = (err: unknown): void => {
    loaded = false
    if (refused) return
    refused = true
    onRefused?.(err)
  }
  const load = (): void => {
    // not before the connection is up: the gateway's client has no offline queue, and the
    // 'ready' listener below loads it then
    if (loading || refused || client.status !== 'ready' || Date.now() < retryAt) return
    loading = true
    loadLibrary(client).then(() => {
      // a refusal of FCALL may have come while this load was out
      loaded = !refused
    }, (err: unknown) => {
      if (isRefusal(err)) refuse(err)
      else retryAt = Date.now() + LOAD_RETRY_MS
    }).finally(() => { loading = false })
  }

  const viaFunction = (entry: FunctionEntry, script: Call, buffer: boolean): Call => {
    const name = functionName(entry)
    return (numKeys, ...keysAndArgs) => {
      if (!loaded) {
        load()
        return script(numKeys, ...keysAndArgs)
      }
      const reply = buffer ? client.callBuffer('FCALL', name, numKeys, ...keysAndArgs) : client.call('FCALL', name, numKeys, ...keysAndArgs)
      return reply.catch((err: unknown) => {
        if (isNotFound(err)) {
          loaded = false
          load()
        } else if (isRefusal(err)) {
          // FCALL itself refused after the library was in: an ACL changed, a failover to a server
          // without functions
          refuse(err)
        } else if (!isOutOfMemory(err)) throw err
        return script(numKeys, ...keysAndArgs)
      })
    }
  }

  // Each connection (or reconnection: a server restarted empty has lost the library) loads it;
  // a server that kept it answers "already exists" at once.
  client.on('ready', () => {
    retryAt = 0
    load()
  })
  load()
  return {
    gatewayLimit: viaFunction('limit', scripts.gatewayLimit.bind(client), false),
    gatewayLimitBatchBuffer: viaFunction('limit_batch', scripts.gatewayLimitBatchBuffer.bind(client), true),
    gatewayLimitRefund: viaFunction('refund', scripts.gatewayLimitRefund.bind(client), false),
    gatewayLimitCharge: viaFunction('charge', scripts.gatewayLimitCharge.bind(client), false)
  }
}
