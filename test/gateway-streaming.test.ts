// Bodies stream through bin/gateway with backpressure: 200 MB each way while the reading side
// stalls for a while, and the gateway process's resident memory (VmRSS from /proc) stays far
// below the body size. A proxy that buffered would hold the whole body during the stall.
import t from 'tap'
import http from 'node:http'
import { readFileSync } from 'node:fs'
import { Readable } from 'node:stream'
import { spawnGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

const MB = 1024 * 1024
const BODY = 200 * MB
// Streaming still grows RSS by 20-50 MB (64 KB chunks wait for the GC), noisily; a proxy that
// buffered would take in ~180 MB during the 2 s stall. Half the body separates the two clearly.
const MAX_GROWTH = BODY / 2

function rssOf (pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8')
  const kb = /^VmRSS:\s+(\d+) kB$/m.exec(status)
  if (kb === null) throw new Error(`no VmRSS for ${pid}`)
  return Number(kb[1]) * 1024
}

/** Samples the child's RSS every 20 ms until stopped; answers the peak. */
function sampleRss (pid: number): { stop: () => number } {
  let peak = rssOf(pid)
  const timer = setInterval(() => { peak = Math.max(peak, rssOf(pid)) }, 20)
  return { stop: () => { clearInterval(timer); peak = Math.max(peak, rssOf(pid)); return peak } }
}

/** `total` bytes in 64 KB chunks, made as they are read. */
function generated (total: number): Readable {
  const chunk = Buffer.alloc(64 * 1024, 'u')
  let left = total
  return new Readable({
    read () {
      if (left <= 0) return this.push(null)
      const piece = left >= chunk.length ? chunk : chunk.subarray(0, left)
      left -= piece.length
      this.push(piece)
    }
  })
}

async function warmUp (url: string): Promise<void> {
  // a few requests first, so the baseline includes the code paths and pools the transfer uses
  for (let i = 0; i < 5; i++) await (await fetch(`${url}/download?bytes=${MB}`)).arrayBuffer()
}

const config = (upstream: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
upstreams:
  backend: { targets: [${upstream}], timeouts: { response: 30s } }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

t.test('a 200 MB upload streams to an upstream that stalls; the gateway RSS stays low', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await spawnGateway(t, config(upstream.url))
  const pid = gw.child.pid as number
  await warmUp(gw.url)
  const baseline = rssOf(pid)
  const rss = sampleRss(pid)
  const reply = await new Promise<{ status: number, body: string }>((resolve, reject) => {
    // the upstream stops reading for 2 s after 20 MB: the client must be held back, not buffered
    const req = http.request({ host: '127.0.0.1', port: gw.port, path: `/upload?pauseAfter=${20 * MB}&pauseMs=2000`, method: 'POST', headers: { 'content-length': String(BODY) }, agent: false }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (s: string) => { body += s })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }))
    })
    req.on('error', reject)
    generated(BODY).pipe(req)
  })
  const peak = rss.stop()
  t.equal(reply.status, 200)
  t.same(JSON.parse(reply.body), { bytes: BODY }, 'every byte arrived')
  t.ok(peak - baseline < MAX_GROWTH, `RSS grew by ${Math.round((peak - baseline) / MB)} MB (baseline ${Math.round(baseline / MB)} MB, peak ${Math.round(peak / MB)} MB)`)
})

t.test('a 200 MB download streams to a client that stalls; the gateway RSS stays low', async (t) => {
  const upstream = await startUpstream(t)
  const gw = await spawnGateway(t, config(upstream.url))
  const pid = gw.child.pid as number
  await warmUp(gw.url)
  const baseline = rssOf(pid)
  for (const chunked of [false, true]) {
    const rss = sampleRss(pid)
    const received = await new Promise<{ status: number, bytes: number }>((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port: gw.port, path: `/download?bytes=${BODY}${chunked ? '&chunked=1' : ''}`, agent: false }, (res) => {
        let bytes = 0
        let paused = false
        res.on('data', (chunk: Buffer) => {
          bytes += chunk.length
          // the client stops reading for 2 s after 20 MB: the upstream must be held back
          if (!paused && bytes >= 20 * MB) {
            paused = true
            res.pause()
            setTimeout(() => res.resume(), 2000)
          }
        })
        res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes }))
        res.on('error', reject)
      })
      req.on('error', reject)
    })
    const peak = rss.stop()
    t.equal(received.status, 200)
    t.equal(received.bytes, BODY, `every byte arrived (${chunked ? 'chunked' : 'content-length'})`)
    t.ok(peak - baseline < MAX_GROWTH, `${chunked ? 'chunked' : 'content-length'}: RSS grew by ${Math.round((peak - baseline) / MB)} MB (baseline ${Math.round(baseline / MB)} MB, peak ${Math.round(peak / MB)} MB)`)
  }
})
