// pino JSON logs. Secrets never reach a log line: credentials are redacted by path, and the
// config is logged only in its redacted form (see admin/redact.ts).
import { pino, type Logger as PinoLogger, type DestinationStream } from 'pino'

export type Logger = PinoLogger
export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent'

export function createLogger (level: LogLevel = 'info', destination?: DestinationStream): Logger {
  return pino({
    level,
    base: { pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    redact: {
      paths: ['*.authorization', '*.password', '*.secret', '*["x-api-key"]', 'headers.cookie'],
      censor: '[redacted]'
    }
  }, destination ?? pino.destination({ dest: 1, sync: false }))
}
