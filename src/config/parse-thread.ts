// A worker thread's entry: parses and checks one gateway.yaml text off the serving thread
// (src/config/load.ts loadConfigText) and posts the result back as data.
import { parentPort, workerData } from 'node:worker_threads'
import { ConfigError, parseConfigText, type ParseReply } from './load.js'

const { text, file, env } = workerData as { text: string, file: string, env: NodeJS.ProcessEnv }
let reply: ParseReply
try {
  const loaded = parseConfigText(text, file, env)
  reply = { ok: true, config: loaded.config, hash: loaded.hash }
} catch (err) {
  reply = err instanceof ConfigError ? { ok: false, problems: err.problems } : { ok: false, error: (err as Error).message }
}
parentPort?.postMessage(reply)
