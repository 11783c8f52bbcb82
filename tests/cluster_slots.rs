//! Every script keeps a resource's keys (and its wake-up channel) in one
//! Redis Cluster slot. Checked on nodes in cluster mode, each its own
//! one-shard cluster holding every slot: such a node refuses a script whose
//! keys lie in different slots (`CROSSSLOT`) even though it holds them all,
//! so every lock kind, every fencing mode and the waiting queue are run
//! there with names with and without hash tags. (The node guard is off:
//! its data-set mark is per node, not per resource, and moves with the
//! work on cluster members.)

mod common;

use std::time::Duration;

use common::{builder, resource};
use quorumlock::testkit::TestCluster;
use quorumlock::{Error, Fencing, LockManager, NodeGuard};

/// `n` nodes in cluster mode, each holding all 16 384 slots, once each
/// says `cluster_state:ok`. A node that started without slots counts
/// itself in a minority and waits its rejoin delay (the node timeout,
/// 0.5 s here, 5 s with the default 15 s) plus up to 2 s of start-up
/// delay before it says ok; the bound below leaves room for a loaded CPU.
fn cluster_mode_nodes(n: usize) -> TestCluster {
    let cluster = TestCluster::start_with_args(
        n,
        &["--cluster-enabled", "yes", "--cluster-node-timeout", "500"],
    )
    .unwrap_or_else(|e| panic!("cannot start nodes in cluster mode: {e}"));
    for url in cluster.urls() {
        let mut conn = common::connect(&url);
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16_383)
            .query(&mut conn)
            .unwrap_or_else(|e| panic!("CLUSTER ADDSLOTSRANGE on {url}: {e}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut conn)
                .expect("CLUSTER INFO");
            if info.contains("cluster_state:ok") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{url} did not reach cluster_state:ok within 30 s; it says: {info}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
    cluster
}

fn manager(urls: Vec<String>, fencing: Fencing) -> LockManager {
    builder(urls)
        .fencing(fencing)
        .node_guard(NodeGuard::disabled())
        .build()
        .expect("valid settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_kind_runs_on_nodes_in_cluster_mode() {
    let cluster = cluster_mode_nodes(3);
    // The check bites: keys of two slots in one script are refused here.
    let refused = redis::cmd("EVAL")
        .arg("return 1")
        .arg(2)
        .arg("quorumlock:lock:a")
        .arg("quorumlock:fence:a")
        .query::<i64>(&mut common::connect(&cluster.urls()[0]));
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().to_uppercase().contains("CROSSSLOT")),
        "a script over two slots ran: {refused:?}"
    );
    let names = ["plain", "user:{42}:cart", "a}b", "x{}y", "open{brace"];
    for fencing in [
        Fencing::CounterNode { node: 0 },
        Fencing::Quorum,
        Fencing::Off,
    ] {
        let manager = manager(cluster.urls(), fencing);
        for name in names {
            let r = resource(name);
            let context = format!("{r:?} with {fencing:?}");
            let mut lock = manager
                .lock(&r)
                .await
                .unwrap_or_else(|e| panic!("{context}: lock: {e}"));
            lock.extend(Duration::from_secs(5))
                .await
                .unwrap_or_else(|e| panic!("{context}: extend: {e}"));
            // Held: a second request is refused (not failed), and a waiter
            // is woken by the release.
            let busy = manager.lock(&r).no_wait().await;
            assert!(
                matches!(busy, Err(Error::Contended { .. })),
                "{context}: {busy:?}"
            );
            let waiter = {
                let (manager, r) = (manager.clone(), r.clone());
                tokio::spawn(async move { manager.lock(&r).wait(Duration::from_secs(5)).await })
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            lock.release()
                .await
                .unwrap_or_else(|e| panic!("{context}: release: {e}"));
            let next = waiter
                .await
                .expect("no panic")
                .unwrap_or_else(|e| panic!("{context}: the waiter: {e}"));
            next.release().await.expect("held");
            let reader = manager
                .read(&r)
                .await
                .unwrap_or_else(|e| panic!("{context}: read: {e}"));
            reader.release().await.expect("held");
        }
        // Several resources under one tag share a slot.
        let (a, b) = (resource("{acct}:1"), resource("{acct}:2"));
        let both = manager
            .lock_many([&a, &b])
            .await
            .unwrap_or_else(|e| panic!("[{a}, {b}] with {fencing:?}: {e}"));
        both.release().await.expect("held");
        assert!(manager.settle().await);
    }
}
