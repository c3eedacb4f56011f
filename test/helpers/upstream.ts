// A real upstream for tests: node:http on 127.0.0.1 port 0, plus a `ws` echo endpoint.
// Every start registers its teardown on the test right away.
//
//   /download?bytes=N[&chunked=1]        N bytes, written with backpressure (never held in memory)
//   /upload[?pauseAfter=N&pauseMs=M]     counts the request body as it streams in, answers { bytes }
//   /slow?ms=N                           waits N ms, then echoes
//   /hang                                never answers
//   /drip?chunks=N&intervalMs=M          headers at once, then one small chunk every M ms
//   /reset                               resets the connection without answering
//   /hop-by-hop                          answers with hop-by-hop headers (and the ones Connection names)
//   /status?code=N                       answers status N
//   anything else                        echoes { name, method, url, headers, rawHeaders, body }
//   any Upgrade: websocket               echoes messages; the message 'close-me' makes the upstream close (4000)
import http, { type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http'
import net from 'node:net'
import { spawn } from 'node:child_process'
import { EventEmitter, once } from 'node:events'
import { WebSocketServer, type WebSocket } from 'ws'
import type { Teardown } from './teardown.js'

export interface EchoBody {
  name: string
  method: string
  url: string
  headers: IncomingHttpHeaders
  rawHeaders: string[]
  body: string
}

export interface Upstream {
  readonly name: string
  readonly url: string
  readonly port: number
  readonly server: http.Server
  /** Requests received (WebSocket upgrades not included). */
  readonly requests: number
  /** URL of every request received, in order. */
  readonly log: readonly string[]
  /** Every WebSocket upgrade request received, in order. */
  readonly upgrades: readonly { url: string, headers: IncomingHttpHeaders }[]
  /** 'aborted' (url): a request closed before its response finished; 'ws-close' (code): a WebSocket closed. */
  readonly events: EventEmitter
  readonly openWebSockets: number
  /** The URL of the next request whose connection closes before the response finished. */
  nextAbort: (timeoutMs?: number) => Promise<string>
  /** The close code of the next WebSocket that closes on the upstream side. */
  nextWebSocketClose: (timeoutMs?: number) => Promise<number>
}

const CHUNK = Buffer.alloc(64 * 1024, 'x')

export async function startUpstream (t: Teardown, name = 'upstream'): Promise<Upstream> {
  const events = new EventEmitter()
  const log: string[] = []
  const sockets = new Set<WebSocket>()
  const upgrades: { url: string, headers: IncomingHttpHeaders }[] = []
  const server = http.createServer((req, res) => {
    log.push(req.url ?? '')
    res.on('close', () => {
      if (!res.writableFinished) events.emit('aborted', req.url)
    })
    route(name, req, res)
  })
  const wss = new WebSocketServer({ server })
  wss.on('connection', (ws, req) => {
    upgrades.push({ url: req.url ?? '', headers: req.headers })
    sockets.add(ws)
    ws.on('message', (data, isBinary) => {
      if (!isBinary && data.toString() === 'close-me') ws.close(4000, 'upstream closes')
      else ws.send(data, { binary: isBinary })
    })
    ws.on('close', (code) => {
      sockets.delete(ws)
      events.emit('ws-close', code)
    })
  })
  const port = await listen(server)
  t.teardown(async () => {
    for (const ws of sockets) ws.terminate()
    wss.close()
    server.closeAllConnections()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  })
  return {
    name,
    url: `http://127.0.0.1:${port}`,
    port,
    server,
    get requests () { return log.length },
    log,
    upgrades,
    events,
    get openWebSockets () { return sockets.size },
    nextAbort: async (timeoutMs = 5000) => await nextEvent<string>(events, 'aborted', timeoutMs),
    nextWebSocketClose: async (timeoutMs = 5000) => await nextEvent<number>(events, 'ws-close', timeoutMs)
  }
}

function route (name: string, req: IncomingMessage, res: ServerResponse): void {
  const url = new URL(req.url ?? '/', 'http://upstream')
  const num = (key: string, fallback: number): number => Number(url.searchParams.get(key) ?? fallback)
  switch (url.pathname) {
    case '/download': {
      const total = num('bytes', 0)
      res.writeHead(200, url.searchParams.has('chunked') ? {} : { 'content-length': total })
      let left = total
      const pump = (): void => {
        while (left > 0) {
          const chunk = left >= CHUNK.length ? CHUNK : CHUNK.subarray(0, left)
          left -= chunk.length
          if (!res.write(chunk)) {
            res.once('drain', pump)
            return
          }
        }
        res.end()
      }
      pump()
      return
    }
    case '/upload': {
      const pauseAfter = num('pauseAfter', Infinity)
      const pauseMs = num('pauseMs', 0)
      let bytes = 0
      let paused = false
      req.on('data', (chunk: Buffer) => {
        bytes += chunk.length
        if (!paused && bytes >= pauseAfter) {
          paused = true
          req.pause()
          setTimeout(() => req.resume(), pauseMs)
        }
      })
      req.on('end', () => json(res, 200, { bytes }))
      return
    }
    case '/slow':
      setTimeout(() => echo(name, req, res), num('ms', 1000))
      return
    case '/hang':
      return
    case '/drip': {
      const chunks = num('chunks', 10)
      res.writeHead(200, { 'content-type': 'text/plain' })
      let sent = 0
      const drip = (): void => {
        if (res.destroyed) return clearInterval(timer)
        res.write(`chunk ${sent}\n`)
        if (++sent === chunks) {
          clearInterval(timer)
          res.end()
        }
      }
      const timer = setInterval(drip, num('intervalMs', 100))
      drip()
      return
    }
    case '/reset':
      req.socket.resetAndDestroy()
      return
    case '/hop-by-hop':
      req.resume()
      res.writeHead(200, [
        'Connection', 'X-Secret, keep-alive',
        'X-Secret', 'connection-specific',
        'Keep-Alive', 'timeout=5',
        'Proxy-Connection', 'keep-alive',
        'Trailer', 'X-Checksum',
        'Upgrade', 'h2c',
        'X-Kept', 'yes',
        'Content-Type', 'text/plain'
      ])
      res.end('hop-by-hop')
      return
    case '/status': {
      req.resume()
      const code = num('code', 200)
      // 204 and 304 have no body, hence no Content-Length either (RFC 9110 §8.6).
      if (code === 204 || code === 304) res.writeHead(code).end()
      else json(res, code, { name })
      return
    }
    default:
      echo(name, req, res)
  }
}

function echo (name: string, req: IncomingMessage, res: ServerResponse): void {
  const chunks: Buffer[] = []
  req.on('data', (chunk: Buffer) => chunks.push(chunk))
  req.on('end', () => {
    const body: EchoBody = { name, method: req.method ?? '', url: req.url ?? '', headers: req.headers, rawHeaders: req.rawHeaders, body: Buffer.concat(chunks).toString() }
    json(res, 200, body)
  })
}

function json (res: ServerResponse, status: number, payload: unknown): void {
  const body = JSON.stringify(payload)
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
  res.end(body)
}

async function nextEvent<T> (events: EventEmitter, name: string, timeoutMs: number): Promise<T> {
  const [value] = await once(events, name, { signal: AbortSignal.timeout(timeoutMs) }) as [T]
  return value
}

async function listen (server: net.Server): Promise<number> {
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  return (server.address() as net.AddressInfo).port
}

/** A node:http server on port 0 with `handler`, closed at teardown; answers its base URL. */
export async function startHttpServer (t: Teardown, handler: http.RequestListener): Promise<{ server: http.Server, url: string }> {
  const server = http.createServer(handler)
  const port = await listen(server)
  t.teardown(async () => {
    server.closeAllConnections()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  })
  return { server, url: `http://127.0.0.1:${port}` }
}

/** What recordingTarget saw: each request as "METHOD /path body", in order. */
export interface RecordingTarget { url: string, seen: string[] }

/** An upstream that records each request, its body read whole, and hands it to `answer`. */
export async function recordingTarget (t: Teardown, answer: (req: http.IncomingMessage, res: http.ServerResponse, nth: number) => void): Promise<RecordingTarget> {
  const seen: string[] = []
  const up = await startHttpServer(t, (req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      seen.push(`${req.method ?? ''} ${req.url ?? ''}${chunks.length > 0 ? ' ' + Buffer.concat(chunks).toString() : ''}`)
      answer(req, res, seen.length)
    })
  })
  return { url: up.url, seen }
}

/**
 * A URL where nothing listens: connections are refused (ECONNREFUSED). On a loopback address
 * other than 127.0.0.1 (Linux routes all of 127/8 to lo): a port freed on 127.0.0.1 was taken by
 * another test's server running in parallel, which answered 404 where a refusal was expected.
 * Tests listen on 127.0.0.1, so only a wildcard listener could take this address's port.
 */
export async function refusingUrl (): Promise<string> {
  const host = `127.0.0.${2 + Math.floor(Math.random() * 250)}`
  const server = net.createServer()
  server.listen(0, host)
  await once(server, 'listening')
  const port = (server.address() as net.AddressInfo).port
  await new Promise<void>((resolve) => server.close(() => resolve()))
  return `http://${host}:${port}`
}

/**
 * A URL on 127.0.0.1 where connecting hangs, for connect timeouts without external addresses: a
 * child process listens with a backlog of 1 and blocks its event loop, so it never accepts; once
 * the accept queue is full the kernel drops further SYNs and connect() waits.
 */
export async function startBlackhole (t: Teardown): Promise<string> {
  const script = `
    const server = require('node:net').createServer()
    server.listen({ port: 0, host: '127.0.0.1', backlog: 1 }, () => {
      require('node:fs').writeSync(1, server.address().port + '\\n')
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0)
    })`
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] })
  t.teardown(() => child.kill('SIGKILL'))
  const [line] = await once(child.stdout, 'data') as [Buffer]
  const port = Number(line.toString().trim())
  // Fill the accept queue until a connection stops completing.
  const fillers: net.Socket[] = []
  t.teardown(() => { for (const socket of fillers) socket.destroy() })
  for (let i = 0; i < 16; i++) {
    const socket = net.connect(port, '127.0.0.1')
    socket.on('error', () => {})
    fillers.push(socket)
    const connected = await Promise.race([
      once(socket, 'connect').then(() => true),
      new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 300))
    ])
    if (!connected) return `http://127.0.0.1:${port}`
  }
  throw new Error('could not fill the accept queue of the blackhole listener')
}

/**
 * Request headers that exercise RFC 9110 §7.6.1: every hop-by-hop field, one named only by
 * Connection, and one end-to-end field that must survive. `dropped` must never reach upstream.
 */
export const HOP_BY_HOP_PROBE = Object.freeze({
  headers: Object.freeze({
    connection: 'X-Secret, keep-alive',
    'x-secret': 'connection-specific',
    'keep-alive': 'timeout=30',
    'proxy-connection': 'keep-alive',
    te: 'trailers',
    trailer: 'X-Checksum',
    upgrade: 'h2c',
    'x-end-to-end': 'kept'
  }) as Readonly<Record<string, string>>,
  dropped: Object.freeze(['x-secret', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'upgrade'])
})
