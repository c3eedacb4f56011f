// Where every log line goes: one bounded buffer in front of stdout (or any fd), written in
// batches by one asynchronous write at a time. pino's own async destination (sonic-boom) has no
// bound that survives a blocked stdout (with its maxLength, a destination that had dropped lines
// never wrote again once stdout drained, seen with sonic-boom 4.2.1), so this module keeps the
// bound itself: a stalled log reader costs lines, counted, never the gateway's memory.
import { write as fsWrite, writeSync } from 'node:fs'
import { EventEmitter } from 'node:events'

export interface LogSinkOptions {
  readonly fd?: number
  /** A batch is written as soon as this many bytes wait (or on the timer). */
  readonly batchBytes?: number
  /** Longest a line waits in the buffer when traffic is low. */
  readonly flushMs?: number
  /** Lines beyond this many bytes waiting (stdout blocked) are dropped and counted. */
  readonly maxBufferBytes?: number
}

export const LOG_BATCH_BYTES = 16 * 1024
export const LOG_FLUSH_MS = 100
export const LOG_MAX_BUFFER_BYTES = 8 * 1024 * 1024

const RETRY_MS = 20

/**
 * A pino DestinationStream (write/flush/flushSync) with a bounded buffer. It is an EventEmitter
 * because pino listens for 'error' on its destination (as on any stream); write failures other
 * than EAGAIN drop the batch and are counted, never thrown into the request path.
 */
export class LogSink extends EventEmitter {
  readonly fd: number
  /** Lines dropped because the buffer was full or a write failed; read by /metrics. */
  dropped = 0
  private readonly batchBytes: number
  private readonly maxBufferBytes: number
  private chunks: string[] = []
  /** Bytes in `chunks` (UTF-16 length: a bound, not an exact byte count). */
  private queued = 0
  /** The batch being written and how much of it is left (a partial write keeps the rest). */
  private inFlight: Buffer | null = null
  private waiters: Array<() => void> = []
  private readonly timer: NodeJS.Timeout
  private closed = false

  constructor (options: LogSinkOptions = {}) {
    super()
    this.fd = options.fd ?? 1
    this.batchBytes = options.batchBytes ?? LOG_BATCH_BYTES
    this.maxBufferBytes = options.maxBufferBytes ?? LOG_MAX_BUFFER_BYTES
    this.timer = setInterval(() => { if (this.queued > 0) this.startWrite() }, options.flushMs ?? LOG_FLUSH_MS)
    this.timer.unref()
  }

  /** Lines waiting, in bytes (queued plus the unwritten part of the batch in flight). */
  get pendingBytes (): number {
    return this.queued + (this.inFlight?.length ?? 0)
  }

  write (line: string): boolean {
    if (this.closed) return false
    if (this.pendingBytes + line.length > this.maxBufferBytes) {
      this.dropped++
      return true
    }
    this.chunks.push(line)
    this.queued += line.length
    if (this.queued >= this.batchBytes) this.startWrite()
    return true
  }

  /** Calls back once everything written so far has reached the fd (or was dropped). */
  flush (cb?: (err?: Error) => void): void {
    if (this.pendingBytes === 0) {
      if (cb !== undefined) process.nextTick(cb)
      return
    }
    if (cb !== undefined) this.waiters.push(cb)
    this.startWrite()
  }

  /** At exit: what is queued, written synchronously; a write already in flight finishes on its own thread. */
  flushSync (): void {
    if (this.inFlight !== null || this.queued === 0) return
    const data = this.take()
    try {
      writeSync(this.fd, data)
    } catch {
      this.dropped += countLines(data)
    }
  }

  end (): void {
    this.flushSync()
    this.closed = true
    clearInterval(this.timer)
  }

  private take (): Buffer {
    const data = Buffer.from(this.chunks.length === 1 ? this.chunks[0] as string : this.chunks.join(''))
    this.chunks = []
    this.queued = 0
    return data
  }

  private startWrite (): void {
    if (this.inFlight !== null || this.queued === 0) return
    this.inFlight = this.take()
    this.writeInFlight()
  }

  private writeInFlight (): void {
    const data = this.inFlight as Buffer
    fsWrite(this.fd, data, 0, data.length, null, (err, written) => {
      if (err !== null) {
        // a non-blocking pipe that is full: keep the batch and try again shortly
        if ((err as NodeJS.ErrnoException).code === 'EAGAIN') {
          setTimeout(() => { this.writeInFlight() }, RETRY_MS).unref()
          return
        }
        this.dropped += countLines(data)
        this.inFlight = null
        this.emit('write-error', err)
      } else if (written < data.length) {
        this.inFlight = data.subarray(written)
        this.writeInFlight()
        return
      } else {
        this.inFlight = null
      }
      if (this.queued > 0) {
        this.startWrite()
      } else if (this.waiters.length > 0) {
        const waiters = this.waiters
        this.waiters = []
        for (const w of waiters) w()
      }
    })
  }
}

function countLines (data: Buffer): number {
  let n = 0
  for (let i = data.indexOf(10); i !== -1; i = data.indexOf(10, i + 1)) n++
  return n
}
