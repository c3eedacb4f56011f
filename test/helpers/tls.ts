import { execFileSync } from 'node:child_process'
import { join } from 'node:path'
import { tempDir, type Teardown } from './teardown.js'

/**
 * A self-signed certificate for `localhost` (P-256, one day), in a directory removed at teardown:
 * the paths of its certificate (also its own CA, for NODE_EXTRA_CA_CERTS) and key.
 */
export function localhostCertificate (t: Teardown, prefix: string): { cert: string, key: string } {
  const dir = tempDir(t, prefix)
  const cert = join(dir, 'cert.pem')
  const key = join(dir, 'key.pem')
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', key, '-out', cert,
    '-days', '1', '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost'], { stdio: 'ignore' })
  return { cert, key }
}
