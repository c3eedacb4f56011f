import { open } from 'node:fs/promises'

/**
 * The most any file the config reads may hold (gateway.yaml, the API key file, PEM files). Without
 * a bound, `-c /dev/zero` or a path mistyped onto a log file held the whole file in memory before
 * any check: 650 MB for /dev/zero, and on a SIGHUP the serving process took it. A key file of a
 * million keys is about 40 MB.
 */
export const MAX_CONFIG_FILE_BYTES = 64 * 1024 * 1024

const CHUNK_BYTES = 64 * 1024

/**
 * The file's bytes, read until its end or past `maxBytes` (then an error saying so). Reads in
 * chunks rather than by the file's size, which a FIFO or a device does not have.
 */
export async function readFileBounded (path: string, maxBytes = MAX_CONFIG_FILE_BYTES): Promise<Buffer> {
  const handle = await open(path, 'r')
  try {
    const tooLarge = `larger than ${maxBytes / (1024 * 1024)} MiB, the most a file of the config may hold (is it the right file?)`
    const chunks: Buffer[] = []
    let total = 0
    for (;;) {
      const chunk = Buffer.allocUnsafe(CHUNK_BYTES)
      const { bytesRead } = await handle.read(chunk, 0, CHUNK_BYTES, null)
      if (bytesRead === 0) break
      total += bytesRead
      if (total > maxBytes) throw new Error(tooLarge)
      chunks.push(bytesRead === CHUNK_BYTES ? chunk : chunk.subarray(0, bytesRead))
    }
    return Buffer.concat(chunks, total)
  } finally {
    await handle.close()
  }
}

/** The file is not there (ENOENT): each reader words that in its own terms. */
export const notFound = (err: unknown): boolean => (err as NodeJS.ErrnoException).code === 'ENOENT'

/**
 * Why a file of the config could not be read, in an operator's words: node's own text for a
 * directory read "EISDIR: illegal operation on a directory, read".
 */
export function readFailure (err: unknown): string {
  switch ((err as NodeJS.ErrnoException).code) {
    case 'ENOENT': return 'file not found'
    case 'EISDIR': return 'is a directory, not a file'
    case 'EACCES': return `permission denied (the gateway runs as uid ${process.getuid?.() ?? '?'})`
    default: return (err as Error).message
  }
}
