// Where the CLI's commands (gateway reload, gateway limits) reach a running gateway's admin listener.
import { splitHostPort } from '../server.js'

/** The admin address a local client connects to: a wildcard bind is reached on loopback. */
export function adminClientUrl (admin: string): string {
  const { host, port } = splitHostPort(admin)
  const h = host === '0.0.0.0' ? '127.0.0.1' : host === '::' ? '::1' : host
  return `http://${h.includes(':') ? `[${h}]` : h}:${port}`
}
