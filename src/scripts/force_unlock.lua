-- Force-unlock, for an operator (`quorumlock break`): deletes the holders'
-- entries it was given, and only those (a holder that took the lock
-- since the operator looked is left alone), or, with ARGV[2] = "*",
-- whoever holds it (a key of a type no lock writes is left alone either
-- way); wakes the first waiter if the lock is free here afterwards.
-- KEYS: five for the resource (see holders.lua), and for a name with a
-- hash tag the counter the other `FenceCounters` setting uses (the higher
-- is reported, as inspect.lua does). ARGV[1] = its wake-up channel;
-- ARGV[2..] = the values to break, or "*".
-- Returns {what was deleted: "x", "r", "none" (nothing of those given:
-- free, or someone else holds it) or "other", the fencing counter as
-- stored ("" when none)}.
-- Works on uncovered keys (see holders.lua).
return uncovered(function()
    local lock = lock_of(0)
    local kind = holders(lock)
    local anyone = ARGV[2] == "*"
    local shown = {}
    for i = 2, #ARGV do
        shown[ARGV[i]] = true
    end
    local deleted = "none"
    if kind == "string" then
        if anyone or shown[redis.call("GET", lock)] then
            redis.call("DEL", lock)
            deleted = "x"
        end
    elseif kind == "zset" then
        if anyone then
            redis.call("DEL", lock)
            deleted = "r"
        else
            for value in pairs(shown) do
                if redis.call("ZREM", lock, value) == 1 then
                    deleted = "r"
                end
            end
        end
    elseif kind ~= "none" then
        deleted = "other"
    end
    local counter = reported_counter(fence_of(0), KEYS[6])
    if redis.call("EXISTS", lock) == 0 then
        pcall(function()
            wake_first(queue_of(0), ARGV[1], true)
        end)
    end
    return { deleted, counter }
end)
