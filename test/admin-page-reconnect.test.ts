// The admin page in a real headless Chromium: a page whose event stream was refused (the 16
// places of /events taken) connects once a place is free, instead of saying "retrying" for good;
// a reset the admin listener never received is reported, not left without a word.
import t from 'tap'
import { startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { launchBrowser } from './helpers/browser.js'
import { eventually } from './helpers/ratelimit.js'

// Polls from the test, not in the page: the page's CSP forbids the eval that waitForFunction needs.
t.test('a page refused by a full /events connects once a place is free', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: 127.0.0.1:0
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - { name: rest, pathPrefix: /, upstream: backend }
`)
  // the 16 places taken by other streams
  const held: AbortController[] = []
  t.teardown(() => { for (const c of held) c.abort() })
  const statuses: number[] = []
  for (let i = 0; i < 16; i++) {
    const c = new AbortController()
    held.push(c)
    statuses.push((await fetch(`${gw.adminUrl}/events`, { signal: c.signal })).status)
  }
  t.same(statuses, Array(16).fill(200), 'every place taken')
  const browser = await launchBrowser(t)
  const page = await browser.newPage()
  const refused = page.waitForResponse(res => res.url().endsWith('/events') && res.status() === 503)
  await page.goto(gw.adminUrl + '/')
  await refused
  await eventually('the page says it is disconnected', async () => (await page.locator('#status').innerText()).startsWith('disconnected'), 10_000)
  held.pop()?.abort()
  // the page tries again 2 s after a refusal: generous for a loaded machine
  await eventually('the page connected and shows the health', async () => (await page.locator('#status').innerText()) === 'ready', 20_000)
  t.pass('the status badge says ready')
})

t.test('a reset the admin listener never received says so on the page', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, `listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0, token: admin-token-of-this-test-0123456789 }
upstreams:
  backend: { targets: [${upstream.url}] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    limits: { ip: { algorithm: token-bucket, limit: 5, window: 1h } }
`)
  const browser = await launchBrowser(t)
  const page = await browser.newPage()
  const errors: string[] = []
  page.on('pageerror', err => errors.push(err.message))
  await page.goto(gw.adminUrl + '/')
  await page.locator('#lookup-route option[value="api"]').waitFor({ state: 'attached' })
  await page.getByLabel('IP').fill('127.0.0.1')
  await page.getByRole('button', { name: 'Look up' }).first().click()
  await page.locator('#lookup-message', { hasText: 'limit' }).waitFor()
  await page.getByLabel('Admin token').fill('admin-token-of-this-test-0123456789')
  // the gateway stops (a restart, a lost tunnel) before the operator clicks Reset
  await gw.close()
  await page.getByRole('button', { name: 'Reset these limits' }).click()
  await eventually('the page reports the failed reset', async () => /reset failed/.test(await page.locator('#lookup-message').innerText()), 10_000)
  t.pass('the operator is told nothing was reset')
  t.same(errors, [], 'no uncaught error in the page')
})
