-- Shared by the scripts that read a fencing counter (prepended to each).
-- Counters are compared as decimal strings, never as Lua numbers: those are
-- doubles, exact only up to 2^53, while tokens run to 2^64 - 1.

-- Whether `s` is a decimal integer without sign or leading zeros.
local function is_count(s)
    return s == "0" or string.match(s, "^[1-9]%d*$") ~= nil
end

-- Whether count `a` is below count `b` (both as `is_count` accepts).
local function below(a, b)
    if #a ~= #b then
        return #a < #b
    end
    return a < b
end

-- The counter at `key` ("0" when absent, or nothing), and an error reply
-- instead when it is not a count at or below `limit`; a counter with an
-- expiry loses it.
local function read_counter(key, limit)
    local counter = redis.pcall("GET", key)
    if type(counter) == "table" and counter.err then
        return nil, redis.error_reply("QLCOUNTER is not a string key (" .. counter.err .. ")")
    end
    if not counter then
        return "0", nil
    end
    if not is_count(counter) then
        return nil, redis.error_reply("QLCOUNTER holds " .. string.format("%q", string.sub(counter, 1, 40))
            .. ", not a decimal integer")
    end
    if below(limit, counter) then
        return nil, redis.error_reply("QLCOUNTER holds " .. counter .. ", above the largest usable counter " .. limit)
    end
    -- A counter never expires: one given an expiry by someone else would
    -- start again from the clock when it ran out, below tokens issued
    -- from it. The expiry goes at its first use.
    redis.call("PERSIST", key)
    return counter, nil
end

-- `counter`, or this node's clock in microseconds since 1970 if that is
-- higher. Tokens issued with it never repeat, even from a counter that lost
-- increments (a crash without `appendfsync always`, a wiped data set): the
-- clock has moved past every token issued before the crash, one per
-- microsecond at the most, unless it was stepped back meanwhile.
local function at_least_now(counter)
    local t = redis.call("TIME")
    local now = tostring(tonumber(t[2]))
    if t[1] ~= "0" then
        now = t[1] .. string.format("%06d", tonumber(t[2]))
    end
    if below(counter, now) then
        return now
    end
    return counter
end

-- Issues the next token from the counter at `key`, read as `counter`: one
-- above it, or the node's clock if that is higher (see `at_least_now`),
-- stored back with one write. `counter` is at most 2^63 - 2 (INCR's limit).
local function issue(key, counter)
    local floored = at_least_now(counter)
    if floored ~= counter then
        redis.call("SET", key, floored)
        return floored
    end
    redis.call("INCR", key)
    -- Read back as a string: INCR's reply would become a Lua double.
    return redis.call("GET", key)
end
