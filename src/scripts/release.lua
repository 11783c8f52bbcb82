-- Compare-and-delete: remove the lock key only while it still holds our value,
-- so a holder whose lock expired never deletes the next holder's key. Also
-- takes a waiter out of the queue, and when the lock is free here afterwards,
-- tells the first waiter in the queue.
-- KEYS[1] = lock key, KEYS[2] = waiter queue, KEYS[3] = waiter leases
-- ARGV[1] = this holder's unique value ("" for none), ARGV[2] = waiter id to
-- dequeue ("" for none), ARGV[3] = the resource's wake-up channel.
-- Returns 1 when deleted, 0 when the key is absent or holds another value.
local deleted = 0
if ARGV[1] ~= "" and redis.call("GET", KEYS[1]) == ARGV[1] then
    deleted = redis.call("DEL", KEYS[1])
end
local left = 0
if ARGV[2] ~= "" then
    left = redis.call("ZREM", KEYS[2], ARGV[2])
    redis.call("ZREM", KEYS[3], ARGV[2])
end
if deleted == 1 or (left == 1 and redis.call("EXISTS", KEYS[1]) == 0) then
    wake_first(KEYS[2], KEYS[3], ARGV[3])
end
return deleted
