-- The common acquire, before the shared rules are defined (see
-- `common_case_first!` in mod.rs): one exclusive resource, no waiter
-- queued for it here, and the key free. acquire.lua (`in_full`, above)
-- gives the same answer then and enqueues no one, since a grant where no
-- one waits starts no queue; here that costs a SET NX and the counter's
-- commands alone. Anything else, a taken key included, runs `in_full`:
-- nothing is written before it, so it starts from the same state.
-- KEYS and ARGV as acquire.lua.
if #KEYS == 5 and ARGV[3] == "x" and redis.call("EXISTS", KEYS[3]) == 0 then
    local fencing, counter = ARGV[4], "0"
    if fencing ~= "set" then
        local bad
        counter, bad = read_counter(KEYS[2], counter_limit(fencing))
        if bad then
            return bad
        end
    end
    if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
        if fencing == "incr" then
            return (issue(KEYS[2], counter))
        elseif fencing == "read" then
            -- Quorum mode's first round, as in acquire.lua.
            return at_least_now(counter)
        elseif fencing == "peek" then
            return counter
        end
        return redis.status_reply("OK")
    end
end
return in_full()
