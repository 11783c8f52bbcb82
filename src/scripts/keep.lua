-- The release of an exclusive lock taken with `at_least` before that time
-- is up: where our value still holds a resource, its key stays, with our
-- value, for `keep` ms more and no longer (it was set to live at least
-- that long; a key that lives longer, extended meanwhile, is cut to it,
-- and no key is ever lengthened here: a stale key of a lock lost to
-- another holder must not block its node longer), so that no one takes it
-- before the minimum time after the acquisition; the waiter that won it
-- leaves the queues, and no one is woken (the key is still held).
-- KEYS: five per resource (see holders.lua).
-- ARGV[1] = our value, ARGV[2] = waiter id to dequeue ("" for none),
-- ARGV[3] = how long (ms) the key stays.
-- Returns 1 when our value held every resource (and now stays), else 0.
-- Works on uncovered keys (see holders.lua).
return uncovered(function()
    local value, waiter, keep = ARGV[1], ARGV[2], tonumber(ARGV[3])
    local held = true
    for i = 0, resources - 1 do
        local lock = lock_of(i)
        if holds(lock, value, "x") then
            local left = redis.call("PTTL", lock)
            if left < 0 or left > keep then
                redis.call("PEXPIRE", lock, keep)
            end
        else
            held = false
        end
        if waiter ~= "" then
            -- As in release.lua: a queue key of a foreign type must not fail a
            -- release that worked.
            pcall(dequeue, queue_of(i), waiter, "x")
        end
    end
    return held and 1 or 0
end)
