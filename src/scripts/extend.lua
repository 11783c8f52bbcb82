-- Compare-and-extend: push back the expiry of our entry on every resource,
-- only while each still holds it, so an extension can never revive or
-- prolong someone else's lock. Never shortens it: an extension that
-- arrives late (sent before a longer one that has already been applied,
-- on another connection) must not cut it below what the holder was since
-- told it has.
-- With the repair flag, an entry that is missing (and whose place no one
-- else holds) is set again: the client sends it only to a node that may
-- have lost our entry (it restarted without persistence, or its clock
-- faulted, since our acquire) while our lock is valid, so no other client
-- can hold a quorum; setting it takes nothing from anyone.
-- KEYS: five per resource (see holders.lua).
-- ARGV[1] = this holder's unique value, ARGV[2] = new TTL in ms, ARGV[3] =
-- "1" to repair, ARGV[4] = "x" or "r".
-- Returns 1 when every entry is ours and now lives at least ARGV[2] ms, 2
-- when some were missing and are set again, 0 (changing nothing) when
-- another holder has one, or one is missing without repair.
-- Works on uncovered keys (see holders.lua).
return uncovered(function()
    local value, ttl, repair, access = ARGV[1], tonumber(ARGV[2]), ARGV[3] == "1", ARGV[4]
    local missing = false
    local ours = {}
    for i = 0, resources - 1 do
        local lock = lock_of(i)
        -- Ours is the common case: look at who else holds it only when not.
        local kind = not holds(lock, value, access) and holders(lock)
        if not kind then
            ours[i] = true
        elseif kind == "none" or (kind == "zset" and access == "r") then
            -- Our entry is gone, and no one holds its place.
            if not repair then
                return 0
            end
            missing = true
        else
            return 0
        end
    end
    for i = 0, resources - 1 do
        local lock = lock_of(i)
        if ours[i] and access == "x" then
            -- TTLs are below 2^35 ms (a year), exact as Lua numbers.
            local left = redis.call("PTTL", lock)
            if left < 0 or left < ttl then
                redis.call("PEXPIRE", lock, ttl)
            end
        else
            set_entry(lock, value, access, ttl)
        end
    end
    return missing and 2 or 1
end)
