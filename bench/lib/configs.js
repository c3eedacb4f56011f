// The bench's gateway configs (bench/configs/*.yaml) with this run's ports and addresses filled in.
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const CONFIGS = fileURLToPath(new URL('../configs/', import.meta.url))

/**
 * `${NAME}` placeholders replaced from `vars`; a placeholder without a value throws.
 * @param {string} template  file name in bench/configs
 * @param {Record<string, string>} vars
 */
export function renderConfig (template, vars) {
  return readFileSync(CONFIGS + template, 'utf8')
    .replace(/\$\{(\w+)\}/g, (_, name) => {
      if (!(name in vars)) throw new Error(`${template}: no value for \${${name}}`)
      return /** @type {string} */ (vars[name])
    })
}
