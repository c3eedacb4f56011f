// A worker thread's entry: parses and checks one gateway.yaml or API key file text off the serving
// thread (src/off-thread.ts) and posts the result back as data.
import { parentPort, workerData } from 'node:worker_threads'
import { ConfigError, parseConfigText, type ParseReply } from './load.js'
import { ApiKeyFileError, parseKeyFileText, type KeyFileReply } from '../identify/api-key-file.js'
import type { ParseJob } from '../off-thread.js'

function parseConfig (text: string, file: string, env: NodeJS.ProcessEnv): ParseReply {
  try {
    const loaded = parseConfigText(text, file, env)
    return { ok: true, config: loaded.config, hash: loaded.hash }
  } catch (err) {
    return err instanceof ConfigError ? { ok: false, problems: err.problems } : { ok: false, error: (err as Error).message }
  }
}

function parseKeyFile (text: string, file: string): KeyFileReply {
  try {
    return { ok: true, items: parseKeyFileText(text, file) }
  } catch (err) {
    return err instanceof ApiKeyFileError ? { ok: false, problems: err.problems } : { ok: false, error: (err as Error).message }
  }
}

const job = workerData as ParseJob
parentPort?.postMessage(job.kind === 'config' ? parseConfig(job.text, job.file, job.env) : parseKeyFile(job.text, job.file))
