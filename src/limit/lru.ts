// How the limiter's per-request code uses lru-cache (11.x), whose defaults cost on every call.
import type { LRUCache } from 'lru-cache'

/**
 * The options object the hot path passes to `get` and `set`. Without one, each call allocates its
 * default `{}` (about 700 bytes per request over the 13 calls of four in-process limits:
 * bench/README.md, thirteenth session). Not frozen: lru-cache writes `status` (undefined) into it.
 */
export const LRU_CALL: Record<never, never> = {}

/**
 * Deletes `key` unless it is the last key `cache` holds; true when deleted. lru-cache runs its
 * `clear` when its last entry is deleted, filling each of its `max`-long arrays: 0.16 ms at
 * 100,000 keys, on the request that deleted it (bench/README.md, twelfth session). Callers keep
 * the last entry in a form that decides like a missing one instead.
 */
export function deleteUnlessLast<K extends NonNullable<unknown>, V extends NonNullable<unknown>> (cache: LRUCache<K, V>, key: K): boolean {
  return cache.size > 1 && cache.delete(key)
}
