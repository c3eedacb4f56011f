// Every file the config reads is bounded (src/read-bounded.ts): `-c /dev/zero` held 650 MB
// before failing, and a SIGHUP onto a huge file would have taken as much in the serving process.
import t from 'tap'
import { truncateSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { spawnGateway, startGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'
import { gateway, oneRoute } from './helpers/cli.js'
import { ConfigError } from '../src/config/load.js'
import { MAX_CONFIG_FILE_BYTES, readFileBounded } from '../src/read-bounded.js'
import { tempDir } from './helpers/teardown.js'

const TOO_LARGE = /larger than 64 MiB, the most a file of the config may hold/

t.test('a device with no end is read up to the bound, then refused with a located error', async t => {
  const run = await gateway(['validate', '-c', '/dev/zero'])
  t.equal(run.code, 1, 'invalid config')
  t.match(run.stderr, new RegExp(`^/dev/zero:0:0: ${TOO_LARGE.source}`))
  await t.rejects(readFileBounded('/dev/zero', 1024 * 1024), /larger than 1 MiB/, 'the bound is the one given')
})

t.test('a file of exactly the bound is read whole; one byte more is refused', async t => {
  const dir = tempDir(t, 'gw-size')
  const file = join(dir, 'f')
  writeFileSync(file, Buffer.alloc(200_000, 'a'))
  t.equal((await readFileBounded(file, 200_000)).length, 200_000, 'every byte, across chunks')
  await t.rejects(readFileBounded(file, 199_999), /larger than/)
  t.equal(MAX_CONFIG_FILE_BYTES, 64 * 1024 * 1024)
})

t.test('a reload onto a file past the bound is rejected, located, and the running config keeps serving', async t => {
  const up = await startUpstream(t)
  const gw = await spawnGateway(t, oneRoute(up.url, 'all'))
  t.equal((await fetch(`${gw.url}/x`)).status, 200)
  truncateSync(gw.file, MAX_CONFIG_FILE_BYTES + 1)
  gw.child.kill('SIGHUP')
  const rejected = await gw.waitForLog(l => l.msg === 'reload rejected; the running configuration keeps serving')
  t.match(rejected.problems, [new RegExp(`^${gw.file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:0:0: ${TOO_LARGE.source}`)])
  t.equal((await fetch(`${gw.url}/x`)).status, 200, 'still serving')
})

t.test('an API key file past the bound stops the start, located at the key file', async t => {
  const dir = tempDir(t, 'gw-size')
  const keyFile = join(dir, 'keys.yaml')
  writeFileSync(keyFile, 'k-1: alice\n')
  truncateSync(keyFile, MAX_CONFIG_FILE_BYTES + 1)
  const yaml = `listen: 127.0.0.1:0
identity: { apiKeys: { header: x-api-key, file: ${keyFile} } }
consumers: { alice: { plan: free } }
plans: { free: { limits: { quota: { limit: 5, period: day } } } }
upstreams: { b: { targets: [http://127.0.0.1:1] } }
routes:
  - { name: a, pathPrefix: /, upstream: b }
`
  const err = await startGateway(t, yaml).then(() => null, (e: unknown) => e)
  t.ok(err instanceof ConfigError, 'refused with a ConfigError')
  t.match((err as Error).message, new RegExp(`${keyFile.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:0:0: ${TOO_LARGE.source}`))
})

t.test('a directory where a file goes is named as such, for the config, the key file and a TLS file', async t => {
  const dir = tempDir(t, 'gw-dir')
  const run = await gateway(['validate', '-c', dir])
  t.equal(run.code, 1)
  // node's own words were "EISDIR: illegal operation on a directory, read"
  t.equal(run.stderr, `${dir}:0:0: is a directory, not a file\n`)
  const yaml = (extra: string): string => `listen: 127.0.0.1:0
${extra}
upstreams: { b: { targets: [http://127.0.0.1:1] } }
routes:
  - { name: a, pathPrefix: /, upstream: b }
`
  const file = join(tempDir(t, 'gw-dir-config'), 'gateway.yaml')
  writeFileSync(file, yaml(`identity: { apiKeys: { header: x-api-key, file: ${dir} } }`))
  const keys = await gateway(['validate', '-c', file])
  t.equal(keys.code, 1)
  t.match(keys.stderr, `${dir}:0:0: is a directory, not a file`)
  writeFileSync(file, yaml(`tls: { cert: ${dir}, key: ${dir} }`))
  const tls = await gateway(['validate', '-c', file])
  t.equal(tls.code, 1)
  t.match(tls.stderr, `tls.cert: cannot read ${dir}: is a directory, not a file`)
})

t.test('a TLS file past the bound is refused at its key, located, without reading it whole', async t => {
  const dir = tempDir(t, 'gw-size-tls')
  const cert = join(dir, 'cert.pem')
  writeFileSync(cert, '-----BEGIN CERTIFICATE-----\n')
  truncateSync(cert, MAX_CONFIG_FILE_BYTES + 1)
  const file = join(dir, 'gateway.yaml')
  writeFileSync(file, `listen: 127.0.0.1:0
tls: { cert: ${cert}, key: ${cert} }
upstreams: { b: { targets: [http://127.0.0.1:1] } }
routes:
  - { name: a, pathPrefix: /, upstream: b }
`)
  const run = await gateway(['validate', '-c', file])
  t.equal(run.code, 1, 'invalid config')
  t.match(run.stderr, new RegExp(`tls\\.cert: cannot read ${cert.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: ${TOO_LARGE.source}`))
})
