-- The `bit` library Redis bundles (LuaBitOp), as much of it as gateway/store/lua/ uses, in plain
-- Lua 5.1: fakeredis runs scripts on lupa's Lua 5.1, which has no `bit`. Loaded by
-- tests/unit/conftest.py (fakeredis' `lua_modules` and LUA_PATH). Operands are bytes and
-- small integers here, so no 32-bit sign handling is needed.
local M = {}

local function each_bit(a, b, keep)
  local out, place = 0, 1
  a, b = a % 4294967296, b % 4294967296
  while a > 0 or b > 0 do
    local x, y = a % 2, b % 2
    if keep(x, y) then out = out + place end
    a, b, place = (a - x) / 2, (b - y) / 2, place * 2
  end
  return out
end

function M.bor(a, b) return each_bit(a, b, function(x, y) return x + y > 0 end) end
function M.bxor(a, b) return each_bit(a, b, function(x, y) return x ~= y end) end
function M.band(a, b) return each_bit(a, b, function(x, y) return x + y == 2 end) end

return M
