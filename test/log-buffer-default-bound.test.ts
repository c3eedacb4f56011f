// README (Logs): "A stdout that stops being read (a stalled log shipper) never grows the gateway's
// memory: at most 8 MiB of lines wait, the lines beyond are dropped and counted in
// gateway_log_dropped_lines_total, requests are served as usual". test/log-sink.test.ts checks the
// bound with small bounds passed to the sink; this checks the one `gateway start` runs with: a
// stalled shipper in front of bin/gateway must not make it hold every line it cannot write.
import t from 'tap'
import { request } from 'undici'
import { gatewayOnUnreadStdout, writeConfig } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

const MIB = 1024 * 1024
const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

t.test('bin/gateway with a stdout nobody reads: at most about 8 MiB of lines wait, the rest are dropped and counted, every request is answered', async t => {
  const up = await startUpstream(t)
  const file = writeConfig(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
upstreams:
  backend: { targets: [${up.url}] }
routes:
  - { name: all, pathPrefix: /, upstream: backend }
`)
  const { child, port, adminPort, exited, stderr, readPipe, head: started } = await gatewayOnUnreadStdout(t, file)
  let head = started
  // every request's line has the same length: a fixed-width path with a 6000-byte pad
  const pad = 'p'.repeat(6000)
  const path = (i: number): string => `/fill/${String(i).padStart(6, '0')}?pad=${pad}`
  // one line read while the test still reads the pipe: its size in bytes, newline included
  const first = await request(`http://127.0.0.1:${port}${path(0)}`)
  await first.body.text()
  let sample: string | undefined
  for (const deadline = Date.now() + 10_000; sample === undefined && Date.now() < deadline;) {
    head += readPipe()
    sample = head.split('\n').find(l => l.includes('"msg":"request"') && l.includes('/fill/000000'))
    if (sample === undefined) await sleep(20)
  }
  if (sample === undefined) throw new Error('no access line for the first request')
  const lineBytes = Buffer.byteLength(sample) + 1
  t.ok(lineBytes > 6000, `an access line is ${lineBytes} bytes`)

  // from here nobody reads: about 24 MiB of lines, three times the bound
  const total = Math.ceil(24 * MIB / lineBytes)
  let next = 1
  let answered = 0
  const client = async (): Promise<void> => {
    while (next <= total) {
      const res = await request(`http://127.0.0.1:${port}${path(next++)}`)
      await res.body.text()
      if (res.statusCode === 200) answered++
    }
  }
  await Promise.all(Array.from({ length: 8 }, client))
  t.equal(answered, total, `all ${total} requests answered while nobody reads the log`)
  // the last lines reach the sink within its flush interval (100 ms): 1 s is a wide margin
  await sleep(1000)
  const metrics = await (await request(`http://127.0.0.1:${adminPort}/metrics`)).body.text()
  const m = /^gateway_log_dropped_lines_total (\d+)$/m.exec(metrics)
  t.ok(m !== null, 'gateway_log_dropped_lines_total is on /metrics')
  const dropped = Number(m?.[1])
  t.ok(dropped > 0, `${dropped} of ${total} lines dropped and counted`)
  // kept: in the sink's buffer (8 MiB), plus what the pipe took before it filled (64 KiB on
  // Linux, up to 1 MiB if raised); 1.5 MiB of margin besides
  const kept = (total - dropped) * lineBytes
  t.ok(kept <= 9.5 * MIB, `lines kept waiting for stdout: ${(kept / MIB).toFixed(2)} MiB (at most 8 MiB in the buffer)`)

  child.kill('SIGTERM')
  t.equal(await exited, 0, `the gateway still exits 0 on SIGTERM (${stderr().trim()})`)
})
