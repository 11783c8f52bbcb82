-- Counter-node acquire: SET NX PX and, only if it succeeded, INCR the
-- resource's fencing counter, atomically; so tokens follow the order in
-- which holders owned this node's key.
-- KEYS[1] = lock key, KEYS[2] = fencing counter key
-- ARGV[1] = this holder's unique value, ARGV[2] = TTL in ms
-- Returns the new token, or nil when the key is held.
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
    return redis.call("INCR", KEYS[2])
end
return false
