-- The node guard's look at a node, in one step: INFO, the node's time, and
-- the mark of its data set, written where it is missing (on a master) and
-- numbered: every observation raises the number, so a data set that comes
-- back without its mark, with another one, or with a lower number has lost
-- writes it acknowledged (see guard/judge.rs).
-- KEYS[1] = the mark ("<id> <run_id> <ms>"; on a cluster node
-- "<id> <run_id>@<node id>/<config epoch> <ms>"), KEYS[2] = its number.
-- ARGV[1] = a random id, for a mark written now; ARGV[2] = "1" to raise
-- the number (a write: each manager does it once a second at most).
-- Returns {INFO text, the mark or nil, the node's time in ms (nil when
-- unknown), the number as found, the number after this raise}: a data set
-- that comes back with less than an earlier observation raised it to is
-- judged on what it had, before this observation raises it again.
-- INFO refused (an ACL, a renamed command) fails the script: the client
-- then does not count the node.
local info = redis.pcall("INFO", "server", "persistence", "memory", "replication", "cluster")
if type(info) == "table" then
    -- Before 7.0, INFO takes one section; the default set has these five.
    info = redis.call("INFO")
end
-- The node's time: INFO has it (since 6.2), for users whose ACL forbids TIME.
local now = nil
local usec = string.match(info, "server_time_usec:(%d+)")
if usec then
    now = math.floor(tonumber(usec) / 1000)
else
    local t = redis.pcall("TIME")
    if type(t) == "table" and t[1] then
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
end
-- A Redis Cluster node signs its marks with its node id and its config
-- epoch ("<run_id>@<id>/<epoch>"). Replication copies a mark, but not the
-- epoch: that moves on whenever the node becomes a master by a failover
-- (or takes slots), so a mark that left with the data set (to a replica
-- that took over) and came back (a failback, then a restart that erased
-- every sign of the promotion) names an older epoch.
-- A cluster node whose id or epoch cannot be read (an ACL without
-- +cluster|myid or +cluster|info) cannot sign: the observation fails, and
-- the client does not count the node, rather than trust a mark it cannot
-- tell from a copy.
local node = ""
if string.find(info, "cluster_enabled:1", 1, true) then
    local myid = redis.pcall("CLUSTER", "MYID")
    local cluster = redis.pcall("CLUSTER", "INFO")
    local epoch = type(cluster) == "string" and string.match(cluster, "cluster_my_epoch:(%d+)")
    if type(myid) ~= "string" or not epoch then
        return redis.error_reply(
            "ERR CLUSTER MYID or CLUSTER INFO unreadable: a cluster node's id and config epoch sign the guard's mark")
    end
    node = "@" .. myid .. "/" .. epoch
end
local mark = redis.pcall("GET", KEYS[1])
-- Anything but a mark (a typo, another type) is replaced: left alone, it
-- would hide every later loss of the data set.
if type(mark) ~= "string" or not string.match(mark, "^%S+ %S+ %d+$") then
    if type(mark) == "table" then
        redis.pcall("DEL", KEYS[1])
    end
    mark = nil
end
-- On a cluster node, a mark another node signed, or this node in another
-- epoch, came with its data: a replica that took over (also one restarted
-- since, which no longer shows the promotion), a failback, or a slot moved
-- here. It says nothing of what this node kept; a fresh one is written,
-- and the data set counts as begun now.
if mark and node ~= "" then
    local writer = string.match(mark, "^%S+ (%S+) %d+$")
    if string.sub(writer, -#node) ~= node then
        mark = nil
    end
end
local number = tonumber(redis.call("GET", KEYS[2]) or "0") or 0
-- The number as found judges the data set; as raised, it is remembered.
local raised = number
if string.find(info, "role:master", 1, true) then
    -- pcall: a full node (noeviction) refuses writes; then no mark is shown.
    if not mark and now then
        local fresh = ARGV[1] .. " " .. (string.match(info, "run_id:(%x+)") or "?") .. node .. " " .. now
        local set = redis.pcall("SET", KEYS[1], fresh)
        if type(set) == "table" and set.ok then
            mark = fresh
        end
    end
    if ARGV[2] == "1" then
        local incremented = redis.pcall("INCR", KEYS[2])
        if type(incremented) == "number" then
            raised = incremented
        end
    end
end
return {info, mark, now or false, number, raised}
