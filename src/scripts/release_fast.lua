-- The common releases, before the shared rules are defined (see
-- `common_case_first!` in mod.rs). Anything else runs `in_full`: nothing
-- is written before it.
-- KEYS and ARGV as release.lua.
if #KEYS == 5 and ARGV[2] == "x" then
    local value, waiter = ARGV[1], ARGV[3]
    -- pcall: GET on a read lock (a sorted set) is a type error, and means
    -- "not ours", as in holders.lua.
    local v = value ~= "" and redis.pcall("GET", KEYS[1])
    -- A rollback of an attempt this node refused: the key holds someone
    -- else (kept for a queue or not) or no one, and there is no waiter to
    -- dequeue. Nothing here is ours, so nothing is deleted, dequeued or
    -- woken; `in_full` would only uncover and cover the key again. A
    -- round is decided at its quorum and its stragglers are rolled back
    -- at once, as a rule on nodes that refused: on a resource with a
    -- queue, each ran the whole script.
    if value ~= "" and waiter == "" and (v == false or (type(v) == "string" and v ~= value
            and string.sub(v, 1, #value + 1) ~= value .. "\0")) then
        return 0
    end
    -- One exclusive resource and no waiter queue here. queue.lua adds and
    -- removes a waiter in `q.queue`, `q.leases` and `q.writers` together,
    -- and gives them the same expiry, so without `q.queue` there is no one
    -- to wake, and at most an entry whose lease ran out a second ago (the
    -- keys' expiries may differ by a few ms), which `purge` drops anyway:
    -- release.lua (`in_full`, above) would only compare and delete.
    if redis.call("EXISTS", KEYS[3]) == 0 then
        if value ~= "" then
            if v == value then
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
end
return in_full()
