//! Direct reads and moves on members that are Redis Clusters (the
//! testkit's `ClusterMember`), shared by the cluster tests.

use quorumlock::testkit::ClusterMember;

/// `cmd`'s reply from the node at `url`; panics naming the node.
pub fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    cmd.query(&mut super::connect(url))
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// `INFO replication` of the node at `url`.
pub fn replication(url: &str) -> String {
    query(url, redis::cmd("INFO").arg("replication"))
}

/// The port of a `redis://host:port` URL.
pub fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port")
}

/// The replica of the master at `master` among `member`'s nodes.
pub fn replica_of(member: &ClusterMember, master: &str) -> String {
    let port = port_of(master);
    member
        .nodes()
        .urls()
        .into_iter()
        .find(|url| replication(url).contains(&format!("master_port:{port}\r")))
        .unwrap_or_else(|| panic!("no replica of {master}"))
}

/// Whether `CLUSTER SLOTS` of the node at `url` names the node on `port`
/// as the master of `slot`.
pub fn names_master(url: &str, slot: u16, port: u16) -> bool {
    let ranges: Vec<redis::Value> = query(url, redis::cmd("CLUSTER").arg("SLOTS"));
    ranges.iter().any(|range| match range {
        redis::Value::Array(fields) => match (&fields[0], &fields[1], &fields[2]) {
            (redis::Value::Int(first), redis::Value::Int(last), redis::Value::Array(master)) => {
                (*first..=*last).contains(&i64::from(slot))
                    && matches!(master.get(1), Some(redis::Value::Int(p)) if *p == i64::from(port))
            }
            _ => false,
        },
        _ => false,
    })
}

/// Starts moving `slot` from the master at `from` to the one at `to`
/// (the testkit's `begin_slot_move`): the slot stays migrating (the old
/// master answers `ASK` for keys it no longer has) until
/// [`finish_slot_move`].
pub fn start_slot_move(member: &ClusterMember, slot: u16, from: &str, to: &str) {
    member
        .begin_slot_move(slot, from, to)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Ends the move of `slot` to the master at `to`: every node of `member`
/// is told it serves the slot now.
pub fn finish_slot_move(member: &ClusterMember, slot: u16, from: &str, to: &str) {
    member
        .end_slot_move(slot, from, to)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Sets `key` on the node at `url` for `ms` under another client's value:
/// that node refuses a lock attempt meanwhile, so the lock is granted by
/// a bare majority of the other members.
pub fn held_briefly_by_someone_else(url: &str, key: &str, ms: u64) {
    let _: () = query(
        url,
        redis::cmd("SET")
            .arg(key)
            .arg("someone-else")
            .arg("PX")
            .arg(ms),
    );
}

/// Cuts `replica`'s link to its `master` for good (its reconnects fail to
/// authenticate): what the master is given from now on never reaches it.
pub fn cut_replica_link(master: &str, replica: &str) {
    let _: () = query(
        replica,
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("masterauth")
            .arg("wrong"),
    );
    let killed: i64 = query(
        master,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
    );
    assert!(killed >= 1, "the master had no replica link");
    // Another replica, not cut off, links again at once: wait until every
    // replica but this one is back online.
    let replicas = |info: &str| {
        info.lines()
            .filter(|line| line.starts_with("slave") && line.contains("state=online"))
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while replicas(&replication(master)) + 1 < killed as usize {
        assert!(
            std::time::Instant::now() < deadline,
            "the master's other replicas did not link again: {}",
            replication(master)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Cuts `replica`'s link to `master` for good (see [`cut_replica_link`])
/// and pauses it until no other node of `member` lists it in `CLUSTER
/// SLOTS`, so that a manager that reads the slot map now finds `master`
/// without a replica, and counts its writes without one's acknowledgement.
/// (The slot map lists a replica from the moment gossip carried its
/// replication offset, and keeps listing it once its link is cut: whether
/// it did by a setup's lock was a race that a loaded machine lost.)
/// Returns the replica's index, to resume it.
pub async fn cut_and_unlist_replica(member: &ClusterMember, master: &str, replica: &str) -> usize {
    cut_replica_link(master, replica);
    let index = member
        .nodes()
        .urls()
        .iter()
        .position(|url| url == replica)
        .expect("the replica is a node of the member");
    member.nodes().pause(index).expect("pause the replica");
    let port = i64::from(port_of(replica));
    let lists_it = |url: &String| {
        let ranges: Vec<Vec<redis::Value>> = query(url, redis::cmd("CLUSTER").arg("SLOTS"));
        ranges.iter().any(|range| {
            range.iter().skip(2).any(|node| {
                matches!(node, redis::Value::Array(fields)
                    if matches!(fields.get(1), Some(redis::Value::Int(p)) if *p == port))
            })
        })
    };
    // A wait, not the check: the cluster's failure reports spread by gossip.
    let deadline = std::time::Instant::now() + super::scaled(std::time::Duration::from_secs(20));
    loop {
        let listing: Vec<String> = member
            .nodes()
            .urls()
            .into_iter()
            .filter(|url| url != replica && lists_it(url))
            .collect();
        if listing.is_empty() {
            return index;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "setup: the paused replica {replica} was still listed by {listing:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
