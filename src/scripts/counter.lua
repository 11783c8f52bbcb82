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

-- The largest counter an acquire with `fencing` may read: a token issued
-- from it ("incr") or checked against one ("peek") must fit a signed 64-bit
-- integer; a reported counter, an unsigned one.
local function counter_limit(fencing)
    if fencing == "incr" or fencing == "peek" then
        return "9223372036854775806"
    end
    return "18446744073709551614"
end

-- The counter at `key` ("0" when absent, or nothing), and an error reply
-- instead when it is not a count at or below `limit`. Read only: a lock's
-- counter may expire (see `issue`).
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
    return counter, nil
end

-- This node's clock in microseconds since 1970, as a count (read once).
local clock_us = nil
local function now_us()
    if clock_us == nil then
        local t = redis.call("TIME")
        clock_us = tostring(tonumber(t[2]))
        if t[1] ~= "0" then
            clock_us = t[1] .. string.format("%06d", tonumber(t[2]))
        end
    end
    return clock_us
end

-- `counter`, or this node's clock in microseconds since 1970 if that is
-- higher. Tokens issued with it never repeat, even from a counter that lost
-- increments (a crash without `appendfsync always`, a wiped data set) or
-- expired (`issue`): the clock has moved past every token issued
-- before, one per microsecond at the most, unless it was stepped back
-- meanwhile.
local function at_least_now(counter)
    local now = now_us()
    if below(counter, now) then
        return now
    end
    return counter
end

-- A counter this node set to its own clock (`issue`, below) expires an
-- hour later (COUNTER_LIFE in fencing.rs): by then the node's clock, which
-- the next token here starts from, has passed it by an hour, unless the
-- clock went back that far (the guard quarantines a node whose clock it
-- sees go back, and a counter node's answer more than a second below
-- another granting node's clock does not count: `clock_lowest`). Every
-- other counter (raised above the clock by one, or stored from other
-- nodes' clocks: quorum mode, a token taken without the counter node, a
-- counter set by hand) is kept for good. So a resource locked once costs
-- its counter node memory for an hour, not forever.
local COUNTER_LIFE_MS = 3600000

-- Issues the next token from the counter at `key`, read as `counter`: one
-- above it, or the node's clock if that is higher (see `at_least_now`),
-- stored back with one write. Returns the token and whether it is the
-- clock (then it expires, see COUNTER_LIFE_MS). `counter` is at most
-- 2^63 - 2 (INCR's limit).
local function issue(key, counter)
    local floored = at_least_now(counter)
    if floored ~= counter then
        redis.call("SET", key, floored, "PX", COUNTER_LIFE_MS)
        return floored, true
    end
    -- Kept for good: SET without an expiry takes a running one away.
    redis.call("INCR", key)
    redis.call("PERSIST", key)
    -- Read back as a string: INCR's reply would become a Lua double.
    return redis.call("GET", key), false
end
