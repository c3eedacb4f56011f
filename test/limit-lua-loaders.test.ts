// The Lua library makes an algorithm's functions only when a call names its code (lua/common.lua,
// load_algorithm): Redis runs a script's whole chunk on every call, and the eight algorithm files
// built eagerly cost each call the functions of algorithms it never uses. These tests check on a
// real redis-server that nothing is built before it is named, that naming a code builds that one
// algorithm, and that an unknown code is still no algorithm; and how scripts.ts writes the loader.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { startRedis } from './helpers/redis.js'
import { LIMIT_SCRIPT, algorithmLoader } from '../src/limit/scripts.js'

const LUA = new URL('../lua/', import.meta.url)
const read = (file: string): string => readFileSync(new URL(file, LUA), 'utf8')

// Replaces limit.lua's body after the library: which codes are built before and after naming 1.
const PROBE = `
local function built ()
  local s = ''
  for code = 1, 8 do
    if rawget(ALGORITHMS, code) ~= nil then s = s .. code end
  end
  return s
end
local before = built()
local gcra = ALGORITHMS[1]
local after = built()
local again = ALGORITHMS[1]
return { before, after, type(gcra.check), tostring(gcra == again), tostring(ALGORITHMS[99] == nil), tostring(ALGORITHMS[0] == nil) }
`

t.test('an algorithm is built the first time a call names its code, and only that one', async (t) => {
  const redis = await startRedis(t)
  const client = redis.client()
  const limitLua = read('limit.lua')
  t.ok(LIMIT_SCRIPT.endsWith(limitLua), 'limit.lua follows the library')
  const script = LIMIT_SCRIPT.slice(0, LIMIT_SCRIPT.length - limitLua.length) + PROBE
  const [before, after, checkType, same, unknown, zero] = await client.eval(script, 0) as string[]
  t.equal(before, '', 'no algorithm is built before a call names one')
  t.equal(after, '1', 'naming gcra built gcra alone')
  t.equal(checkType, 'function', 'with its functions')
  t.equal(same, 'true', 'named again, the same algorithm: built once per call')
  t.equal(unknown, 'true', 'an unknown code is no algorithm')
  t.equal(zero, 'true', 'nor is 0')
  const [beforeNext] = await client.eval(script, 0) as string[]
  t.equal(beforeNext, '', 'the next call starts with nothing built again')
})

t.test('scripts.ts writes one loader whose branch for each code is that algorithm file', async (t) => {
  const gcra = read('gcra.lua')
  const lease = read('lease.lua')
  t.equal(algorithmLoader([['gcra.lua', gcra], ['lease.lua', lease]]),
    `load_algorithm = function (code)\nif code == 1 then\n${gcra}\nelseif code == 8 then\n${lease}\nend\nend`)
  t.throws(() => algorithmLoader([['two.lua', 'ALGORITHMS[1] = {}\nALGORITHMS[2] = {}\n']]), /registers 2 algorithms/)
  t.throws(() => algorithmLoader([['none.lua', 'local x = 1\n']]), /registers 0 algorithms/)
  for (let code = 1; code <= 8; code++) t.match(LIMIT_SCRIPT, new RegExp(`^(if|elseif) code == ${code} then$`, 'm'), `code ${code} has its branch`)
  t.equal(LIMIT_SCRIPT.match(/^load_algorithm = function \(code\)$/gm)?.length, 1, 'one loader')
})
