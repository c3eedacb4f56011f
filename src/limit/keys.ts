// Limit keys and their Redis Cluster hash slots.
//
// Keys carry no hash tag on purpose: every (limit, client) key hashes to its own slot, so the
// load spreads over all masters (the seed documents' literal `{biz}` put every user of a business
// on one slot). Braces in the client-supplied value are percent-encoded so a client cannot pick
// its own slot, or pile everyone onto one, by sending "{tag}" in its identity; '%' is encoded too
// so the encoding stays one-to-one. Prefix and limit id come from the config and are used as is.

const ESCAPES: Readonly<Record<string, string>> = { '{': '%7B', '}': '%7D', '%': '%25' }
const HAS_SPECIAL = /[{}%]/
const SPECIALS = /[{}%]/g

/** `value` with `{`, `}` and `%` percent-encoded (returned as is when it has none). */
export function escapeKeyValue (value: string): string {
  return HAS_SPECIAL.test(value) ? value.replace(SPECIALS, (c) => ESCAPES[c] as string) : value
}

/** `<prefix>:<limit id>:<value>`, with `{`, `}` and `%` in `value` percent-encoded. */
export function limitKey (prefix: string, limitId: string, value: string): string {
  return `${prefix}:${limitId}:${escapeKeyValue(value)}`
}

// CRC16-CCITT (XMODEM), the hash of the Redis Cluster specification. Computed here rather than
// importing `cluster-key-slot`, which is only a transitive dependency of ioredis.
const CRC_TABLE = new Uint16Array(256)
for (let i = 0; i < 256; i++) {
  let crc = i << 8
  for (let b = 0; b < 8; b++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff
  CRC_TABLE[i] = crc
}

function crc16 (bytes: Uint8Array, start: number, end: number): number {
  let crc = 0
  for (let i = start; i < end; i++) crc = ((crc << 8) & 0xffff) ^ (CRC_TABLE[((crc >> 8) ^ (bytes[i] as number)) & 0xff] as number)
  return crc
}

const OPEN = 0x7b // '{'
const CLOSE = 0x7d // '}'

/** The Redis Cluster slot of `key` (0..16383), honouring a `{hash tag}` as Redis does. */
export function keySlot (key: string): number {
  const bytes = Buffer.from(key, 'utf8')
  const open = bytes.indexOf(OPEN)
  if (open >= 0) {
    const close = bytes.indexOf(CLOSE, open + 1)
    // Only a non-empty tag counts: "{}" hashes the whole key.
    if (close > open + 1) return crc16(bytes, open + 1, close) & 16383
  }
  return crc16(bytes, 0, bytes.length) & 16383
}
