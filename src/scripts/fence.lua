-- Shared by the fenced-storage scripts (after counter.lua): the check and
-- the claim of a resource's highest token.

-- The highest token recorded at `key`, or, as a second value, the reply
-- that ends the script: fenced out ({0, highest}, when `offered` is lower)
-- or an unusable record (a QLCOUNTER error).
local function fence_check(key, offered)
    local highest, bad = read_counter(key, "18446744073709551615")
    if bad then
        return nil, bad
    end
    -- The storage's record never expires: one given an expiry by someone
    -- else would let any token in when it ran out.
    redis.call("PERSIST", key)
    if below(offered, highest) then
        return nil, {0, highest}
    end
    return highest, nil
end

-- Records `offered` at `key` as the highest token, if it is higher.
local function fence_claim(key, highest, offered)
    if below(highest, offered) then
        redis.call("SET", key, offered)
    end
end
