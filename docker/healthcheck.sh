#!/bin/sh
# The nodes' health check (docker-compose.yml): the node answers PING.
#
# On a new cluster's first start it also marks the node new, so that
# clients count it at once instead of after the quarantine window that a
# node which lost its data set waits out: it writes the node guard's
# data-set mark, dated long ago ("<id> new 0", docs/operations.md), on a
# node that has no mark yet, and only while every node of the cluster is
# still empty (a node's DBSIZE is 0, or 1 when its one key is such a
# mark), and only on a node that persists every write. A node that comes
# back empty into a cluster that has served (any node holds a client's
# mark or locks) is never marked: it may have forgotten locks it granted.
# Until a client has observed the node, a peer that cannot be reached
# makes the check fail, so that `up --wait` returns only once the marks
# are written.
#
# QUORUMLOCK_PEERS: every node of the cluster as host:port, this one too.
# QUORUMLOCK_SELF: this node as host:port (default 127.0.0.1:6379).
set -u
self=${QUORUMLOCK_SELF:-127.0.0.1:6379}
cli() {
    address=$1
    shift
    redis-cli -h "${address%:*}" -p "${address##*:}" "$@"
}
[ "$(cli "$self" PING)" = PONG ] || exit 1
# Marked already (new, or by the first client that observed it).
[ "$(cli "$self" EXISTS quorumlock:node)" = 0 ] || exit 0
# Only a node that persists every write: one that does not forgets its
# locks at every restart, and a cluster of them all restarted at once
# would look new.
[ "$(cli "$self" CONFIG GET appendfsync | tail -n 1)" = always ] || exit 0
[ "$(cli "$self" CONFIG GET appendonly | tail -n 1)" = yes ] || exit 0
for peer in ${QUORUMLOCK_PEERS:?list every node as host:port}; do
    keys=$(cli "$peer" DBSIZE 2>/dev/null) || exit 1
    case "$keys" in
    0) ;;
    1)
        case "$(cli "$peer" GET quorumlock:node)" in
        *" 0") ;;
        *) exit 0 ;;
        esac
        ;;
    *) exit 0 ;;
    esac
done
id=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
# NX: a client that observed the node in between has marked it already.
cli "$self" SET quorumlock:node "$id new 0" NX >/dev/null
