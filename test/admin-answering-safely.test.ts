// The README's GW_ERR_ADMIN_FAILED: a throw in an admin handler (a bug) is answered 500 with its
// message and the listener goes on serving; uncaught, a throw in a request listener ended the
// process, every worker's traffic with it. The handler the admin listeners (the gateway's and,
// under workers: N, the primary's) are built on, on a real listener.
import t from 'tap'
import { answeringSafely, json } from '../src/admin/admin-server.js'
import { startHttpServer } from './helpers/upstream.js'
import { send } from './helpers/ratelimit.js'

t.test('a throw is a 500 GW_ERR_ADMIN_FAILED naming it, a target that does not parse a 400, and the listener serves on', async t => {
  const { url } = await startHttpServer(t, answeringSafely((req, res) => {
    if (req.url === '/bug') throw new TypeError('cannot read properties of undefined (reading \'routes\')')
    if (req.url === '/half') {
      res.writeHead(200, { 'content-type': 'text/plain' })
      res.write('part')
      throw new Error('after the head')
    }
    if (req.url === '/bad') decodeURIComponent('%zz')
    json(res, 200, { ok: true })
  }))
  const bug = await send(`${url}/bug`)
  t.same([bug.status, bug.json?.error, bug.json?.message], [500, 'GW_ERR_ADMIN_FAILED', 'cannot read properties of undefined (reading \'routes\')'])
  const bad = await send(`${url}/bad`)
  t.same([bad.status, bad.json?.error], [400, 'GW_ERR_BAD_REQUEST'], 'a target that does not parse is the client\'s')
  // its head gone out, an answer cannot turn into a 500: the connection is cut
  await t.rejects(send(`${url}/half`), 'the half-written answer is cut')
  t.same((await send(`${url}/ok`)).json, { ok: true }, 'served on')
})
