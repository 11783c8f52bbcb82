-- The common release, before the shared rules are defined (see
-- `common_case_first!` in mod.rs): one exclusive resource and no waiter
-- queue here. A waiter is in `q.leases` and `q.writers` only while it is
-- in `q.queue` (queue.lua adds and removes it in all of them together,
-- and no queue key outlives `q.queue`), so there is no one to dequeue or
-- wake, and release.lua (`in_full`, above) would only compare and delete.
-- Anything else runs `in_full`: nothing is written before it.
-- KEYS and ARGV as release.lua.
if #KEYS == 5 and ARGV[2] == "x" and redis.call("EXISTS", KEYS[3]) == 0 then
    -- pcall: GET on a read lock (a sorted set) is a type error, and means
    -- "not ours", as in holders.lua.
    if ARGV[1] ~= "" and redis.pcall("GET", KEYS[1]) == ARGV[1] then
        redis.call("DEL", KEYS[1])
        return 1
    end
    return 0
end
return in_full()
