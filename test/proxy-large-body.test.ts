// Large bodies both ways with flat gateway memory. The forwarding server runs in a child process
// (this same file, forked) so that its RSS is measured alone, apart from the client and upstream.
// Each transfer has a stall in the middle (the upstream stops reading the upload, the client stops
// reading the download): without backpressure the gateway would buffer what arrives meanwhile.
import { fork } from 'node:child_process'
import { once } from 'node:events'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { Readable } from 'node:stream'
import { fileURLToPath } from 'node:url'
import { request } from 'undici'
import { UpstreamPool } from '../src/proxy/upstream-pool.js'
import { createForwardPlan, forwardRequest } from '../src/proxy/forward.js'
import { startUpstream } from './helpers/upstream.js'

const MB = 1024 * 1024
const TOTAL = 300 * MB
// Growth allowed over the warmed-up baseline: socket buffers and a few GC cycles of 64 KiB chunks.
const MAX_GROWTH = 64 * MB

type Message = { type: 'start', upstream: string } | { type: 'port', port: number } | { type: 'rss' } | { type: 'rss', rss: number }

if (process.env.PROXY_LARGE_BODY_CHILD === '1') runGateway()
else await runTests()

/** The child: a node:http server calling forwardRequest, answering the parent's RSS questions. */
function runGateway (): void {
  const send = (message: Message): void => { process.send?.(message) }
  process.on('message', (message: Message) => {
    if (message.type === 'rss') return send({ type: 'rss', rss: process.memoryUsage().rss })
    if (message.type !== 'start') return
    const pool = new UpstreamPool({
      name: 'large',
      targets: [{ url: message.upstream, weight: 1 }],
      connectTimeoutMs: 2000,
      responseTimeoutMs: 30_000,
      ejectMs: 10_000,
      maxConnectionsPerTarget: 8,
      keepAliveTimeoutMs: 4000
    })
    const plan = createForwardPlan({ pool, stripPrefix: null, responseTimeoutMs: 30_000, maxBodySize: Infinity, requestHeaders: { set: [], remove: [] }, responseHeaders: { set: [], remove: [] } })
    const server = http.createServer((req, res) => {
      forwardRequest(req, res, plan, { requestId: 'large', clientIp: '127.0.0.1', proto: 'http', path: req.url ?? '/' }, () => {})
    })
    server.listen(0, '127.0.0.1', () => send({ type: 'port', port: (server.address() as AddressInfo).port }))
  })
  process.on('disconnect', () => process.exit(0))
}

async function runTests (): Promise<void> {
  const { default: tap } = await import('tap')
  // One parent test: the root ends by itself once idle, which must not happen between two awaits of the set-up.
  await tap.test('large bodies through a forwarding child process', async (t) => {
    const upstream = await startUpstream(t)
    const child = fork(fileURLToPath(import.meta.url), [], {
      env: { ...process.env, PROXY_LARGE_BODY_CHILD: '1' },
      execArgv: process.execArgv,
      stdio: ['ignore', 'ignore', 'inherit', 'ipc']
    })
    t.teardown(() => { child.kill() })
    const reply = async <T extends Message['type']>(type: T): Promise<Extract<Message, { type: T }>> => {
      for (;;) {
        const [message] = await once(child, 'message') as [Message]
        if (message.type === type) return message as Extract<Message, { type: T }>
      }
    }
    child.send({ type: 'start', upstream: upstream.url })
    const { port } = await reply('port') as { port: number }
    const gateway = `http://127.0.0.1:${port}`
    const rss = async (): Promise<number> => {
      child.send({ type: 'rss' })
      return (await reply('rss') as { rss: number }).rss
    }

    // Samples the child's RSS while `transfer` runs; answers the peak growth over the baseline.
    const peakGrowth = async (transfer: () => Promise<void>): Promise<number> => {
      const baseline = await rss()
      let peak = baseline
      let running = true
      const sampler = (async () => {
        while (running) {
          peak = Math.max(peak, await rss())
          await new Promise((resolve) => setTimeout(resolve, 50))
        }
      })()
      try {
        await transfer()
      } finally {
        running = false
        await sampler
      }
      return peak - baseline
    }

    const upload = async (bytes: number, path: string): Promise<number> => {
      const chunk = Buffer.alloc(64 * 1024, 'u')
      let left = bytes
      const body = new Readable({
        read () {
          if (left <= 0) return void this.push(null)
          const piece = left >= chunk.length ? chunk : chunk.subarray(0, left)
          left -= piece.length
          this.push(piece)
        }
      })
      const res = await request(gateway + path, { method: 'POST', body, headers: { 'content-length': String(bytes) } })
      return (await res.body.json() as { bytes: number }).bytes
    }

    const download = async (bytes: number, stallAfter: number, stallMs: number): Promise<number> => {
      const res = await request(`${gateway}/download?bytes=${bytes}`)
      let received = 0
      let stalled = false
      for await (const chunk of res.body) {
        received += (chunk as Buffer).length
        if (!stalled && received >= stallAfter) {
          stalled = true
          await new Promise((resolve) => setTimeout(resolve, stallMs))
        }
      }
      return received
    }

    // Warm up JIT, pools and allocator so the baseline is the steady state.
    t.equal(await upload(16 * MB, '/upload'), 16 * MB)
    t.equal(await download(16 * MB, Infinity, 0), 16 * MB)

    t.test('a 300 MB upload passes with flat gateway memory, even while the upstream stops reading', async (t) => {
      let bytes = 0
      const growth = await peakGrowth(async () => {
        bytes = await upload(TOTAL, `/upload?pauseAfter=${64 * MB}&pauseMs=1500`)
      })
      t.equal(bytes, TOTAL, 'the upstream counted every byte')
      t.comment(`gateway RSS growth during a 300 MB upload: ${(growth / MB).toFixed(1)} MB`)
      t.ok(growth < MAX_GROWTH, `RSS grew ${(growth / MB).toFixed(1)} MB (limit ${MAX_GROWTH / MB} MB)`)
    })

    t.test('a 300 MB download passes with flat gateway memory, even while the client stops reading', async (t) => {
      let bytes = 0
      const growth = await peakGrowth(async () => {
        bytes = await download(TOTAL, 64 * MB, 1500)
      })
      t.equal(bytes, TOTAL, 'the client received every byte')
      t.comment(`gateway RSS growth during a 300 MB download: ${(growth / MB).toFixed(1)} MB`)
      t.ok(growth < MAX_GROWTH, `RSS grew ${(growth / MB).toFixed(1)} MB (limit ${MAX_GROWTH / MB} MB)`)
    })

    t.test('a 300 MB chunked upload (no Content-Length) passes too', async (t) => {
      const chunk = Buffer.alloc(64 * 1024, 'c')
      let left = TOTAL
      const body = Readable.from((function * () {
        while (left > 0) {
          left -= chunk.length
          yield chunk
        }
      })())
      let bytes = 0
      const growth = await peakGrowth(async () => {
        const res = await request(gateway + '/upload', { method: 'PUT', body })
        bytes = (await res.body.json() as { bytes: number }).bytes
      })
      t.equal(bytes, TOTAL, 'the upstream counted every byte')
      t.comment(`gateway RSS growth during a 300 MB chunked upload: ${(growth / MB).toFixed(1)} MB`)
      t.ok(growth < MAX_GROWTH, `RSS grew ${(growth / MB).toFixed(1)} MB (limit ${MAX_GROWTH / MB} MB)`)
    })
  })
}
