//! The testkit's Redis Cluster member: every slot served once created, the
//! master of a key where `CLUSTER KEYSLOT` and `CLUSTER SLOTS` put it, a
//! resource's keys all on one master, and replicas attached when asked for.

use quorumlock::internals::{KeyKind, key_of};
use quorumlock::testkit::ClusterMember;

fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("cannot reach {url}: {e}"));
    cmd.query(&mut conn)
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

#[test]
fn a_member_serves_every_slot_and_keeps_a_resource_on_one_master() {
    let member = ClusterMember::start(3, 1).expect("a 3-master cluster with replicas");
    assert_eq!(member.masters(), 3);
    assert_eq!(member.nodes().len(), 6);
    let roles: Vec<String> = member
        .nodes()
        .urls()
        .iter()
        .map(|url| {
            let info: String = query(url, redis::cmd("INFO").arg("replication"));
            info.lines()
                .find_map(|l| l.strip_prefix("role:"))
                .expect("role")
                .trim()
                .to_owned()
        })
        .collect();
    assert_eq!(
        roles.iter().filter(|r| *r == "master").count(),
        3,
        "{roles:?}"
    );
    let seed = &member.nodes().urls()[0];
    let mut owners = std::collections::BTreeSet::new();
    for resource in ["invoice:7", "user:{42}:cart", "a}b", "order:1", "order:2"] {
        let lock = key_of(KeyKind::Lock, resource);
        let owner = member.master_of(&lock).expect("an owner");
        // The library's slot is Redis's.
        let slot: i64 = query(seed, redis::cmd("CLUSTER").arg("KEYSLOT").arg(&lock));
        assert_eq!(
            slot,
            i64::from(quorumlock::internals::slot(&lock)),
            "{lock}"
        );
        // Every key of the resource lives on that master: it takes them all
        // in one script (a key of another slot would be refused there).
        for kind in KeyKind::ALL {
            assert_eq!(
                member.master_of(&key_of(kind, resource)).expect("an owner"),
                owner
            );
        }
        let touched: i64 = query(
            &owner,
            redis::cmd("EVAL")
                .arg("return redis.call('EXISTS', unpack(KEYS))")
                .arg(5)
                .arg(&lock)
                .arg(key_of(KeyKind::Fence, resource))
                .arg(key_of(KeyKind::Waiters, resource))
                .arg(key_of(KeyKind::WaiterLeases, resource))
                .arg(key_of(KeyKind::WaitingWriters, resource)),
        );
        assert_eq!(touched, 0, "{resource}");
        owners.insert(owner);
    }
    assert!(
        owners.len() > 1,
        "five resources all on one master: {owners:?}"
    );
    assert!(
        ClusterMember::start(2, 0).is_err(),
        "two masters are refused"
    );
}
