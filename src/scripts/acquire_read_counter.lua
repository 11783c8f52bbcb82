-- Quorum-mode acquire, first round: SET NX PX and, only if it succeeded,
-- report this node's fencing counter (0 when none was stored yet).
-- KEYS[1] = lock key, KEYS[2] = fencing counter key
-- ARGV[1] = this holder's unique value, ARGV[2] = TTL in ms
-- Returns the counter, or nil when the key is held.
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
    return tonumber(redis.call("GET", KEYS[2]) or "0")
end
return false
