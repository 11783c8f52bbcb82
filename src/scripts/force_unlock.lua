-- Force-unlock, for an operator (`quorumlock break`): deletes the lock
-- key whoever holds it (an exclusive holder or every reader; a key of a
-- type no lock writes is left alone), and wakes the first waiter.
-- KEYS: five for the resource (see holders.lua). ARGV[1] = its wake-up
-- channel.
-- Returns {what was deleted: "x", "r", "none" or "other", the fencing
-- counter as stored ("" when none)}.
local lock = lock_of(0)
local kind = holders(lock)
if kind == "string" or kind == "zset" then
    redis.call("DEL", lock)
end
local counter = redis.pcall("GET", fence_of(0))
if type(counter) ~= "string" then
    counter = ""
end
pcall(function()
    wake_first(queue_of(0), ARGV[1], true)
end)
local names = { string = "x", zset = "r", none = "none" }
return { names[kind] or "other", counter }
