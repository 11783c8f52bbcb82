-- Shared by the scripts that keep a resource's waiter queue (prepended to
-- each). A queue `q` is three keys: `q.queue`, a sorted set of every waiter
-- id scored by the waiter's ticket (its arrival time, which every node is
-- given alike, so all nodes order the same waiters the same way);
-- `q.leases`, each waiter's lease, the node time (ms) after which its
-- entries are dead; and `q.writers`, the exclusive waiters alone, by ticket
-- (so a reader finds the first writer in one step).

-- The node's time in milliseconds.
local function node_ms()
    local t = redis.call("TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Takes waiter `id` out of the queue; true if it was in it. `access`:
-- "x" (it may be among the writers), "r" (it is not), nil (unknown).
local function dequeue(q, id, access)
    if access ~= "r" then
        redis.call("ZREM", q.writers, id)
    end
    redis.call("ZREM", q.leases, id)
    return redis.call("ZREM", q.queue, id) == 1
end

-- Drops waiters whose lease ran out (they died without leaving), at most
-- 100 per call so that no call does unbounded work.
local function purge(q, now)
    local dead = redis.call("ZRANGEBYSCORE", q.leases, "-inf", now, "LIMIT", 0, 100)
    if #dead > 0 then
        redis.call("ZREM", q.queue, unpack(dead))
        redis.call("ZREM", q.leases, unpack(dead))
        redis.call("ZREM", q.writers, unpack(dead))
    end
end

-- The first live entry of `set` (`q.queue` or `q.writers`): {id, ticket,
-- lease = its lease} (`lease` may be missing after many dead entries), or
-- an empty table. Purges only when the first one's lease has run out, so
-- the common case reads two entries. `head`: the first entry, when the
-- caller has just read it (`ZRANGE … 0 0 WITHSCORES`).
local function first_in(q, set, now, head)
    -- Bounded: each round drops up to 101 dead entries.
    for _ = 1, 10 do
        head = head or redis.call("ZRANGE", set, 0, 0, "WITHSCORES")
        if not head[1] then
            return head
        end
        local lease = tonumber(redis.call("ZSCORE", q.leases, head[1]))
        if lease ~= nil and lease > now then
            head.lease = lease
            return head
        end
        purge(q, now)
        dequeue(q, head[1])
        head = nil
    end
    return redis.call("ZRANGE", set, 0, 0, "WITHSCORES")
end

-- Whether waiter `id` waits to read (it is not among the writers).
local function is_reader(q, id)
    return redis.call("ZSCORE", q.writers, id) == false
end

-- Whether the entry {id, ticket} is served before waiter `id` with
-- `ticket`: the queue's order, by ticket, then by id (as the sorted set
-- orders equal scores).
local function before(entry_id, entry_ticket, ticket, id)
    return entry_ticket < ticket or (entry_ticket == ticket and entry_id < id)
end

-- The live waiter that keeps waiter `id` (with `ticket`; both nil for a
-- call that does not wait) out for now, and its lease if known, or nil. An exclusive waiter waits
-- for everyone ahead of it. A reader waits only for writers (exclusive
-- waiters) ahead of it. A call that does not wait counts every live
-- waiter it would wait for as ahead: no one passes the queue (a plain
-- SET NX cannot either: the queue keeps the lock key, see holders.lua),
-- and a stream of readers cannot starve a waiting writer.
local function waiter_ahead(q, now, access, ticket, id)
    local head = first_in(q, access == "x" and q.queue or q.writers, now)
    if head[1] == nil or head[1] == id then
        return nil
    end
    if ticket == nil or before(head[1], tonumber(head[2]), ticket, id) then
        return head[1], head.lease
    end
    return nil
end

-- Keeps a queue key at least `ms` longer, so that a queue whose waiters
-- all died without leaving is removed by Redis itself.
local function outlive(key, ms)
    local left = redis.call("PTTL", key)
    if left == -1 or (left >= 0 and left < ms) then
        redis.call("PEXPIRE", key, ms)
    end
end

-- Queues waiter `id` with `ticket` (again: the same ticket on every
-- attempt keeps its place), its entries living `lease_ms` from `now`.
local function enqueue(q, ticket, id, lease_ms, now, access)
    redis.call("ZADD", q.queue, ticket, id)
    redis.call("ZADD", q.leases, now + lease_ms, id)
    -- No key lives past its last waiter's lease (plus a second for clock steps).
    outlive(q.queue, lease_ms + 1000)
    outlive(q.leases, lease_ms + 1000)
    if access == "x" then
        redis.call("ZADD", q.writers, ticket, id)
        outlive(q.writers, lease_ms + 1000)
    end
end

-- Tells the first live waiter that the lock is free here (`free`), or
-- read-locked (not `free`: then only a reader at the head can go in).
-- A reader at the head goes in with the readers queued right behind it:
-- they are told too. Runs after the release's delete, so it must not
-- fail: without TIME (an ACL), waiters wake on their timers instead.
local function wake_first(q, channel, free)
    -- The head first: without one there is no one to wake, nor a clock to read.
    local head = redis.call("ZRANGE", q.queue, 0, 0, "WITHSCORES")
    if not head[1] then
        return
    end
    local t = redis.pcall("TIME")
    if type(t) ~= "table" or t.err then
        return
    end
    head = first_in(q, q.queue, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), head)
    if not head[1] then
        return
    end
    local reader = is_reader(q, head[1])
    if not (free or reader) then
        return
    end
    -- pcall: a user whose ACL forbids PUBLISH still releases; waiters then
    -- wake on their expiry bound instead.
    redis.pcall("PUBLISH", channel, head[1])
    if reader then
        for _, id in ipairs(redis.call("ZRANGE", q.queue, 1, 100)) do
            if not is_reader(q, id) then
                break
            end
            redis.pcall("PUBLISH", channel, id)
        end
    end
end
