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
    // own requests reaches the nodes. A long TTL: the waiter renews its
    // place only every 30 s.
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
    let (holder, waiter, other) = (manager(), manager(), manager());
    for each in [&holder, &waiter, &other] {
        reach_every_node(each, &direct).await;
    }
    let name = resource("refused-beside-a-queue");
    let held = holder.lock(&name).no_wait().await.expect("the first lock");
    // The waiter's queued round is decided at a quorum: on a loaded
    // machine its requests to the last nodes may not have gone out by
    // then, and it would queue there only at its renewal, 30 s on. Such a
    // waiter is dropped (it leaves the queue) and another one started.
    let mut waiting = None;
    let mut seen = Vec::new();
    for _ in 0..10 {
        let task = {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move { waiter.lock(&name).wait(Duration::from_secs(30)).await })
        };
        let queued = common::eventually(common::scaled(Duration::from_secs(2)), || {
            direct.iter().all(|url| common::queued_on(url, &name) == 1)
        })
        .await;
        if queued {
            waiting = Some(task);
            break;
        }
        seen = direct
            .iter()
            .map(|url| common::queued_on(url, &name))
            .collect();
        task.abort();
        let _ = task.await;
        assert!(waiter.settle().await, "the dropped waiter left the queue");
    }
    let waiting = waiting.unwrap_or_else(|| {
        panic!("no waiter queued on every node in 10 tries (queued per node: {seen:?})")
    });
    // Nodes 3 and 4 answer 200 ms after the others from now on: every
    // refused round below is decided by the first three, and rolled back
    // on the last two. (Set before the waiter queued, a loaded machine
    // decided the waiter's own rounds before their requests to nodes 3
    // and 4 went out.)
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
    let lock = waiting
        .await
        .expect("the waiter did not panic")
        .expect("the waiter got the lock");
    lock.release().await.expect("release the waiter's lock");
}
