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
-- Works on uncovered keys (see holders.lua), but for a quiet dequeue.
-- A quiet dequeue (no value: a waiter that won leaves the queues while its
-- lock holds) changes no lock key while others still wait: the key is
-- covered until at least the leases key's expiry (every enqueue covers it
-- again), and taking an entry out does not lengthen that. Uncovering and
-- covering it again would only rewrite it as it was. Where no live waiter
-- is left, it is uncovered, as `cover` would then leave it.
if ARGV[1] == "" then
    for i = 0, resources - 1 do
        local q = queue_of(i)
        -- As in release.lua: a queue key of a foreign type is skipped.
        pcall(function()
            if ARGV[2] ~= "" then
                dequeue(q, ARGV[2], "x")
            end
            if not first_in(q, q.queue, now_ms())[1] then
                uncover(lock_of(i))
            end
        end)
    end
    return 0
end
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
