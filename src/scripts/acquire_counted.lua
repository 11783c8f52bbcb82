-- Counter-node acquire: SET NX PX (`set_lone`) and, only if it succeeded, INCR the
-- resource's fencing counter, atomically; so tokens follow the order in
-- which holders owned this node's key.
-- KEYS[1] = lock key, KEYS[2] = fencing counter key
-- ARGV[1] = this holder's unique value, ARGV[2] = TTL in ms
-- Returns the new token (a decimal string: one above the counter, and no
-- lower than the node's clock in microseconds), nil when the key is held, or a
-- QLCOUNTER error when the counter cannot be incremented.
-- The counter is checked before the SET: a script that fails halfway is not
-- rolled back, and a key left by a failing INCR would block for a TTL.
-- INCR stops at 2^63 - 1.
local counter, bad = read_counter(KEYS[2], "9223372036854775806")
if bad then
    return bad
end
if set_lone(KEYS[1], ARGV[1], ARGV[2]) then
    return (issue(KEYS[2], counter))
end
return false
