// The admin API (/limits, /consumers/NAME) on the workers primary (`workers: N`). The primary
// holds no limit state: every worker is asked over IPC (src/workers.ts) and the answers combined.
//
// With Redis the budget is shared, so every worker reads the same keys: `remaining` is the shared
// value and only the deny cache differs per worker. Without Redis each worker keeps its own
// in-process budget of `limit`: `remaining` is summed over the workers (what the whole gateway
// would still admit) and `perWorker` shows each. A reset always runs in every worker: the local
// level, the deny cache and the Redis fallback are per process whatever the store.
import { adminError, type AdminAnswer, type LimitsOps } from './limits-api.js'

export type AdminOp = 'lookup' | 'reset' | 'consumer' | 'metrics'

/** One worker's answer; `answer` null when it did not answer in time (or exited meanwhile). */
export interface WorkerAnswer {
  readonly pid: number
  readonly answer: AdminAnswer | null
  /** Why there is no answer. */
  readonly reason?: string
}

/** Asks every ready worker; resolves once each has answered or its time is up. */
export type AskWorkers = (op: AdminOp, arg: string, by: string) => Promise<readonly WorkerAnswer[]>

interface PerWorker {
  pid: number
  remaining: number
  resetMs: number
  retryAfterMs: number
  deniedMs: number
}

type LimitView = Record<string, unknown> & { key: string, remaining: number, resetMs: number, retryAfterMs: number, deniedMs: number }

const num = (v: unknown): number => typeof v === 'number' ? v : 0

/** -1 means "never"; otherwise the soonest wait among those that are limited. */
function soonestRetry (waits: readonly number[]): number {
  const finite = waits.filter(w => w >= 0)
  return finite.length === 0 ? -1 : Math.min(...finite)
}

function combineLimits (answers: ReadonlyArray<{ pid: number, body: Record<string, unknown> }>, shared: boolean): LimitView[] {
  const first = answers[0]?.body.limits as LimitView[] | undefined ?? []
  return first.map((limit) => {
    // matched by key: a worker in the middle of a reload may list its limits in another order
    const per: PerWorker[] = []
    for (const { pid, body } of answers) {
      const l = (body.limits as LimitView[] | undefined ?? []).find(x => x.key === limit.key)
      if (l !== undefined) per.push({ pid, remaining: num(l.remaining), resetMs: num(l.resetMs), retryAfterMs: num(l.retryAfterMs), deniedMs: num(l.deniedMs) })
    }
    const deniedMs = Math.max(0, ...per.map(p => p.deniedMs))
    const resetMs = Math.max(0, ...per.map(p => p.resetMs))
    // the local level is each worker's own, Redis or not (scope: "instance")
    if (shared && limit.scope !== 'instance') {
      // the same key read by each worker moments apart: the least remaining is the latest
      const remaining = Math.min(...per.map(p => p.remaining))
      const waits = per.map(p => p.retryAfterMs)
      const retryAfterMs = waits.includes(-1) ? -1 : Math.max(0, ...waits)
      return { ...limit, remaining, resetMs, retryAfterMs, deniedMs, perWorker: per }
    }
    const remaining = per.reduce((a, p) => a + p.remaining, 0)
    // summed budgets: the client passes on a worker that has budget (a wait of 0, the soonest), so
    // it waits only if none has
    const retryAfterMs = soonestRetry(per.map(p => p.retryAfterMs))
    return { ...limit, remaining, resetMs, retryAfterMs, deniedMs, perWorker: per }
  })
}

const SHARED_NOTE = 'Redis holds one budget for all workers: remaining is read from it (the local level, scope "instance", is each worker\'s own: summed); deniedMs is the longest any worker\'s deny cache holds the client'
const SUMMED_NOTE = 'each worker keeps its own in-process budget of `limit`: remaining is summed over the workers, perWorker shows each'

/**
 * A failure of any worker wins: a partial answer must not look whole. A reset that reached only
 * some workers says which, so the operator knows to repeat it.
 */
function failure (op: AdminOp, answers: readonly WorkerAnswer[], timeoutMs: number): AdminAnswer | null {
  const summary = answers.map(a => ({ pid: a.pid, status: a.answer?.status ?? null, ...(a.reason !== undefined ? { reason: a.reason } : {}) }))
  const silent = answers.filter(a => a.answer === null)
  if (silent.length > 0) {
    const done = answers.filter(a => a.answer?.status === 200).map(a => a.pid)
    const what = op === 'reset' ? `; the reset was applied by worker${done.length === 1 ? '' : 's'} [${done.join(', ')}] alone: repeat it` : ''
    const base = adminError('GW_ERR_ADMIN_WORKERS_UNAVAILABLE', `${answers.length - silent.length} of ${answers.length} workers answered within ${timeoutMs} ms (no answer from pid ${silent.map(a => `${a.pid}: ${a.reason ?? 'timeout'}`).join(', ')})${what}`)
    return { status: base.status, body: { ...base.body, workers: summary } }
  }
  const failed = answers.find(a => a.answer !== null && a.answer.status !== 200)
  if (failed?.answer == null) return null
  return { status: failed.answer.status, body: { ...failed.answer.body, workers: summary } }
}

export function createWorkersLimitsOps (ask: AskWorkers, sharedStore: () => boolean, timeoutMs: number): LimitsOps {
  const gather = async (op: AdminOp, arg: string, by: string): Promise<AdminAnswer | Array<{ pid: number, body: Record<string, unknown> }>> => {
    const answers = await ask(op, arg, by)
    if (answers.length === 0) return adminError('GW_ERR_NOT_READY', 'no worker is ready')
    return failure(op, answers, timeoutMs) ?? answers.map(a => ({ pid: a.pid, body: (a.answer as AdminAnswer).body }))
  }

  return {
    async lookup (query) {
      const got = await gather('lookup', query, '')
      if (!Array.isArray(got)) return got
      const shared = sharedStore()
      const first = got[0]?.body ?? {}
      return {
        status: 200,
        body: { ...first, limits: combineLimits(got, shared), workers: got.length, combined: shared ? 'shared' : 'summed', note: shared ? SHARED_NOTE : SUMMED_NOTE }
      }
    },

    async reset (query, by) {
      const got = await gather('reset', query, by)
      if (!Array.isArray(got)) return got
      const shared = sharedStore()
      const bodies = got.map(g => g.body)
      const first = bodies[0] ?? {}
      const counts = (field: string): number[] | null => {
        const values = bodies.map(b => b[field])
        return values.every(v => typeof v === 'number') ? values as number[] : null
      }
      const deleted = counts('keysDeleted')
      const instances = counts('instances')
      const incomplete = bodies.find(b => b.complete === false)
      return {
        status: 200,
        body: {
          ...first,
          // Redis: each worker deletes the same keys (DEL is idempotent), so the sum counts each key
          // once; in process: the keys each worker held state for, summed
          keysDeleted: deleted === null ? null : deleted.reduce((a, b) => a + b, 0),
          // Redis: PUBLISH's count of subscribers (every worker of every instance); else the workers reset
          instances: shared ? (instances === null ? null : Math.max(...instances)) : got.length,
          complete: incomplete === undefined,
          ...(incomplete !== undefined ? { warning: incomplete.warning } : {}),
          workers: got.length,
          resetIn: got.map(g => g.pid)
        }
      }
    },

    async consumer (name) {
      const got = await gather('consumer', name, '')
      if (!Array.isArray(got)) return got
      const shared = sharedStore()
      const first = got[0]?.body ?? {}
      const quota = first.quota as Record<string, unknown> | null | undefined
      if (shared || quota === null || quota === undefined) return { status: 200, body: { ...first, workers: got.length, combined: shared ? 'shared' : 'summed' } }
      const per = got.map(g => {
        const q = g.body.quota as Record<string, unknown> | null
        return { pid: g.pid, used: num(q?.used), remaining: num(q?.remaining) }
      })
      const summed = { ...quota, used: per.reduce((a, p) => a + p.used, 0), remaining: per.reduce((a, p) => a + p.remaining, 0), perWorker: per }
      return { status: 200, body: { ...first, quota: summed, workers: got.length, combined: 'summed', note: SUMMED_NOTE } }
    }
  }
}
