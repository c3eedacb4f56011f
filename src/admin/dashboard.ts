// The admin page: static files from admin-ui/ (read once at start, no external asset, a strict
// Content-Security-Policy), the live event stream (/events) and the compiled routes (/routes).
// The page's client lookup and reset use the admin API's /limits endpoints.
import { readFileSync } from 'node:fs'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { ERRORS, errorBody } from '../errors.js'
import { EVENT_STREAM_HEAD, type LiveFeed } from './live-feed.js'
import type { Runtime } from '../runtime.js'
import { describeLimit } from './limits-api.js'

const UI_DIR = new URL('../../admin-ui/', import.meta.url)

// Nothing inline, nothing from elsewhere: a script injected into the page through a route name
// or a client key could not run, and the page cannot send data anywhere but this listener.
export const DASHBOARD_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'"
].join('; ')

interface Asset { readonly type: string, readonly body: Buffer }

// path -> [file in admin-ui/, content type]
const ASSET_FILES: ReadonlyArray<readonly [string, string, string]> = [
  ['/', 'index.html', 'text/html; charset=utf-8'],
  ['/ui/app.js', 'app.js', 'text/javascript; charset=utf-8'],
  ['/ui/app.css', 'app.css', 'text/css; charset=utf-8']
]

/** The page's own files: they carry no data, and are served without the read token (the page asks for it). */
export const PAGE_FILE_PATHS: readonly string[] = ASSET_FILES.map(([path]) => path)

/** Every path the page answers (GET and HEAD only). */
export const DASHBOARD_PATHS: readonly string[] = [...PAGE_FILE_PATHS, '/events', '/routes']

function loadAssets (): ReadonlyMap<string, Asset> {
  return new Map(ASSET_FILES.map(([path, file, type]) => [path, { type, body: readFileSync(new URL(file, UI_DIR)) }]))
}

let assets: ReadonlyMap<string, Asset> | null = null

/** One compiled route as the page's Limits table shows it (the same runtime that serves requests). */
export interface RouteView {
  name: string
  match: { host: string | null, path: string | null, pathPrefix: string | null, methods: readonly string[] | null, websocket: boolean }
  /** null for a route that answers itself (respond: its status is `respond`). */
  upstream: { name: string, targets: string[] } | null
  respond: number | null
  limits: Array<Record<string, unknown>>
}

export function describeRoutes (rt: Runtime): { generation: number, local: unknown, routes: RouteView[] } {
  return {
    generation: rt.generation,
    local: rt.config.local ?? null,
    routes: rt.routeList.map(r => ({
      name: r.name,
      match: { host: r.host ?? null, path: r.path ?? null, pathPrefix: r.pathPrefix ?? null, methods: r.methods ?? null, websocket: r.websocket },
      upstream: r.upstream === null ? null : { name: r.upstream, targets: rt.pools.get(r.upstream)?.health().map(t => t.url) ?? [] },
      respond: r.respond?.status ?? null,
      limits: r.limits.all.map(l => ({
        ...describeLimit(l),
        shadow: l.shadow,
        // a concurrency limit caps leases held at once (limit); its windowMs is the lease TTL
        concurrency: l.concurrency,
        onError: l.onError,
        status: l.status,
        // the scope is the key prefix without its trailing separator: what a Redis SCAN would match
        scope: l.keyBase.endsWith(':') ? l.keyBase.slice(0, -1) : l.keyBase
      }))
    }))
  }
}

function sendAsset (res: ServerResponse, asset: Asset, head: boolean): void {
  res.writeHead(200, {
    'content-type': asset.type,
    'content-length': asset.body.length,
    'content-security-policy': DASHBOARD_CSP,
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'cache-control': 'no-cache'
  })
  res.end(head ? undefined : asset.body)
}

/**
 * Answers the page's paths; false for any other path (the admin server answers those).
 * `feed` is null where no live data is kept.
 */
export function handleDashboard (req: IncomingMessage, res: ServerResponse, path: string, feed: LiveFeed | null, runtime: () => Runtime | null, json: (res: ServerResponse, status: number, body: unknown) => void): boolean {
  assets ??= loadAssets()
  const asset = assets.get(path)
  if (asset !== undefined) {
    sendAsset(res, asset, req.method === 'HEAD')
    return true
  }
  if (path === '/events') {
    if (feed === null) {
      json(res, ERRORS.GW_ERR_NOT_FOUND.status, errorBody('GW_ERR_NOT_FOUND', 'no live data on this listener'))
      return true
    }
    // A HEAD gets the stream's head and nothing to wait for: node writes no body to it, so a
    // subscribed HEAD never sent even its head and held one of the feed's places for good.
    if (req.method === 'HEAD') {
      res.writeHead(200, EVENT_STREAM_HEAD)
      res.end()
      return true
    }
    const outcome = feed.subscribe(res)
    if (outcome === 'pipelined') {
      // written after the request before it ends (for a stream: never), and holding no place
      json(res, ERRORS.GW_ERR_BAD_REQUEST.status, errorBody('GW_ERR_BAD_REQUEST', 'an event stream cannot be pipelined behind another request'))
    } else if (outcome === 'full') {
      json(res, ERRORS.GW_ERR_ADMIN_BUSY.status, errorBody('GW_ERR_ADMIN_BUSY', `${ERRORS.GW_ERR_ADMIN_BUSY.message} (at most ${feed.maxSubscribers})`))
    }
    return true
  }
  if (path === '/routes') {
    const rt = runtime()
    if (rt === null) json(res, ERRORS.GW_ERR_NOT_READY.status, errorBody('GW_ERR_NOT_READY', 'no configuration loaded yet'))
    else json(res, 200, describeRoutes(rt))
    return true
  }
  return false
}
