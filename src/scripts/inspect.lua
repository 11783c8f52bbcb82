-- Who holds a lock on this node, for `LockManager::holders`, `quorumlock
-- status` and `quorumlock list`. Reads only.
-- KEYS[1] = the lock key, KEYS[2] = the fencing counter, KEYS[3] = the
-- waiters' leases (see queue.lua), and for a name with a hash tag KEYS[4]
-- = the counter the other `FenceCounters` setting uses (the higher of the
-- two is reported: clients that disagree on the setting must not make an
-- operator believe a token lower than one issued).
-- Returns {kind, entries, counter, waiters}: kind "none", "x" (an
-- exclusive holder), "r" (readers) or "other" (a key of a type no lock
-- writes: it keeps everyone out); entries {value, ms left (-1: no
-- expiry), ...}, at most 1000 readers; the counter as stored ("" when
-- none); how many waiters' leases are live.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lock = KEYS[1]
local kind, entries = redis.call("TYPE", lock)["ok"], {}
if kind == "string" then
    kind = "x"
    local value, left = redis.call("GET", lock), redis.call("PTTL", lock)
    -- A key kept for the waiters (see holders.lua): its holder's own
    -- expiry follows "\0"; "\0" alone holds no one.
    local at = string.find(value, "\0", 1, true)
    if at then
        local due = tonumber(string.sub(value, at + 1)) or 0
        value, left = string.sub(value, 1, at - 1), due - now
        if value == "" or left < 0 then
            kind = "none"
        end
    end
    if kind == "x" then
        entries = { value, left }
    end
elseif kind == "zset" then
    kind = "r"
    -- Expired readers are not holders (the next script drops them).
    local readers = redis.call("ZRANGEBYSCORE", lock, "(" .. now, "+inf", "WITHSCORES", "LIMIT", 0, 1000)
    for i = 1, #readers, 2 do
        entries[#entries + 1] = readers[i]
        entries[#entries + 1] = tonumber(readers[i + 1]) - now
    end
    if #entries == 0 then
        kind = "none"
    end
elseif kind ~= "none" then
    kind = "other"
end
local counter = reported_counter(KEYS[2], KEYS[4])
local waiters = redis.pcall("ZCOUNT", KEYS[3], "(" .. now, "+inf")
if type(waiters) ~= "number" then
    waiters = 0
end
return { kind, entries, counter, waiters }
