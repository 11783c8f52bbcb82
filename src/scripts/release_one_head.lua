-- Compare-and-delete of one exclusive lock that no waiter won (the common
-- release): the same outcome as release.lua for such a lock, at a fraction
-- of its cost on the node. The waiter queue's rules (queue.lua, placed
-- inside `wake_waiters` below) are only set up when someone waits, since
-- defining them is most of a script's cost.
-- KEYS[1] = the lock key, KEYS[2..4] = the queue's three keys.
-- ARGV[1] = this holder's unique value, ARGV[2] = the wake-up channel.
-- Returns 1 when our value was held, and is now gone; else 0.
local function wake_waiters(queue_keys, channel)
