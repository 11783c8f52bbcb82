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

-- Tells the first live waiter, if any, that the lock is free here.
local function wake_head(queue, leases, channel)
    if redis.call("EXISTS", queue) == 0 then
        return
    end
    purge(queue, leases, node_ms())
    local head = redis.call("ZRANGE", queue, 0, 0)[1]
    if head then
        -- pcall: a user whose ACL forbids PUBLISH still releases; waiters
        -- then wake on their expiry bound instead.
        redis.pcall("PUBLISH", channel, head)
    end
end
