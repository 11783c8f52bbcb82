    wake_first(queue_keys, channel, true)
end

-- pcall: GET on a read lock (a sorted set) is a type error, and means
-- "not ours", as in holders.lua.
if redis.pcall("GET", KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call("DEL", KEYS[1])
-- After the delete, the queue's part must not fail the release that
-- worked: a queue key of a foreign type is skipped.
pcall(function()
    if redis.call("EXISTS", KEYS[2]) == 1 then
        wake_waiters({ queue = KEYS[2], leases = KEYS[3], writers = KEYS[4] }, ARGV[2])
    end
end)
return 1
