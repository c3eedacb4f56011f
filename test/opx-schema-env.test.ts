// Regression: the JSON Schema editors use rejected `url: ${REDIS_URL:-...}`, so the README's own
// example was flagged. Every `${...}` value of the shipped configs must satisfy the schema node at
// its path, as an editor's validator would check it.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { parse } from 'yaml'

type SchemaNode = Record<string, unknown>
const schema = JSON.parse(readFileSync('gateway.schema.json', 'utf8')) as SchemaNode

/** The schema nodes a value at `path` may match (union branches expanded). */
function nodesAt (node: SchemaNode, path: Array<string | number>): SchemaNode[] {
  const branches = [node, ...((node.anyOf ?? node.oneOf ?? []) as SchemaNode[])]
  if (path.length === 0) return branches
  const [head, ...rest] = path
  const out: SchemaNode[] = []
  for (const b of branches) {
    if (typeof head === 'number' && b.items !== undefined) out.push(...nodesAt(b.items as SchemaNode, rest))
    if (typeof head === 'string') {
      const props = b.properties as Record<string, SchemaNode> | undefined
      const child = props?.[head] ?? (typeof b.additionalProperties === 'object' ? b.additionalProperties as SchemaNode : undefined)
      if (child !== undefined) out.push(...nodesAt(child, rest))
    }
  }
  return out
}

function acceptsString (nodes: SchemaNode[], value: string): boolean {
  return nodes.some(n => n.type === 'string' && (typeof n.pattern !== 'string' || new RegExp(n.pattern, 'u').test(value)))
}

function envValues (value: unknown, path: Array<string | number> = []): Array<[Array<string | number>, string]> {
  if (typeof value === 'string') return value.includes('${') ? [[path, value]] : []
  if (Array.isArray(value)) return value.flatMap((v, i) => envValues(v, [...path, i]))
  if (value !== null && typeof value === 'object') return Object.entries(value).flatMap(([k, v]) => envValues(v, [...path, k]))
  return []
}

const readme = readFileSync('README.md', 'utf8')
const readmeYaml = [...readme.matchAll(/```ya?ml\n([\s\S]*?)```/g)].map(m => m[1] as string)
const sources: Array<[string, string]> = [
  ['examples/gateway.compose.yaml', readFileSync('examples/gateway.compose.yaml', 'utf8')],
  ['examples/gateway.docker.yaml', readFileSync('examples/gateway.docker.yaml', 'utf8')],
  ...readmeYaml.map((text, i): [string, string] => [`README yaml block ${i}`, text])
]

t.test('every ${VAR} value in the shipped configs and the README is valid for the editor schema', async t => {
  let checked = 0
  for (const [name, text] of sources) {
    let doc: unknown
    try { doc = parse(text) } catch { continue } // README fragments that are not whole documents
    for (const [path, value] of envValues(doc)) {
      checked++
      t.ok(acceptsString(nodesAt(schema, path), value), `${name} ${path.join('.')}: ${value}`)
    }
  }
  t.ok(checked >= 3, `checked ${checked} references (redis.url and the upstream targets at least)`)
})

t.test('patterned fields still reject a malformed value that is not a reference', async t => {
  t.notOk(acceptsString(nodesAt(schema, ['redis', 'url']), 'http://not-redis'))
  t.ok(acceptsString(nodesAt(schema, ['redis', 'url']), 'redis://127.0.0.1:6379'))
  t.ok(acceptsString(nodesAt(schema, ['listen']), '${LISTEN:-0.0.0.0:8080}'))
  t.notOk(acceptsString(nodesAt(schema, ['listen']), '$LISTEN'))
})
