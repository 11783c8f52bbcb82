-- A token's second round (quorum mode; counter-node fencing without the
-- counter node's token): while every lock entry still holds our value,
-- raise each resource's fencing counter to our token (never lower it).
-- KEYS: five per resource (see holders.lua).
-- ARGV[1] = this holder's unique value, ARGV[2] = the token (decimal),
-- ARGV[3] = "x" (exclusive) or "r" (a reader's entry)
-- Returns 1 when stored (or already at least as high), 0 when not ours.
for i = 0, resources - 1 do
    if not holds(lock_of(i), ARGV[1], ARGV[3]) then
        return 0
    end
end
-- Every counter is checked before any is written: no half-stored token.
local raise = {}
for i = 0, resources - 1 do
    local current, bad = read_counter(fence_of(i), "18446744073709551615")
    if bad then
        return name_counter(bad, i)
    end
    if below(current, ARGV[2]) then
        raise[#raise + 1] = fence_of(i)
    end
end
for _, key in ipairs(raise) do
    redis.call("SET", key, ARGV[2])
end
return 1
