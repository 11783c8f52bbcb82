-- Storage-side fencing check: write, delete or append to a key only when the
-- offered token is at least the highest token recorded for the resource,
-- and record it. Check and write are one atomic step.
-- KEYS[1] = highest-token key of the resource, KEYS[2] = the data key
-- ARGV[1] = offered token (decimal), ARGV[2] = "set", "del" or "push"
-- (RPUSH), ARGV[3] = value (set, push)
-- Returns {1, token} when written, {0, highest} when fenced out (tokens as
-- decimal strings), or a QLCOUNTER error when the recorded token is unusable.
local offered = ARGV[1]
local highest, refused = fence_check(KEYS[1], offered)
if refused then
    return refused
end
-- Refuse before writing anything: a failing RPUSH after the token was
-- recorded would leave half a write.
if ARGV[2] == "push" then
    local kind = redis.call("TYPE", KEYS[2])["ok"]
    if kind ~= "none" and kind ~= "list" then
        return redis.error_reply("WRONGTYPE " .. KEYS[2] .. " holds a " .. kind .. ", not a list")
    end
end
fence_claim(KEYS[1], highest, offered)
if ARGV[2] == "del" then
    redis.call("DEL", KEYS[2])
elseif ARGV[2] == "push" then
    redis.call("RPUSH", KEYS[2], ARGV[3])
else
    redis.call("SET", KEYS[2], ARGV[3])
end
return {1, offered}
