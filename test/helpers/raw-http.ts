// Raw HTTP/1.1 on a socket, for what a well-behaved client library will not send: duplicate
// Host lines, hundreds of header fields, pipelined requests, malformed heads.
import net from 'node:net'

export interface RawReply {
  readonly status: number
  /** Lowercase names; a repeated field keeps its last value. */
  readonly headers: Record<string, string>
  readonly body: string
  readonly json: Record<string, unknown> | null
}

/** Writes `raw` on a fresh connection and returns everything the gateway sent until it closed. */
export async function rawExchange (port: number, raw: string | Buffer, timeoutMs = 10_000): Promise<string> {
  const socket = net.connect(port, '127.0.0.1')
  socket.setTimeout(timeoutMs, () => socket.destroy())
  socket.on('error', () => socket.destroy())
  socket.write(raw)
  let text = ''
  socket.setEncoding('latin1')
  for await (const chunk of socket) text += chunk as string
  return text
}

/** Splits a byte stream of HTTP/1.1 responses (Content-Length framed, or one closed by the connection). */
export function parseResponses (text: string): RawReply[] {
  const out: RawReply[] = []
  let rest = text
  while (rest.length > 0) {
    const end = rest.indexOf('\r\n\r\n')
    if (end === -1) break
    const [statusLine, ...lines] = rest.slice(0, end).split('\r\n')
    const headers: Record<string, string> = {}
    for (const line of lines) {
      const colon = line.indexOf(':')
      headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim()
    }
    const status = Number((statusLine ?? '').split(' ')[1])
    const length = headers['content-length']
    const bodyless = status === 304 || status === 204 || (status >= 100 && status < 200)
    const size = bodyless ? 0 : length === undefined ? rest.length - end - 4 : Number(length)
    const body = rest.slice(end + 4, end + 4 + size)
    let json: Record<string, unknown> | null = null
    try { json = JSON.parse(body) as Record<string, unknown> } catch { /* not JSON */ }
    out.push({ status, headers, body, json })
    rest = rest.slice(end + 4 + size)
  }
  return out
}

/** One request on a fresh connection (`Connection: close` is added), its one response. */
export async function rawRequest (port: number, head: string, body = ''): Promise<RawReply> {
  const text = await rawExchange(port, `${head}Connection: close\r\n\r\n${body}`)
  const [reply] = parseResponses(text)
  if (reply === undefined) throw new Error(`no response in ${JSON.stringify(text.slice(0, 200))}`)
  return reply
}

/** A connection that sends what it is told and collects what comes back. */
export function rawConnection (port: number): { send: (raw: string) => void, received: () => string, untilText: (re: RegExp) => Promise<string>, closed: Promise<void> } {
  const socket = net.connect(port, '127.0.0.1')
  socket.on('error', () => {})
  let text = ''
  socket.setEncoding('latin1')
  socket.on('data', (chunk: string) => { text += chunk })
  const closed = new Promise<void>((resolve) => socket.once('close', () => { resolve() }))
  return {
    send: (raw) => { socket.write(raw) },
    received: () => text,
    untilText: async (re) => {
      const deadline = Date.now() + 10_000
      while (!re.test(text)) {
        if (Date.now() > deadline) throw new Error(`no ${String(re)} in ${JSON.stringify(text)}`)
        await new Promise((resolve) => setTimeout(resolve, 10))
      }
      return text
    },
    closed
  }
}
