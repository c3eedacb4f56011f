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
  /**
   * Other processes write to the same fd (workers mode: the primary and every worker share
   * stdout): each write holds whole lines and at most PIPE_BUF bytes, which a pipe never
   * interleaves with another writer's. A larger batch was spliced mid-line with another
   * process's, and the log's reader got broken JSON.
   */
  readonly sharedFd?: boolean
}

/** POSIX: a pipe write no longer than this is never interleaved with other writers' (Linux). */
export const PIPE_BUF = 4096

export const LOG_BATCH_BYTES = 16 * 1024
export const LOG_FLUSH_MS = 100
export const LOG_MAX_BUFFER_BYTES = 8 * 1024 * 1024

const RETRY_MS = 20
/** Longest the exit's synchronous flush waits for a full pipe's reader (EAGAIN) before it gives up. */
export const LOG_EXIT_FLUSH_MS = 1000

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
  /** Two batches (at most the bound) and 4 KiB: what a buffer holds before it has to grow. */
  private readonly initialBytes: number
  /**
   * Lines waiting, already encoded (UTF-8) into `buffer[0, used)`. Each line is copied in as it
   * is written instead of kept as a string until its batch goes out: an access line is a tree of
   * ~30 concatenated strings, and trees that waited for a slow write survived young-generation
   * GCs, which copied every node of every line, and took several times their bytes in the heap.
   * Waiting lines now cost their bytes, which is what `maxBufferBytes` bounds (bench/README.md,
   * ninth session: what this changes in CPU time is within the machine's noise).
   */
  private buffer: Buffer
  private used = 0
  /** The buffer of the last finished write, kept for the next batch (two buffers take turns). */
  private spare: Buffer | null = null
  /** The batch being written and how much of it is left (a partial write keeps the rest). */
  private inFlight: Buffer | null = null
  /** The whole buffer `inFlight` is a view of: the spare once its write is done. */
  private inFlightBuffer: Buffer | null = null
  private waiters: Array<() => void> = []
  /** Set while the batch in flight waits to be written again (a full non-blocking pipe: EAGAIN). */
  private retry: NodeJS.Timeout | null = null
  /**
   * Armed by the first line of a batch and cleared when it fires: an idle gateway has no timer to
   * wake for (an interval woke it ten times a second with nothing to write).
   */
  private timer: NodeJS.Timeout | null = null
  private readonly flushMs: number
  private closed = false
  private readonly sharedFd: boolean

  constructor (options: LogSinkOptions = {}) {
    super()
    this.fd = options.fd ?? 1
    this.sharedFd = options.sharedFd === true
    this.batchBytes = options.batchBytes ?? LOG_BATCH_BYTES
    this.maxBufferBytes = options.maxBufferBytes ?? LOG_MAX_BUFFER_BYTES
    this.initialBytes = Math.min(2 * this.batchBytes, this.maxBufferBytes) + 4096
    this.buffer = Buffer.allocUnsafeSlow(this.initialBytes)
    this.flushMs = options.flushMs ?? LOG_FLUSH_MS
  }

  /** Lines waiting, in bytes (queued plus the unwritten part of the batch in flight). */
  get pendingBytes (): number {
    return this.used + (this.inFlight?.length ?? 0)
  }

  write (line: string): boolean {
    if (this.closed) return false
    // a line's UTF-8 is at most three bytes per UTF-16 unit: its exact size is counted only when
    // that worst case would not fit the buffer or the bound
    const worst = line.length * 3
    if (this.used + worst > this.buffer.length || this.pendingBytes + worst > this.maxBufferBytes) {
      const bytes = Buffer.byteLength(line)
      if (this.pendingBytes + bytes > this.maxBufferBytes) {
        this.dropped++
        return true
      }
      if (this.used + bytes > this.buffer.length) this.grow(bytes)
    }
    this.used += this.buffer.write(line, this.used)
    if (this.used >= this.batchBytes) this.startWrite()
    else if (this.timer === null) this.armTimer()
    return true
  }

  /**
   * A line waits at most flushMs. A batch still being written when it fires is followed by the
   * next as soon as it is done (writeInFlight), so the timer is not armed again for it.
   */
  private armTimer (): void {
    this.timer = setTimeout(() => {
      this.timer = null
      if (this.used > 0) this.startWrite()
    }, this.flushMs)
    this.timer.unref()
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

  /**
   * At exit: what waits is written synchronously, the batch that waits for a full pipe's reader
   * (EAGAIN) first. A pipe that stays full gets LOG_EXIT_FLUSH_MS, then what it could not take is
   * counted as dropped, line by line, and said on stderr: no line is lost without a count. A write
   * running on libuv's thread pool is left to finish and start the next (see flushAtExit).
   */
  flushSync (): void {
    if (this.inFlight !== null && this.retry === null) return
    let data: Buffer
    if (this.inFlight !== null) {
      clearTimeout(this.retry as NodeJS.Timeout)
      this.retry = null
      data = this.used === 0 ? this.inFlight : Buffer.concat([this.inFlight, this.buffer.subarray(0, this.used)])
      this.writeDone()
    } else {
      if (this.used === 0) return
      data = this.buffer.subarray(0, this.used)
    }
    this.used = 0
    const written = writeAllSync(this.fd, data, LOG_EXIT_FLUSH_MS, this.sharedFd)
    // a line is whole once its newline is written: the newlines left unwritten count the rest
    if (written < data.length) {
      const lost = countLines(data.subarray(written))
      this.dropped += lost
      reportExitDrops(`log: ${lost} lines dropped at exit: the log's reader did not take them within ${LOG_EXIT_FLUSH_MS} ms\n`)
    }
  }

  /**
   * flushSync for the process's 'exit' event. A write still on libuv's thread pool then (the
   * process is ended by process.exit or a crash while it runs) has a result this process never
   * sees, and the lines queued behind it cannot be written before it without splicing them into
   * its batch: both are counted and said on stderr, where flushSync left them uncounted. (Such a
   * write on a blocking fd would hold the exit itself: libuv joins its threads at exit, which is
   * why src/log.ts makes a stdout pipe non-blocking.)
   */
  flushAtExit (): void {
    if (this.inFlight === null || this.retry !== null) {
      this.flushSync()
      return
    }
    const running = countLines(this.inFlight)
    const lost = running + countLines(this.buffer.subarray(0, this.used))
    this.used = 0
    this.dropped += lost
    if (lost > 0) reportExitDrops(`log: ${lost} lines dropped at exit (${running} of them in a write that had not finished and may have reached the log)\n`)
  }

  end (): void {
    this.flushSync()
    this.closed = true
    if (this.timer !== null) clearTimeout(this.timer)
    this.timer = null
  }

  /**
   * Room for `bytes` more (lines pile up while a write is slow). write has checked that they fit
   * the bound, so doubling stops at the bound: the buffer never holds more than it allows.
   */
  private grow (bytes: number): void {
    const bigger = Buffer.allocUnsafeSlow(Math.max(Math.min(2 * this.buffer.length, this.maxBufferBytes), this.used + bytes))
    this.buffer.copy(bigger, 0, 0, this.used)
    this.buffer = bigger
  }

  private startWrite (): void {
    if (this.inFlight !== null || this.used === 0) return
    this.inFlightBuffer = this.buffer
    this.inFlight = this.buffer.subarray(0, this.used)
    this.buffer = this.spare ?? Buffer.allocUnsafeSlow(this.initialBytes)
    this.spare = null
    this.used = 0
    this.writeInFlight()
  }

  private writeInFlight (): void {
    const data = this.inFlight as Buffer
    fsWrite(this.fd, data, 0, this.sharedFd ? atomicLength(data, 0) : data.length, null, (err, written) => {
      if (err !== null) {
        // a non-blocking pipe that is full: keep the batch and try again shortly
        if ((err as NodeJS.ErrnoException).code === 'EAGAIN') {
          this.retry = setTimeout(() => {
            this.retry = null
            this.writeInFlight()
          }, RETRY_MS)
          this.retry.unref()
          return
        }
        this.dropped += countLines(data)
        this.writeDone()
        this.emit('write-error', err)
      } else if (written < data.length) {
        this.inFlight = data.subarray(written)
        this.writeInFlight()
        return
      } else {
        this.writeDone()
      }
      if (this.used > 0) {
        this.startWrite()
      } else if (this.waiters.length > 0) {
        const waiters = this.waiters
        this.waiters = []
        for (const w of waiters) w()
      }
    })
  }

  /** The batch is out (or dropped): its buffer is the next spare, unless it grew past the usual size. */
  private writeDone (): void {
    const done = this.inFlightBuffer as Buffer
    this.inFlight = null
    this.inFlightBuffer = null
    if (done.length === this.initialBytes) this.spare = done
  }
}

/**
 * Writes `data` synchronously, waiting out EAGAIN (a full non-blocking pipe) for at most
 * `boundMs`; returns the bytes written. Any other failure ends it.
 */
function writeAllSync (fd: number, data: Buffer, boundMs: number, shared: boolean): number {
  const deadline = Date.now() + boundMs
  let written = 0
  let pause: Int32Array | null = null
  while (written < data.length) {
    try {
      written += writeSync(fd, data, written, shared ? atomicLength(data, written) : data.length - written)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EAGAIN' || Date.now() >= deadline) break
      pause ??= new Int32Array(new SharedArrayBuffer(4))
      Atomics.wait(pause, 0, 0, 5)
    }
  }
  return written
}

/**
 * The length of `data`, from `from`, that one write to a shared fd takes: whole lines within PIPE_BUF
 * bytes, or a single longer line whole (it cannot be atomic; it still ends at its newline).
 */
function atomicLength (data: Buffer, from: number): number {
  const rest = data.length - from
  if (rest <= PIPE_BUF) return rest
  const lastEnd = data.lastIndexOf(10, from + PIPE_BUF - 1)
  if (lastEnd >= from) return lastEnd + 1 - from
  const lineEnd = data.indexOf(10, from)
  return lineEnd === -1 ? rest : lineEnd + 1 - from
}

function reportExitDrops (message: string): void {
  try {
    writeSync(2, message)
  } catch {
    // stderr is gone too: the count in `dropped` is all there is
  }
}

function countLines (data: Buffer): number {
  let n = 0
  for (let i = data.indexOf(10); i !== -1; i = data.indexOf(10, i + 1)) n++
  return n
}
