// Bodies stream through bin/gateway with backpressure: 200 MB each way while the reading side
// stalls for a while, and the gateway process's resident memory (VmRSS from /proc) stays far
// below the body size. A proxy that buffered would hold the whole body during the stall.
import t from 'tap'
import http from 'node:http'
import { readFileSync } from 'node:fs'
import { Readable } from 'node:stream'
import { spawnGateway } from './helpers/gateway.js'
import { startHttpServer } from './helpers/upstream.js'

const MB = 1024 * 1024
const BODY = 200 * MB
// The sharp check is the gateway's decision to stop reading: the bytes one side has produced
// but the other not yet consumed are bounded by the kernel buffers of the two loopback
// connections (receive + send buffer maxima, autotuned) plus a little in the processes, whatever
// the machine's load. A proxy that buffered lets the sender run on during the 2 s stall, up to
// the ~180 MB left of the body.
function maxOf (sysctl: string): number {
  try {
    return Number(readFileSync(`/proc/sys/net/ipv4/${sysctl}`, 'utf8').trim().split(/\s+/)[2])
  } catch {
    return 6 * MB // Linux's default maximum
  }
}
const MAX_IN_FLIGHT = 2 * (maxOf('tcp_rmem') + maxOf('tcp_wmem')) + 16 * MB
// RSS as the operator sees it: streaming grows it by 20-60 MB (64 KB chunks wait for the GC),
// noisily, so this bound is loose; a proxy that buffered would hold ~180 MB.
const MAX_GROWTH = 150 * MB

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

/** `total` bytes in 64 KB chunks, made as they are read; `produced` counts them. */
function generated (total: number): Readable & { produced: number } {
  const chunk = Buffer.alloc(64 * 1024, 'u')
  let left = total
  const stream = new Readable({
    read () {
      if (left <= 0) return this.push(null)
      const piece = left >= chunk.length ? chunk : chunk.subarray(0, left)
      left -= piece.length
      stream.produced += piece.length
      this.push(piece)
    }
  }) as Readable & { produced: number }
  stream.produced = 0
  return stream
}

/** Samples `produced() - consumed()` every 10 ms until stopped; answers the peak. */
function sampleInFlight (produced: () => number, consumed: () => number): { stop: () => number } {
  let peak = 0
  const timer = setInterval(() => { peak = Math.max(peak, produced() - consumed()) }, 10)
  return { stop: () => { clearInterval(timer); return peak } }
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

t.test('the in-flight bound separates streaming from buffering on this machine', async (t) => {
  t.ok(MAX_IN_FLIGHT < BODY - 40 * MB, `${Math.round(MAX_IN_FLIGHT / MB)} MB of socket buffers is well below the body`)
})

t.test('a 200 MB upload streams to an upstream that stalls; the gateway RSS stays low', async (t) => {
  // the upstream stops reading for 2 s after 20 MB: the client must be held back, not buffered
  let consumed = 0
  const upstream = await startHttpServer(t, (req, res) => {
    if (req.url?.startsWith('/download') === true) {
      res.end(Buffer.alloc(MB))
      return
    }
    let paused = false
    req.on('data', (chunk: Buffer) => {
      consumed += chunk.length
      if (!paused && consumed >= 20 * MB) {
        paused = true
        req.pause()
        setTimeout(() => req.resume(), 2000)
      }
    })
    req.on('end', () => res.end(JSON.stringify({ bytes: consumed })))
  })
  const gw = await spawnGateway(t, config(upstream.url))
  const pid = gw.child.pid as number
  await warmUp(gw.url)
  const baseline = rssOf(pid)
  const rss = sampleRss(pid)
  const body = generated(BODY)
  const inFlight = sampleInFlight(() => body.produced, () => consumed)
  const reply = await new Promise<{ status: number, body: string }>((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: gw.port, path: '/upload', method: 'POST', headers: { 'content-length': String(BODY) }, agent: false }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (s: string) => { body += s })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }))
    })
    req.on('error', reject)
    body.pipe(req)
  })
  const peak = rss.stop()
  const peakInFlight = inFlight.stop()
  t.equal(reply.status, 200)
  t.same(JSON.parse(reply.body), { bytes: BODY }, 'every byte arrived')
  t.ok(peakInFlight < MAX_IN_FLIGHT, `the client was held back: at most ${Math.round(peakInFlight / MB)} MB sent and not yet read by the upstream`)
  t.ok(peak - baseline < MAX_GROWTH, `RSS grew by ${Math.round((peak - baseline) / MB)} MB (baseline ${Math.round(baseline / MB)} MB, peak ${Math.round(peak / MB)} MB)`)
})

t.test('a 200 MB download streams to a client that stalls; the gateway RSS stays low', async (t) => {
  // the same /download as the upstream helper's, counting what it wrote
  let produced = 0
  const counting = await startHttpServer(t, (req, res) => {
    const url = new URL(req.url ?? '/', 'http://upstream')
    const total = Number(url.searchParams.get('bytes'))
    res.writeHead(200, url.searchParams.has('chunked') ? {} : { 'content-length': total })
    const body = generated(total)
    body.on('data', () => { produced = body.produced })
    body.pipe(res)
  })
  const gw = await spawnGateway(t, config(counting.url))
  const pid = gw.child.pid as number
  await warmUp(gw.url)
  const baseline = rssOf(pid)
  for (const chunked of [false, true]) {
    const rss = sampleRss(pid)
    produced = 0
    let bytesSeen = 0
    const inFlight = sampleInFlight(() => produced, () => bytesSeen)
    const received = await new Promise<{ status: number, bytes: number }>((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port: gw.port, path: `/download?bytes=${BODY}${chunked ? '&chunked=1' : ''}`, agent: false }, (res) => {
        let bytes = 0
        let paused = false
        res.on('data', (chunk: Buffer) => {
          bytes += chunk.length
          bytesSeen = bytes
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
    const peakInFlight = inFlight.stop()
    t.equal(received.status, 200)
    t.equal(received.bytes, BODY, `every byte arrived (${chunked ? 'chunked' : 'content-length'})`)
    t.ok(peakInFlight < MAX_IN_FLIGHT, `${chunked ? 'chunked' : 'content-length'}: the upstream was held back: at most ${Math.round(peakInFlight / MB)} MB written and not yet read by the client`)
    t.ok(peak - baseline < MAX_GROWTH, `${chunked ? 'chunked' : 'content-length'}: RSS grew by ${Math.round((peak - baseline) / MB)} MB (baseline ${Math.round(baseline / MB)} MB, peak ${Math.round(peak / MB)} MB)`)
  }
})
