// Shutdown steps that call a peer (Redis, an OTLP collector) or wait for sockets must not hang on
// one that stalls: each waits for its work, at most a bound, and goes on.

/** Node's longest timer (2^31 - 1 ms, about 596h): a longer one fires after 1 ms. */
export const MAX_TIMER_MS = 2_147_483_647

/**
 * Resolves once `work` settles (its failure ignored: the caller gave up on it already) or after
 * `ms`, whichever comes first. The timer is cleared either way, so nothing of it outlives the wait.
 */
export async function waitAtMost (work: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  const bound = new Promise<void>(resolve => { timer = setTimeout(resolve, ms) })
  try {
    await Promise.race([work.then(() => {}, () => {}), bound])
  } finally {
    clearTimeout(timer)
  }
}
