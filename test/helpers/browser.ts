// A real headless Chromium for the admin page's tests, driven by playwright-core. The browser is
// the OS package (scripts/preflight.mjs installs it for `npm test`), not a download.
import { accessSync, constants } from 'node:fs'
import { delimiter, join } from 'node:path'
import { chromium, type Browser } from 'playwright-core'
import type { Teardown } from './teardown.js'

const NAMES = ['chromium', 'chromium-browser', 'google-chrome']

export function findChromium (): string {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    for (const name of NAMES) {
      try {
        accessSync(join(dir, name), constants.X_OK)
        return join(dir, name)
      } catch { /* not here */ }
    }
  }
  throw new Error(`no Chromium on PATH (${NAMES.join(', ')}): run node scripts/preflight.mjs test`)
}

export async function launchBrowser (t: Teardown): Promise<Browser> {
  const browser = await chromium.launch({ executablePath: findChromium(), headless: true })
  t.teardown(() => browser.close())
  return browser
}
