-- Shared by the scripts that keep a resource's waiter queue (prepended to
-- each). The queue is a sorted set of waiter ids scored by the waiter's
-- ticket (its arrival time, which every node is given alike, so all nodes
-- order the same waiters the same way); a second sorted set holds each
-- waiter's lease, the node time (ms) after which an entry is dead.
-- Waiters for a read lock have odd ids, all others (exclusive) even ones.

-- The node's time in milliseconds.
local function node_ms()
    local t = redis.call("TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether waiter `id` (a decimal string) waits to read.
local function is_reader(id)
    return string.find(id, "[13579]$") ~= nil
end

-- Drops waiters whose lease ran out (they died without leaving), at most
-- 100 per call so that no call does unbounded work.
local function purge(queue, leases, now)
    local dead = redis.call("ZRANGEBYSCORE", leases, "-inf", now, "LIMIT", 0, 100)
    if #dead > 0 then
        redis.call("ZREM", queue, unpack(dead))
        redis.call("ZREM", leases, unpack(dead))
    end
end

-- The first live waiter: {id, ticket}, or an empty table. Purges only when
-- the first one's lease has run out, so the common case reads two entries.
local function first_waiter(queue, leases, now)
    local head = redis.call("ZRANGE", queue, 0, 0, "WITHSCORES")
    if head[1] then
        local lease = tonumber(redis.call("ZSCORE", leases, head[1]))
        if lease == nil or lease <= now then
            purge(queue, leases, now)
            redis.call("ZREM", queue, head[1])
            head = redis.call("ZRANGE", queue, 0, 0, "WITHSCORES")
        end
    end
    return head
end

-- Whether the entry {id, ticket} is served before waiter `id` with
-- `ticket`: the queue's order, by ticket, then by id (as the sorted set
-- orders equal scores).
local function before(entry_id, entry_ticket, ticket, id)
    return entry_ticket < ticket or (entry_ticket == ticket and entry_id < id)
end

-- How many entries a reader looks past for a writer ahead of it. Beyond
-- that it counts as behind (it waits a little longer; nothing unsafe).
local READER_SCAN = 100

-- The live waiter that keeps waiter `id` (with `ticket`; both nil for a
-- call that does not wait) out for now, or nil. An exclusive waiter waits
-- for everyone ahead of it; a call that does not wait ignores the queue.
-- A reader, waiting or not, waits only for writers (exclusive waiters)
-- ahead of it, and a reader that does not wait counts every waiting
-- writer as ahead: so a stream of readers cannot starve a writer.
local function waiter_ahead(queue, leases, now, access, ticket, id)
    if access == "x" then
        if ticket == nil then
            return nil
        end
        local head = first_waiter(queue, leases, now)
        if head[1] and head[1] ~= id and before(head[1], tonumber(head[2]), ticket, id) then
            return head[1]
        end
        return nil
    end
    purge(queue, leases, now)
    local entries = redis.call("ZRANGE", queue, 0, READER_SCAN - 1, "WITHSCORES")
    for j = 1, #entries, 2 do
        local entry, entry_ticket = entries[j], tonumber(entries[j + 1])
        if ticket ~= nil and (entry == id or not before(entry, entry_ticket, ticket, id)) then
            return nil
        end
        if not is_reader(entry) then
            return entry
        end
    end
    if #entries == 2 * READER_SCAN then
        return entries[#entries - 1]
    end
    return nil
end

-- Keeps the queue's keys at least `ms` longer, so that a queue whose
-- waiters all died without leaving is removed by Redis itself.
local function outlive(key, ms)
    local left = redis.call("PTTL", key)
    if left == -1 or (left >= 0 and left < ms) then
        redis.call("PEXPIRE", key, ms)
    end
end

-- Tells the first live waiter, if any, that the lock is free here; when
-- it waits to read, also the readers queued right behind it (they can all
-- go in together).
local function wake_first(queue, leases, channel)
    if redis.call("EXISTS", queue) == 0 then
        return
    end
    local head = first_waiter(queue, leases, node_ms())
    if not head[1] then
        return
    end
    -- pcall: a user whose ACL forbids PUBLISH still releases; waiters then
    -- wake on their expiry bound instead.
    redis.pcall("PUBLISH", channel, head[1])
    if is_reader(head[1]) then
        local next = redis.call("ZRANGE", queue, 1, READER_SCAN)
        for _, id in ipairs(next) do
            if not is_reader(id) then
                break
            end
            redis.pcall("PUBLISH", channel, id)
        end
    end
end
