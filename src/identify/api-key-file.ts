// `identity.apiKeys.file`: more "key: consumer" lines kept outside gateway.yaml (so keys can be
// rotated without touching the config, and kept with tighter permissions). Read when the runtime is
// compiled, so SIGHUP re-reads it; a bad file is a located error and the running config keeps serving.
import { notFound, readFailure, readFileBounded } from '../read-bounded.js'
import { LineCounter, parseDocument, isMap, isScalar } from 'yaml'
import { MAX_USER_LENGTH, type ConsumerDirectory } from './identity.js'
import { misreadScalar, repeatedKeyMessage, repeatedKeys, unknownTag } from './yaml-scalars.js'
import { PARSE_OFF_THREAD_CHARS, parseOffThread } from '../off-thread.js'

/**
 * What an API key may hold: what a header value carries byte for byte (RFC 9110 §5.5: visible
 * ASCII, Latin-1's obs-text, spaces and tabs inside). A character above U+00FF never reaches the
 * gateway as written: node reads a header's bytes as Latin-1.
 */
export const API_KEY_TEXT = /^[\x21-\x7e\x80-\xff](?:[\x20-\x7e\x80-\xff\t]*[\x21-\x7e\x80-\xff])?$/
export const API_KEY_CHARS = 'an API key must be characters a header carries as written (visible ASCII or Latin-1, spaces and tabs inside): a character above U+00FF could never match'

/** A problem at a place in the key file; line 0 = the file itself (missing, unreadable). */
export interface KeyFileProblem {
  readonly file: string
  readonly line: number
  readonly column: number
  /** The entry by position (`[3]`), never the key: errors must not print secrets. */
  readonly path: string
  readonly message: string
}

/** The key file cannot be used; the assembler reports `problems` like config errors. */
export class ApiKeyFileError extends Error {
  readonly code = 'GW_ERR_CONFIG_INVALID'
  constructor (readonly problems: readonly KeyFileProblem[]) {
    super(problems.map(p => `${p.file}:${p.line}:${p.column}${p.path === '' ? '' : ' ' + p.path}: ${p.message}`).join('\n'))
  }
}

/**
 * Why `consumer` cannot be the target of an API key, or null. With plans configured, a key must
 * lead to a consumer that has an entry in `consumers`, unless `defaultPlan` catches the rest.
 */
export function consumerProblem (consumer: string, consumers: ConsumerDirectory): string | null {
  if (consumer.length === 0) return 'an API key must map to a consumer name'
  // checked here too, so that the key file's entry is named (compileApiKeys could only blame identity.apiKeys)
  if (consumer.length > MAX_USER_LENGTH) return `a consumer name has at most ${MAX_USER_LENGTH} characters`
  if (consumers.known.size > 0 && consumers.defaultPlan === null && !consumers.plans.has(consumer)) {
    return `API key maps to consumer "${consumer}", which has no entry in consumers (and there is no defaultPlan)`
  }
  return null
}

/** An entry of the key file as written, its consumer not yet checked against the config's consumers. */
export interface KeyFileEntry {
  readonly key: string
  readonly consumer: string
  /** Its position among the entries: what a problem names, never the key. */
  readonly index: number
  /** Where a problem with its consumer is shown: the consumer's value, or the key without one. */
  readonly line: number
  readonly column: number
}

/** The key file's entries in order, each read or refused with its problem. */
export type KeyFileItem = KeyFileEntry | { readonly problem: KeyFileProblem }

/** What src/config/parse-thread.ts posts back for a key file. */
export type KeyFileReply =
  | { readonly ok: true, readonly items: readonly KeyFileItem[] }
  | { readonly ok: false, readonly problems: readonly KeyFileProblem[] }
  | { readonly ok: false, readonly error: string }

/** The [key, consumer] pairs of the file; [] without a file. Throws ApiKeyFileError located in the file. */
export async function readApiKeyFile (file: string | undefined, consumers: ConsumerDirectory, read: (path: string) => Promise<Buffer> = readFileBounded): Promise<Array<[string, string]>> {
  if (file === undefined) return []
  let text: string
  try {
    text = (await read(file)).toString('utf8')
  } catch (err) {
    throw new ApiKeyFileError([{ file, line: 0, column: 0, path: '', message: notFound(err) ? 'API key file not found' : readFailure(err) }])
  }
  const out: Array<[string, string]> = []
  const problems: KeyFileProblem[] = []
  for (const item of await keyFileItems(text, file)) {
    if ('problem' in item) {
      problems.push(item.problem)
      continue
    }
    const problem = consumerProblem(item.consumer, consumers)
    if (problem !== null) problems.push({ file, line: item.line, column: item.column, path: `[${item.index}]`, message: problem })
    else out.push([item.key, item.consumer])
  }
  if (problems.length > 0) throw new ApiKeyFileError(problems)
  return out
}

/** parseKeyFileText, on a worker thread for a long file: a 20,000-line file took 1 to 2.6 s to parse. */
async function keyFileItems (text: string, file: string): Promise<readonly KeyFileItem[]> {
  if (text.length < PARSE_OFF_THREAD_CHARS) return parseKeyFileText(text, file)
  const reply = await parseOffThread<KeyFileReply>({ kind: 'keyFile', text, file })
  if (!reply.ok) throw 'problems' in reply ? new ApiKeyFileError(reply.problems) : new Error(reply.error)
  return reply.items
}

/**
 * The entries of a key file's text, in order, each with its problem if it has one. A file that is
 * not "key: consumer" lines (YAML errors, repeated keys, another shape) throws ApiKeyFileError.
 */
export function parseKeyFileText (text: string, file: string): KeyFileItem[] {
  const lineCounter = new LineCounter()
  // repeated keys are found by repeatedKeys, in one pass (YAML's check is quadratic)
  const doc = parseDocument(text, { lineCounter, prettyErrors: false, uniqueKeys: false })
  const at = (offset: number | undefined, path: string, message: string): KeyFileProblem => {
    const pos = lineCounter.linePos(offset ?? 0)
    return { file, line: pos.line, column: pos.col, path, message }
  }
  const errors = [...doc.errors.map(e => [e.pos[0], e.message.split('\n')[0] ?? e.message] as const), ...repeatedKeys(doc).map(r => [r.offset, repeatedKeyMessage(lineCounter.linePos(r.firstOffset).line)] as const)]
  if (errors.length > 0) throw new ApiKeyFileError(errors.sort((a, b) => a[0] - b[0]).map(([offset, message]) => at(offset, '', message)))
  if (doc.contents === null) return []
  if (!isMap(doc.contents)) throw new ApiKeyFileError([at(doc.contents.range?.[0], '', 'expected "key: consumer" lines')])
  // an entry is named by its position ([0], [1], ...), never by the key: errors must not print secrets
  return doc.contents.items.map((pair, i): KeyFileItem => {
    const keyNode = pair.key
    const valueNode = pair.value
    const key = isScalar(keyNode) ? String(keyNode.value) : ''
    const where = isScalar(keyNode) ? keyNode.range?.[0] : undefined
    const refused = (offset: number | undefined, message: string): KeyFileItem => ({ problem: at(offset, `[${i}]`, message) })
    if (!isScalar(keyNode) || key.length === 0 || key.trim() !== key) return refused(where, 'an API key must be non-empty without surrounding spaces')
    // `!env NAME: alice` was the key "NAME" (yaml keeps the text after a tag it does not know)
    const tag = unknownTag(doc, keyNode) ?? unknownTag(doc, valueNode)
    if (tag !== null) return refused(where, `unknown tag ${tag}: it would be dropped and the text after it taken as written (this file substitutes nothing)`)
    // the reason names the value YAML read, never the text: that is the secret
    const misread = misreadScalar(keyNode, text, true)
    if (misread !== null) return refused(where, `this API key: ${misread}`)
    if (!API_KEY_TEXT.test(key)) return refused(where, API_KEY_CHARS)
    // gateway.yaml substitutes ${VAR}; this file does not: never accept the literal silently
    if (key.includes('${')) return refused(where, '"${" in an API key: environment references are not substituted in the key file')
    const consumer = isScalar(valueNode) && valueNode.value !== null ? String(valueNode.value) : ''
    const consumerAt = isScalar(valueNode) ? valueNode.range?.[0] : where
    const misreadConsumer = misreadScalar(valueNode, text)
    if (consumer !== '' && misreadConsumer !== null) return refused(consumerAt, `consumer name: ${misreadConsumer}`)
    const pos = lineCounter.linePos(consumerAt ?? 0)
    return { key, consumer, index: i, line: pos.line, column: pos.col }
  })
}
