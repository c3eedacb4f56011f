import { execFileSync } from 'node:child_process'
import { join } from 'node:path'
import { tempDir, type Teardown } from './teardown.js'

/**
 * Writes a self-signed certificate for `cn` (P-256, one day) and its key to `cert` and `key`,
 * replacing what they held (as a renewal does). `extra`: more `openssl req` arguments.
 */
export function writeSelfSigned (cert: string, key: string, cn: string, extra: readonly string[] = []): void {
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', key, '-out', cert,
    '-days', '1', '-subj', `/CN=${cn}`, ...extra], { stdio: 'ignore' })
}

/** A self-signed certificate for `cn` and its key (cert.pem, key.pem) in a directory of their own, removed at teardown. */
export function selfSignedCertificate (t: Teardown, prefix: string, cn: string, extra: readonly string[] = []): { dir: string, cert: string, key: string } {
  const dir = tempDir(t, prefix)
  const cert = join(dir, 'cert.pem')
  const key = join(dir, 'key.pem')
  writeSelfSigned(cert, key, cn, extra)
  return { dir, cert, key }
}

/**
 * A self-signed certificate for `localhost`, in a directory removed at teardown: the paths of its
 * certificate (also its own CA, for NODE_EXTRA_CA_CERTS) and key.
 */
export function localhostCertificate (t: Teardown, prefix: string): { cert: string, key: string } {
  const { cert, key } = selfSignedCertificate(t, prefix, 'localhost', ['-addext', 'subjectAltName=DNS:localhost'])
  return { cert, key }
}
