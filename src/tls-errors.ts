// What a TLS connection's failure says, for the two clients that make them: the Redis client
// (src/limit/redis-client.ts) and the upstream forward (src/proxy/upstream-errors.ts). Kept here,
// outside both stages, so that the list is one.

/**
 * Node's codes for a server certificate it does not accept: OpenSSL's verification results
 * (X509_V_ERR_* without the prefix) and node's own name check. What a wrong CA, a wrong server
 * name or an expired certificate gives.
 */
const CERTIFICATE_REFUSED: ReadonlySet<string> = new Set([
  'UNABLE_TO_GET_ISSUER_CERT', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_DECRYPT_CERT_SIGNATURE', 'UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY',
  'DEPTH_ZERO_SELF_SIGNED_CERT', 'SELF_SIGNED_CERT_IN_CHAIN', 'CERT_SIGNATURE_FAILURE', 'CERT_NOT_YET_VALID',
  'CERT_HAS_EXPIRED', 'ERROR_IN_CERT_NOT_BEFORE_FIELD', 'ERROR_IN_CERT_NOT_AFTER_FIELD',
  'CERT_CHAIN_TOO_LONG', 'CERT_REVOKED', 'INVALID_CA', 'PATH_LENGTH_EXCEEDED',
  'INVALID_PURPOSE', 'CERT_UNTRUSTED', 'CERT_REJECTED', 'HOSTNAME_MISMATCH'
])

/**
 * A code of TLS refusing the peer while connecting: its certificate (the list above, node's
 * ERR_TLS_* checks such as ERR_TLS_CERT_ALTNAME_INVALID) or the handshake (ERR_SSL_*: TLS spoken
 * to a plain port, no common protocol version or cipher, a client certificate asked for). A
 * setting to fix, which retrying the same peer never cures.
 */
export function isTlsRefusalCode (code: string): boolean {
  return CERTIFICATE_REFUSED.has(code) || code.startsWith('ERR_SSL_') || code.startsWith('ERR_TLS_')
}
