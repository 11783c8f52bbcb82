-- Shared by the scripts that keep a resource's waiter queue (prepended to
-- each). The queue is a sorted set of waiter ids scored by the waiter's
-- ticket (its arrival time, which every node is given alike, so all nodes
-- order the same waiters the same way); a second sorted set holds each
-- waiter's lease, the node time (ms) after which an entry is dead.

-- The node's time in milliseconds.
local function node_ms()
    local t = redis.call("TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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

-- Keeps the queue's keys at least `ms` longer, so that a queue whose
-- waiters all died without leaving is removed by Redis itself.
local function outlive(key, ms)
    local left = redis.call("PTTL", key)
    if left == -1 or (left >= 0 and left < ms) then
        redis.call("PEXPIRE", key, ms)
    end
end

-- Tells the first live waiter, if any, that the lock is free here.
local function wake_first(queue, leases, channel)
    if redis.call("EXISTS", queue) == 0 then
        return
    end
    local head = first_waiter(queue, leases, node_ms())
    if head[1] then
        -- pcall: a user whose ACL forbids PUBLISH still releases; waiters
        -- then wake on their expiry bound instead.
        redis.pcall("PUBLISH", channel, head[1])
    end
end
