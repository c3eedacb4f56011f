// Median and range over rounds: the bench reports medians, with min-max to show the noise.

/**
 * @typedef {{ median: number, min: number, max: number, n: number }} Spread
 */

/**
 * @param {number[]} values
 * @returns {Spread | null}
 */
export function spread (values) {
  const v = values.filter((x) => Number.isFinite(x)).sort((a, b) => a - b)
  if (v.length === 0) return null
  const mid = v.length >> 1
  const median = v.length % 2 === 1 ? /** @type {number} */ (v[mid]) : (/** @type {number} */ (v[mid - 1]) + /** @type {number} */ (v[mid])) / 2
  return { median, min: /** @type {number} */ (v[0]), max: /** @type {number} */ (v[v.length - 1]), n: v.length }
}

/**
 * Significant digits that suit a table: 12345 → "12345", 12.345 → "12.3", 0.01234 → "0.0123".
 * @param {number | null | undefined} x
 */
export function fmt (x) {
  if (x === null || x === undefined || !Number.isFinite(x)) return '-'
  const a = Math.abs(x)
  if (a >= 1000) return String(Math.round(x))
  if (a >= 100) return x.toFixed(0)
  if (a >= 10) return x.toFixed(1)
  if (a >= 1) return x.toFixed(2)
  if (a === 0) return '0'
  return x.toPrecision(2)
}

/**
 * "median [min-max]", or "-" when there is nothing to show.
 * @param {Spread | null | undefined} s
 */
export function fmtSpread (s) {
  if (!s) return '-'
  return s.n > 1 && s.min !== s.max ? `${fmt(s.median)} [${fmt(s.min)}-${fmt(s.max)}]` : fmt(s.median)
}
