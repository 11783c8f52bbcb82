-- Compare-and-delete: remove the lock key only while it still holds our value,
-- so a holder whose lock expired never deletes the next holder's key.
-- KEYS[1] = lock key, ARGV[1] = this holder's unique value.
-- Returns 1 when deleted, 0 when the key is absent or holds another value.
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
end
return 0
