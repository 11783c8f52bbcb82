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

/// What the full release script runs on each node so far: `PEXPIRETIME`
/// (keeping the lock key for the queue, `holders.lua`), which neither a
/// plain attempt, nor the common release, nor a look at the holders sends.
fn full_releases(direct_urls: &[String]) -> Vec<u64> {
    direct_urls
        .iter()
        .map(|url| common::command_calls(url, "pexpiretime"))
        .collect()
}

/// A round is decided at its quorum, and the nodes that have not answered
/// by then are rolled back at once, in the same stream as the attempt (so
/// that our next attempt never meets our own key). As a rule they refused:
/// where a waiter is queued, that rollback must not run the whole release
/// script (the queue's key-keeping), only see that the key is someone
/// else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_where_the_attempt_was_refused_is_cheap_beside_a_queue() {
    let cluster = TestCluster::start_proxied_with_args(5, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    let direct = direct_urls(&cluster);
    // No fencing: an attempt is then a plain SET NX on every node (the
    // counter node's is a script). No node guard: nothing but the test's
    // own requests reaches the nodes.
    let manager = || {
        builder(cluster.urls())
            .node_guard(NodeGuard::disabled())
            .fencing(Fencing::Off)
            .ttl(Duration::from_secs(60))
            // settings: longer than the helper's: commands are counted here, and a timed-out round would add some
            .node_timeout(Duration::from_secs(2))
            .build()
            .expect("valid settings")
    };
    let (holder, other) = (manager(), manager());
    for each in [&holder, &other] {
        reach_every_node(each, &direct).await;
    }
    let name = resource("refused-beside-a-queue");
    let held = holder.lock(&name).no_wait().await.expect("the first lock");
    // A waiter queued on every node, written by hand: a live one renews
    // its place every second (its lease is at most 2 s), and its renewals
    // would run scripts on the nodes while the rollbacks are counted.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    let lease_until = now + Duration::from_secs(3600);
    common::queue_writer_by_hand(
        &direct,
        &name,
        now.as_micros() as u64,
        lease_until.as_millis() as u64,
    );
    // Nodes 3 and 4 answer 200 ms after the others from now on: every
    // refused round below is decided by the first three, and rolled back
    // on the last two.
    for i in 3..5 {
        cluster
            .proxy(i)
            .expect("proxied")
            .set_latency(Delay::fixed(Duration::from_millis(100)));
    }
    assert!(other.settle().await, "the warm-up's cleanup finished");
    let before = full_releases(&direct);
    for attempt in 0..5 {
        match other.lock(&name).no_wait().await {
            Err(Error::Contended { .. }) => {}
            result => panic!("attempt {attempt} at a held lock: {result:?}"),
        }
    }
    assert!(other.settle().await, "the attempts' cleanup finished");
    let after = full_releases(&direct);
    let ran: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(
        ran,
        vec![0; 5],
        "PEXPIRETIME calls (the full release script) on each node after 5 attempts that every \
         node refused, with a waiter queued"
    );
    held.release().await.expect("release the first lock");
}
