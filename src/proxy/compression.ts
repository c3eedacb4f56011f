// Response compression (`compression:`, nginx's gzip module, Traefik's compress middleware,
// Envoy's compressor filter): an upstream that sends JSON or HTML uncompressed has it sent to
// clients that accept gzip or Brotli compressed, as it streams. Decided once per response from its
// head (decideCompression) and done by a zlib stream between the upstream's body and the client.
import { listsMember } from './forward-headers.js'
import { constants as zlibConstants, createBrotliCompress, createGzip, type BrotliCompress, type Gzip } from 'node:zlib'

export type Encoding = 'br' | 'gzip'

/** What of the request the decision reads. */
export interface CompressionRequest {
  readonly acceptEncoding: string | undefined
  readonly ifNoneMatch: string | undefined
}

export interface CompressionDecision {
  /** The head the answer goes out with. */
  readonly head: string[]
  /** The coding of its body; null: as it came. */
  readonly encoding: Encoding | null
  /** The upstream's Content-Length, when it gave one. */
  readonly length: number | null
}
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
  /** Answers compressed at once by the process; beyond it they go out as they came. */
  readonly maxConcurrent: number
}

export interface CompressionPolicy {
  readonly encodings: readonly Encoding[]
  readonly minSize: number
  readonly compressible: (mediaType: string) => boolean
  readonly gzipLevel: number
  readonly brotliQuality: number
  readonly maxConcurrent: number
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
  return Object.freeze({ encodings: options.encodings, minSize: options.minSize, compressible, gzipLevel: options.gzipLevel, brotliQuality: options.brotliQuality, maxConcurrent: options.maxConcurrent })
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

/** Statuses whose body is never compressed: none (204, 205, 304) or a part of one (206). */
const NO_BODY_TO_COMPRESS: ReadonlySet<number> = new Set([204, 205, 206, 304])

/**
 * The head a response goes out with, and the coding its body is compressed with (null: as it
 * came). A response that could be compressed gets `Vary: Accept-Encoding` either way, so a cache
 * keeps the two apart. Not compressed: a HEAD's, a status without a whole body, a body already
 * encoded, a `Cache-Control: no-transform`, a type not listed, a Content-Length under minSize.
 * Compressed: Content-Length and Accept-Ranges go (the length is unknown, ranges would count
 * compressed bytes), a strong ETag becomes weak (the bytes differ, the meaning does not: nginx
 * does the same).
 */
export function decideCompression (policy: CompressionPolicy, method: string, request: CompressionRequest, status: number, head: string[]): CompressionDecision | null {
  if (status === 304) return revalidated(policy, request, head)
  if (method === 'HEAD' || status < 200 || NO_BODY_TO_COMPRESS.has(status)) return null
  let type: string | null = null
  let vary = -1
  let etag = -1
  let length: number | null = null
  for (let i = 0; i < head.length; i += 2) {
    const name = (head[i] as string).toLowerCase()
    const value = head[i + 1] as string
    switch (name) {
      case 'content-type': type = value.split(';', 1)[0]?.trim().toLowerCase() ?? ''; break
      case 'content-encoding': if (value.trim().toLowerCase() !== 'identity') return null; break
      // an empty body stays empty (a coding would give it 20 bytes)
      case 'content-length':
        length = Number(value)
        if (length < policy.minSize || length === 0) return null
        break
      case 'cache-control': if (/(?:^|[\s,])no-transform(?:$|[\s,;=])/i.test(value)) return null; break
      case 'vary': vary = i; break
      case 'etag': etag = i; break
      // a digest of the content (RFC 9530's Content-Digest and Repr-Digest cover the coded bytes;
      // RFC 3230's Digest, Content-MD5) no longer holds once it is compressed: a signed or checked
      // answer passes as it came
      case 'content-digest': case 'repr-digest': case 'digest': case 'content-md5': return null
    }
  }
  if (type === null || !policy.compressible(type)) return null
  // past maxConcurrent the answer goes out as it came, with the Vary its compressed form would have
  const encoding = openEncoders < policy.maxConcurrent ? negotiateEncoding(request.acceptEncoding, policy.encodings) : null
  const out = withVary(head, vary)
  if (encoding === null) return { head: out, encoding: null, length }
  const compressed: string[] = []
  for (let i = 0; i < out.length; i += 2) {
    const name = (out[i] as string).toLowerCase()
    if (name === 'content-length' || name === 'accept-ranges' || name === 'content-encoding') continue
    const value = out[i + 1] as string
    compressed.push(out[i] as string, i === etag && value.startsWith('"') ? `W/${value}` : value)
  }
  compressed.push('content-encoding', encoding)
  return { head: compressed, encoding, length }
}

/** `head` with Accept-Encoding in its Vary (the field at `vary`, -1 for none), unless a Vary field lists it or `*`. */
function withVary (head: string[], vary: number): string[] {
  if (vary !== -1 && listsMember(head, 'vary', 'accept-encoding')) return head
  const out = head.slice()
  if (vary === -1) out.push('vary', 'Accept-Encoding')
  else out[vary + 1] = `${out[vary + 1] as string}, Accept-Encoding`
  return out
}

/**
 * A 304 on a compressing route. It gets the Vary the 200 had (RFC 9110 §15.4.5), Accept-Encoding
 * added; having no Content-Type, it cannot tell whether its 200 was of a type compressed, so a
 * 304 for a type never compressed says it too (a cache then keeps that answer apart per coding,
 * no more). And when it revalidates a compressed answer (the client, or a cache, asks with the
 * weak ETag that answer went out with; the upstream, comparing weakly, answers with its strong
 * one), it names the weak ETag: relayed as is, it named a validator the stored answer does not
 * have, which a cache may not use to freshen it (RFC 9111 §4.3.4).
 */
function revalidated (policy: CompressionPolicy, request: CompressionRequest, head: string[]): CompressionDecision | null {
  let etag = -1
  let vary = -1
  for (let i = 0; i < head.length; i += 2) {
    const name = (head[i] as string).toLowerCase()
    if (name === 'etag') etag = i
    else if (name === 'vary') vary = i
  }
  const out = withVary(head, vary)
  const strong = etag === -1 ? '' : (head[etag + 1] as string).trim()
  const weak = strong.startsWith('"') && request.ifNoneMatch !== undefined &&
    request.ifNoneMatch.split(',').some(tag => tag.trim() === `W/${strong}`) &&
    negotiateEncoding(request.acceptEncoding, policy.encodings) !== null
  if (!weak) return out === head ? null : { head: out, encoding: null, length: null }
  const weakened = out === head ? head.slice() : out
  weakened[etag + 1] = `W/${strong}`
  return { head: weakened, encoding: null, length: null }
}

export type Encoder = Gzip | BrotliCompress

/**
 * A 256 KiB Brotli window, not the default 4 MiB: an encoder's memory is held per answer for as
 * long as its client reads (by RSS, after 1 MB in 64 KiB writes: 1.8 MB with the default window,
 * 1.3 MB with this one, 0.6 MB for gzip 5), and a JSON document came out no larger at quality 4.
 */
const BROTLI_WINDOW_BITS = 18

/**
 * Encoders open in this process, across reloads: each holds 0.6-1.3 MB until its answer ends, so
 * slow readers of compressed answers, each held up to sendTimeout, would otherwise hold that much
 * per connection (compression.maxConcurrent bounds it).
 */
let openEncoders = 0
const encoderClosed = (): void => { openEncoders-- }

/** Encoders open now (gateway_compression_encoders_open). */
export const openEncoderCount = (): number => openEncoders

export function createEncoder (policy: CompressionPolicy, encoding: Encoding, length: number | null): Encoder {
  const encoder = encoding === 'gzip' ? createGzip({ level: policy.gzipLevel }) : createBrotli(policy, length)
  openEncoders++
  // 'close' comes once, after the end or a destroy (autoDestroy)
  encoder.once('close', encoderClosed)
  return encoder
}

function createBrotli (policy: CompressionPolicy, length: number | null): BrotliCompress {
  return createBrotliCompress({
    params: {
      [zlibConstants.BROTLI_PARAM_QUALITY]: policy.brotliQuality,
      [zlibConstants.BROTLI_PARAM_MODE]: zlibConstants.BROTLI_MODE_TEXT,
      [zlibConstants.BROTLI_PARAM_LGWIN]: BROTLI_WINDOW_BITS,
      ...(length !== null ? { [zlibConstants.BROTLI_PARAM_SIZE_HINT]: length } : {})
    }
  })
}

/**
 * What the encoder holds goes out: called once at the end of each event-loop turn in which the
 * upstream sent bytes, so a stream's events or a long poll's answer reach the client as they
 * came. Once per turn, not per write: undici hands over each HTTP chunk apart, and an upstream
 * that writes a line per chunk made a flush per line, which took most of the compression
 * (gzip 70 kB instead of 25 kB for 5000 NDJSON lines). A sync flush, not node's default full
 * one, which forgets the dictionary.
 */
export function flushEncoder (encoder: Encoder, encoding: Encoding): void {
  if (encoder.destroyed || encoder.writableEnded) return
  encoder.flush(encoding === 'gzip' ? zlibConstants.Z_SYNC_FLUSH : zlibConstants.BROTLI_OPERATION_FLUSH)
}
