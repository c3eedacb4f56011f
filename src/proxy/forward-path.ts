/**
 * Removes a route's prefix from `path` (normalized path + '?' + raw query). The prefix only matches
 * whole segments ('/api' strips '/api/users' and '/api?x', not '/apiary'), and the result always
 * starts with '/'. The query is never touched, and a path whose prefix is not a whole segment is
 * passed as the client wrote it.
 */
export function stripPathPrefix (path: string, prefix: string | null): string {
  if (prefix === null || prefix === '' || prefix === '/') return path
  if (path.startsWith(prefix)) return stripWholeSegment(path, prefix)
  // The route matched it all the same: `caseInsensitive` (`/API/users` for `/api/`), or
  // `matchTrailingSlash` (`/api` for `pathPrefix: /api/`). Only for such a path, so the exact
  // case keeps its allocation-free test. The prefix is a prefix of the route's path (config
  // check), so for a route matched exactly this comparison finds nothing new.
  const folded = prefix.toLowerCase()
  // Stripped as written, never case-folded: '/APIadmin' through a caseInsensitive '/api' route
  // went upstream as '/apiadmin', the path of another route, past that route's limits.
  if (path.slice(0, prefix.length).toLowerCase() === folded) return stripWholeSegment(path, prefix)
  if (prefix.endsWith('/')) {
    const bare = prefix.length - 1
    const next = path.charCodeAt(bare)
    if ((Number.isNaN(next) || next === 0x3f) && path.slice(0, bare).toLowerCase() === folded.slice(0, bare)) return '/' + path.slice(bare)
  }
  return path
}

/** `path` without its first `prefix.length` characters when they end a segment; else `path` itself. */
function stripWholeSegment (path: string, prefix: string): string {
  const next = path.charCodeAt(prefix.length)
  // NaN (end of path), '/' or '?' after the prefix, or a prefix that itself ends with '/'.
  if (!(Number.isNaN(next) || next === 0x2f || next === 0x3f || prefix.endsWith('/'))) return path
  const rest = path.slice(prefix.length)
  return rest.charCodeAt(0) === 0x2f ? rest : '/' + rest
}
