// /events over a slow link: the 5-minute history of a gateway with many busy routes is megabytes,
// and a reader still taking it when the first update comes is slow, not gone. A real LiveFeed on
// a real HTTP server and socket; the reader pauses, as a slow link does, then reads on.
import t, { type Test } from 'tap'
import { createServer } from 'node:http'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { LiveFeed } from '../src/admin/live-feed.js'
import type { LiveFrame } from '../src/admin/live-stats.js'

/** A reader of `feed`'s /events that has subscribed and reads nothing yet (its socket paused). */
async function pausedReader (t: Test, feed: LiveFeed): Promise<Socket> {
  const server = createServer((req, res) => { feed.subscribe(res) })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { feed.stop(); server.closeAllConnections(); server.close() })
  const socket = connect((server.address() as AddressInfo).port, '127.0.0.1')
  t.teardown(() => socket.destroy())
  socket.pause()
  socket.write('GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n')
  for (let i = 0; i < 200 && feed.subscriberCount === 0; i++) await new Promise(resolve => setTimeout(resolve, 25))
  t.equal(feed.subscriberCount, 1, 'subscribed')
  return socket
}

t.test('a reader still taking a large history gets the updates after it, not a cut stream', async t => {
  const feed = new LiveFeed(() => null, () => ({}))
  // 5 minutes of 400 busy routes with long names: about 20 MB of history, more than the kernel's
  // socket buffers hold on loopback, so most of it waits in the response's own queue
  const routes: LiveFrame['routes'] = {}
  for (let i = 0; i < 400; i++) routes[`route-${String(i).padStart(4, '0')}-${'x'.repeat(100)}`] = { n: 100, s4: 1, s5: 1, lat: [[10, 50], [20, 50]] }
  for (let s = 0; s < 300; s++) {
    feed.ingest({ routes, decisions: {}, rejected: [] })
    feed.tick(1_000_000 + s * 1000)
  }
  const socket = await pausedReader(t, feed)
  // the first update comes while the reader has taken little of the history
  feed.tick(2_000_000)
  t.equal(feed.subscriberCount, 1, 'the slow reader is kept')

  // only the events' names are looked for: a window over the end of what came, not all 20 MB
  const seen = await new Promise<{ history: boolean, update: boolean }>(resolve => {
    const found = { history: false, update: false }
    let tail = ''
    const timer = setTimeout(() => resolve(found), 30_000)
    socket.on('data', (chunk: Buffer) => {
      const text = tail + chunk.toString('latin1')
      found.history ||= text.includes('event: history')
      found.update ||= text.includes('event: update')
      tail = text.slice(-32)
      if (found.update) { clearTimeout(timer); resolve(found) }
    })
    socket.on('close', () => { clearTimeout(timer); resolve(found) })
    socket.resume()
  })
  t.ok(seen.history, 'the history')
  t.ok(seen.update, 'then the update (the stream was cut at the first update)')
})

t.test('a reader that stopped for good is still dropped once past the history and the bound', async t => {
  const feed = new LiveFeed(() => null, () => ({ pad: 'y'.repeat(64 * 1024) }))
  await pausedReader(t, feed)
  // 64 KiB per update, never read: the kernel's buffers fill, then the response's queue grows
  let ticks = 0
  while (feed.subscriberCount === 1 && ticks < 2000) {
    feed.tick(3_000_000 + ticks * 1000)
    ticks++
    if (ticks % 50 === 0) await new Promise(resolve => setTimeout(resolve, 10))
  }
  t.equal(feed.subscriberCount, 0, `dropped after ${ticks} updates (${ticks * 64} KiB)`)
})
