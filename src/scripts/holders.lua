-- Shared by the scripts that read or change who holds a lock (prepended to
-- each). Every script takes, for each resource of the lock, five keys: the
-- lock key, the fencing counter, and the waiter queue's three (queue.lua).
-- A lock key holds either one exclusive holder (a string: its value) or the
-- readers of a read lock (a sorted set of their values, each scored by the
-- node time in ms at which it expires; the key itself expires with the
-- last of them), so a plain SET NX fails while anyone holds it.

-- The node's time in ms, read once per script and only when needed: a
-- plain exclusive lock never asks (a user whose ACL forbids TIME can still
-- take and release one).
local clock = nil
local function now_ms()
    if clock == nil then
        clock = node_ms()
    end
    return clock
end

-- The keys of resource `i` (from 0), and how many resources there are.
local KEYS_PER_RESOURCE = 5
local function lock_of(i) return KEYS[KEYS_PER_RESOURCE * i + 1] end
local function fence_of(i) return KEYS[KEYS_PER_RESOURCE * i + 2] end
local function queue_of(i)
    local base = KEYS_PER_RESOURCE * i
    return { queue = KEYS[base + 3], leases = KEYS[base + 4], writers = KEYS[base + 5] }
end
local resources = #KEYS / KEYS_PER_RESOURCE

-- A counter error of resource `i`, naming its key when the lock has
-- several (the client then names that key alone).
local function name_counter(bad, i)
    if resources > 1 then
        bad.err = bad.err .. " (in " .. fence_of(i) .. ")"
    end
    return bad
end

-- Who holds `lock` now: "none", "string" (an exclusive holder) or "zset"
-- (readers). Expired readers are dropped first.
local function holders(lock)
    local kind = redis.call("TYPE", lock)["ok"]
    if kind == "zset" then
        redis.call("ZREMRANGEBYSCORE", lock, "-inf", now_ms())
        if redis.call("EXISTS", lock) == 0 then
            kind = "none"
        end
    end
    return kind
end

-- Makes the readers' key expire with its last reader.
local function expire_with_last_reader(lock)
    local last = redis.call("ZRANGE", lock, -1, -1, "WITHSCORES")
    if last[2] then
        redis.call("PEXPIREAT", lock, last[2])
    end
end

-- Whether `value` holds `lock` now: as its exclusive holder ("x") or as a
-- reader whose entry has not expired ("r"). A key of the other kind is
-- not ours (pcall: GET on readers is a type error).
local function holds(lock, value, access)
    if access == "x" then
        return redis.pcall("GET", lock) == value
    end
    local kind = redis.call("TYPE", lock)["ok"]
    if kind ~= "zset" then
        return false
    end
    local expires = redis.call("ZSCORE", lock, value)
    return expires ~= false and tonumber(expires) > now_ms()
end

-- Sets `value`'s entry in `lock` for `ttl` ms from now; a reader's entry
-- is never moved earlier (a late extension must not cut it).
local function set_entry(lock, value, access, ttl)
    if access == "x" then
        redis.call("SET", lock, value, "PX", ttl)
        return
    end
    local expires = now_ms() + ttl
    local current = redis.call("ZSCORE", lock, value)
    if current == false or tonumber(current) < expires then
        redis.call("ZADD", lock, expires, value)
    end
    expire_with_last_reader(lock)
end
