// What the Redis-over-TLS tests (test/redis-tls.test.ts, test/redis-sentinel-tls.test.ts) share: a
// gateway whose one route has an api limit of 3 an hour, decided by the `redis` given, and the
// readings they assert on.

/** One route named `route` with `api: 3/1h`, on the `redis:` value given (a YAML flow mapping). */
export function limitedConfig (upstream: string, route: string, redis: string): string {
  return `listen: 127.0.0.1:0
admin: 127.0.0.1:0
log: { level: info }
redis: ${redis}
upstreams:
  backend: { targets: [${upstream}] }
routes:
  - name: ${route}
    pathPrefix: /
    upstream: backend
    limits:
      api: { algorithm: fixed-window, limit: 3, window: 1h }
`
}

/** The statuses of `n` requests to `url`, one after the other. */
export async function statuses (url: string, n: number): Promise<number[]> {
  const out: number[] = []
  for (let i = 0; i < n; i++) out.push((await fetch(url)).status)
  return out
}

export interface Readyz { status: string, redis: { state: string, connected: boolean } }

export async function readyz (adminUrl: string): Promise<Readyz> {
  return await (await fetch(`${adminUrl}/readyz`)).json() as Readyz
}
