/**
 * The gateway-wide count of request-body bytes held in memory by body buffering. Bytes are taken
 * as they arrive, not as a Content-Length announces them: a client that announces 1 MB and
 * trickles holds only what it sent, and buffering itself can never be a memory attack.
 */
export class BodyBudget {
  #held = 0
  limit: number

  constructor (limit: number) {
    this.limit = limit
  }

  get held (): number {
    return this.#held
  }

  /** Takes `bytes` if they fit under the limit; false (nothing taken) when they do not. */
  take (bytes: number): boolean {
    if (this.#held + bytes > this.limit) return false
    this.#held += bytes
    return true
  }

  release (bytes: number): void {
    this.#held = Math.max(0, this.#held - bytes)
  }
}
