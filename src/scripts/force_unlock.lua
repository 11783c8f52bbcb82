-- Force-unlock, for an operator (`quorumlock break`): deletes the lock
-- key whoever holds it (an exclusive holder or every reader; a key of a
-- type no lock writes is left alone), and wakes the first waiter.
-- KEYS: five for the resource (see holders.lua), and for a name with a
-- hash tag the counter the other `FenceCounters` setting uses (the higher
-- is reported, as inspect.lua does). ARGV[1] = its wake-up channel.
-- Returns {what was deleted: "x", "r", "none" or "other", the fencing
-- counter as stored ("" when none)}.
local lock = lock_of(0)
local kind = holders(lock)
if kind == "string" or kind == "zset" then
    redis.call("DEL", lock)
end
local counter = reported_counter(fence_of(0), KEYS[6])
pcall(function()
    wake_first(queue_of(0), ARGV[1], true)
end)
local names = { string = "x", zset = "r", none = "none" }
return { names[kind] or "other", counter }
