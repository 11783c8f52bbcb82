-- Shared by the operators' scripts (inspect.lua, force_unlock.lua): the
-- fencing counter they report.

-- A counter as stored, "" for none (pcall: a key of a foreign type, or a
-- value that is no decimal count, reads as none).
local function counter_of(key)
    local counter = redis.pcall("GET", key)
    if type(counter) ~= "string" or not string.match(counter, "^%d+$") then
        return ""
    end
    return counter
end

-- The higher of the counters at `key` and, if given, at `other` (the
-- counter the other `FenceCounters` setting uses for a name with a tag).
local function reported_counter(key, other)
    local counter = counter_of(key)
    if other then
        local second = counter_of(other)
        if #second > #counter or (#second == #counter and second > counter) then
            counter = second
        end
    end
    return counter
end
