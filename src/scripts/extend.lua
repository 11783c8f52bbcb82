-- Compare-and-PEXPIRE: push back the expiry only while the key still holds our
-- value, so an extension can never revive or prolong someone else's lock.
-- KEYS[1] = lock key, ARGV[1] = this holder's unique value, ARGV[2] = new TTL in ms.
-- Returns 1 when extended, 0 when the key is absent or holds another value.
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
