-- Quorum-mode acquire, second round: while the lock key still holds our
-- value, raise this node's fencing counter to our token (never lower it).
-- KEYS[1] = lock key, KEYS[2] = fencing counter key
-- ARGV[1] = this holder's unique value, ARGV[2] = the token (decimal)
-- Returns 1 when stored (or already at least as high), 0 when not ours.
if redis.call("GET", KEYS[1]) == ARGV[1] then
    local current, bad = read_counter(KEYS[2], "18446744073709551615")
    if bad then
        return bad
    end
    if below(current, ARGV[2]) then
        redis.call("SET", KEYS[2], ARGV[2])
    end
    return 1
end
return 0
