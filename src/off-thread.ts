// Parsing long enough to hold every request runs on a worker thread: a gateway.yaml or an API key
// file of PARSE_OFF_THREAD_CHARS or more (src/config/parse-thread.ts does the work). Outside
// src/config, which no stage imports, so that src/identify can send its key file here. The yaml
// parser takes 0.2 to 0.4 ms per route: a reload of a 2 MB file with 20,000 routes held the
// serving thread 4 to 7 s, and one of a 20,000-line key file 1 to 2.6 s. A shorter text is parsed
// in place, quicker than a thread starts.
import { extname } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Worker } from 'node:worker_threads'

export const PARSE_OFF_THREAD_CHARS = 32 * 1024

/** What a parser thread is given: a gateway.yaml text (with the environment it substitutes) or a key file's. */
export type ParseJob =
  | { readonly kind: 'config', readonly text: string, readonly file: string, readonly env: NodeJS.ProcessEnv }
  | { readonly kind: 'keyFile', readonly text: string, readonly file: string }

// the thread's module, in src/config: .js when built, .ts when the tests run the sources
const PARSE_THREAD = new URL(`./config/parse-thread${extname(fileURLToPath(import.meta.url))}`, import.meta.url)

/** Runs `job` on a thread of its own; resolves with the one message it posts (ParseReply, KeyFileReply). */
export async function parseOffThread<Reply> (job: ParseJob): Promise<Reply> {
  return await new Promise<Reply>((resolve, reject) => {
    const thread = new Worker(PARSE_THREAD, { workerData: job })
    thread.once('message', resolve)
    thread.once('error', reject)
    thread.once('exit', code => reject(new Error(`the parser thread exited with code ${code}`)))
  })
}
