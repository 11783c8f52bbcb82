-- Storage-side fenced read (read-and-claim): read a key only when the
-- offered token is at least the highest token recorded for the resource,
-- and raise the recorded token to it before reading. A holder with a lower
-- token is refused from then on, so it cannot write between this read and
-- the reader's own write (a lost update that checking writes alone allows).
-- Check, claim and read are one atomic step.
-- KEYS[1] = highest-token key of the resource, KEYS[2] = the data key
-- ARGV[1] = offered token (decimal), ARGV[2] = "get" (a string) or "list"
-- (all of a list, LRANGE 0 -1)
-- Returns {1, value} when read (the string, false when absent, or the
-- list's entries), {0, highest} when fenced out (decimal string), or a
-- QLCOUNTER error when the recorded token is unusable.
local offered = ARGV[1]
local highest, refused = fence_check(KEYS[1], offered)
if refused then
    return refused
end
-- Refuse a key of the wrong type before claiming: a failed read claims
-- nothing.
local wanted = "string"
if ARGV[2] == "list" then
    wanted = "list"
end
local kind = redis.call("TYPE", KEYS[2])["ok"]
if kind ~= "none" and kind ~= wanted then
    return redis.error_reply("WRONGTYPE " .. KEYS[2] .. " holds a " .. kind .. ", not a " .. wanted)
end
fence_claim(KEYS[1], highest, offered)
if wanted == "list" then
    return {1, redis.call("LRANGE", KEYS[2], 0, -1)}
end
return {1, redis.call("GET", KEYS[2])}
