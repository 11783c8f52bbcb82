-- Compare-and-PEXPIRE: push back the expiry only while the key still holds our
-- value, so an extension can never revive or prolong someone else's lock.
-- Never shortens it: an extension that arrives late (sent before a longer
-- one that has already been applied, on another connection) must not cut
-- the key below what the holder was since told it has.
-- KEYS[1] = lock key, ARGV[1] = this holder's unique value, ARGV[2] = new TTL in ms.
-- Returns 1 when the key is ours and now lives at least ARGV[2] ms, 0 when it
-- is absent or holds another value.
if redis.call("GET", KEYS[1]) == ARGV[1] then
    -- TTLs are below 2^35 ms (a year), exact as Lua numbers.
    local left = redis.call("PTTL", KEYS[1])
    if left < 0 or left < tonumber(ARGV[2]) then
        redis.call("PEXPIRE", KEYS[1], ARGV[2])
    end
    return 1
end
return 0
