/**
 * Removes a route's prefix from `path` (normalized path + '?' + raw query). The prefix only matches
 * whole segments ('/api' strips '/api/users' and '/api?x', not '/apiary'), and the result always
 * starts with '/'. The query is never touched.
 */
export function stripPathPrefix (path: string, prefix: string | null): string {
  if (prefix === null || prefix === '' || prefix === '/' || !path.startsWith(prefix)) return path
  const next = path.charCodeAt(prefix.length)
  // NaN (end of path), '/' or '?' after the prefix, or a prefix that itself ends with '/'.
  if (!(Number.isNaN(next) || next === 0x2f || next === 0x3f || prefix.endsWith('/'))) return path
  const rest = path.slice(prefix.length)
  return rest.charCodeAt(0) === 0x2f ? rest : '/' + rest
}
