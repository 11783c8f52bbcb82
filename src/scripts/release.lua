-- Compare-and-delete: remove our entry from every lock key that still holds
-- it, so a holder whose lock expired never deletes the next holder's.
-- Also takes a waiter out of the queues, and where the lock is free
-- afterwards tells the first waiter (where it is read-locked, only a
-- reader: a writer could not go in yet).
-- KEYS: five per resource (see holders.lua).
-- ARGV[1] = this holder's unique value ("" for none), ARGV[2] = "x" or
-- "r", ARGV[3] = waiter id to dequeue ("" for none), then each resource's
-- wake-up channel.
-- Returns 1 when our entry was held, and is now gone, on every resource;
-- else 0.
-- Works on uncovered keys (see holders.lua).
-- The hot key's common release, without uncovering the key and covering
-- it again: one exclusive resource whose key holds us, kept for a queue.
-- It answers and leaves the nodes as the script below would: our key
-- gone, the waiter dequeued, the first one woken, and the key kept for
-- the queue (`cover` of a missing key) while a live waiter is left.
local function released_to_the_queue()
    if resources ~= 1 or ARGV[2] ~= "x" or ARGV[1] == "" then
        return nil
    end
    local lock, q, waiter = lock_of(0), queue_of(0), ARGV[3]
    local v, owner, due = string_key(lock)
    if v == nil or owner ~= ARGV[1] or due == nil or due < now_ms() then
        return nil
    end
    pcall(function()
        if waiter ~= "" then
            dequeue(q, waiter, "x")
        end
        wake_first(q, ARGV[4], true)
    end)
    local until_ms = -1
    pcall(function()
        if first_in(q, q.queue, now_ms())[1] then
            until_ms = redis.call("PEXPIRETIME", q.leases)
        end
    end)
    if until_ms >= 0 then
        redis.call("SET", lock, COVER, "PXAT", until_ms)
    else
        redis.call("DEL", lock)
    end
    return 1
end

local released = released_to_the_queue()
if released ~= nil then
    return released
end
return uncovered(function()
    local value, access, waiter = ARGV[1], ARGV[2], ARGV[3]
    local held = value ~= ""
    for i = 0, resources - 1 do
        local lock, q = lock_of(i), queue_of(i)
        local removed = false
        if value ~= "" then
            if holds(lock, value, access) then
                removed = true
            else
                held = false
            end
            if access == "x" then
                if removed then
                    redis.call("DEL", lock)
                end
            elseif redis.call("TYPE", lock)["ok"] == "zset" and redis.call("ZREM", lock, value) == 1 then
                -- An expired entry goes too; the key lives as long as the
                -- readers left.
                removed = true
                expire_with_last_reader(lock)
            end
        end
        -- The queue's part comes after the delete, so it must not fail a
        -- release that worked: a queue key of a foreign type is skipped.
        pcall(function()
            local left = waiter ~= "" and dequeue(q, waiter, access)
            if removed or left then
                -- An exclusive holder that just deleted its key knows it is free.
                local kind = (removed and access == "x") and "none" or holders(lock)
                if kind == "none" or kind == "zset" then
                    wake_first(q, ARGV[3 + i + 1], kind == "none")
                end
            end
        end)
    end
    return held and 1 or 0
end)
