// V8 turns a built-in prototype into a dictionary ("slow") object when a class extends the
// built-in, and does not turn it back while its methods are only called on primitives. ioredis 6
// defines `class VerbatimString extends String` when it loads: from then on, every string method
// the request path calls (charCodeAt, indexOf, slice, includes, toLowerCase: routing, header
// names, undici's parser) was a generic property load in optimized code, about 60 per request
// (bench/README.md, nineteenth session). V8 restores a prototype to fast properties when an inline
// cache misses on an object that inherits from it, so a few property loads on wrapper objects,
// from a function that has its feedback vector by then, put the prototypes back.
const WRAPPERS: readonly object[] = [Object(''), Object(0), Object(false), Object(Symbol('fast-prototypes')), Object(0n)]

// V8 gives a function its inline caches (its feedback vector) only after it has run for a while
// (--lazy-feedback-allocation and its interrupt budget); before that a load does not reach the code
// that restores the prototype. 4 calls did it on Node 20; 32 leave a margin for other versions.
const CALLS = 32

function loadAbsent (wrapper: object): unknown {
  return (wrapper as { readonly absentProperty?: unknown }).absentProperty
}

/**
 * Puts String.prototype and the other primitives' prototypes back in fast mode after a dependency
 * extended them. Once V8 has restored a prototype this way it marks it to stay fast, so a class
 * that extends it later (an embedding process's own code) no longer turns it slow: one call, when
 * the module that loads ioredis is evaluated, is enough.
 */
export function restoreFastPrototypes (): void {
  for (let i = 0; i < CALLS; i++) {
    for (const wrapper of WRAPPERS) loadAbsent(wrapper)
  }
}
