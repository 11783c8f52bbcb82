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
        local v = redis.pcall("GET", lock)
        if v == value then
            return true
        end
        -- Covered (see below): ours until its own expiry.
        if type(v) ~= "string" or string.sub(v, 1, #value + 1) ~= value .. "\0" then
            return false
        end
        local due = tonumber(string.sub(v, #value + 2))
        return due ~= nil and due >= now_ms()
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

-- Covering. While a live waiter is queued for a resource, its lock key
-- exists, so that a plain SET NX (the first attempt of every exclusive
-- lock, see ops.rs) is refused and no newcomer passes the queue. A key
-- kept for the queue holds no one past its holder's own time: an
-- exclusive holder's key then reads "<value>\0<ms>", the node time in ms
-- at which its holder's key would have expired (an absolute expiry, as
-- Redis keeps one), and "\0" alone holds no one (the lock is free, for
-- the first waiter). A readers' key keeps each reader's expiry in its
-- score, so only the key's own expiry is lengthened. Values never hold a
-- "\0" (descriptions refuse control characters). Every script that
-- changes who holds a lock uncovers its keys first (back to what they
-- would be with no one waiting) and covers them again last (`uncovered`),
-- so that everything between reads and writes plain keys.
local COVER = "\0"

-- The owner of a lock key's string value, and its holder's expiry when
-- the key is covered (0 for "\0": no one), else nil.
local function covered_value(v)
    local at = string.find(v, COVER, 1, true)
    if not at then
        return v, nil
    end
    return string.sub(v, 1, at - 1), tonumber(string.sub(v, at + 1)) or 0
end

-- A lock key's string value, its owner and, when covered, its holder's
-- expiry (as `covered_value`); nil for a missing key or readers.
local function string_key(lock)
    local v = redis.pcall("GET", lock)
    if type(v) ~= "string" then
        return nil
    end
    return v, covered_value(v)
end

-- Puts `lock` back as it would be with no one waiting: a covered
-- holder's key with its own expiry, exactly (SET … PXAT keeps a key set
-- to expire this very millisecond through it, as Redis keeps any key), a
-- key that holds no one gone, a readers' key expiring with its last
-- reader.
local function uncover(lock)
    -- One GET tells a string (the common case) from a missing key, and
    -- fails on any other type (pcall): TYPE only then.
    local v = redis.pcall("GET", lock)
    if type(v) == "string" then
        local owner, due = covered_value(v)
        if due == nil then
            return
        end
        if owner ~= "" and due >= now_ms() then
            redis.call("SET", lock, owner, "PXAT", due)
        else
            redis.call("DEL", lock)
        end
    elseif type(v) == "table" and redis.call("TYPE", lock)["ok"] == "zset" then
        local last = redis.call("ZRANGE", lock, -1, -1, "WITHSCORES")
        local at = redis.call("PEXPIRETIME", lock)
        -- A key without expiry (PERSIST) is left to `set_lone`.
        if last[2] and at > tonumber(last[2]) then
            redis.call("PEXPIREAT", lock, last[2])
        end
    end
end

-- Keeps `lock` while queue `q` has a live waiter: at least as long as the
-- waiters' leases key lives (it outlives every live lease).
local function cover(lock, q)
    -- (A missing queue has no head either.)
    if not first_in(q, q.queue, now_ms())[1] then
        return
    end
    local until_ms = redis.call("PEXPIRETIME", q.leases)
    if until_ms < 0 then
        return
    end
    -- As in `uncover`: one GET for a string or a missing key.
    local v = redis.pcall("GET", lock)
    if v == false then
        redis.call("SET", lock, COVER, "PXAT", until_ms)
        return
    end
    local at = redis.call("PEXPIRETIME", lock)
    -- A key without expiry keeps everyone out anyway.
    if at < 0 or at >= until_ms then
        return
    end
    if type(v) == "string" then
        local _, due = covered_value(v)
        if due == nil then
            v = v .. COVER .. at
        end
        redis.call("SET", lock, v, "PXAT", until_ms)
    elseif redis.call("TYPE", lock)["ok"] == "zset" then
        redis.call("PEXPIREAT", lock, until_ms)
    end
end

-- Runs `body` (a script's work on holders) on uncovered keys, then covers
-- them again; returns what `body` returned. Covering comes after the work,
-- so it must not fail it: a queue key of a foreign type is skipped
-- (pcall), as the release skips it.
local function uncovered(body)
    for i = 0, resources - 1 do
        uncover(lock_of(i))
    end
    local result = body()
    for i = 0, resources - 1 do
        pcall(cover, lock_of(i), queue_of(i))
    end
    return result
end
