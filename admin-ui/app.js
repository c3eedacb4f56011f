// The admin page: one event stream (/events) for traffic, rejections and health; /routes for the
// compiled limits; the admin API's /limits for lookup and reset. No framework, no external asset;
// every value from the gateway goes into the DOM as text, never as HTML.
const HISTORY = 300
const $ = (id) => document.getElementById(id)

/** Builds an element; children are nodes or text (strings are never parsed as HTML). */
function el (tag, attrs = {}, ...children) {
  const node = document.createElement(tag)
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue
    if (k === 'class') node.className = v
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v)
    else node.setAttribute(k, v === true ? '' : String(v))
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(typeof c === 'string' || typeof c === 'number' ? String(c) : c)
  return node
}

// ---- numbers for people ----------------------------------------------------------------------
export function formatCount (n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '–'
  const abs = Math.abs(n)
  if (abs >= 1e6) return trim(n / 1e6) + 'M'
  if (abs >= 1e3) return trim(n / 1e3) + 'k'
  return String(Math.round(n * 10) / 10)
}
function trim (x) { return (Math.round(x * 10) / 10).toString() }
export function formatMs (ms) {
  if (ms === null || ms === undefined) return '–'
  if (ms >= 86_400_000) return trim(ms / 86_400_000) + ' d'
  if (ms >= 3_600_000) return trim(ms / 3_600_000) + ' h'
  if (ms >= 60_000) return trim(ms / 60_000) + ' min'
  if (ms >= 1000) return trim(ms / 1000) + ' s'
  if (ms >= 10) return Math.round(ms) + ' ms'
  if (ms >= 1) return trim(ms) + ' ms'
  return Math.round(ms * 1000) + ' µs'
}
const formatRate = (n) => formatCount(n) + ' req/s'

// ---- live data ---------------------------------------------------------------------------------
const state = { history: [], top: [], health: null, routes: null }

function sumDecisions (seconds) {
  const out = new Map() // route -> dimension -> [a, r, s, f]
  for (const s of seconds) {
    for (const [route, dims] of Object.entries(s.decisions)) {
      let m = out.get(route)
      if (!m) out.set(route, m = new Map())
      for (const [dim, c] of Object.entries(dims)) {
        const acc = m.get(dim) ?? [0, 0, 0, 0]
        for (let i = 0; i < 4; i++) acc[i] += c[i]
        m.set(dim, acc)
      }
    }
  }
  return out
}

function totals (s) {
  let req = 0; let rej = 0; let s5 = 0
  for (const r of Object.values(s.routes)) { req += r.rps; s5 += r.s5 }
  for (const dims of Object.values(s.decisions)) for (const c of Object.values(dims)) rej += c[1]
  return { req, rej, s5 }
}

function renderTraffic () {
  const last = state.history[state.history.length - 1]
  if (!last) return
  const t = totals(last)
  $('total-rps').textContent = formatRate(t.req)
  $('total-rejected').textContent = formatCount(t.rej) + '/s'
  $('total-5xx').textContent = formatCount(t.s5) + '/s'
  drawChart()
  const minute = sumDecisions(state.history.slice(-60))
  const names = new Set([...Object.keys(last.routes), ...minute.keys()])
  const body = $('routes-live').tBodies[0]
  body.replaceChildren(...[...names].sort().map(name => {
    const r = last.routes[name] ?? { rps: 0, p50: null, p99: null, s4: 0, s5: 0 }
    const dims = minute.get(name)
    const decisions = dims
      ? el('ul', { class: 'limits' }, ...[...dims].map(([dim, c]) => el('li', {}, `${dim}: ${formatCount(c[0])} / ${formatCount(c[1])} / ${formatCount(c[2])} / ${formatCount(c[3])}`)))
      : '–'
    return el('tr', { 'data-route': name },
      el('th', { scope: 'row' }, name === '-' ? '(no route)' : name),
      el('td', { class: 'num' }, formatCount(r.rps)),
      el('td', { class: 'num' }, formatMs(r.p50)),
      el('td', { class: 'num' }, formatMs(r.p99)),
      el('td', { class: 'num' }, formatCount(r.s4)),
      el('td', { class: 'num' }, formatCount(r.s5)),
      el('td', {}, decisions))
  }))
}

function drawChart () {
  const canvas = $('chart')
  const ratio = window.devicePixelRatio || 1
  const w = canvas.clientWidth; const h = canvas.clientHeight
  if (w === 0) return
  canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio)
  const ctx = canvas.getContext('2d')
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0)
  ctx.clearRect(0, 0, w, h)
  const series = state.history.map(totals)
  const max = Math.max(1, ...series.map(s => Math.max(s.req, s.rej)))
  const css = getComputedStyle(document.documentElement)
  ctx.font = '12px system-ui, sans-serif'
  ctx.fillStyle = css.getPropertyValue('--muted')
  ctx.fillText(formatRate(max), 4, 12)
  const x = (i) => w - (series.length - 1 - i) * (w / (HISTORY - 1))
  const y = (v) => h - 4 - (v / max) * (h - 20)
  for (const [key, color] of [['req', '--req'], ['rej', '--rej']]) {
    ctx.strokeStyle = css.getPropertyValue(color)
    ctx.lineWidth = 1.5
    ctx.beginPath()
    series.forEach((s, i) => { if (i === 0) ctx.moveTo(x(i), y(s[key])); else ctx.lineTo(x(i), y(s[key])) })
    ctx.stroke()
  }
}

function renderTop () {
  const rows = state.top.map(([client, count]) => {
    const sp = client.indexOf(' ')
    const kind = client.slice(0, sp); const value = client.slice(sp + 1)
    return el('tr', {},
      el('th', { scope: 'row' }, `${kind} ${value}`),
      el('td', { class: 'num' }, formatCount(count)),
      el('td', {}, el('button', { type: 'button', class: 'small', onclick: () => lookupClient(kind, value) }, 'Look up')))
  })
  $('top-table').tBodies[0].replaceChildren(...rows)
  $('top-empty').hidden = rows.length > 0
}

function renderHealth () {
  const h = state.health
  if (!h) return
  const badge = $('status')
  const status = h.status ?? 'unknown'
  badge.textContent = status === 'ready' ? 'ready' : status
  badge.className = 'badge ' + (status === 'ready' ? 'ready' : status === 'degraded' ? 'degraded' : 'down')
  $('config-line').textContent = `generation ${h.generation ?? '–'} · config ${String(h.hash ?? '').slice(0, 12)}${h.loadedAt ? ' · loaded ' + h.loadedAt : ''}`
  const redis = h.redis ?? {}
  const items = [
    ['Redis', redis.state === 'not_configured' ? 'not configured (limits in process)' : `${redis.state}${redis.breaker ? ', breaker ' + redis.breaker : ''}`],
    ['Live instances', redis.instances !== undefined ? String(redis.instances) : '–']
  ]
  // Redis Cluster: one breaker per master
  for (const n of redis.nodes ?? []) items.push([`Breaker ${n.node}`, n.state])
  if (h.workers !== undefined) items.push(['Workers', `${h.workersReady} of ${h.workers} ready`])
  $('health-list').replaceChildren(...items.flatMap(([k, v]) => [el('dt', {}, k), el('dd', { 'data-health': k }, v)]))
  const rows = []
  for (const [upstream, targets] of Object.entries(h.upstreams ?? {})) {
    for (const t of targets) {
      rows.push(el('tr', {},
        el('th', { scope: 'row' }, upstream), el('td', {}, t.url),
        el('td', { class: t.healthy ? 'healthy' : 'unhealthy' }, targetHealthText(t)),
        el('td', { class: 'num' }, t.ejectedForMs > 0 ? formatMs(t.ejectedForMs) : '–'),
        el('td', { class: 'num' }, String(t.consecutiveFailures ?? 0))))
    }
  }
  $('upstreams-table').tBodies[0].replaceChildren(...rows)
  const reloads = [...(h.reloads ?? [])].reverse()
  $('reloads').replaceChildren(...(reloads.length === 0
    ? [el('li', { class: 'muted' }, 'no reload since start')]
    : reloads.map(r => el('li', { class: r.ok ? '' : 'rejected-reload' },
      `${r.at}: ${r.ok ? `generation ${r.generation} loaded` : 'rejected, the running configuration kept serving'}`,
      r.ok ? null : el('pre', { class: 'error-lines' }, (r.problems ?? []).join('\n'))))))
  // also until a first answer: under workers the primary has no routes before a worker reports
  if (state.routes === null || h.generation !== state.routes.generation) void loadRoutes()
}

// ---- the admin token (reads need it with admin.reads: token; DELETE always) -------------------
const TOKEN_KEY = 'gateway-admin-token'
/** Headers for a read: the token when this tab has one (kept in sessionStorage, gone with the tab). */
function readHeaders () {
  const token = sessionStorage.getItem(TOKEN_KEY)
  return token === null ? {} : { authorization: `Bearer ${token}` }
}
/** A read answered 401: ask for the token; once given, the page connects again. */
function askReadToken () {
  sessionStorage.removeItem(TOKEN_KEY)
  $('status').textContent = 'admin token needed'
  $('status').className = 'badge down'
  $('read-token-form').hidden = false
}
function giveReadToken () {
  const token = $('read-token').value
  if (!token) return
  sessionStorage.setItem(TOKEN_KEY, token)
  $('read-token').value = ''
  $('read-token-form').hidden = true
  void loadRoutes()
  void connect()
}

// ---- limits (the compiled runtime) ------------------------------------------------------------
let routesLoading = false
async function loadRoutes () {
  if (routesLoading) return
  routesLoading = true
  let res
  try {
    res = await fetch('/routes', { cache: 'no-store', headers: readHeaders() })
    if (res.status === 401) askReadToken()
    if (!res.ok) return
    state.routes = await res.json()
  } catch {
    return
  } finally {
    routesLoading = false
  }
  $('limits-generation').textContent = `generation ${state.routes.generation}`
  const local = state.routes.local
  $('local-line').textContent = local ? `Local level (per client IP, in process): ${local.limit} per ${local.window}${local.burst ? `, burst ${local.burst}` : ''}` : 'No local level.'
  $('limits-table').tBodies[0].replaceChildren(...state.routes.routes.map(r => {
    const m = r.match
    const match = [m.host ? `host ${m.host}` : null, m.path ? `path ${m.path}` : null, m.pathPrefix ? `prefix ${m.pathPrefix}` : null,
      m.methods ? m.methods.join(',') : 'any method', m.websocket ? 'websocket' : null].filter(Boolean).join(' · ')
    const limits = r.limits.length === 0
      ? 'none'
      : el('ul', { class: 'limits' }, ...r.limits.map(l => el('li', {}, l.concurrency
        ? `${l.name} [${l.dimension}] at most ${formatCount(l.limit)} in flight (lease TTL ${formatMs(l.windowMs)}); onError ${l.onError}`
        : `${l.name} [${l.dimension}] ${l.algorithm} ${formatCount(l.limit)} per ${l.period ?? formatMs(l.windowMs)}` +
          (l.burst !== undefined && l.burst !== l.limit ? `, burst ${l.burst}` : '') + (l.cost !== 1 ? `, cost ${l.cost}` : '') +
          (l.shadow ? ' (shadow)' : '') + `; onError ${l.onError}; scope ${l.scope}`)))
    return el('tr', { 'data-route': r.name }, el('th', { scope: 'row' }, r.name), el('td', {}, match),
      el('td', {}, r.upstream === null ? `answered by the gateway: ${r.respond}` : `${r.upstream.name} (${r.upstream.targets.join(', ')})`), el('td', {}, limits))
  }))
  const select = $('lookup-route')
  const current = select.value
  select.replaceChildren(...state.routes.routes.map(r => el('option', { value: r.name }, r.name)))
  if (current) select.value = current
}

// ---- lookup and reset (the admin API) ---------------------------------------------------------
function lookupQuery () {
  const q = new URLSearchParams()
  q.set('route', $('lookup-route').value)
  if ($('lookup-ip').value.trim()) q.set('ip', $('lookup-ip').value.trim())
  if ($('lookup-user').value.trim()) q.set('user', $('lookup-user').value.trim())
  return q
}

function lookupClient (kind, value) {
  $('lookup-ip').value = kind === 'ip' ? value : ''
  $('lookup-user').value = kind === 'ip' ? '' : value
  location.hash = '#lookup'
  void lookup()
}

async function lookup () {
  const msg = $('lookup-message')
  msg.textContent = 'looking up…'
  let res
  try {
    res = await fetch('/limits?' + lookupQuery(), { cache: 'no-store', headers: readHeaders() })
  } catch (err) {
    msg.textContent = `lookup failed: ${err.message}`
    return
  }
  const body = await res.json().catch(() => ({}))
  if (res.status === 401) askReadToken()
  if (!res.ok) {
    msg.textContent = `${res.status} ${body.error ?? ''}: ${body.message ?? ''}`
    $('lookup-table').hidden = true
    $('reset-form').hidden = true
    return
  }
  const limits = Array.isArray(body.limits) ? body.limits : []
  // workers: N: the primary combined every worker's answer (src/admin/limits-over-workers.ts)
  // the local level is each worker's own bucket, with Redis too (scope "instance")
  const localOwn = body.combined === 'shared' && limits.some(l => l.scope === 'instance') ? ' The local level is each worker\'s own, summed.' : ''
  const across = body.combined === 'summed'
    ? ` Summed over ${body.workers} workers, each with its own budget.`
    : body.combined === 'shared' ? ` ${body.workers} workers share the Redis budget.${localOwn}` : ''
  msg.textContent = limits.length === 0 ? 'No limit applies to this client on this route.' : `${limits.length} limit${limits.length === 1 ? '' : 's'} apply.${across}`
  const perWorker = (l) => (body.combined === 'summed' || l.scope === 'instance') && Array.isArray(l.perWorker)
    ? ` (${l.perWorker.map(p => formatCount(p.remaining)).join(' + ')})`
    : ''
  $('lookup-table').tBodies[0].replaceChildren(...limits.map(l => el('tr', { 'data-limit': l.name },
    el('th', { scope: 'row' }, l.name), el('td', {}, l.dimension ?? ''), el('td', {}, l.algorithm ?? ''),
    el('td', { class: 'num' }, `${formatCount(l.limit)} per ${formatMs(l.windowMs ?? l.window)}`),
    el('td', { class: 'num', 'data-remaining': l.remaining }, formatCount(l.remaining) + perWorker(l)),
    el('td', { class: 'num' }, formatMs(l.resetMs)),
    el('td', {}, el('code', {}, l.key ?? '')))))
  $('lookup-table').hidden = limits.length === 0
  $('reset-form').hidden = limits.length === 0
  const token = sessionStorage.getItem(TOKEN_KEY)
  $('token-label').hidden = token !== null
}

async function reset () {
  const msg = $('lookup-message')
  let token = sessionStorage.getItem(TOKEN_KEY)
  if (token === null) {
    token = $('admin-token').value
    if (!token) { msg.textContent = 'The admin token is needed to reset limits.'; $('admin-token').focus(); return }
  }
  let res
  try {
    res = await fetch('/limits?' + lookupQuery(), { method: 'DELETE', headers: { authorization: `Bearer ${token}` } })
  } catch (err) {
    // no answer from the admin listener (a restart, a lost tunnel): the reset may not have run
    msg.textContent = `reset failed, no answer from the gateway (look the client up again): ${err.message}`
    return
  }
  const body = await res.json().catch(() => ({}))
  if (res.status === 401 || res.status === 403) {
    sessionStorage.removeItem(TOKEN_KEY)
    $('token-label').hidden = false
    msg.textContent = `${res.status} ${body.error ?? ''}: ${body.message ?? 'the token was refused'}`
    return
  }
  if (!res.ok) { msg.textContent = `${res.status} ${body.error ?? ''}: ${body.message ?? ''}`; return }
  // kept for this tab only: sessionStorage is gone when the tab closes
  sessionStorage.setItem(TOKEN_KEY, token)
  $('admin-token').value = ''
  await lookup()
  const where = typeof body.workers === 'number' ? ` in ${body.workers} workers` : ''
  const partial = body.complete === false && body.warning ? ` ${body.warning}.` : ''
  msg.textContent = `Reset done${where}.${partial} ${msg.textContent}`
}

// ---- wiring ------------------------------------------------------------------------------------
function onHistory (data) {
  state.history = data.history
  state.top = data.top
  state.health = data.health
  renderTraffic(); renderTop(); renderHealth()
}
function onUpdate (u) {
  state.history.push({ t: u.t, routes: u.routes, decisions: u.decisions })
  if (state.history.length > HISTORY) state.history.shift()
  state.top = u.top
  state.health = u.health
  renderTraffic(); renderTop(); renderHealth()
}

function disconnected () {
  $('status').textContent = 'disconnected, retrying…'
  $('status').className = 'badge down'
  setTimeout(connect, 2000)
}

/**
 * The event stream, read with fetch rather than an EventSource, which cannot send the
 * Authorization header admin.reads: token asks for. Whatever ends it (a lost connection, a refusal
 * such as 503 GW_ERR_ADMIN_BUSY while 16 pages are open) is retried after 2 s, except a 401, which
 * waits for the token.
 */
let streaming = false
async function connect () {
  // a token given while a stream still runs (one answered 401 elsewhere) opens no second one
  if (streaming) return
  let res
  try {
    res = await fetch('/events', { cache: 'no-store', headers: readHeaders() })
  } catch {
    return disconnected()
  }
  if (res.status === 401) return askReadToken()
  if (!res.ok || res.body === null) {
    await res.body?.cancel().catch(() => {})
    return disconnected()
  }
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader()
  let buffer = ''
  streaming = true
  try {
    for (;;) {
      const { value, done } = await reader.read()
      if (done) break
      buffer += value
      // text/event-stream: events end with a blank line, fields are "name: value"
      for (let end = buffer.indexOf('\n\n'); end !== -1; end = buffer.indexOf('\n\n')) {
        const lines = buffer.slice(0, end).split('\n')
        buffer = buffer.slice(end + 2)
        const event = lines.find(l => l.startsWith('event:'))?.slice(6).trim() ?? 'message'
        const data = lines.filter(l => l.startsWith('data:')).map(l => l.slice(5).replace(/^ /, '')).join('\n')
        if (event === 'history') onHistory(JSON.parse(data))
        else if (event === 'update') onUpdate(JSON.parse(data))
      }
    }
  } catch { /* the connection was lost: retried below */ }
  streaming = false
  disconnected()
}

document.addEventListener('DOMContentLoaded', () => {
  $('lookup-form').addEventListener('submit', (e) => { e.preventDefault(); void lookup() })
  $('reset-form').addEventListener('submit', (e) => { e.preventDefault(); void reset() })
  $('read-token-form').addEventListener('submit', (e) => { e.preventDefault(); giveReadToken() })
  window.addEventListener('resize', drawChart)
  void loadRoutes()
  void connect()
})

/** Why a target takes no traffic: passive ejection, failing active health checks, or both. */
function targetHealthText (t) {
  if (t.healthy) return 'healthy'
  const why = []
  if (t.ejectedForMs > 0) why.push('ejected')
  if (t.check !== undefined && !t.check.healthy) why.push(`checks failing${t.check.lastFailure ? ': ' + t.check.lastFailure : ''}`)
  return why.length === 0 ? 'ejected' : why.join(', ')
}
