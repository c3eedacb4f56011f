// upstreams.X.timeouts.idle below 10 s is kept by the gateway's own timer: the longest pause
// between two chunks of the upstream's body, to the millisecond. undici keeps its bodyTimeout on
// timers that tick every half second, so `idle: 100ms` cut a pause after 0.5-1 s. The timer
// starts again at every chunk, and does not run while the gateway stops reading because its own
// client is slow (that is sendTimeout's), as undici's does not.
import t, { type Test } from 'tap'
import { request } from 'undici'
import { startGateway } from './helpers/gateway.js'
import { startHttpServer, startUpstream } from './helpers/upstream.js'

const withIdle = (url: string, idle: string): string => `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${url}], timeouts: { idle: ${idle} } }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`

/** What /drip sends: `chunk 0\n` ... */
const chunks = (n: number): string => Array.from({ length: n }, (_, i) => `chunk ${i}\n`).join('')

t.test('a pause longer than timeouts.idle is cut on time', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, withIdle(up.url, '100ms'))
  let paused = 0
  for (let i = 0; i < 3; i++) {
    // one chunk at once, the next in 5 s
    const res = await request(`${gw.url}/drip?chunks=3&intervalMs=5000`)
    t.equal(res.statusCode, 200, 'the head came at once')
    const since = Date.now()
    await t.rejects(res.body.text(), 'the body is cut')
    paused += Date.now() - since
  }
  // three pauses of 100 ms: undici's timers alone took at least 1.5 s for them (0.5-1 s each)
  t.ok(paused >= 295 && paused < 1450, `three pauses cut after ${paused} ms in all`)
  t.equal(gw.lines.filter(l => l.msg === 'request' && l.error === 'response_timeout').length, 3, 'each logged as response_timeout, as undici\'s was')
})

/** /drip through a gateway with `idle`: the whole body comes, and nothing is logged cut. */
async function uncut (t: Test, idle: string, n: number, intervalMs: number): Promise<void> {
  const up = await startUpstream(t)
  const gw = await startGateway(t, withIdle(up.url, idle))
  const res = await request(`${gw.url}/drip?chunks=${n}&intervalMs=${intervalMs}`)
  t.equal(res.statusCode, 200)
  t.equal(await res.body.text(), chunks(n), 'the whole body')
  t.notOk(gw.lines.some(l => l.msg === 'request' && l.error !== undefined), 'nothing cut')
}

t.test('every chunk starts the pause again: a body that keeps coming is never cut', async t => {
  // 8 chunks 50 ms apart: 350 ms in all, longer than the idle timeout, never a pause of it
  await uncut(t, '150ms', 8, 50)
})

t.test('a client slow to read is no pause of the upstream\'s: the body is not cut', async t => {
  const up = await startUpstream(t)
  const gw = await startGateway(t, withIdle(up.url, '200ms'))
  const bytes = 32 * 1024 * 1024
  const res = await request(`${gw.url}/download?bytes=${bytes}`)
  t.equal(res.statusCode, 200)
  // nothing read for 700 ms: the gateway stops reading the upstream once buffers are full
  await new Promise(resolve => setTimeout(resolve, 700))
  let got = 0
  for await (const chunk of res.body) got += (chunk as Buffer).length
  t.equal(got, bytes, 'every byte')
})

t.test('after a slow client drained, a pause of the upstream is cut on time: the deadline starts again at the drain', async t => {
  const BIG = Buffer.alloc(64 * 1024, 'a')
  const { url } = await startHttpServer(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream' })
    // 16 MiB with backpressure, then silence
    let left = 256
    const pump = (): void => {
      while (left > 0) {
        left--
        if (!res.write(BIG)) {
          res.once('drain', pump)
          return
        }
      }
    }
    pump()
  })
  const gw = await startGateway(t, withIdle(url, '100ms'))
  const res = await request(`${gw.url}/big`)
  // nothing read for 700 ms: the gateway stops reading the upstream, its idle deadline cleared
  await new Promise(resolve => setTimeout(resolve, 700))
  let got = 0
  let lastByte = 0
  await t.rejects((async () => {
    for await (const chunk of res.body) {
      got += (chunk as Buffer).length
      lastByte = Date.now()
    }
  })(), 'cut once the upstream pauses')
  const pause = Date.now() - lastByte
  t.equal(got, 256 * BIG.length, 'every byte the upstream sent')
  // undici's timer, left alone after the drain, took 0.5-1 s
  t.ok(pause < 450, `cut ${pause} ms after the last byte`)
})

t.test('idle: 0s is no timeout', async t => {
  await uncut(t, '0s', 3, 100)
})
