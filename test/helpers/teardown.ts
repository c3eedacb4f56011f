// The one teardown contract of the test helpers: every start helper takes the test first and
// registers its own teardown right after starting what it started (issue 7 item 8).
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { join, resolve } from 'node:path'

/** What a helper needs from a tap test: tap's `t` (root or subtest) satisfies it. */
export interface Teardown { teardown: (fn: () => unknown) => void }

/** Where tap keeps t.testdir() fixtures: inside the repository and git-ignored (.tap/). */
export const FIXTURES = resolve(import.meta.dirname, '..', '..', '.tap', 'fixtures')

/**
 * A fresh directory inside the repository, removed at teardown, for the files a test writes
 * (configs, keys, certificates, Redis data). Not t.testdir(): that gives one directory per test,
 * wiped by a second call, and names it after the whole subtest path, which long names overflow.
 */
export function tempDir (t: Teardown, prefix: string): string {
  mkdirSync(FIXTURES, { recursive: true })
  const dir = mkdtempSync(join(FIXTURES, `${prefix}-`))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}
