-- Quorum-mode acquire, first round: SET NX PX (`set_lone`) and, only if it succeeded,
-- report this node's fencing counter, or its clock in microseconds if that
-- is higher (see `at_least_now`).
-- KEYS[1] = lock key, KEYS[2] = fencing counter key
-- ARGV[1] = this holder's unique value, ARGV[2] = TTL in ms
-- Returns the counter (a decimal string), nil when the key is held, or a
-- QLCOUNTER error (checked before the SET) when the counter is unusable.
-- At most 2^64 - 2, so that the token (the highest counter + 1) fits.
local counter, bad = read_counter(KEYS[2], "18446744073709551614")
if bad then
    return bad
end
if set_lone(KEYS[1], ARGV[1], ARGV[2]) then
    return at_least_now(counter)
end
return false
