// admin.reads: token: every admin endpoint but the health checks and the page's own files needs the
// admin token, on a single process and on the workers primary; the CLI and the page send it.
import t from 'tap'
import { writeFileSync } from 'node:fs'
import { request } from 'node:http'
import { startGateway, spawnGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { gateway } from './helpers/cli.js'
import { launchBrowser } from './helpers/browser.js'
import { eventually } from './helpers/ratelimit.js'

const TOKEN = 'read-token-of-this-test-0123456789'
const config = (upstream: string, admin: string, extra = ''): string => `listen: 127.0.0.1:0
admin: ${admin}
${extra}upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: api
    pathPrefix: /
    upstream: backend
    limits:
      ip: { limit: 5, window: 1m }
`

/** Status, www-authenticate and JSON error code of a request (an event stream's head, then cut). */
async function ask (url: string, method = 'GET', token?: string): Promise<{ status: number, challenge: string | undefined, error: unknown }> {
  return await new Promise((resolve, reject) => {
    const req = request(url, { method, headers: token === undefined ? {} : { authorization: `Bearer ${token}` } }, (res) => {
      if (String(res.headers['content-type']).startsWith('text/event-stream')) {
        res.destroy()
        resolve({ status: res.statusCode ?? 0, challenge: res.headers['www-authenticate'], error: null })
        return
      }
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (d: string) => { body += d })
      res.on('end', () => {
        let error: unknown = null
        try { error = (JSON.parse(body) as { error?: unknown }).error ?? null } catch { /* not JSON */ }
        resolve({ status: res.statusCode ?? 0, challenge: res.headers['www-authenticate'], error })
      })
    })
    req.on('error', reject)
    req.end()
  })
}

const GUARDED = ['/config', '/metrics', '/routes', '/events', '/limits?route=api&ip=203.0.113.7']
const OPEN = ['/healthz', '/readyz', '/', '/ui/app.js', '/ui/app.css']

t.test('reads: token: every read but the health checks and the page files needs the token; reads: open does not', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url, `{ listen: 127.0.0.1:0, token: ${TOKEN}, reads: token }`))
  for (const path of GUARDED) {
    t.match(await ask(gw.adminUrl + path), { status: 401, challenge: 'Bearer realm="gateway admin"', error: 'GW_ERR_ADMIN_UNAUTHORIZED' }, `${path} without a token`)
    t.match(await ask(gw.adminUrl + path, 'GET', TOKEN.slice(1)), { status: 401, error: 'GW_ERR_ADMIN_UNAUTHORIZED' }, `${path} with a wrong token`)
    t.equal((await ask(gw.adminUrl + path, 'GET', TOKEN)).status, 200, `${path} with the token`)
  }
  for (const path of OPEN) t.equal((await ask(gw.adminUrl + path)).status, 200, `${path} open`)
  const refusalsBefore = gw.lines.filter(l => l.msg === 'admin request refused: missing or wrong token').length
  t.match(await ask(gw.adminUrl + '/limits?route=api&ip=203.0.113.7', 'DELETE'), { status: 401, error: 'GW_ERR_ADMIN_UNAUTHORIZED' }, 'a reset without the token')
  t.match(await ask(gw.adminUrl + '/limits?route=api&ip=203.0.113.7', 'DELETE', TOKEN.slice(1)), { status: 401, error: 'GW_ERR_ADMIN_UNAUTHORIZED' }, 'a reset with a wrong token')
  t.equal(gw.lines.filter(l => l.msg === 'admin request refused: missing or wrong token').length - refusalsBefore, 2, 'each refused reset is logged, as with reads open (reads refused are not: every scrape would be)')
  t.equal((await ask(gw.adminUrl + '/limits?route=api&ip=203.0.113.7', 'DELETE', TOKEN)).status, 200, 'a reset with it')

  // a reload turns it off: the rule is read from the config in force
  writeFileSync(gw.runtime!.file, config(upstream.url, `{ listen: 127.0.0.1:0, token: ${TOKEN} }`))
  t.equal((await gw.reload()).ok, true)
  for (const path of GUARDED) t.equal((await ask(gw.adminUrl + path)).status, 200, `${path} open again with reads: open (the default)`)
})

/** An open /events stream: whether it has ended, and the events it got. */
function openStream (url: string): Promise<{ ended: () => boolean, events: () => number, close: () => void }> {
  return new Promise((resolve, reject) => {
    const req = request(url, (res) => {
      if (res.statusCode !== 200) { reject(new Error(`status ${String(res.statusCode)}`)); return }
      let ended = false
      let events = 0
      res.setEncoding('utf8')
      res.on('data', (d: string) => { events += d.split('\nevent: ').length - 1 + (d.startsWith('event: ') ? 1 : 0) })
      res.on('close', () => { ended = true })
      resolve({ ended: () => ended, events: () => events, close: () => { req.destroy() } })
    })
    req.on('error', reject)
    req.end()
  })
}

t.test('a reload that changes who may read ends the event streams opened before it; one that does not keeps them', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url, `{ listen: 127.0.0.1:0, token: ${TOKEN} }`))
  const stream = await openStream(`${gw.adminUrl}/events`)
  t.teardown(() => { stream.close() })
  // the same rules (a limit changed): kept, and fed
  writeFileSync(gw.runtime!.file, config(upstream.url, `{ listen: 127.0.0.1:0, token: ${TOKEN} }`).replace('limit: 5', 'limit: 6'))
  t.equal((await gw.reload()).ok, true)
  const before = stream.events()
  await eventually('an update after the reload', async () => stream.events() > before, 10_000)
  t.notOk(stream.ended(), 'a reload that keeps reads open keeps the stream')
  // reads: token now: the anonymous stream opened before ends, and a new one is refused
  writeFileSync(gw.runtime!.file, config(upstream.url, `{ listen: 127.0.0.1:0, token: ${TOKEN}, reads: token }`))
  t.equal((await gw.reload()).ok, true)
  await eventually('the stream opened before the token was asked for ends', async () => stream.ended(), 10_000)
  t.pass('it ended')
  t.match(await ask(`${gw.adminUrl}/events`), { status: 401, error: 'GW_ERR_ADMIN_UNAUTHORIZED' }, 'opened again, it is asked for the token')
  // a new token: a stream that had the old one ends too
  const withToken = await new Promise<{ ended: () => boolean, close: () => void }>((resolve, reject) => {
    const req = request(`${gw.adminUrl}/events`, { headers: { authorization: `Bearer ${TOKEN}` } }, (res) => {
      let ended = false
      res.resume()
      res.on('close', () => { ended = true })
      if (res.statusCode === 200) resolve({ ended: () => ended, close: () => { req.destroy() } })
      else reject(new Error(`status ${String(res.statusCode)}`))
    })
    req.on('error', reject)
    req.end()
  })
  t.teardown(() => { withToken.close() })
  writeFileSync(gw.runtime!.file, config(upstream.url, `{ listen: 127.0.0.1:0, token: ${TOKEN}-rotated, reads: token }`))
  t.equal((await gw.reload()).ok, true)
  await eventually('the stream of the old token ends', async () => withToken.ended(), 10_000)
  t.pass('the token rotated: ended')
})

t.test('reads: token without a token is a located error', async t => {
  const dir = t.testdir({ 'gw.yaml': config('http://127.0.0.1:9', '{ listen: 127.0.0.1:0, reads: token }') })
  const run = await gateway(['validate', '-c', `${dir}/gw.yaml`])
  t.equal(run.code, 1)
  t.match(run.stderr, /gw\.yaml:2:\d+ admin\.reads: "reads: token" needs "admin\.token"/)
})

t.test('workers: 2: the primary asks for the token too; gateway reload and gateway limits get send it from the file', async t => {
  const upstream = await startUpstream(t)
  const gw = await spawnGateway(t, config(upstream.url, `{ listen: 0.0.0.0:0, token: ${TOKEN}, reads: token }`, 'workers: 2\n').replace('    limits:\n      ip: { limit: 5, window: 1m }\n', ''), [], { waitFor: 'gateway primary started' })
  await eventually('the workers are ready', async () => (await ask(`${gw.adminUrl}/readyz`)).status === 200, 20_000)
  for (const path of ['/config', '/metrics', '/events']) {
    t.match(await ask(gw.adminUrl + path), { status: 401, error: 'GW_ERR_ADMIN_UNAUTHORIZED' }, `${path} without a token`)
    t.equal((await ask(gw.adminUrl + path, 'GET', TOKEN)).status, 200, `${path} with the token`)
  }
  t.equal((await ask(`${gw.adminUrl}/healthz`)).status, 200, '/healthz open')
  t.notOk(gw.logs.some(l => /admin listener binds a non-loopback address/.test(String(l.msg))), 'no warning about open reads on 0.0.0.0: they are guarded')
  const reloaded = await gateway(['reload', '--pid-file', gw.pidFile, '-c', gw.file, '--admin', `127.0.0.1:${gw.adminPort}`], { GATEWAY_ADMIN_TOKEN: '' })
  t.equal(reloaded.code, 0, reloaded.stderr)
  t.match(reloaded.stdout, /^reloaded: generation 1 -> 2/)
  const got = await gateway(['limits', 'get', '--route', 'api', '--ip', '203.0.113.7', '-c', gw.file, '--admin', `127.0.0.1:${gw.adminPort}`], { GATEWAY_ADMIN_TOKEN: '' })
  t.equal(got.code, 0, got.stderr)
  const refused = await gateway(['limits', 'get', '--route', 'api', '--ip', '203.0.113.7', '--admin', `127.0.0.1:${gw.adminPort}`], { GATEWAY_ADMIN_TOKEN: '' })
  t.equal(refused.code, 1)
  t.match(refused.stderr, /gateway limits get: 401 GW_ERR_ADMIN_UNAUTHORIZED: admin\.reads is token/)
  // the token given on the command line, or in the environment, without the file
  const flagged = await gateway(['limits', 'get', '--route', 'api', '--ip', '203.0.113.7', '--admin', `127.0.0.1:${gw.adminPort}`, '--token', TOKEN], { GATEWAY_ADMIN_TOKEN: '' })
  t.equal(flagged.code, 0, `--token: ${flagged.stderr}`)
  const fromEnv = await gateway(['limits', 'get', '--route', 'api', '--ip', '203.0.113.7', '--admin', `127.0.0.1:${gw.adminPort}`], { GATEWAY_ADMIN_TOKEN: TOKEN })
  t.equal(fromEnv.code, 0, `$GATEWAY_ADMIN_TOKEN: ${fromEnv.stderr}`)
  const wrong = await gateway(['reload', '--pid-file', gw.pidFile, '-c', gw.file, '--admin', `127.0.0.1:${gw.adminPort}`], { GATEWAY_ADMIN_TOKEN: TOKEN.slice(1) })
  t.equal(wrong.code, 4)
  t.match(wrong.stderr, /\/config answered 401: its reads need the admin token/)
})

t.test('the page asks for the token, then connects', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, config(upstream.url, `{ listen: 127.0.0.1:0, token: ${TOKEN}, reads: token }`))
  const browser = await launchBrowser(t)
  const page = await browser.newPage()
  await page.goto(gw.adminUrl + '/')
  await page.locator('#read-token-form').waitFor({ state: 'visible' })
  t.equal(await page.locator('#status').innerText(), 'admin token needed')
  await page.getByLabel('Token', { exact: true }).fill(TOKEN)
  await page.getByRole('button', { name: 'Connect' }).click()
  await eventually('the page connected and shows the health', async () => (await page.locator('#status').innerText()) === 'ready', 20_000)
  await page.locator('#limits-table tr[data-route="api"]').waitFor()
  t.equal(await page.locator('#read-token-form').isVisible(), false, 'the form is gone')
  t.equal(await page.evaluate('sessionStorage.getItem("gateway-admin-token")'), TOKEN, 'kept for this tab')
})
