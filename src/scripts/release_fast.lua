-- The common release, before the shared rules are defined (see
-- `common_case_first!` in mod.rs): one exclusive resource and no waiter
-- queue here. queue.lua adds and removes a waiter in `q.queue`,
-- `q.leases` and `q.writers` together, and gives them the same expiry,
-- so without `q.queue` there is no one to wake, and at most an entry
-- whose lease ran out a second ago (the keys' expiries may differ by a
-- few ms), which `purge` drops anyway: release.lua (`in_full`, above)
-- would only compare and delete.
-- Anything else runs `in_full`: nothing is written before it.
-- KEYS and ARGV as release.lua.
if #KEYS == 5 and ARGV[2] == "x" and redis.call("EXISTS", KEYS[3]) == 0 then
    -- pcall: GET on a read lock (a sorted set) is a type error, and means
    -- "not ours", as in holders.lua.
    if ARGV[1] ~= "" then
        local v = redis.pcall("GET", KEYS[1])
        if v == ARGV[1] then
            redis.call("DEL", KEYS[1])
            return 1
        end
        -- A key still kept for a queue that just expired (holders.lua):
        -- the rules read it.
        if type(v) == "string" and string.find(v, "\0", 1, true) then
            return in_full()
        end
    end
    return 0
end
return in_full()
