-- Acquire, for any lock but the plain single-resource one that SET NX and
-- acquire_counted.lua serve: several resources (all or none), a read lock,
-- or a waiter queued behind the resource's queue. Everything is checked
-- before anything is written, so the node grants every resource or none.
-- KEYS: five per resource (see holders.lua).
-- ARGV[1] = this attempt's unique value, ARGV[2] = TTL in ms, ARGV[3] =
-- "x" (exclusive) or "r" (read), ARGV[4] = fencing: "set" (none), "incr"
-- (counter node: the token is one above the highest counter of the
-- resources, and no lower than the node's clock in microseconds; every
-- counter is raised to it), "read" (report the highest counter, raised to
-- the node's clock as "incr" is: a reader's token, or for an exclusive
-- lock quorum mode's first round), "peek" (counter-node fencing's other
-- nodes: report the highest counter as it stands);
-- when waiting, ARGV[5] = the waiter's ticket, ARGV[6] = waiter id,
-- ARGV[7] = how long (ms) its queue entries live unless renewed, and for
-- several resources ARGV[8..] = each one's wake-up channel; else
-- ARGV[5] = "".
-- A waiter for several resources holds others back only where that helps
-- it: taking the resources in the lock's order (sorted by name, the same
-- for every client), it is queued up to the first one it is blocked on
-- (held by another, or another waiter ahead of it), and so keeps its place
-- there and reserves the free ones before it; it leaves the queues of the
-- resources after that one. So a holder of `a` that waits for `b` is never
-- kept out of a free `b` by a waiter for [a, b]: that waiter is blocked on
-- `a` and not queued on `b`. Every wait then points at a later resource in
-- the order, or at an earlier ticket on the same resource, or at a holder:
-- no cycle among waiters, as long as holders that wait take their
-- resources in that order too.
-- Returns, when granted: "OK", the token ("incr") or the highest counter
-- ("read", "peek"), as {that, "queued"} when the waiter is left in line
-- here; when not: nil, or for a waiter {ms until the lock may be free
-- here (-1 unknown), 1 when other waiters are ahead, else 0}. A counter
-- that cannot be used is a QLCOUNTER error, checked before any write.
-- Works on uncovered keys (see holders.lua).
-- The reply of a grant (the fencing work is done here, after every check
-- passed): the token ("incr"), the counter ("read", "peek"), or OK.
local function granted_reply(fencing, access, highest, highest_key, some_missing)
    if fencing == "incr" then
        local token, from_clock = issue(highest_key, highest)
        for i = 0, resources - 1 do
            if fence_of(i) ~= highest_key then
                if from_clock then
                    redis.call("SET", fence_of(i), token, "PX", COUNTER_LIFE_MS)
                else
                    redis.call("SET", fence_of(i), token)
                end
            end
        end
        return token
    elseif fencing == "read" and access == "x" then
        -- Quorum mode's first round: the token will be above this.
        return at_least_now(highest)
    elseif fencing == "read" then
        -- A reader's token: the latest writer's, as it stands. Where a
        -- resource has no counter (no writer yet, or the counter lost with
        -- the node's data or expired: below writers before), raised to
        -- the node's clock, which has passed every expired counter: a
        -- writer's script runs a microsecond or more later, so its token,
        -- one above the counter or the clock then, is above it.
        if some_missing then
            return at_least_now(highest)
        end
        return highest
    elseif fencing == "peek" then
        -- What the counter node's token is checked against.
        return highest
    end
    return redis.status_reply("OK")
end

-- The hot key's common refusal, without uncovering the key and covering it
-- again: the key is held by someone else who still holds it (`v`, covered
-- or not). It answers and leaves the nodes as the script below would:
-- refused, the waiter queued, and the key as `cover` leaves it after
-- `uncover`.
local function refused_behind_a_holder(lock, q, v, owner, due, ticket, waiter, lease_ms)
    -- When it may be free here, as the script below counts it: the waiter
    -- ahead's lease, and the holder's own time left (-1: no expiry).
    local left = due ~= nil and due - now_ms() or redis.call("PTTL", lock)
    local opens_in, behind = left, 0
    local ahead, lease = waiter_ahead(q, now_ms(), "x", ticket, waiter)
    if ahead then
        behind = 1
        lease = lease or tonumber(redis.call("ZSCORE", q.leases, ahead))
        if lease and left >= 0 then
            opens_in = math.max(left, lease - now_ms(), 0)
        end
    end
    enqueue(q, ticket, waiter, lease_ms, now_ms(), "x")
    -- `cover`, after `uncover` would have left the holder's own key (its
    -- own expiry `at`): covered until the leases key's expiry if that is
    -- later, else plain. (A live waiter heads the queue: this one.)
    local until_ms = redis.call("PEXPIRETIME", q.leases)
    local at = due or redis.call("PEXPIRETIME", lock)
    local stays_plain = until_ms < 0 or at < 0 or at >= until_ms
    if due == nil then
        if not stays_plain then
            redis.call("SET", lock, v .. COVER .. at, "PXAT", until_ms)
        end
    elseif stays_plain then
        redis.call("SET", lock, owner, "PXAT", due)
    elseif redis.call("PEXPIRETIME", lock) ~= until_ms then
        redis.call("PEXPIREAT", lock, until_ms)
    end
    return {opens_in, behind}
end

-- The hot key's common grant, the same way: the waiter first in line takes
-- the key kept for the queue, which holds no one now. It answers and
-- leaves the nodes as the script below would: granted in line, the key
-- set for it and covered as `cover` leaves it.
local function granted_to_the_head(lock, q, value, ticket, waiter, lease_ms, fencing, highest, some_missing)
    redis.call("SET", lock, value, "PX", ARGV[2])
    if redis.call("ZSCORE", q.queue, waiter) == false then
        enqueue(q, ticket, waiter, lease_ms, now_ms(), "x")
    end
    local granted = granted_reply(fencing, "x", highest, fence_of(0), some_missing)
    -- `cover`: the key lives as long as the leases key, its holder as long
    -- as its own expiry.
    local until_ms = redis.call("PEXPIRETIME", q.leases)
    if until_ms >= 0 then
        local at = redis.call("PEXPIRETIME", lock)
        if at >= 0 and at < until_ms then
            redis.call("SET", lock, value .. COVER .. at, "PXAT", until_ms)
        end
    end
    return { granted, "queued" }
end

-- The two above, for a lone exclusive waiter at a key kept for the queue
-- (read once); nil for anything else (a free key not kept, our own value
-- held, readers, another waiter first in line): the script below.
local function at_a_kept_key()
    if resources ~= 1 or ARGV[3] ~= "x" or ARGV[5] == "" then
        return nil
    end
    local lock, q, value = lock_of(0), queue_of(0), ARGV[1]
    local v, owner, due = string_key(lock)
    if v == nil then
        return nil
    end
    local held = owner ~= "" and (due == nil or due >= now_ms())
    if (held and owner == value) or (not held and due == nil) then
        return nil
    end
    local ticket, waiter, lease_ms = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
    if not held then
        local head = first_in(q, q.queue, now_ms())
        if head[1] == nil or (head[1] ~= waiter and before(head[1], tonumber(head[2]), ticket, waiter)) then
            return nil
        end
    end
    local fencing = ARGV[4]
    local highest, some_missing = "0", false
    if fencing ~= "set" then
        local counter, bad = read_counter(fence_of(0), counter_limit(fencing))
        if bad then
            return bad
        end
        some_missing = counter == "0"
        if below(highest, counter) then
            highest = counter
        end
    end
    if held then
        return refused_behind_a_holder(lock, q, v, owner, due, ticket, waiter, lease_ms)
    end
    return granted_to_the_head(lock, q, value, ticket, waiter, lease_ms, fencing, highest, some_missing)
end

local kept = at_a_kept_key()
if kept ~= nil then
    return kept
end
return uncovered(function()
    local value, ttl, access, fencing = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
    local ticket, waiter, lease_ms = nil, nil, nil
    if ARGV[5] ~= "" then
        -- Tickets are microseconds since 1970: below 2^53, exact as Lua numbers.
        ticket, waiter, lease_ms = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
    end
    -- A lone exclusive resource is checked and set by one `set_lone` below.
    local lone = resources == 1 and access == "x"

    local highest, highest_key = "0", fence_of(0)
    -- Whether some resource has no counter here (never locked, lost with
    -- the node's data, or expired).
    local some_missing = false
    if fencing ~= "set" then
        local limit = counter_limit(fencing)
        for i = 0, resources - 1 do
            local counter, bad = read_counter(fence_of(i), limit)
            if bad then
                return name_counter(bad, i)
            end
            some_missing = some_missing or counter == "0"
            if below(highest, counter) then
                highest, highest_key = counter, fence_of(i)
            end
        end
    end

    local free, behind = true, false
    -- Resources with a waiter queue on this node.
    local queued_here = {}
    -- The first resource (in the lock's order) this attempt is blocked on.
    local blocked_at = nil
    -- When the lock may be free here: the longest wait over the resources
    -- (-1: unknown, a key without expiry).
    local opens_in = 0
    local function not_before(ms)
        if ms < 0 or opens_in < 0 then
            opens_in = -1
        elseif ms > opens_in then
            opens_in = ms
        end
    end
    for i = 0, resources - 1 do
        local lock, q = lock_of(i), queue_of(i)
        -- Readers share with readers; anything else (a holder, or a key of a
        -- type no lock writes) keeps everyone out.
        local kind = lone and "none" or holders(lock)
        if kind ~= "none" and not (kind == "zset" and access == "r") then
            free = false
            blocked_at = blocked_at or i
            not_before(redis.call("PTTL", lock))
        end
        queued_here[i] = redis.call("EXISTS", q.queue) == 1
        if queued_here[i] then
            local ahead, ahead_lease = waiter_ahead(q, now_ms(), access, ticket, waiter)
            if ahead then
                free, behind = false, true
                blocked_at = blocked_at or i
                -- Served first, it may hold the lock until its lease ends (if it
                -- died, its entry goes then).
                local lease = ahead_lease or tonumber(redis.call("ZSCORE", q.leases, ahead))
                if lease then
                    not_before(math.max(0, lease - now_ms()))
                end
                if lone then
                    -- Not checked above; and behind, it is not set below.
                    local left = redis.call("PTTL", lock)
                    if left ~= -2 then
                        not_before(left)
                    end
                end
            end
        end
    end

    if free and lone and not set_lone(lock_of(0), value, ttl) then
        free = false
        blocked_at = 0
        not_before(redis.call("PTTL", lock_of(0)))
    elseif free and not lone then
        for i = 0, resources - 1 do
            set_entry(lock_of(i), value, access, ttl)
        end
    end

    if free then
        -- A granted waiter stays queued (first) here, and is queued if others
        -- wait here and it was not yet: the attempt may still lose on the
        -- other nodes, and must not lose its place then. The release of the
        -- lock it wins takes it out of the queue. (Where no one waits, no
        -- queue is started: an uncontended wait costs what `try_lock` does.)
        -- The grant then says it left the waiter in line here ("queued"
        -- after it), so that a waiter that wins at once knows to leave.
        local in_line = false
        if ticket ~= nil then
            for i = 0, resources - 1 do
                local q = queue_of(i)
                if queued_here[i] then
                    in_line = true
                    if redis.call("ZSCORE", q.queue, waiter) == false then
                        enqueue(q, ticket, waiter, lease_ms, now_ms(), access)
                    end
                end
            end
        end
        local granted = granted_reply(fencing, access, highest, highest_key, some_missing)
        if in_line then
            return { granted, "queued" }
        end
        return granted
    end
    if ticket == nil then
        return false
    end
    for i = 0, resources - 1 do
        local q = queue_of(i)
        if i <= blocked_at then
            enqueue(q, ticket, waiter, lease_ms, now_ms(), access)
        elseif queued_here[i] and dequeue(q, waiter, access) then
            -- Queued there by an earlier attempt: it held others back, and the
            -- first of them may go in now.
            local kind = holders(lock_of(i))
            if kind == "none" or kind == "zset" then
                wake_first(q, ARGV[7 + i + 1], kind == "none")
            end
        end
    end
    return {opens_in, behind and 1 or 0}
end)
