-- A waiter's acquire: SET NX PX only when no live waiter is queued ahead of
-- it; otherwise (or when the key is held) queue it and say when the lock may
-- be free here. Fencing as in the other acquire scripts, chosen by mode.
-- KEYS[1] = lock key, KEYS[2] = fencing counter, KEYS[3] = waiter queue,
-- KEYS[4] = waiter leases
-- ARGV[1] = this attempt's unique value, ARGV[2] = TTL in ms, ARGV[3] = mode
-- ("set": no counter, "incr": counter node, "read": quorum mode's first
-- round), ARGV[4] = the waiter's ticket, ARGV[5] = waiter id, ARGV[6] = how
-- long (ms) the queue entry lives unless renewed by the next attempt.
-- Returns, when set: "OK", the new token ("incr") or the counter ("read");
-- when not: {ms until the lock may be free here (-1 unknown), 1 when other
-- waiters are ahead, else 0}. A counter that cannot be used is a QLCOUNTER
-- error, checked before anything is written.
local mode = ARGV[3]
local counter, bad = "0", nil
if mode == "incr" then
    counter, bad = read_counter(KEYS[2], "9223372036854775806")
elseif mode == "read" then
    counter, bad = read_counter(KEYS[2], "18446744073709551614")
end
if bad then
    return bad
end
local queue, leases, waiter = KEYS[3], KEYS[4], ARGV[5]
-- Tickets are microseconds since 1970: below 2^53, exact as Lua numbers.
local ticket = tonumber(ARGV[4])
local now = nil
local head = {}
if redis.call("EXISTS", queue) == 1 then
    now = node_ms()
    head = first_waiter(queue, leases, now)
end
-- First when no one is queued ahead: the queue's order is by ticket, then
-- by id (as the sorted set orders equal scores).
local ahead = head[1] ~= nil and head[1] ~= waiter
if ahead then
    local head_ticket = tonumber(head[2])
    ahead = head_ticket < ticket or (head_ticket == ticket and head[1] < waiter)
end
-- Granted, the waiter stays queued (first) here: the attempt may still lose
-- on the other nodes, and must not lose its place then. The release of the
-- lock it wins takes it out of the queue.
if not ahead and redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
    if mode == "incr" then
        redis.call("INCR", KEYS[2])
        return redis.call("GET", KEYS[2])
    elseif mode == "read" then
        return counter
    end
    return redis.status_reply("OK")
end
now = now or node_ms()
-- Same ticket on every attempt: a waiter keeps its place.
redis.call("ZADD", queue, ticket, waiter)
redis.call("ZADD", leases, now + tonumber(ARGV[6]), waiter)
-- No key lives past its last waiter's lease (plus a second for clock steps).
outlive(queue, tonumber(ARGV[6]) + 1000)
outlive(leases, tonumber(ARGV[6]) + 1000)
-- The key's own expiry (-2: absent, -1: no expiry, unknown) ...
local opens_in = redis.call("PTTL", KEYS[1])
if opens_in == -2 then
    opens_in = 0
end
-- ... and, behind another waiter, no sooner than its lease ends (if it
-- died), since it is served first.
if ahead and opens_in >= 0 then
    local lease = tonumber(redis.call("ZSCORE", leases, head[1]))
    if lease and lease - now > opens_in then
        opens_in = lease - now
    end
end
return {opens_in, ahead and 1 or 0}
