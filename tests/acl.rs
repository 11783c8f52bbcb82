//! Lock nodes and fenced storage reached as ACL users allowed only what
//! the library needs: the minimal ACLs of docs/operations.md ("ACL users"), pasted
//! into real servers. Every kind of lock works through them, the node
//! guard sees the nodes, and a user missing a permission gets an error
//! that names what was denied.

mod common;

use std::time::Duration;

use common::{builder, resource};
use quorumlock::guard::QuarantineReason;
use quorumlock::testkit::TestCluster;
use quorumlock::{Error, FencedRedis, Fencing, HealthState, LockManager, NodeErrorKind};

/// The lock nodes' user, as docs/operations.md gives it.
const LOCK_ACL: &str = "ACL SETUSER quorumlock on >CHANGE-ME resetkeys ~quorumlock:* \
resetchannels &quorumlock:* -@all +set +get +del +exists +incr +persist +pexpire +pexpireat +pexpiretime +pttl \
+type +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore +zscore +publish +subscribe \
+unsubscribe +ping +evalsha +script|load +time +info +config|get";

/// The fenced storage's user (for data under `orders:*`), as docs/operations.md
/// gives it.
const STORAGE_ACL: &str = "ACL SETUSER app on >CHANGE-ME resetkeys ~orders:* \
~quorumlock:fenced:* -@all +get +set +del +persist +rpush +lrange +type +evalsha +script|load";

const PASSWORD: &str = "s3cret-for-tests";

/// Runs an `ACL SETUSER` line on node `i`, as the default user, with the
/// test's password, plus `extra` rules.
fn create_user(cluster: &TestCluster, i: usize, line: &str, extra: &[&str]) {
    let line = line.replace("CHANGE-ME", PASSWORD);
    let mut words = line.split_whitespace();
    let mut cmd = redis::cmd(words.next().expect("ACL"));
    cmd.arg(words.collect::<Vec<_>>()).arg(extra);
    let _: () = cmd
        .query(&mut common::connect(&cluster.url(i).expect("node")))
        .unwrap_or_else(|e| panic!("{line} {extra:?} on node {i}: {e}"));
}

/// The nodes' URLs with `user`'s credentials.
fn as_user(cluster: &TestCluster, user: &str) -> Vec<String> {
    cluster
        .urls()
        .iter()
        .map(|url| url.replace("redis://", &format!("redis://{user}:{PASSWORD}@")))
        .collect()
}

#[test]
fn the_readme_gives_these_acls() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
            .expect("docs/operations.md");
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    for acl in [LOCK_ACL, STORAGE_ACL] {
        assert!(flat.contains(acl), "docs/operations.md must give `{acl}`");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_lock_works_as_the_minimal_acl_user() {
    let cluster = common::cluster(3);
    for i in 0..3 {
        create_user(&cluster, i, LOCK_ACL, &[]);
    }
    let urls = as_user(&cluster, "quorumlock");
    for fencing in [Fencing::CounterNode { node: 0 }, Fencing::Quorum] {
        let manager = builder(urls.clone())
            .fencing(fencing)
            .build()
            .expect("valid settings");
        let r = resource("acl");
        let mut lock = manager.lock(&r).await.expect("lock as the ACL user");
        let token = lock.token().expect("fencing on");
        lock.extend(Duration::from_secs(10)).await.expect("extend");
        // Waiting: queued, subscribed to the wake channel, woken by the release.
        let waiting = tokio::spawn({
            let (manager, r) = (manager.clone(), r.clone());
            async move { manager.lock(&r).wait(Duration::from_secs(10)).await }
        });
        // The waiter is counted (`inspect.lua`'s ZCOUNT: without +zcount
        // the denial was swallowed and every count read 0).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let waiters = manager.holders(&r).await.expect("holders").waiters;
            if waiters == 1 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the queued waiter is not counted as the ACL user: {waiters} waiters"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        lock.release().await.expect("release");
        let next = waiting
            .await
            .expect("no panic")
            .expect("woken and acquired");
        assert!(next.token().expect("fencing on") > token);
        next.release().await.expect("release");
        // Readers, several resources, a kept-alive lock.
        let (a, b) = (
            manager.read(&r).await.expect("read"),
            manager.read(&r).await.expect("read"),
        );
        a.release().await.expect("release");
        b.release().await.expect("release");
        let both = manager
            .lock_many(&[resource("acl-a"), resource("acl-b")])
            .await
            .expect("lock_many");
        both.release().await.expect("release");
        let answer = manager
            .lock(&r)
            .run(|_| async { 42 })
            .await
            .expect("with_lock");
        assert_eq!(answer, 42);
        // The node guard could read INFO, CONFIG and TIME: nothing is
        // quarantined, every node is up.
        assert!(
            manager.quarantined_nodes().is_empty(),
            "{:?}",
            manager.quarantined_nodes()
        );
        assert!(manager.settle().await);
        let health = manager.health();
        assert_eq!(health.state, HealthState::Healthy, "{health:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_storage_works_as_its_minimal_acl_user() {
    let lock_nodes = common::cluster(3);
    let manager = common::manager(lock_nodes.urls());
    let storage_node = common::cluster(1);
    create_user(&storage_node, 0, STORAGE_ACL, &[]);
    let url = as_user(&storage_node, "app").remove(0);
    let storage = FencedRedis::new(&url).expect("valid URL");
    let old = manager.lock("orders:7").await.expect("free");
    let stale = old.fence().expect("fencing on");
    old.release().await.expect("release");
    let lock = manager.lock("orders:7").await.expect("free");
    let fence = lock.fence().expect("fencing on");
    assert_eq!(
        storage
            .read(&fence, "orders:7:state")
            .await
            .expect("fenced read as the ACL user"),
        None
    );
    assert!(
        storage
            .read_list(&fence, "orders:7:log")
            .await
            .expect("fenced list read as the ACL user")
            .is_empty()
    );
    storage
        .set(&fence, "orders:7:state", "paid")
        .await
        .expect("set as the ACL user");
    storage
        .push(&fence, "orders:7:log", "paid")
        .await
        .expect("push as the ACL user");
    assert_eq!(
        storage.get("orders:7:state").await.expect("get").as_deref(),
        Some("paid")
    );
    assert!(matches!(
        storage.set(&stale, "orders:7:state", "void").await,
        Err(Error::FencedOut { .. })
    ));
    lock.release().await.expect("release");
}

/// What a lock call says when the user may not run EVALSHA (counter
/// fencing needs it), and when it may not touch the lock keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_is_named() {
    let cluster = common::cluster(3);
    for i in 0..3 {
        create_user(&cluster, i, LOCK_ACL, &["-evalsha"]);
    }
    let manager = builder(as_user(&cluster, "quorumlock"))
        .unavailable_retry(quorumlock::Backoff::none())
        .build()
        .expect("valid settings");
    let error = manager
        .lock(&resource("acl-denied"))
        .no_wait()
        .await
        .expect_err("EVALSHA is denied");
    let denied = match &error {
        Error::QuorumUnavailable { errors, .. } => errors.clone(),
        other => panic!("expected the nodes' failures, got {other:?}"),
    };
    // The node guard's observation runs a script too: refused, the node
    // is not counted (a restart could not be seen), and says why.
    assert!(
        denied.iter().any(|e| match &e.kind {
            NodeErrorKind::PermissionDenied(what) => what == "the `evalsha` command",
            NodeErrorKind::Quarantined(quarantine) => matches!(&quarantine.reason,
                QuarantineReason::Unobserved { why } if why.contains("the `evalsha` command")),
            _ => false,
        }),
        "{error}"
    );
    assert!(error.to_string().contains("evalsha"), "{error}");
    assert!(error.is_unavailable(), "{error:?}");

    // Keys outside the user's pattern.
    for i in 0..3 {
        create_user(&cluster, i, LOCK_ACL, &["resetkeys", "~other:*"]);
    }
    let manager: LockManager = builder(as_user(&cluster, "quorumlock"))
        .fencing(Fencing::Off)
        .unavailable_retry(quorumlock::Backoff::none())
        .build()
        .expect("valid settings");
    let error = manager
        .lock(&resource("acl-keys"))
        .no_wait()
        .await
        .expect_err("the lock keys are denied");
    assert!(error.to_string().contains("these keys"), "{error}");
}

/// An attempt refused by some nodes and granted by the rest is checked
/// for a split vote by reading the holders. When that read fails (here:
/// the user may not ZRANGEBYSCORE, which reading readers needs and the
/// attempt does not), what failed is the read, and the caller is told
/// so: it used to count as "held" and come out as `Contended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_check_that_cannot_read_says_so() {
    let cluster = common::cluster(3);
    for i in 0..3 {
        create_user(&cluster, i, LOCK_ACL, &["-zrangebyscore"]);
    }
    let name = resource("acl-split-unread");
    // A reader on nodes 0 and 1 only: a writer is refused there, granted
    // on node 2.
    let reader = builder(cluster.urls())
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid settings");
    // Every node observed first: a fresh manager's first grant leaves out
    // a node it is still observing (on the redis-rs wire the read lock
    // then never reached the third node).
    common::reach_every_node(&reader, &cluster.urls()).await;
    let read = reader.read(&name).await.expect("read");
    // Granted by the first two answers: the third may land a moment later.
    let key = quorumlock::internals::lock_key(&name);
    let everywhere = common::eventually(common::scaled(Duration::from_secs(2)), || {
        (0..3).all(|i| {
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query(&mut common::connect(&cluster.url(i).expect("node")))
                .expect("TYPE");
            kind == "zset"
        })
    })
    .await;
    assert!(everywhere, "the read lock never reached all three nodes");
    let _: i64 = redis::cmd("DEL")
        .arg(quorumlock::internals::lock_key(&name))
        .query(&mut common::connect(&cluster.url(2).expect("node")))
        .expect("DEL");
    let manager = builder(as_user(&cluster, "quorumlock"))
        .fencing(Fencing::Off)
        .unavailable_retry(quorumlock::Backoff::none())
        .build()
        .expect("valid settings");
    let error = manager
        .lock(&name)
        .no_wait()
        .await
        .expect_err("read-locked on two of three nodes");
    assert!(
        !matches!(error, Error::Contended { .. })
            && error.to_string().contains("permission denied"),
        "the holders could not be read (ZRANGEBYSCORE denied), yet the attempt says: {error}"
    );
    read.release().await.expect("release");
}

/// What a member that is a Redis Cluster needs besides `LOCK_ACL`, as
/// docs/scaling-out.md gives it.
const CLUSTER_ACL_EXTRA: &str = "+cluster|slots +cluster|myid +cluster|info +wait";

/// A cluster member (a replica per shard) reached as the minimal ACL user
/// with the cluster's rules works, and the guard counts its masters;
/// without `+cluster|myid` and `+cluster|info` the guard cannot sign its
/// mark (a copy would pass for it) and does not count them, saying why;
/// without `+wait` no write is acknowledged, and the error says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_member_needs_its_identity_readable_to_count() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/scaling-out.md"))
        .expect("docs/scaling-out.md");
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&format!("`{CLUSTER_ACL_EXTRA}`")),
        "docs/scaling-out.md must give `{CLUSTER_ACL_EXTRA}`"
    );
    let member = quorumlock::testkit::ClusterMember::start(3, 1)
        .expect("a 3-master cluster with a replica each");
    let nodes = member.nodes();
    let extra: Vec<&str> = CLUSTER_ACL_EXTRA.split_whitespace().collect();
    let without_wait: Vec<&str> = extra.iter().copied().filter(|r| *r != "+wait").collect();
    for i in 0..nodes.len() {
        create_user(nodes, i, LOCK_ACL, &extra);
        let blind = LOCK_ACL.replace("quorumlock on", "blind on");
        create_user(nodes, i, &blind, &["+cluster|slots", "+wait"]);
        let no_wait = LOCK_ACL.replace("quorumlock on", "nowait on");
        create_user(nodes, i, &no_wait, &without_wait);
    }
    let url = |user: &str| {
        member.url().expect("a URL").replace(
            "redis+cluster://",
            &format!("redis+cluster://{user}:{PASSWORD}@"),
        )
    };
    let manager = |user: &str| {
        builder(vec![url(user)])
            .fencing(Fencing::Off)
            .build()
            .expect("valid settings")
    };
    let counted = manager("quorumlock");
    let lock = counted
        .lock(&resource("acl-cluster"))
        .await
        .unwrap_or_else(|e| panic!("the minimal ACL user with the cluster's rules: {e}"));
    lock.release().await.expect("release");
    assert!(
        counted.quarantined_nodes().is_empty(),
        "{:?}",
        counted.quarantined_nodes()
    );
    let blind = manager("blind");
    let refused = blind.lock(&resource("acl-cluster")).no_wait().await;
    assert!(
        refused.is_err(),
        "counted without its identity: {refused:?}"
    );
    let quarantined = blind.quarantined_nodes();
    assert!(
        !quarantined.is_empty()
            && quarantined.iter().all(|(_, q)| matches!(
                &q.reason,
                QuarantineReason::Unobserved { why } if why.contains("CLUSTER MYID or CLUSTER INFO unreadable")
            )),
        "{quarantined:?}"
    );
    let refused = manager("nowait")
        .lock(&resource("acl-cluster"))
        .no_wait()
        .await
        .expect_err("granted without a replica's acknowledgement");
    assert!(
        refused.to_string().contains("NOPERM") && refused.to_string().contains("+wait"),
        "without +wait: {refused}"
    );
}
