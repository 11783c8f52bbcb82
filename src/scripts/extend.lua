-- Compare-and-PEXPIRE: push back the expiry only while the key still holds our
-- value, so an extension can never revive or prolong someone else's lock.
-- Never shortens it: an extension that arrives late (sent before a longer
-- one that has already been applied, on another connection) must not cut
-- the key below what the holder was since told it has.
-- With the repair flag, a key that is missing altogether is set again: the
-- client sends it only to a node that may have lost our key (it restarted
-- without persistence, or its clock faulted, since our SET) while our lock
-- is valid, so no other client can hold a quorum; setting an absent key
-- takes nothing from anyone (another holder's key is never touched).
-- KEYS[1] = lock key, ARGV[1] = this holder's unique value, ARGV[2] = new TTL
-- in ms, ARGV[3] = "1" to repair.
-- Returns 1 when the key is ours and now lives at least ARGV[2] ms, 2 when it
-- was missing and is set again, 0 when it holds another value (or is absent
-- without repair).
local current = redis.call("GET", KEYS[1])
if current == ARGV[1] then
    -- TTLs are below 2^35 ms (a year), exact as Lua numbers.
    local left = redis.call("PTTL", KEYS[1])
    if left < 0 or left < tonumber(ARGV[2]) then
        redis.call("PEXPIRE", KEYS[1], ARGV[2])
    end
    return 1
end
if current == false and ARGV[3] == "1" then
    redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    return 2
end
return 0
