// OTLP/HTTP (JSON) as the tracing tests read it: a local receiver and the spans of its exports.
import type { IncomingMessage } from 'node:http'
import { startHttpServer } from './upstream.js'
import type { Teardown } from './teardown.js'

export interface OtlpValue { stringValue?: string, intValue?: number | string, doubleValue?: number }
export interface OtlpSpan { traceId: string, spanId: string, parentSpanId?: string, name: string, kind: number, attributes: Array<{ key: string, value: OtlpValue }>, status?: { code?: number } }
export interface OtlpExport { resourceSpans: Array<{ resource: { attributes: Array<{ key: string, value: OtlpValue }> }, scopeSpans: Array<{ spans: OtlpSpan[] }> }> }

/** Every span of these exports, in order. */
export const spansIn = (exports: readonly OtlpExport[]): OtlpSpan[] => exports.flatMap(e => e.resourceSpans.flatMap(r => r.scopeSpans.flatMap(s => s.spans)))

/** A span attribute's value: a string, or a number (OTLP JSON writes 64-bit ints as strings). */
export const attr = (span: OtlpSpan, key: string): string | number | undefined => {
  const v = span.attributes.find(a => a.key === key)?.value
  if (v === undefined) return undefined
  return v.stringValue ?? (v.intValue !== undefined ? Number(v.intValue) : v.doubleValue)
}

/** An OTLP/HTTP receiver: each export's body (and its request) goes to `received`, answered 200 {}. */
export async function startReceiver (t: Teardown, received: (body: string, req: IncomingMessage) => void): Promise<{ url: string }> {
  const { url } = await startHttpServer(t, (req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      received(Buffer.concat(chunks).toString(), req)
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    })
  })
  return { url }
}
