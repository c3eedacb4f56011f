// Response compression (`compression:`, nginx's gzip module, Traefik's compress middleware,
// Envoy's compressor filter): an upstream that sends JSON or HTML uncompressed has it sent to
// clients that accept gzip or Brotli compressed, as it streams. Decided once per response from its
// head (decideCompression) and done by a zlib stream between the upstream's body and the client.
import { constants as zlibConstants, createBrotliCompress, createGzip, type BrotliCompress, type Gzip } from 'node:zlib'

export type Encoding = 'br' | 'gzip'
export const ENCODINGS: readonly Encoding[] = ['br', 'gzip']

export interface CompressionOptions {
  /** The server's preference when the client accepts several equally. */
  readonly encodings: readonly Encoding[]
  /** A response whose Content-Length is below it passes as it is (an unknown length is compressed). */
  readonly minSize: number
  /** Media types compressed: `text/html`, `text/*`, `application/*+json`. */
  readonly types: readonly string[]
  readonly gzipLevel: number
  readonly brotliQuality: number
}

export interface CompressionPolicy {
  readonly encodings: readonly Encoding[]
  readonly minSize: number
  readonly compressible: (mediaType: string) => boolean
  readonly gzipLevel: number
  readonly brotliQuality: number
}

/** What is compressed when `types` is not given: text that compresses well, never an image or an archive. */
export const DEFAULT_COMPRESSED_TYPES: readonly string[] = Object.freeze([
  'text/html', 'text/plain', 'text/css', 'text/javascript', 'text/xml', 'text/csv', 'text/markdown',
  'application/json', 'application/javascript', 'application/xml', 'application/*+json', 'application/*+xml',
  'application/x-ndjson', 'application/graphql-response+json', 'application/wasm', 'image/svg+xml'
])

const TOKEN = /^[!#$%&'*+.^_`|~0-9a-z-]+$/

/** Why a `types` entry cannot be used, or null: `type/subtype`, `type/*` or `type/*+suffix`. */
export function mediaRangeProblem (range: string): string | null {
  const [type, subtype, ...more] = range.toLowerCase().split('/')
  if (type === undefined || subtype === undefined || more.length > 0 || type === '*' || !TOKEN.test(type)) return `"${range}" is no media type (type/subtype, type/* or type/*+suffix)`
  if (subtype === '*' || (subtype.startsWith('*+') && TOKEN.test(subtype.slice(2)) && !subtype.slice(2).includes('*'))) return null
  if (!TOKEN.test(subtype) || subtype.includes('*')) return `"${range}" is no media type (type/subtype, type/* or type/*+suffix)`
  return null
}

export function compileCompression (options: CompressionOptions): CompressionPolicy {
  const exact = new Set<string>()
  const anySubtype = new Set<string>()
  const suffixes: Array<readonly [string, string]> = []
  for (const range of options.types) {
    const problem = mediaRangeProblem(range)
    if (problem !== null) throw new Error(problem)
    const [type, subtype] = range.toLowerCase().split('/') as [string, string]
    if (subtype === '*') anySubtype.add(type)
    else if (subtype.startsWith('*+')) suffixes.push([type + '/', subtype.slice(1)])
    else exact.add(range.toLowerCase())
  }
  const compressible = (mediaType: string): boolean => {
    if (exact.has(mediaType)) return true
    const slash = mediaType.indexOf('/')
    if (slash <= 0) return false
    if (anySubtype.has(mediaType.slice(0, slash))) return true
    for (const [type, suffix] of suffixes) if (mediaType.startsWith(type) && mediaType.endsWith(suffix) && mediaType.length > type.length + suffix.length) return true
    return false
  }
  return Object.freeze({ encodings: options.encodings, minSize: options.minSize, compressible, gzipLevel: options.gzipLevel, brotliQuality: options.brotliQuality })
}

/**
 * The coding of `encodings` the client takes with the highest weight (RFC 9110 §12.5.3), the
 * first in `encodings` among equals; null when it takes none (no field: identity only).
 */
export function negotiateEncoding (acceptEncoding: string | undefined, encodings: readonly Encoding[]): Encoding | null {
  if (acceptEncoding === undefined || acceptEncoding === '') return null
  let star = -1
  const weights = new Map<string, number>()
  for (const member of acceptEncoding.split(',')) {
    const [name = '', ...params] = member.split(';')
    const coding = name.trim().toLowerCase()
    if (coding === '') continue
    let q = 1
    for (const param of params) {
      const [key = '', value = ''] = param.split('=')
      if (key.trim().toLowerCase() !== 'q') continue
      const n = Number(value.trim())
      // RFC 9110 §12.4.2: 0 to 1, three decimals at most; a weight that is none is none
      q = /^(?:0(?:\.\d{0,3})?|1(?:\.0{0,3})?)$/.test(value.trim()) ? n : 0
    }
    // a coding named twice: its highest weight (browsers do not, proxies that join fields may)
    if (coding === '*') star = Math.max(star, q)
    else weights.set(coding, Math.max(weights.get(coding) ?? 0, q))
  }
  let best: Encoding | null = null
  let bestQ = 0
  for (const encoding of encodings) {
    const q = weights.get(encoding) ?? (encoding === 'gzip' ? weights.get('x-gzip') : undefined) ?? (star > 0 ? star : 0)
    if (q > bestQ) {
      best = encoding
      bestQ = q
    }
  }
  return best
}

/** Statuses whose body is never compressed: none (204, 304) or a part of one (206). */
const NO_BODY_TO_COMPRESS: ReadonlySet<number> = new Set([204, 206, 304])

/**
 * The head a response goes out with, and the coding its body is compressed with (null: as it
 * came). A response that could be compressed gets `Vary: Accept-Encoding` either way, so a cache
 * keeps the two apart. Not compressed: a HEAD's, a status without a whole body, a body already
 * encoded, a `Cache-Control: no-transform`, a type not listed, a Content-Length under minSize.
 * Compressed: Content-Length and Accept-Ranges go (the length is unknown, ranges would count
 * compressed bytes), a strong ETag becomes weak (the bytes differ, the meaning does not: nginx
 * does the same).
 */
export function decideCompression (policy: CompressionPolicy, method: string, acceptEncoding: string | undefined, status: number, head: string[]): { head: string[], encoding: Encoding | null } | null {
  if (method === 'HEAD' || status < 200 || NO_BODY_TO_COMPRESS.has(status)) return null
  let type: string | null = null
  let vary = -1
  let etag = -1
  for (let i = 0; i < head.length; i += 2) {
    const name = (head[i] as string).toLowerCase()
    const value = head[i + 1] as string
    switch (name) {
      case 'content-type': type = value.split(';', 1)[0]?.trim().toLowerCase() ?? ''; break
      case 'content-encoding': if (value.trim().toLowerCase() !== 'identity') return null; break
      // an empty body stays empty (a coding would give it 20 bytes)
      case 'content-length': if (Number(value) < policy.minSize || Number(value) === 0) return null; break
      case 'cache-control': if (/(?:^|[\s,])no-transform(?:$|[\s,;=])/i.test(value)) return null; break
      case 'vary': vary = i; break
      case 'etag': etag = i; break
    }
  }
  if (type === null || !policy.compressible(type)) return null
  const encoding = negotiateEncoding(acceptEncoding, policy.encodings)
  let out = head
  const listed = vary !== -1 && /(?:^|,)\s*(?:\*|accept-encoding)\s*(?:,|$)/i.test(head[vary + 1] as string)
  if (!listed) {
    out = out.slice()
    if (vary === -1) out.push('vary', 'Accept-Encoding')
    else out[vary + 1] = `${out[vary + 1] as string}, Accept-Encoding`
  }
  if (encoding === null) return { head: out, encoding: null }
  const compressed: string[] = []
  for (let i = 0; i < out.length; i += 2) {
    const name = (out[i] as string).toLowerCase()
    if (name === 'content-length' || name === 'accept-ranges' || name === 'content-encoding') continue
    const value = out[i + 1] as string
    compressed.push(out[i] as string, i === etag && value.startsWith('"') ? `W/${value}` : value)
  }
  compressed.push('content-encoding', encoding)
  return { head: compressed, encoding }
}

export type Encoder = Gzip | BrotliCompress

/**
 * Each write is flushed as it is compressed: what the upstream sent reaches the client as it
 * came (an event stream's events, a long poll's answer), not when 16 KiB of output have gathered.
 * A sync flush costs a few bytes per upstream read.
 */
export function createEncoder (policy: CompressionPolicy, encoding: Encoding): Encoder {
  if (encoding === 'gzip') return createGzip({ level: policy.gzipLevel, flush: zlibConstants.Z_SYNC_FLUSH })
  return createBrotliCompress({
    flush: zlibConstants.BROTLI_OPERATION_FLUSH,
    params: { [zlibConstants.BROTLI_PARAM_QUALITY]: policy.brotliQuality, [zlibConstants.BROTLI_PARAM_MODE]: zlibConstants.BROTLI_MODE_TEXT }
  })
}
