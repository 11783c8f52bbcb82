-- Shared by the scripts that take a lone exclusive resource with SET NX.

-- SET NX PX of `lock` for `value`; whether it was set. A key of readers
-- whose entries have all expired holds no one: it goes with its last
-- reader (PEXPIREAT), unless someone took that expiry away (PERSIST), and
-- then it would keep every writer out for good. Such a key is dropped
-- here and the SET tried again; readers still alive in it keep it, and it
-- gets its expiry back.
local function set_lone(lock, value, ttl)
    if redis.call("SET", lock, value, "NX", "PX", ttl) then
        return true
    end
    if redis.call("PTTL", lock) ~= -1 or redis.call("TYPE", lock)["ok"] ~= "zset" then
        return false
    end
    local t = redis.call("TIME")
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call("ZREMRANGEBYSCORE", lock, "-inf", now)
    local last = redis.call("ZRANGE", lock, -1, -1, "WITHSCORES")
    if last[2] then
        redis.call("PEXPIREAT", lock, last[2])
        return false
    end
    return redis.call("SET", lock, value, "NX", "PX", ttl) ~= false
end
