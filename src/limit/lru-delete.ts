import type { LRUCache } from 'lru-cache'

/**
 * Deletes `key` unless it is the last key `cache` holds; true when deleted. lru-cache (11.x) runs
 * its `clear` when its last entry is deleted, filling each of its `max`-long arrays: 0.16 ms at
 * 100,000 keys, on the request that deleted it (bench/README.md, twelfth session). Callers keep
 * the last entry in a form that decides like a missing one instead.
 */
export function deleteUnlessLast<K extends NonNullable<unknown>, V extends NonNullable<unknown>> (cache: LRUCache<K, V>, key: K): boolean {
  return cache.size > 1 && cache.delete(key)
}
