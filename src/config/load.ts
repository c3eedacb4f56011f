// Reads gateway.yaml and turns every problem into a located message:
//   gateway.yaml:14:7 routes[1].upstream: unknown upstream "backend2"
// The YAML document keeps node positions, so zod issues (which carry a key path) and our own
// cross-reference checks can both be pointed back at the text.
import { readFailure, readFileBounded } from '../read-bounded.js'
import { createHash } from 'node:crypto'
import { LineCounter, parseDocument, visit, isAlias, isCollection, isMap, isPair, isSeq, isScalar, type Alias, type Document, type Node as YamlNode } from 'yaml'
import { dirname, resolve } from 'node:path'
import { PARSE_OFF_THREAD_CHARS, parseOffThread } from '../off-thread.js'
import { configSchema, gatewayJsonSchema, BUCKET_ALGORITHMS, type GatewayConfig, type LimitConfig } from './schema.js'
import { adminListen, applyDefaults, deepFreeze, type ResolvedConfig } from './defaults.js'
import { utcOffsetMinutes } from '../limit/algorithms/calendar-quota.js'
import { MAX_EXACT, validateLimitSpec } from '../limit/algorithms/index.js'
import ipaddr from 'ipaddr.js'
import { parseDuration } from './units.js'
import { keyPathOf, repeatedKeyMessage, misreadScalar, repeatedKeys, unresolvedTags } from '../identify/yaml-scalars.js'
import { API_KEY_CHARS, API_KEY_TEXT } from '../identify/api-key-file.js'
import { MAX_USER_LENGTH } from '../identify/identity.js'
import { HOP_BY_HOP } from '../proxy/hop-by-hop.js'
import { isSecretKey, redactUrlQuery } from '../admin/redact.js'
import type { z } from 'zod'

export type KeyPath = ReadonlyArray<string | number>

export interface ConfigProblem {
  readonly file: string
  readonly line: number
  readonly column: number
  readonly path: string
  readonly message: string
}

export class ConfigError extends Error {
  readonly code = 'GW_ERR_CONFIG_INVALID'
  readonly problems: readonly ConfigProblem[]
  constructor (problems: readonly ConfigProblem[]) {
    super(problems.map(formatProblem).join('\n'))
    this.problems = problems
  }
}

export interface LoadedConfig {
  readonly file: string
  /** The file with every default applied (src/config/defaults.ts), frozen. */
  readonly config: ResolvedConfig
  /** sha256 of the file text: shown on /config so operators can tell which file is live. */
  readonly hash: string
  /**
   * A problem found after loading (while compiling the runtime) located like the schema's: at
   * the value of `path` in the file, or at its deepest ancestor that is written there.
   */
  readonly problemAt: (path: KeyPath, message: string) => ConfigProblem
  /**
   * The files the config names (API key file, TLS certificate and key) as a workers primary read
   * them, base64 by path: compiling uses these instead of reading the disk (src/workers.ts).
   */
  readonly files?: NamedFiles
}

/** File contents by path, base64: what goes over a worker's IPC channel unchanged. */
export type NamedFiles = Readonly<Record<string, string>>

/** The files a config names, read at compile time: the API key file, TLS certificate and key, redis.tls's files. */
export function namedFiles (config: ResolvedConfig): string[] {
  const files: string[] = []
  const identity = config.identity
  if (identity !== undefined && 'apiKeys' in identity && identity.apiKeys.file !== undefined) files.push(identity.apiKeys.file)
  if (config.tls !== undefined) files.push(config.tls.cert, config.tls.key)
  const redisTls = config.redis?.tls
  if (typeof redisTls === 'object') for (const file of [redisTls.ca, redisTls.cert, redisTls.key]) if (file !== undefined) files.push(file)
  return files
}

/** Reads `paths`; one that cannot be read is left out, and compiling reports it as it reads it. */
export async function readNamedFiles (paths: readonly string[]): Promise<NamedFiles> {
  const read = await Promise.all(paths.map(async path => [path, (await readFileBounded(path).catch(() => null))?.toString('base64')] as const))
  return Object.fromEntries(read.filter((e): e is readonly [string, string] => e[1] !== undefined))
}

/** A file compiling reads: the given copy when there is one, else the disk's. */
export function fileReader (loaded: LoadedConfig): (path: string) => Promise<Buffer> {
  const given = loaded.files
  return async path => {
    const copy = given?.[path]
    return copy !== undefined ? Buffer.from(copy, 'base64') : await readFileBounded(path)
  }
}

export function formatProblem (p: ConfigProblem): string {
  return `${p.file}:${p.line}:${p.column}${p.path === '' ? '' : ' ' + p.path}: ${p.message}`
}

/** How many of a rejected reload's problems are logged and kept for /config and the admin page. */
export const REPORTED_PROBLEMS = 100

/**
 * A rejected reload's problems as lines, the first REPORTED_PROBLEMS of them and a count of the
 * rest: a file with 20,000 errors made each of the admin page's updates (which carry the last
 * reloads) 40 MB, serialised every second on the serving thread. `gateway validate` lists them all.
 */
export function reloadProblems (err: unknown): string[] {
  if (!(err instanceof ConfigError)) return [(err as Error).message]
  const shown = err.problems.slice(0, REPORTED_PROBLEMS).map(formatProblem)
  const more = err.problems.length - shown.length
  if (more > 0) shown.push(`... and ${more} more problems (gateway validate lists them all)`)
  return shown
}

/** What a problem shows instead of an inline API key (`identity.apiKeys.keys.<key>`). */
const API_KEY_SHOWN = '<an API key>'

/**
 * The inline API key a problem's path names, or null. A key written with a `${VAR}` reference, in
 * a problem of its substitution (`asWritten`), is the file's text, not a credential: shown, it says
 * what to fix. Every other key is one, whatever it holds (a "${" from the environment or a `$${`).
 */
/**
 * Whether what is written at `path` is a secret (/config hides it, src/admin/redact.ts): a key
 * named as one (`token`, `password`, `secret`, `key`...), a header a route sets or matches, or the
 * inline API keys (a key of that map is the path's end).
 */
function secretAt (path: KeyPath): boolean {
  if (path[0] === 'identity' && path[1] === 'apiKeys' && path[2] === 'keys') return true
  const set = path.indexOf('set')
  if (set > 0 && (path[set - 1] === 'request' || path[set - 1] === 'response')) return true
  // a route matching a header's value may match a shared secret (x-internal-auth: ...)
  const matched = path.indexOf('matchHeaders')
  if (matched >= 0 && matched < path.length - 1) return true
  const last = path.findLast((segment): segment is string => typeof segment === 'string')
  return last !== undefined && isSecretKey(last)
}

/**
 * The inline API key `path` names, to be hidden, or null when there is none to hide. A key written
 * as one bare reference (`${API_KEY}`) is shown: the variable's name is no secret, and the error
 * is about it. Any other key is hidden whole, one with a `${` in it too: `k-live-9f3a${oops`
 * showed its literal part, and `${API_KEY:-k-live-9f3a}` its default.
 */
function apiKeyIn (path: KeyPath, asWritten: boolean): string | null {
  const key = path[3]
  if (path[0] !== 'identity' || path[1] !== 'apiKeys' || path[2] !== 'keys' || typeof key !== 'string' || key.length === 0) return null
  return asWritten && BARE_REFERENCE_RE.test(key) ? null : key
}
const BARE_REFERENCE_RE = /^\$\{[A-Za-z_][A-Za-z0-9_]*\}$/

export function formatKeyPath (path: KeyPath): string {
  let out = ''
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`
    else out += out === '' ? seg : `.${seg}`
  }
  return out
}

export async function loadConfigFile (file: string, env: NodeJS.ProcessEnv = process.env): Promise<LoadedConfig> {
  let text: string
  try {
    text = (await readFileBounded(file)).toString('utf8')
  } catch (err) {
    throw new ConfigError([{ file, line: 0, column: 0, path: '', message: readFailure(err) }])
  }
  return await loadConfigText(text, file, env)
}

export { PARSE_OFF_THREAD_CHARS } from '../off-thread.js'

/** What src/config/parse-thread.ts posts back. */
export type ParseReply =
  | { readonly ok: true, readonly config: ResolvedConfig, readonly hash: string }
  | { readonly ok: false, readonly problems: readonly ConfigProblem[] }
  | { readonly ok: false, readonly error: string }

/**
 * parseConfigText, off the serving thread for a long text. The config comes back as data (frozen
 * again here); a problem found later, while compiling, is located by parsing the text once more
 * on this thread, which happens with a file being refused.
 */
export async function loadConfigText (text: string, file: string, env: NodeJS.ProcessEnv = process.env): Promise<LoadedConfig> {
  if (text.length < PARSE_OFF_THREAD_CHARS) return parseConfigText(text, file, env)
  const reply = await parseOffThread<ParseReply>({ kind: 'config', text, file, env })
  if (!reply.ok) throw 'problems' in reply ? new ConfigError(reply.problems) : new Error(reply.error)
  let located: LoadedConfig | null = null
  return {
    file,
    config: deepFreeze(reply.config),
    hash: reply.hash,
    problemAt: (path, message) => (located ??= parseConfigText(text, file, env)).problemAt(path, message)
  }
}

export function parseConfigText (text: string, file: string, env: NodeJS.ProcessEnv = process.env): LoadedConfig {
  const name = file
  const lineCounter = new LineCounter()
  // repeated keys are found by repeatedKeys, in one pass (YAML's check is quadratic)
  const doc = parseDocument(text, { lineCounter, prettyErrors: false, uniqueKeys: false })
  const at = (offset: number | undefined, path: KeyPath, message: string, asWritten = false): ConfigProblem => {
    const pos = lineCounter.linePos(offset ?? 0)
    const secret = apiKeyIn(path, asWritten)
    if (secret === null) return { file: name, line: pos.line, column: pos.col, path: formatKeyPath(path), message }
    // An inline API key is a credential: it never goes into an error (logged on a reload, shown on
    // /config's lastReload and the admin page). Line and column point at it.
    return { file: name, line: pos.line, column: pos.col, path: formatKeyPath([...path.slice(0, 3), API_KEY_SHOWN, ...path.slice(4)]), message: message.split(secret).join(API_KEY_SHOWN) }
  }

  // readFile(file, 'utf8') turns every byte that is not UTF-8 into U+FFFD without a word: a
  // jwt.secret saved in Latin-1 was silently another secret, and each client's token failed
  const replaced = text.indexOf('\uFFFD')
  if (replaced !== -1) throw new ConfigError([at(replaced, [], 'the file is not UTF-8 here (bytes read as U+FFFD, the replacement character): save it as UTF-8')])
  const errors = [
    ...doc.errors.map(e => [e.pos[0], [], e.message.split('\n')[0] ?? e.message] as const),
    // the path names the key (at() hides an inline API key's), so a repeat deep in a flow map is found
    ...repeatedKeys(doc).map(r => [r.offset, r.path, repeatedKeyMessage(lineCounter.linePos(r.firstOffset).line)] as const)
  ]
  if (errors.length > 0) {
    throw new ConfigError(errors.sort((a, b) => a[0] - b[0]).map(([offset, path, message]) => at(offset, path, message)))
  }

  const problems: ConfigProblem[] = []
  for (const { path, offset, tag } of unresolvedTags(doc)) {
    // A secret written unquoted that starts with "!" reads as a tag: the message never quotes it
    const quoted = secretAt(path) ? 'at the start of a secret (not quoted here; quote a secret that starts with "!")' : tag
    problems.push(at(offset, path, `unknown tag ${quoted}: it would be dropped and the text after it taken as written (write \${VAR} for a value from the environment)`))
  }
  // `? [a, b]` as a key: toJS stringified it with a Node warning on stderr, and the unknown key
  // "[ a, b ]" it became could not be located (1:1)
  visit(doc, {
    Pair: (_key, pair) => {
      if (isCollection(pair.key)) problems.push(at(rangeStart(pair.key), [], 'a key must be a name, not a list or a map'))
    }
  })
  for (const [path, offset, message] of misreadNames(doc, text)) problems.push(at(offset, path, message))
  if (problems.length > 0) throw new ConfigError(problems)
  const aliasProblem = aliasProblemIn(doc)
  if (aliasProblem !== null) throw new ConfigError([at(rangeStart(aliasProblem[0]), [], aliasProblem[1])])
  // yaml's guard against exponential expansion ("billion laughs") counts the copies of an anchor
  // the expansion makes. A fixed 100 refused a file reusing one anchor on a hundred routes; no
  // document can write more aliases than it has characters, so flat reuse always fits, while
  // nested aliases multiply far past it.
  const maxAliasCount = Math.max(100, text.length)
  let js: unknown
  try {
    js = doc.toJS({ maxAliasCount })
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err)
    if (!message.startsWith('Excessive alias count')) throw new ConfigError([at(0, [], message)])
    const alias = aliasBeyond(doc, maxAliasCount)
    throw new ConfigError([at(rangeStart(alias), [], `aliases expand to more than ${maxAliasCount} copies of one anchor (nested aliases multiply, as in a "billion laughs" document): write fewer levels of aliases`)])
  }
  const raw: unknown = substituteEnv(js, [], env, (path, msg) => {
    problems.push(at(locate(doc, path), path, msg, true))
  })
  if (problems.length > 0) throw new ConfigError(problems)

  const parsed = configSchema.safeParse(raw ?? {})
  if (!parsed.success) {
    for (const issue of parsed.error.issues) reportIssue(issue, [], raw, doc, at, problems)
    throw new ConfigError(problems)
  }

  const written = parsed.data
  // The API key file is named relative to gateway.yaml, wherever the gateway was started from.
  const identity = written.identity
  if (identity !== undefined && 'apiKeys' in identity && identity.apiKeys.file !== undefined) {
    identity.apiKeys.file = resolve(dirname(file), identity.apiKeys.file)
  }
  const config = applyDefaults(written)
  for (const [path, message] of crossChecks(written, config)) problems.push(at(locate(doc, path), path, message))
  if (problems.length > 0) throw new ConfigError(problems)

  return {
    file,
    config,
    hash: createHash('sha256').update(text).digest('hex'),
    problemAt: (path, message) => at(locate(doc, path), path, message)
  }
}

type Issue = z.core.$ZodIssue
type Locate = (offset: number | undefined, path: KeyPath, message: string) => ConfigProblem

/** One zod issue as located problems; `prefix` is the path of the union an issue came from. */
function reportIssue (issue: Issue, prefix: KeyPath, raw: unknown, doc: Document, at: Locate, problems: ConfigProblem[]): void {
  const path = [...prefix, ...issue.path.filter((p): p is string | number => typeof p !== 'symbol')]
  if (issue.code === 'unrecognized_keys') {
    for (const key of issue.keys) {
      const keyPath = [...path, key]
      const suggestion = closestKey(key, validKeysAt(path))
      const did = suggestion === null ? '' : ` (did you mean ${suggestion}?)`
      if (suggestion !== key && mayHoldApiKey(path, raw)) {
        // An API key written a level too high (identity.apiKeys.k-live-1: bob) lands here: named by
        // its place in the map, so a reload's log and the admin page never show the credential.
        const shown = [...path, `<key ${positionOf(doc, path, key)}>`]
        problems.push(at(locateKey(doc, keyPath), shown, `unknown key, not quoted as it may be an API key (inline keys go under "keys")${did}`))
        continue
      }
      // valid in another branch of a union (identity with both header and apiKeys): not a typo
      const message = suggestion === key
        ? `key "${key}" belongs to another form of ${formatKeyPath(path)}: it cannot be combined with the keys beside it`
        : `unknown key "${key}"${did}`
      problems.push(at(locateKey(doc, keyPath), keyPath, message))
    }
  } else if (issue.code === 'invalid_union' && issue.errors.length > 0) {
    // zod reports a union as "Invalid input" with every branch's issues inside; a typo'd key
    // (identity.apikeys) is what the operator must fix, so the branch closest to the text speaks.
    for (const branchIssue of closestBranch(issue.errors)) reportIssue(branchIssue, path, raw, doc, at, problems)
  } else if (path.length === 1 && (path[0] === 'listen' || path[0] === 'admin') && typeof valueAt(raw, path) === 'number') {
    // `listen: 8080` reads naturally but names no interface: say so instead of "expected string"
    problems.push(at(locate(doc, path), path, `expected "host:port" as a string, e.g. "0.0.0.0:${String(valueAt(raw, path))}" (a bare port does not say which interface)`))
  } else if (issue.code === 'invalid_type' && valueAt(raw, path) === undefined) {
    problems.push(at(locate(doc, path), path, 'required key is missing'))
  } else {
    problems.push(at(locate(doc, path), path, issue.message))
  }
}

/** Whether an unknown key in the map at `path` may be an inline API key: in identity.apiKeys, or beside it. */
function mayHoldApiKey (path: KeyPath, raw: unknown): boolean {
  if (path[0] !== 'identity') return false
  if (path.length === 2 && path[1] === 'apiKeys') return true
  const identity = valueAt(raw, ['identity'])
  return path.length === 1 && identity !== null && typeof identity === 'object' && 'apiKeys' in identity
}

/** 1-based place of `key` among the keys of the map at `path` as written (0 when it is not found there). */
function positionOf (doc: Document, path: KeyPath, key: string): number {
  const map = doc.getIn(path, true)
  return isMap(map) ? map.items.findIndex(p => isScalar(p.key) && String(p.key.value) === key) + 1 : 0
}

/**
 * The union branch the text most likely meant. A key unknown to every branch is reported alone
 * (the missing keys are its consequence); otherwise a branch of the wrong type is never chosen,
 * a branch that knows every key written at its top beats one that does not (a jwt identity with
 * two wrong values is still a jwt identity), and then the one with the fewest issues wins.
 */
function closestBranch (branches: readonly Issue[][]): Issue[] {
  const unknownIn = (b: Issue[]): Set<string> => new Set(b.flatMap(i => i.code === 'unrecognized_keys' && i.path.length === 0 ? i.keys : []))
  const sets = branches.map(unknownIn)
  const everywhere = [...(sets[0] ?? [])].filter(k => sets.every(s => s.has(k)))
  if (everywhere.length > 0) return [{ code: 'unrecognized_keys', keys: everywhere, path: [], message: '', input: undefined } as unknown as Issue]
  const rank = (b: Issue[]): [number, number] => b.some(i => i.code === 'invalid_type' && i.path.length === 0) ? [Infinity, 0] : [unknownIn(b).size, b.length]
  const better = (a: [number, number], c: [number, number]): boolean => a[0] < c[0] || (a[0] === c[0] && a[1] < c[1])
  return branches.reduce((best, b) => better(rank(b), rank(best)) ? b : best)
}

// `${VAR}` and `${VAR:-default}` in string values only: substitution happens after YAML parsing,
// so a value can never inject YAML structure. `$${` is a literal `${` (a value that must hold one,
// such as a template the upstream expands, had no way to); a lone `$` or `$$` stays as written.
const ENV_RE = /\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}/g

function substituteEnv (value: unknown, path: KeyPath, env: NodeJS.ProcessEnv, fail: (path: KeyPath, msg: string) => void): unknown {
  if (typeof value === 'string') {
    if (!value.includes('${')) return value
    return value.replace(ENV_RE, (_m, name: string | undefined, fallback: string | undefined) => {
      if (name === undefined) return '${'
      const v = env[name]
      if (v !== undefined && v !== '') return v
      if (fallback !== undefined) return fallback
      fail(path, `environment variable ${name} is not set and has no default (use \${${name}:-default})`)
      return ''
    })
  }
  if (Array.isArray(value)) return value.map((v, i) => substituteEnv(v, [...path, i], env, fail))
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {}
    for (const [k, v] of Object.entries(value)) {
      // Map keys too (an API key from the environment, issue 9). A "${" that is not a complete
      // reference is refused: a literal "${X" key would otherwise be accepted silently.
      const substituted = k.includes('${')
      const key = substituted ? substituteEnv(k, [...path, k], env, fail) as string : k
      if (substituted && key.includes('${') && k.replace(ENV_RE, '').includes('${')) fail([...path, k], `"\${" in a key is not a complete \${VAR} reference`)
      // either order: a written key after a ${VAR} key that became the same (YAML refuses two
      // written alike) replaced it silently; that one is not quoted, it may be an API key
      else if (Object.hasOwn(out, key)) fail([...path, k], substituted ? `key "${k}" is substituted to a key that is already present` : 'this key is already present, substituted from a ${VAR} key before it')
      // defined, not assigned: `out.__proto__ = {workers: 4}` set the prototype, so the schema read
      // workers: 4 through it and never saw the unknown key
      Object.defineProperty(out, key, { value: substituteEnv(v, [...path, k], env, fail), enumerable: true, writable: true, configurable: true })
    }
    return out
  }
  return value
}

let jsonSchema: Record<string, unknown> | null = null

/** Keys the schema allows in the object at `path` (union branches merged). */
function validKeysAt (path: KeyPath): string[] {
  jsonSchema ??= gatewayJsonSchema()
  let nodes: Array<Record<string, unknown>> = [jsonSchema]
  const expand = (ns: Array<Record<string, unknown>>): Array<Record<string, unknown>> =>
    ns.flatMap(n => [n, ...expand((n.anyOf ?? n.oneOf ?? []) as Array<Record<string, unknown>>)])
  for (const seg of path) {
    nodes = expand(nodes).flatMap(n => {
      if (typeof seg === 'number') return n.items !== undefined ? [n.items as Record<string, unknown>] : []
      const child = (n.properties as Record<string, Record<string, unknown>> | undefined)?.[seg] ??
        (typeof n.additionalProperties === 'object' ? n.additionalProperties as Record<string, unknown> : undefined)
      return child !== undefined ? [child] : []
    })
  }
  return [...new Set(expand(nodes).flatMap(n => Object.keys((n.properties ?? {}) as object)))]
}

/** The valid key a typo most likely meant: same letters ignoring case, or within a small edit distance. */
export function closestKey (key: string, candidates: readonly string[]): string | null {
  let best: string | null = null
  let bestDistance = Math.max(2, Math.floor(key.length / 3)) + 1
  for (const c of candidates) {
    const d = c.toLowerCase() === key.toLowerCase() ? 0 : editDistance(key, c)
    if (d < bestDistance) {
      best = c
      bestDistance = d
    }
  }
  return best
}

function editDistance (a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    const cur = [i]
    for (let j = 1; j <= b.length; j++) {
      cur[j] = Math.min((prev[j] as number) + 1, (cur[j - 1] as number) + 1, (prev[j - 1] as number) + (a[i - 1] === b[j - 1] ? 0 : 1))
    }
    prev = cur
  }
  return prev[b.length] as number
}

function valueAt (root: unknown, path: KeyPath): unknown {
  let v = root
  for (const seg of path) {
    if (v === null || typeof v !== 'object') return undefined
    v = (v as Record<string | number, unknown>)[seg]
  }
  return v
}

/**
 * Why a header rule cannot work, or null. The framing fields are the gateway's to write from the
 * body it relays: a rule would desynchronise the connection (a Content-Length that is not the
 * body's makes the client read the rest as the next response). Hop-by-hop fields describe one
 * connection and are never forwarded (RFC 9110 §7.6.1); removing them is what already happens.
 */
function headerRuleProblem (side: 'request' | 'response', op: 'set' | 'remove', name: string): string | null {
  if (name === 'content-length' || name === 'transfer-encoding') return `${name} frames the message and is written by the gateway from the body it relays: a rule cannot ${op} it`
  if (op === 'remove') return null
  if (HOP_BY_HOP.includes(name)) return `${name} is hop-by-hop (RFC 9110 §7.6.1): it describes one connection and is never forwarded, so it cannot be set`
  if (side === 'request' && name === 'expect') return 'expect cannot be set: the gateway answers 100-continue itself and never sends Expect upstream'
  return null
}

/**
 * Keys of `identity.apiKeys.keys` and `consumers` that YAML reads as something other than the text
 * written (src/identify/yaml-scalars.ts): located at the key. An API key's message never shows it.
 */
function misreadNames (doc: Document, text: string): Array<[KeyPath, number | undefined, string]> {
  const out: Array<[KeyPath, number | undefined, string]> = []
  for (const [mapPath, what] of [[['identity', 'apiKeys', 'keys'], 'this API key'], [['consumers'], 'consumer name']] as const) {
    const map = doc.getIn(mapPath, true)
    if (!isMap(map)) continue
    for (const pair of map.items) {
      // zod's records drop this key: the consumer's entry vanished (its keys got defaultPlan), as did such an API key
      if (isScalar(pair.key) && pair.key.value === '__proto__') {
        out.push([[...mapPath, '__proto__'], rangeStart(pair.key), `${what}: "__proto__" is reserved (the config's maps drop it): use another name`])
        continue
      }
      const secret = what === 'this API key'
      const reason = misreadScalar(pair.key, text, secret)
      if (reason === null || !isScalar(pair.key)) continue
      // a null key's path segment must not be "null": the message's "null" would be redacted as the key
      out.push([[...mapPath, pair.key.value === null ? '<null>' : String(pair.key.value)], rangeStart(pair.key), `${what}: ${reason}`])
    }
  }
  return out
}

/** Offset of the value at `path`, or of the deepest existing ancestor when it is missing. */
function locate (doc: Document, path: KeyPath): number | undefined {
  let node: unknown = doc.contents
  let offset = rangeStart(node)
  for (const seg of path) {
    let next: unknown
    if (isMap(node)) next = node.items.find(p => isScalar(p.key) && String(p.key.value) === String(seg))?.value
    else if (isSeq(node) && typeof seg === 'number') next = node.items[seg]
    if (next === undefined || next === null) return offset
    node = next
    offset = rangeStart(node) ?? offset
  }
  return offset
}

/** Offset of the key itself (for unknown keys, the key is what the operator must fix). */
function locateKey (doc: Document, path: KeyPath): number | undefined {
  const parentPath = path.slice(0, -1)
  const key = path[path.length - 1]
  let node: unknown = doc.contents
  for (const seg of parentPath) {
    if (isMap(node)) node = node.items.find(p => isScalar(p.key) && String(p.key.value) === String(seg))?.value
    else if (isSeq(node) && typeof seg === 'number') node = node.items[seg]
  }
  if (isMap(node)) {
    const pair = node.items.find(p => isScalar(p.key) && String(p.key.value) === String(key))
    if (pair !== undefined) return rangeStart(pair.key)
  }
  return locate(doc, parentPath)
}

/**
 * An alias yaml's toJS cannot resolve (no anchor of that name before it), or one inside the node
 * its anchor names (`a: &x [*x]`): that value would contain itself, and walking it (substitution,
 * validation) would never end. With the reason, or null.
 */
function aliasProblemIn (doc: Document): [Alias, string] | null {
  let found: [Alias, string] | null = null
  visit(doc, {
    Alias: (_key, alias, ancestors) => {
      const target = alias.resolve(doc)
      // A secret written unquoted that starts with "*" reads as an alias: never quoted
      const name = secretAt(keyPathOf(ancestors, alias)) ? null : alias.source
      if (target === undefined) {
        found = [alias, name === null
          ? 'an alias at the start of a secret (not quoted here) names no anchor before it: quote a secret that starts with "*"'
          : `alias *${name} names no anchor before it (write &${name} on an earlier node)`]
      } else if (ancestors.includes(target)) {
        found = [alias, name === null
          ? 'an alias at the start of a secret (not quoted here) is inside the node it names: the value would contain itself'
          : `alias *${name} is inside the node anchored &${name}: the value would contain itself`]
      } else return undefined
      return visit.BREAK
    }
  })
  return found
}

/**
 * The alias at which yaml's expansion count (toJS, `maxAliasCount`) passes `max`, computed as
 * yaml does: aliases resolve in document order, and each use of an anchor weighs the copies that
 * the aliases inside it already stand for. Undefined when none does (the error is then located at
 * the document's start).
 */
function aliasBeyond (doc: Document, max: number): Alias | undefined {
  const uses = new Map<unknown, { count: number, weight: number }>()
  const weight = (node: unknown): number => {
    if (isAlias(node)) {
      const u = uses.get(node.resolve(doc))
      return u === undefined ? 0 : u.count * u.weight
    }
    if (isCollection(node)) return node.items.reduce((m: number, item: unknown) => Math.max(m, weight(item)), 0)
    if (isPair(node)) return Math.max(weight(node.key), weight(node.value))
    return 1
  }
  let beyond: Alias | undefined
  visit(doc, {
    Alias: (_key, alias) => {
      const target = alias.resolve(doc)
      if (target === undefined) return undefined
      let u = uses.get(target)
      if (u === undefined) uses.set(target, u = { count: 0, weight: 0 })
      u.count++
      if (u.weight === 0) u.weight = weight(target)
      if (u.count * u.weight <= max) return undefined
      beyond = alias
      return visit.BREAK
    }
  })
  return beyond
}

function rangeStart (node: unknown): number | undefined {
  return (node as YamlNode | null)?.range?.[0]
}

/**
 * Whether `config` (as written, or resolved) holds limits the workers of `workers: N` must share
 * through Redis. Plans carry user limits and quotas of their own: without Redis each worker would
 * grant the whole plan.
 */
export function hasSharedLimits (config: { readonly limits?: unknown, readonly plans?: unknown, readonly concurrency?: unknown, readonly routes: ReadonlyArray<{ readonly limits?: unknown, readonly concurrency?: unknown }> }): boolean {
  return config.limits !== undefined || config.plans !== undefined || config.concurrency !== undefined || config.routes.some(r => r.limits !== undefined || r.concurrency !== undefined)
}

/** Checks zod cannot express per field: references, uniqueness, combinations (`resolved`: with defaults). */
function crossChecks (config: GatewayConfig, resolved: ResolvedConfig): Array<[KeyPath, string]> {
  const out: Array<[KeyPath, string]> = []
  const names = new Map<string, number>()
  config.routes.forEach((route, i) => {
    const prev = names.get(route.name)
    if (prev !== undefined) out.push([['routes', i, 'name'], `duplicate route name "${route.name}" (also routes[${prev}])`])
    names.set(route.name, i)
    if ((route.upstream === undefined) === (route.respond === undefined)) {
      out.push([['routes', i], 'a route needs exactly one of "upstream" (forward) or "respond" (the gateway answers)'])
    } else if (route.upstream !== undefined && !Object.hasOwn(config.upstreams, route.upstream)) {
      out.push([['routes', i, 'upstream'], `unknown upstream "${route.upstream}"`])
    }
    if (route.respond !== undefined) out.push(...respondChecks(route, ['routes', i]))
    if ((route.path === undefined) === (route.pathPrefix === undefined)) {
      out.push([['routes', i], 'a route needs exactly one of "path" (exact) or "pathPrefix"'])
    }
    if (route.stripPrefix !== undefined) {
      const matched = route.pathPrefix ?? route.path ?? ''
      if (!matched.startsWith(route.stripPrefix)) {
        out.push([['routes', i, 'stripPrefix'], `"${route.stripPrefix}" is not a prefix of the route's path "${matched}"`])
      }
    }
    for (const dim of ['api', 'ip', 'user'] as const) {
      const limit = route.limits?.[dim]
      if (limit !== undefined) out.push(...checkLimit(limit, ['routes', i, 'limits', dim]))
    }
    const fieldNames = new Map<string, string>()
    for (const [name, wanted] of Object.entries(route.matchHeaders ?? {})) {
      // the routing already normalized Host (port, case, trailing dot): matched raw, it would miss
      if (name.toLowerCase() === 'host') out.push([['routes', i, 'matchHeaders', name], 'the host is matched by the route\'s "host" (exact or *.example.com), not by matchHeaders'])
      // one field, two conditions that must both hold: a route no request reaches, with no warning
      const first = fieldNames.get(name.toLowerCase())
      if (first !== undefined) out.push([['routes', i, 'matchHeaders', name], `"${first}" names the same field (names are case-insensitive): give it one condition`])
      else fieldNames.set(name.toLowerCase(), name)
      // node strips a value's surrounding blanks (RFC 9110 §5.5): " v2" would match no request
      const values = typeof wanted === 'string' ? [wanted] : Array.isArray(wanted) ? wanted : []
      if (values.some(v => v !== v.replace(/^[ \t]+|[ \t]+$/g, ''))) out.push([['routes', i, 'matchHeaders', name], 'a value starting or ending with a space or tab matches no request: a field\'s value arrives without them'])
    }
    for (const side of ['request', 'response'] as const) {
      const rules = route.headers?.[side]
      for (const name of Object.keys(rules?.set ?? {})) {
        const why = headerRuleProblem(side, 'set', name.toLowerCase())
        if (why !== null) out.push([['routes', i, 'headers', side, 'set', name], why])
      }
      rules?.remove?.forEach((name, j) => {
        const why = headerRuleProblem(side, 'remove', name.toLowerCase())
        if (why !== null) out.push([['routes', i, 'headers', side, 'remove', j], why])
      })
    }
  })
  for (const dim of ['global', 'ip', 'user'] as const) {
    const limit = config.limits?.[dim]
    if (limit !== undefined) out.push(...checkLimit(limit, ['limits', dim]))
  }
  // The local level refills limit/window tokens per ms: a window of 0 refilled the bucket at once (the
  // level never limited), one past the limits' bound made Retry-After and RateLimit-Policy 3.6e+26
  const localWindow = config.local === undefined ? null : windowProblem(parseDuration(config.local.window), 'the longest window a limit takes): 0 would refill the bucket at once, so the level would never limit')
  if (localWindow !== null) out.push([['local', 'window'], localWindow])
  const hasUserLimit = config.limits?.user !== undefined || config.routes.some(r => r.limits?.user !== undefined) ||
    Object.values(config.plans ?? {}).some(p => p.limits !== undefined || p.routes !== undefined)
  if (hasUserLimit && config.identity === undefined) {
    out.push([['identity'], 'a "user" limit, plan or quota is configured but no identity: add identity.header, identity.apiKeys or identity.jwt'])
  }
  // The failure budget is compiled into its own plan (src/limit/plan.ts compileFailurePlan): left
  // unchecked, a limit the stage refuses passed validation and failed every wrong credential.
  const failureLimit = config.identity?.failureLimit
  if (failureLimit !== undefined) {
    out.push(...checkLimit(failureLimit, ['identity', 'failureLimit']))
    if (failureLimit.mode === 'shadow') {
      out.push([['identity', 'failureLimit', 'mode'], 'a failure budget cannot be in shadow mode: it is what stops a client guessing credentials, so it is always enforced (remove "mode")'])
    }
  }
  const jwt = config.identity !== undefined && 'jwt' in config.identity ? config.identity.jwt : undefined
  if (jwt !== undefined) {
    const sources = [jwt.secret, jwt.publicKey, jwt.jwksUrl].filter(v => v !== undefined).length
    if (sources !== 1) out.push([['identity', 'jwt'], 'give exactly one of "secret", "publicKey" or "jwksUrl"'])
    if (jwt.jwksUrl !== undefined) {
      out.push(...urlCredentialChecks(jwt.jwksUrl, ['identity', 'jwt', 'jwksUrl'], 'a JWKS URL may not hold credentials (user:password@): it would be shown on /config, in logs and in errors; serve the key set where the gateway can read it without them'))
    }
  }
  if (config.tracing !== undefined) {
    out.push(...urlCredentialChecks(config.tracing.otlp, ['tracing', 'otlp'], 'an OTLP collector URL may not hold credentials (user:password@): it would be shown on /config, in logs and in errors, and an OTLP/HTTP collector takes its credentials in a header (e.g. Authorization), not in the URL'))
  }
  // Concurrency limits (issue 10): a user cap needs users; a lease renewed every third of its TTL
  // needs a TTL a stalled event loop does not outlast.
  const hasUserConcurrency = config.concurrency?.user !== undefined || config.routes.some(r => r.concurrency?.user !== undefined)
  if (hasUserConcurrency && config.identity === undefined) {
    out.push([['identity'], 'a "concurrency.user" limit is configured but no identity: add identity.header, identity.apiKeys or identity.jwt'])
  }
  // node:http refuses a server whose headers may take longer than the whole request (and a reload
  // would set it without a word): reported here, at the key the operator wrote
  const headersMs = parseDuration(resolved.server.headersTimeout)
  const requestMs = parseDuration(resolved.server.requestTimeout)
  if (requestMs > 0 && headersMs > requestMs) {
    out.push([['server', config.server?.headersTimeout !== undefined ? 'headersTimeout' : 'requestTimeout'], `headersTimeout (${resolved.server.headersTimeout}) must not be longer than requestTimeout (${resolved.server.requestTimeout}): the headers are part of the request`])
  }
  if (config.redis?.leaseTtl !== undefined && parseDuration(config.redis.leaseTtl) < 1000) {
    out.push([['redis', 'leaseTtl'], 'leaseTtl must be at least 1s (leases are renewed every third of it)'])
  }
  if (resolved.workers > 1 && config.redis === undefined && hasSharedLimits(config)) {
    out.push([['workers'], 'workers > 1 needs "redis:" for the shared limits: without it each worker would enforce every limit on its own (N times the budget)'])
  }
  const listen = resolved.listen
  const admin = adminListen(resolved)
  if (sameSocket(listen, admin)) {
    const adminPath = typeof config.admin === 'object' ? ['admin', 'listen'] : ['admin']
    out.push([config.admin !== undefined ? adminPath : ['listen'], `"${admin}" is also the ${config.admin !== undefined ? 'listen' : 'admin'} address: the admin listener needs its own port`])
  }
  const redirectHttp = config.tls?.redirectHttp?.listen
  if (redirectHttp !== undefined && (sameSocket(redirectHttp, listen) || sameSocket(redirectHttp, admin))) {
    out.push([['tls', 'redirectHttp', 'listen'], `"${redirectHttp}" is also the ${sameSocket(redirectHttp, listen) ? 'listen' : 'admin'} address: the redirect listener needs its own port`])
  }
  if (typeof config.admin === 'object' && config.admin.reads === 'token' && config.admin.token === undefined) {
    out.push([['admin', 'reads'], '"reads: token" needs "admin.token" (the Bearer token reads are then asked for)'])
  }
  out.push(...planChecks(config))
  config.trustedProxies?.forEach((p, i) => {
    const why = addressRangeProblem(p, false)
    if (why !== null) out.push([['trustedProxies', i], why])
  })
  config.proxyProtocol?.from.forEach((p, i) => {
    const why = addressRangeProblem(p, true)
    if (why !== null) out.push([['proxyProtocol', 'from', i], why])
  })
  const restrictions: Array<[KeyPath, { allow?: string[], deny?: string[] } | undefined]> = [
    [['ipRestriction'], config.ipRestriction],
    ...config.routes.map((r, i): [KeyPath, { allow?: string[], deny?: string[] } | undefined] => [['routes', i, 'ipRestriction'], r.ipRestriction])
  ]
  for (const [path, r] of restrictions) {
    for (const list of ['allow', 'deny'] as const) {
      r?.[list]?.forEach((range, j) => {
        const why = addressRangeProblem(range, true)
        if (why !== null) out.push([[...path, list, j], why])
      })
    }
  }
  const redis = config.redis
  if (redis !== undefined) {
    const modes = [redis.url, redis.cluster, redis.sentinels].filter(v => v !== undefined).length
    if (modes !== 1) out.push([['redis'], 'give exactly one of "url", "cluster" or "sentinels"'])
    if (redis.sentinels !== undefined && redis.name === undefined) out.push([['redis', 'name'], 'sentinels need the master "name"'])
    // Said rather than ignored: a sentinelTls with no sentinels to apply to, or no tls settings to
    // apply, was written expecting an effect it would not have.
    if (redis.sentinelTls !== undefined && redis.sentinels === undefined) out.push([['redis', 'sentinelTls'], 'sentinelTls is for "sentinels": remove it, or give the sentinels'])
    else if (redis.sentinelTls === true && (redis.tls === undefined || redis.tls === false)) out.push([['redis', 'sentinelTls'], 'sentinelTls uses the "tls" settings: set tls (true, or { ca, servername, cert, key })'])
  }
  for (const [name, up] of Object.entries(config.upstreams)) {
    up.targets.forEach((t, i) => {
      const url = typeof t === 'string' ? t : t.url
      const path: KeyPath = typeof t === 'string' ? ['upstreams', name, 'targets', i] : ['upstreams', name, 'targets', i, 'url']
      try {
        const u = new URL(url)
        // The pool connects to the origin, so credentials never reached the upstream, while the
        // URL as written went to access lines, metrics, /readyz and the admin page.
        if (u.username !== '' || u.password !== '') out.push([path, 'a target URL may not hold credentials (user:password@): set an Authorization header with headers.request.set instead'])
        else if (u.pathname !== '/' || u.search !== '') out.push([['upstreams', name, 'targets', i], 'a target is an origin (scheme, host, port) without a path'])
        else if (u.port === '0') out.push([path, 'port 0 is not a port a target can be reached on'])
      } catch {
        out.push([['upstreams', name, 'targets', i], `invalid URL "${quotableUrl(url)}"`])
      }
    })
  }
  return out
}

/** What a route the gateway answers itself cannot also have: settings of a forward it never makes. */
function respondChecks (route: GatewayConfig['routes'][number], at: KeyPath): Array<[KeyPath, string]> {
  const out: Array<[KeyPath, string]> = []
  for (const key of ['websocket', 'stripPrefix', 'timeouts', 'maxBodySize', 'headers', 'retries', 'retryOn', 'retryBackoff'] as const) {
    if (route[key] !== undefined) out.push([[...at, key], `a route with "respond" forwards nothing: "${key}" has no effect (set the answer's fields in respond.headers)`])
  }
  const respond = route.respond
  if (respond === undefined) return out
  for (const name of Object.keys(respond.headers ?? {})) {
    const lower = name.toLowerCase()
    // the fields a response header rule may not set either (framing, hop-by-hop), and Content-Type
    if (lower === 'content-type' || headerRuleProblem('response', 'set', lower) !== null) {
      out.push([[...at, 'respond', 'headers', name], lower === 'content-type' ? 'set it with respond.contentType' : `"${name}" is written by the gateway`])
    }
  }
  if ((respond.status === 204 || respond.status === 304) && respond.body !== undefined) {
    out.push([[...at, 'respond', 'body'], `a ${respond.status} carries no body`])
  }
  return out
}

const PROXY_KEYWORDS: ReadonlySet<string> = new Set(['loopback', 'linklocal', 'uniquelocal'])

/**
 * Why `text` is not an address range proxy-addr takes as meant: one of its keywords, an address or
 * a CIDR, IPv4 in four decimal parts only (ipaddr.js also reads "192.168.1/24" as 192.168.0.1/24, a
 * neighbouring network). `exact` also refuses a CIDR with bits set beyond its prefix, whose range
 * is not the one written ("10.1.2.3/8" is 10.0.0.0/8, a typo for /32 as often as not).
 */
function addressRangeProblem (text: string, exact: boolean): string | null {
  if (PROXY_KEYWORDS.has(text)) return null
  const refused = `"${text}" is not an IP address, a CIDR (e.g. 10.0.0.0/8, 2001:db8::/32) or one of loopback, linklocal, uniquelocal`
  const slash = text.indexOf('/')
  const address = slash === -1 ? text : text.slice(0, slash)
  const v4 = ipaddr.IPv4.isValidFourPartDecimal(address)
  if (!v4 && (address.includes('%') || !ipaddr.IPv6.isValid(address))) return refused
  if (slash === -1) return null
  const bits = text.slice(slash + 1)
  if (!/^\d{1,3}$/.test(bits) || Number(bits) > (v4 ? 32 : 128)) return refused
  // proxy-addr refuses a /0 when the gateway starts, with a message that names no key
  if (Number(bits) === 0) return `"${text}": a /0 range is not taken; write ${v4 ? '0.0.0.0/1 and 128.0.0.0/1' : '::/1 and 8000::/1'} for every ${v4 ? 'IPv4' : 'IPv6'} address`
  if (!exact) return null
  const network = v4 ? ipaddr.IPv4.networkAddressFromCIDR(text) : ipaddr.IPv6.networkAddressFromCIDR(text)
  if (network.toNormalizedString() === ipaddr.parse(address).toNormalizedString()) return null
  return `"${text}" has bits set beyond its /${bits}: write ${network.toString()}/${bits} for that network, or /${v4 ? 32 : 128} for the one address`
}

/** `refusal` at `path` when `url` holds a user name or password; a URL that does not parse is quoted without them. */
function urlCredentialChecks (url: string, path: KeyPath, refusal: string): Array<[KeyPath, string]> {
  try {
    const u = new URL(url)
    return u.username !== '' || u.password !== '' ? [[path, refusal]] : []
  } catch {
    return [[path, `invalid URL "${quotableUrl(url)}"`]]
  }
}

/**
 * `url` as a message may quote it: whatever stands before an "@" in its authority shown as
 * `<credentials>`, and secret query values (a signed JWKS URL's `?sig=`) as `[redacted]`.
 */
function quotableUrl (url: string): string {
  // the userinfo ends at the LAST "@" (as redactUrl takes it): a password holding "/", "?" or "#"
  // ends no earlier, where stopping at the first of them quoted it whole
  return redactUrlQuery(url.replace(/^([a-z][a-z0-9+.-]*:\/\/)(.*)@/is, '$1<credentials>@'))
}

/** Two binds that would collide: same port on the same host, or on a wildcard (port 0 never collides). */
function sameSocket (a: string, b: string): boolean {
  const pa = a.slice(a.lastIndexOf(':') + 1)
  const pb = b.slice(b.lastIndexOf(':') + 1)
  if (pa !== pb || Number(pa) === 0) return false
  const ha = a.slice(0, a.lastIndexOf(':'))
  const hb = b.slice(0, b.lastIndexOf(':'))
  const wildcard = (h: string): boolean => h === '' || h === '0.0.0.0' || h === '[::]'
  return ha === hb || wildcard(ha) || wildcard(hb)
}

/** A window the limiter cannot count exactly (1 ms to 2^50 µs): its bounds, then `why`; null when within. */
function windowProblem (ms: number, why: string): string | null {
  return ms < 1 || ms * 1000 > MAX_EXACT ? `must be from 1ms to ${Math.floor(MAX_EXACT / 3.6e9)}h (2^50 µs, ${why}` : null
}

function checkLimit (limit: LimitConfig, path: KeyPath): Array<[KeyPath, string]> {
  const out: Array<[KeyPath, string]> = []
  const algorithm = limit.algorithm ?? 'gcra'
  if (limit.burst !== undefined && !BUCKET_ALGORITHMS.has(algorithm)) {
    out.push([[...path, 'burst'], `"burst" applies to gcra, token-bucket and leaky-bucket, not ${algorithm}`])
  }
  if (limit.onLimit === 'delay' && algorithm !== 'leaky-bucket') {
    out.push([[...path, 'onLimit'], '"onLimit: delay" needs algorithm: leaky-bucket (the one algorithm that can hold a request for its slot)'])
  }
  if (limit.maxDelay !== undefined && limit.onLimit !== 'delay') {
    out.push([[...path, 'maxDelay'], '"maxDelay" needs "onLimit: delay"'])
  }
  if (limit.onLimit === 'delay' && limit.maxDelay === undefined) {
    out.push([[...path, 'maxDelay'], '"onLimit: delay" needs "maxDelay" (the longest a request may wait)'])
  }
  // said with the key the operator wrote: the spec's own validator only knew "windowMs is too large"
  const windowMs = parseDuration(limit.window)
  const badWindow = windowProblem(windowMs, 'what the limiter counts exactly)')
  if (badWindow !== null) {
    out.push([[...path, 'window'], badWindow])
    return out
  }
  // the limit stage's own validator, on the spec it would compile (see limitRule in src/runtime.ts)
  const invalid = validateLimitSpec({
    id: 'check',
    algorithm,
    limit: limit.limit,
    windowMs,
    burst: BUCKET_ALGORITHMS.has(algorithm) ? (limit.burst ?? limit.limit) : limit.limit,
    maxDelayMs: limit.onLimit === 'delay' && limit.maxDelay !== undefined ? parseDuration(limit.maxDelay) : 0
  })
  if (invalid !== undefined) out.push([path, invalid.replaceAll('windowMs', 'window (in ms)').replaceAll('maxDelayMs', 'maxDelay (in ms)')])
  const capacity = BUCKET_ALGORITHMS.has(algorithm) ? (limit.burst ?? limit.limit) : limit.limit
  if (limit.cost !== undefined && limit.cost > capacity) {
    out.push([[...path, 'cost'], `cost ${limit.cost} is above the capacity ${capacity}: every request would be rejected`])
  }
  return out
}

/** consumers, plans and API keys (issue 9): every plan a name refers to exists, every key leads to a consumer. */
function planChecks (config: GatewayConfig): Array<[KeyPath, string]> {
  const out: Array<[KeyPath, string]> = []
  const plans = config.plans ?? {}
  const known = Object.keys(plans)
  const unknownPlan = (name: string): string => `unknown plan "${name}"${known.length === 0 ? ' (no plans are configured)' : ` (plans: ${known.join(', ')})`}`
  for (const [name, c] of Object.entries(config.consumers ?? {})) {
    if (!Object.hasOwn(plans, c.plan)) out.push([['consumers', name, 'plan'], unknownPlan(c.plan)])
  }
  if (config.defaultPlan !== undefined && !Object.hasOwn(plans, config.defaultPlan)) out.push([['defaultPlan'], unknownPlan(config.defaultPlan)])
  if (config.quotaTimezone !== undefined) {
    try {
      utcOffsetMinutes(config.quotaTimezone, Date.now())
    } catch {
      out.push([['quotaTimezone'], `unknown time zone "${config.quotaTimezone}" (expected an IANA name such as Europe/Berlin)`])
    }
  }
  const routeNames = new Set(config.routes.map(r => r.name))
  for (const [name, plan] of Object.entries(plans)) {
    if (plan.limits?.user !== undefined) out.push(...checkLimit(plan.limits.user, ['plans', name, 'limits', 'user']))
    for (const [route, override] of Object.entries(plan.routes ?? {})) {
      if (!routeNames.has(route)) out.push([['plans', name, 'routes', route], `unknown route "${route}"`])
      out.push(...checkLimit(override.user, ['plans', name, 'routes', route, 'user']))
    }
    const quota = plan.limits?.quota
    if (quota?.cost !== undefined && quota.cost > quota.limit) out.push([['plans', name, 'limits', 'quota', 'cost'], `cost ${quota.cost} is above the quota ${quota.limit}: every request would be rejected`])
  }
  const identity = config.identity
  if (identity !== undefined && 'apiKeys' in identity) {
    const { keys, file } = identity.apiKeys
    if (keys === undefined && file === undefined) out.push([['identity', 'apiKeys'], 'give "keys", "file" or both'])
    for (const [key, consumer] of Object.entries(keys ?? {})) {
      const path: KeyPath = ['identity', 'apiKeys', 'keys', key]
      if (!API_KEY_TEXT.test(key)) out.push([path, API_KEY_CHARS])
      else if (consumer.length === 0) out.push([path, 'an API key must map to a consumer name'])
      else if (consumer.length > MAX_USER_LENGTH) out.push([path, `a consumer name has at most ${MAX_USER_LENGTH} characters`])
      else if (known.length > 0 && config.defaultPlan === undefined && !Object.hasOwn(config.consumers ?? {}, consumer)) {
        out.push([path, `API key maps to consumer "${consumer}", which has no entry in consumers (and there is no defaultPlan)`])
      }
    }
  }
  return out
}
