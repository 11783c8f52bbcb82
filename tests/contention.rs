//! Many clients, one resource: the lock must serialise a critical section
//! that would visibly break if two of them ever ran it at once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{builder, healthy_nodes, resource};

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
