// How the workers primary combines its workers' answers to GET /limits (README "With workers: N"):
// with Redis one shared budget (remaining is the latest read, the least; a client waits as long as
// the longest wait read; deniedMs is the longest any worker's deny cache holds the client), the
// local level each worker's own (summed); without Redis every budget summed. The workers' answers
// are given here as they come over IPC, with values no two real workers read at once on a quiet
// machine (two reads of one key moments apart, deny caches filled at different times), so that a
// rule picking the wrong worker shows.
import t from 'tap'
import { createWorkersLimitsOps, type WorkerAnswer } from '../src/admin/limits-over-workers.js'

interface View { name: string, key: string, scope?: string, remaining: number, resetMs: number, retryAfterMs: number, deniedMs: number }

const limit = (name: string, key: string, v: Partial<View>, scope?: string): View =>
  ({ name, key, remaining: 0, resetMs: 0, retryAfterMs: 0, deniedMs: 0, ...(scope !== undefined ? { scope } : {}), ...v })

const answered = (pid: number, limits: View[]): WorkerAnswer =>
  ({ pid, answer: { status: 200, body: { route: 'api', ip: '10.0.0.7', limits } } })

async function lookup (shared: boolean, answers: WorkerAnswer[]): Promise<{ status: number, combined: unknown, limits: Map<string, View & { perWorker: unknown[] }> }> {
  const ops = createWorkersLimitsOps(async () => answers, () => shared, 3000)
  const got = await ops.lookup('route=api&ip=10.0.0.7')
  const limits = new Map<string, View & { perWorker: unknown[] }>()
  for (const l of (got.body.limits ?? []) as Array<View & { perWorker: unknown[] }>) limits.set(l.name, l)
  return { status: got.status, combined: got.body.combined, limits }
}

t.test('with Redis: the least remaining, the longest wait and the longest deny; the local level summed', async t => {
  // worker 102 read the key after 101 (one request later) and refused the client first;
  // each lists the limits in its own order (a worker in the middle of a reload)
  const got = await lookup(true, [
    answered(101, [
      limit('local', 'local:10.0.0.7', { remaining: 3, retryAfterMs: 0, resetMs: 400 }, 'instance'),
      limit('ip', 'gw:ip:10.0.0.7', { remaining: 2, retryAfterMs: 0, resetMs: 9000, deniedMs: 300 }),
      limit('global', 'gw:global', { remaining: 50, retryAfterMs: 0, resetMs: 100, deniedMs: 0 })
    ]),
    answered(102, [
      limit('global', 'gw:global', { remaining: 40, retryAfterMs: 0, resetMs: 120, deniedMs: 0 }),
      limit('ip', 'gw:ip:10.0.0.7', { remaining: 1, retryAfterMs: 700, resetMs: 8000, deniedMs: 1200 }),
      limit('local', 'local:10.0.0.7', { remaining: 4, retryAfterMs: 0, resetMs: 200 }, 'instance')
    ])
  ])
  t.equal(got.status, 200)
  t.equal(got.combined, 'shared')
  t.match(got.limits.get('ip'), { key: 'gw:ip:10.0.0.7', remaining: 1, retryAfterMs: 700, deniedMs: 1200, resetMs: 9000 }, 'the shared key: least remaining, longest wait, longest deny, latest reset')
  t.same(got.limits.get('ip')?.perWorker, [
    { pid: 101, remaining: 2, resetMs: 9000, retryAfterMs: 0, deniedMs: 300 },
    { pid: 102, remaining: 1, resetMs: 8000, retryAfterMs: 700, deniedMs: 1200 }
  ], 'each worker\'s read, matched by key whatever the order it listed them in')
  t.match(got.limits.get('global'), { remaining: 40 }, 'the gateway-wide budget: the latest read')
  t.match(got.limits.get('local'), { scope: 'instance', remaining: 7, retryAfterMs: 0, resetMs: 400 }, 'each worker\'s own bucket: summed')
  t.same([...got.limits.keys()], ['local', 'ip', 'global'], 'in the first worker\'s order')

  // a worker that reads a limit as never admitting (-1) wins over any finite wait
  const never = await lookup(true, [
    answered(101, [limit('ip', 'k', { remaining: 0, retryAfterMs: 5000 })]),
    answered(102, [limit('ip', 'k', { remaining: 0, retryAfterMs: -1 })])
  ])
  t.equal(never.limits.get('ip')?.retryAfterMs, -1, 'never, as one worker read it')
})

t.test('without Redis: every budget summed; a client waits only when no worker has budget, and then the soonest', async t => {
  const oneHas = await lookup(false, [
    answered(101, [limit('ip', 'k', { remaining: 0, retryAfterMs: 900, deniedMs: 900 })]),
    answered(102, [limit('ip', 'k', { remaining: 2, retryAfterMs: 0 })])
  ])
  t.equal(oneHas.combined, 'summed')
  t.match(oneHas.limits.get('ip'), { remaining: 2, retryAfterMs: 0, deniedMs: 900 }, 'one worker still admits: no wait')
  const none = await lookup(false, [
    answered(101, [limit('ip', 'k', { remaining: 0, retryAfterMs: 900 })]),
    answered(102, [limit('ip', 'k', { remaining: 0, retryAfterMs: -1 })]),
    answered(103, [limit('ip', 'k', { remaining: 0, retryAfterMs: 400 })])
  ])
  t.match(none.limits.get('ip'), { remaining: 0, retryAfterMs: 400 }, 'the soonest worker to admit again')
  const never = await lookup(false, [
    answered(101, [limit('ip', 'k', { retryAfterMs: -1 })]),
    answered(102, [limit('ip', 'k', { retryAfterMs: -1 })])
  ])
  t.equal(never.limits.get('ip')?.retryAfterMs, -1, 'never, when no worker will ever admit it')
})
