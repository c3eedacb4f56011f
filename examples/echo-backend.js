// A small backend for the demo: echoes the request as JSON, and echoes WebSocket messages.
import { createServer } from 'node:http'
import { createHash } from 'node:crypto'

const port = Number(process.env.PORT ?? 3000)
// 127.0.0.1 by default; the compose stack sets HOST=0.0.0.0 so the gateway containers reach it.
const host = process.env.HOST ?? '127.0.0.1'

const server = createServer((req, res) => {
  const chunks = []
  req.on('data', c => chunks.push(c))
  req.on('end', () => {
    const body = JSON.stringify({ method: req.method, url: req.url, headers: req.headers, bodyBytes: Buffer.concat(chunks).length }, null, 2)
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(body + '\n')
  })
})

// Minimal RFC 6455 echo of short text frames, enough to show an upgrade passing through.
server.on('upgrade', (req, socket) => {
  const accept = createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64')
  socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`)
  socket.on('data', buf => {
    const opcode = buf[0] & 0x0f
    if (opcode === 8) return socket.end()
    const len = buf[1] & 0x7f
    if (len > 125) return socket.end()
    const mask = buf.subarray(2, 6)
    const payload = Buffer.from(buf.subarray(6, 6 + len).map((b, i) => b ^ mask[i % 4]))
    socket.write(Buffer.concat([Buffer.from([0x81, payload.length]), payload]))
  })
  socket.on('error', () => socket.destroy())
})

server.once('error', err => {
  // one line, not a stack trace (a port taken is the usual case)
  console.error(`echo backend: ${host}:${port}: ${err.code === 'EADDRINUSE' ? 'address already in use' : err.message}`)
  process.exit(1)
})
server.listen(port, host, () => console.log(`echo backend on http://${host}:${port}`))
