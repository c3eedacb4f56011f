// Preloaded (`node --import`) into a contender by bench/alloc.js: V8's sampling heap profiler, objects
// that garbage collection has already freed included, turned on by the first SIGUSR2 and off by
// the second, which writes `{ intervalBytes, samples, sites }` to $ALLOC_SAMPLER_OUT. Each sample
// stands for `intervalBytes` allocated on average, so samples x interval / requests is the bytes
// one request allocates; `sites` counts the samples per allocating function (an optimised
// function's inlined callees are counted as it).
import inspector from 'node:inspector'
import { writeFileSync } from 'node:fs'

const INTERVAL = 256
const session = new inspector.Session()
session.connect()
let sampling = false
process.on('SIGUSR2', () => {
  if (!sampling) {
    sampling = true
    session.post('HeapProfiler.startSampling', { samplingInterval: INTERVAL, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true })
    return
  }
  session.post('HeapProfiler.stopSampling', (err, result) => {
    if (err) throw err
    /** @type {Map<number, string>} */
    const names = new Map()
    /** @param {import('node:inspector').HeapProfiler.SamplingHeapProfileNode} node */
    const walk = (node) => {
      const f = node.callFrame
      const url = f.url.replace(/^file:\/\//, '').replace(process.cwd() + '/', '')
      names.set(node.id, `${f.functionName || '(anonymous)'} ${url}:${f.lineNumber + 1}`)
      for (const child of node.children) walk(child)
    }
    walk(result.profile.head)
    /** @type {Record<string, number>} */
    const sites = {}
    for (const s of result.profile.samples) {
      const name = names.get(s.nodeId) ?? '(unknown)'
      sites[name] = (sites[name] ?? 0) + 1
    }
    writeFileSync(process.env.ALLOC_SAMPLER_OUT ?? 'alloc-sampler.json', JSON.stringify({ intervalBytes: INTERVAL, samples: result.profile.samples.length, sites }))
  })
})
