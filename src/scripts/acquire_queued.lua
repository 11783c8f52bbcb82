-- A waiter's acquire: SET NX PX only when no live waiter is queued ahead of
-- it; otherwise (or when the key is held) queue it and say when the lock may
-- be free here. Fencing as in the other acquire scripts, chosen by mode.
-- KEYS[1] = lock key, KEYS[2] = fencing counter, KEYS[3] = waiter queue,
-- KEYS[4] = waiter leases
-- ARGV[1] = this attempt's unique value, ARGV[2] = TTL in ms, ARGV[3] = mode
-- ("set": no counter, "incr": counter node, "read": quorum mode's first
-- round), ARGV[4] = the waiter's ticket, ARGV[5] = waiter id, ARGV[6] = how
-- long (ms) the queue entry lives unless renewed by the next attempt.
-- Returns, when set: "OK", the new token ("incr") or the counter ("read");
-- when not: {ms until the lock may be free here (-1 unknown), the waiter's
-- place in the queue (0 = first)}. A counter that cannot be used is a
-- QLCOUNTER error, checked before anything is written.
local mode = ARGV[3]
local counter, bad = "0", nil
if mode == "incr" then
    counter, bad = read_counter(KEYS[2], "9223372036854775806")
elseif mode == "read" then
    counter, bad = read_counter(KEYS[2], "18446744073709551614")
end
if bad then
    return bad
end
local now = node_ms()
purge(KEYS[3], KEYS[4], now)
-- Same ticket on every attempt: a waiter keeps its place.
redis.call("ZADD", KEYS[3], ARGV[4], ARGV[5])
redis.call("ZADD", KEYS[4], now + tonumber(ARGV[6]), ARGV[5])
local place = redis.call("ZRANK", KEYS[3], ARGV[5])
if place == 0 and redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
    redis.call("ZREM", KEYS[3], ARGV[5])
    redis.call("ZREM", KEYS[4], ARGV[5])
    if mode == "incr" then
        redis.call("INCR", KEYS[2])
        return redis.call("GET", KEYS[2])
    elseif mode == "read" then
        return counter
    end
    return redis.status_reply("OK")
end
-- The key's own expiry (-2: absent, -1: no expiry, unknown) ...
local opens_in = redis.call("PTTL", KEYS[1])
if opens_in == -2 then
    opens_in = 0
end
-- ... and, behind other waiters, no sooner than the first one's lease ends
-- (if it died), since it is served first.
if place > 0 and opens_in >= 0 then
    local head = redis.call("ZRANGE", KEYS[3], 0, 0)[1]
    local lease = tonumber(redis.call("ZSCORE", KEYS[4], head))
    if lease and lease - now > opens_in then
        opens_in = lease - now
    end
end
return {opens_in, place}
