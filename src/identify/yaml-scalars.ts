// Map keys that are names or secrets (API keys, consumer names) must be the text written. YAML's
// core schema reads `007` as the number 7, `1e3` as 1000, `~` or an empty key as null: an API key
// written `007123456789` would then be `7123456789`, and a line `: eve` (an empty variable in a
// generated file) would make the literal key "null" valid. Such a key is refused, located, and
// the fix named: quote it.
import { isNode, isPair, isScalar, isSeq, visit, type Document, type Scalar } from 'yaml'

/**
 * Why the scalar `node` of `text` is not read as the text written, or null when it is. `secret`:
 * the value is an API key, so the reason names its type, never the value YAML read.
 */
export function misreadScalar (node: unknown, text: string, secret = false): string | null {
  if (!isScalar(node)) return null
  const value = (node as Scalar).value
  if (typeof value === 'string') return null
  if (value === null) return 'YAML reads it as null (an empty key, ~ or null): quote it, or remove the line'
  const range = (node as Scalar).range
  const written = range === undefined || range === null ? null : text.slice(range[0], range[1]).trim()
  if (written === String(value)) return null
  return `YAML reads it as ${secret ? `a ${typeof value}` : `the ${typeof value} ${String(value)}`}, not as the text written: quote it`
}

/** YAML's own message for a repeated key, kept so the errors read as before. */
/** Where a key repeats an earlier one of its map, and where that earlier one is. */
export interface RepeatedKey {
  readonly offset: number
  readonly firstOffset: number
  /** The repeat's key path, its own key last. */
  readonly path: Array<string | number>
}

/** The message for a repeated key: it never quotes the key (an API key is a secret); the path names it where that is safe. */
export const repeatedKeyMessage = (firstLine: number): string =>
  `written twice in one map (first at line ${firstLine}): one would silently replace the other; keep one`

/**
 * Where a scalar key repeats an earlier key of its map. YAML's own check (`uniqueKeys: true`)
 * compares each key with every earlier one of its map: a key file of 20,000 lines took 18 s to
 * parse, and a SIGHUP that read it held every request as long. A map per map finds the repeats in
 * one pass.
 */
export function repeatedKeys (doc: Document): RepeatedKey[] {
  const out: RepeatedKey[] = []
  visit(doc, {
    Map (_key, map, ancestors) {
      const seen = new Map<string, number>()
      for (const pair of map.items) {
        if (!isScalar(pair.key)) continue
        // as text: `1` and "1" are two YAML keys but one config key and one API key, and the
        // later one silently took the earlier's place
        const value = String(pair.key.value)
        const offset = pair.key.range?.[0] ?? 0
        const first = seen.get(value)
        if (first !== undefined) out.push({ offset, firstOffset: first, path: [...keyPathOf(ancestors, map), value] })
        else seen.set(value, offset)
      }
    }
  })
  return out
}

/**
 * Nodes carrying a tag the core schema does not know (`!env NAME`, `!!js/function`, `!secret x`),
 * with their key path and the tag's offset. yaml keeps such a node's text as a plain string with a
 * mere warning: `token: !env GATEWAY_ADMIN_TOKEN` was the token "GATEWAY_ADMIN_TOKEN".
 */
export function unresolvedTags (doc: Document): Array<{ path: Array<string | number>, offset: number, tag: string }> {
  const out: Array<{ path: Array<string | number>, offset: number, tag: string }> = []
  visit(doc, {
    Node: (_key, node, ancestors) => {
      if (node.tag === undefined || unknownTag(doc, node) === null) return
      out.push({ path: keyPathOf(ancestors, node), offset: node.range?.[0] ?? 0, tag: unknownTag(doc, node) as string })
    }
  })
  return out
}

/**
 * The key path of `node` under `ancestors` (a visitor's): the keys of the pairs whose value holds
 * it, and the indexes in sequences. A node that is a key itself ends the path at its map's key.
 */
export function keyPathOf (ancestors: readonly unknown[], node: unknown): Array<string | number> {
  const chain: unknown[] = [...ancestors, node]
  const path: Array<string | number> = []
  chain.forEach((a, i) => {
    if (isPair(a) && chain[i + 1] === a.value && isScalar(a.key)) path.push(String(a.key.value))
    else if (isSeq(a)) path.push(a.items.indexOf(chain[i + 1] as never))
  })
  return path
}

/** The tag of `node` as written (`!env`, `!!js/function`) when the core schema does not know it, else null. */
export function unknownTag (doc: Document, node: unknown): string | null {
  const tag = isNode(node) ? node.tag : undefined
  if (tag === undefined || doc.schema.tags.some(t => t.tag === tag)) return null
  return tag.replace(/^tag:yaml\.org,2002:/, '!!')
}
