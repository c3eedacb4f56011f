import { DURATION_RE, SIZE_RE } from './schema.js'

const DURATION_MS: Readonly<Record<string, number>> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }
const SIZE_BYTES: Readonly<Record<string, number>> = { b: 1, kb: 1024, mb: 1024 ** 2, gb: 1024 ** 3 }

/** "250ms" | "1s" | "1m" | "1h" -> milliseconds. The schema already validated the shape. */
export function parseDuration (text: string): number {
  const m = DURATION_RE.exec(text)
  if (m === null) throw new Error(`invalid duration "${text}"`)
  return Number(m[1]) * (DURATION_MS[m[2] as string] as number)
}

export function durationOr (text: string | undefined, fallbackMs: number): number {
  return text === undefined ? fallbackMs : parseDuration(text)
}

/** 1048576 | "512kb" | "10mb" | "1gb" -> bytes. */
export function parseSize (value: number | string): number {
  if (typeof value === 'number') return value
  const m = SIZE_RE.exec(value)
  if (m === null) throw new Error(`invalid size "${value}"`)
  return Number(m[1]) * (SIZE_BYTES[(m[2] as string).toLowerCase()] as number)
}
