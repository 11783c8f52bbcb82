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
-- instead when it is not a count at or below `limit`.
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

