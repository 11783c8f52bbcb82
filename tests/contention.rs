//! Many clients, one resource: the lock must serialise a critical section
//! that would visibly break if two of them ever ran it at once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{builder, direct_urls, healthy_nodes, reach_every_node, resource};
use quorumlock::testkit::{Delay, TestCluster};
use quorumlock::{Error, Fencing, NodeGuard};

const TASKS: u64 = 8;
const ITERATIONS: u64 = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contending_clients_never_overlap() {
    let nodes = healthy_nodes();
    let name = Arc::new(resource("contended"));
    // A deliberately racy read-modify-write: without mutual exclusion,
    // interleaved increments are lost and `inside` is seen set.
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));

    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        // One manager per task: separate clients, as separate processes would be.
        let manager = builder(nodes.urls.clone()).build().expect("valid settings");
        let (name, counter, inside, overlaps) = (
            Arc::clone(&name),
            Arc::clone(&counter),
            Arc::clone(&inside),
            Arc::clone(&overlaps),
        );
        tasks.push(tokio::spawn(async move {
            let mut acquired = 0u64;
            for _ in 0..ITERATIONS {
                let lock = manager.lock(&name).await.expect("eventually acquired");
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let seen = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                assert!(lock.is_valid(), "critical section ran within validity");
                lock.release().await.expect("release a valid lock");
                acquired += 1;
            }
            acquired
        }));
    }
    let mut acquisitions = 0;
    for task in tasks {
        acquisitions += task.await.expect("task did not panic");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(acquisitions, TASKS * ITERATIONS);
    assert_eq!(counter.load(Ordering::SeqCst), acquisitions, "lost updates");
}

/// Rollbacks each node has run so far: each runs `release_fast.lua`,
/// whose one `EXISTS` (is anyone queued?) nothing else run here sends (the
/// attempts are plain `SET NX`, and a split vote's look at the holders runs
/// `inspect.lua`, which has none).
fn rollbacks(direct_urls: &[String]) -> Vec<u64> {
    direct_urls
        .iter()
        .map(|url| {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut common::connect(url))
                .expect("INFO commandstats");
            info.lines()
                .find_map(|line| line.strip_prefix("cmdstat_exists:calls="))
                .and_then(|rest| rest.split(',').next()?.parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

/// A refused attempt's nodes that answer after the round is decided are
/// waited for, not rolled back blind: a node that refused set nothing, and
/// each rollback is a release script (on a hot resource, a whole one) on a
/// node that is busy enough already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_rolls_nothing_back_where_it_was_refused_late() {
    let cluster = TestCluster::start_proxied_with_args(5, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    // Nodes 3 and 4 answer 200 ms after the others: every round here is
    // decided by the first three.
    for i in 3..5 {
        cluster
            .proxy(i)
            .expect("proxied")
            .set_latency(Delay::fixed(Duration::from_millis(100)));
    }
    let direct = direct_urls(&cluster);
    // No fencing: an attempt is then a plain SET NX on every node (the
    // counter node's is a script), and no node's refusal decides alone. No
    // node guard: nothing but the test's own requests reaches the nodes.
    let manager = builder(cluster.urls())
        .node_guard(NodeGuard::disabled())
        .fencing(Fencing::Off)
        .node_timeout(Duration::from_secs(2))
        .build()
        .expect("valid settings");
    reach_every_node(&manager, &direct).await;
    let name = resource("refused-late");
    let holder = manager.lock(&name).no_wait().await.expect("the first lock");
    assert!(manager.settle().await, "the warm-up's cleanup finished");
    let before = rollbacks(&direct);
    for attempt in 0..5 {
        match manager.lock(&name).no_wait().await {
            Err(Error::Contended { refused, .. }) => {
                assert!(
                    refused >= 3,
                    "attempt {attempt}: refused by only {refused} nodes"
                )
            }
            other => panic!("attempt {attempt} at a held lock: {other:?}"),
        }
    }
    assert!(manager.settle().await, "the attempts' cleanup finished");
    let after = rollbacks(&direct);
    let sent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(
        sent,
        vec![0; 5],
        "rollbacks run on each node after 5 attempts that every node refused"
    );
    holder.release().await.expect("release the first lock");
}
