//! Runtime lifecycle: a manager outlives the tokio runtimes it is used in.
//! Connections opened, connects started and locks held in a runtime that
//! shuts down must not break the manager in the next runtime, nor leave
//! keys behind, nor make `settle()` wait forever.

mod common;

use std::time::Duration;

use common::{
    SETTLE_LIMIT, builder, direct_urls, lock_entries, nothing_left, resource, trust_unpersisted,
};
use quorumlock::testkit::{Delay, TestCluster};
use quorumlock::{Fencing, LockManager};

const NODE_TIMEOUT: Duration = Duration::from_millis(250);

fn proxied() -> TestCluster {
    TestCluster::start_proxied_with_args(5, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"))
}

fn manager(cluster: &TestCluster) -> LockManager {
    trust_unpersisted(builder(cluster.urls()))
        .ttl(Duration::from_secs(10))
        // timing: rounds through delayed proxies; 250 ms rides out a slow disk
        .node_timeout(NODE_TIMEOUT)
        .fencing(Fencing::CounterNode { node: 0 })
        .build()
        .expect("valid settings")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Twenty lock + release round trips in a fresh runtime; all must work.
fn works_in_a_new_runtime(manager: &LockManager, context: &str) {
    runtime().block_on(async {
        let mut failures = Vec::new();
        for i in 0..20 {
            let name = resource("lifecycle-next");
            match manager.lock(&name).await {
                Ok(lock) => {
                    if let Err(e) = lock.release().await {
                        failures.push(format!("release {i}: {e}"));
                    }
                }
                Err(e) => failures.push(format!("lock {i}: {e}")),
            }
        }
        assert!(
            failures.is_empty(),
            "{context}: {} of 20 lock+release calls failed in the next runtime: {failures:?}",
            failures.len()
        );
        assert_settles(manager, context).await;
    });
}

async fn assert_settles(manager: &LockManager, context: &str) {
    tokio::time::timeout(SETTLE_LIMIT, manager.settle())
        .await
        .unwrap_or_else(|_| panic!("{context}: settle() still waiting after {SETTLE_LIMIT:?}"));
}

#[test]
fn a_connect_cut_off_by_runtime_shutdown_heals_in_the_next_runtime() {
    let cluster = proxied();
    let manager = manager(&cluster);
    // The counter node holds the connect's handshake; the first runtime
    // gives up on the lock and is dropped with the connect in flight.
    cluster.proxy(0).expect("proxied").set_unresponsive(true);
    runtime().block_on(async {
        let name = resource("lifecycle-connect");
        let attempt = manager.lock(&name).no_wait();
        let _ = tokio::time::timeout(Duration::from_millis(100), attempt).await;
    });
    cluster.proxy(0).expect("proxied").heal();
    works_in_a_new_runtime(&manager, "connect cut off");
}

#[test]
fn connections_of_a_dropped_runtime_are_replaced() {
    let cluster = proxied();
    let direct = direct_urls(&cluster);
    let manager = manager(&cluster);
    let name = resource("lifecycle-request");
    // Open every connection in a first runtime, then drop that runtime
    // while an acquisition is in flight on them.
    runtime().block_on(async {
        let warm = manager.lock(&resource("warm")).await.expect("lock");
        warm.release().await.expect("release");
        manager.settle().await;
        let slow = Delay::fixed(Duration::from_millis(150));
        for i in 0..cluster.len() {
            cluster.proxy(i).expect("proxied").set_latency(slow);
        }
        let manager = manager.clone();
        let name = name.clone();
        tokio::spawn(async move { manager.lock(&name).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
    });
    for i in 0..cluster.len() {
        cluster.proxy(i).expect("proxied").heal();
    }
    // The dropped attempt's SETs are still in the proxies: let them land.
    std::thread::sleep(Duration::from_millis(400));
    works_in_a_new_runtime(&manager, "connections from a dropped runtime");
    runtime().block_on(async {
        assert_settles(&manager, "after the dropped attempt").await;
    });
    assert!(
        nothing_left(&direct, &name),
        "the attempt dropped with its runtime left keys behind after settle(): {:?}",
        lock_entries(&direct, &name)
    );
}

#[test]
fn locks_held_by_tasks_of_a_runtime_that_shuts_down_are_released() {
    let cluster = proxied();
    let direct = direct_urls(&cluster);
    let manager = manager(&cluster);
    let (plain, kept) = (resource("lifecycle-held"), resource("lifecycle-kept"));
    let first = runtime();
    first.block_on(async {
        let lock = manager.lock(&plain).await.expect("free");
        let keep = manager
            .lock(&kept)
            .await
            .expect("free")
            .keep_alive()
            .expect("runtime");
        tokio::spawn(async move {
            let _held = (lock, keep);
            std::future::pending::<()>().await
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
    });
    // Shutting down drops the task, and with it the lock and the watchdog.
    drop(first);
    runtime().block_on(async {
        assert_settles(&manager, "after the runtime shut down").await;
    });
    for name in [&plain, &kept] {
        assert!(
            nothing_left(&direct, name),
            "a lock held by a task of the dropped runtime was not released by settle() in the \
             next runtime (10 s TTL): {:?}",
            lock_entries(&direct, name)
        );
    }
    works_in_a_new_runtime(&manager, "after a holder's runtime shut down");
}

#[test]
fn one_manager_serves_runtime_after_runtime() {
    let cluster = proxied();
    let manager = manager(&cluster);
    for round in 0..4 {
        // Each runtime ends with a lock still being acquired on a slow node.
        let slow = Delay::fixed(Duration::from_millis(30));
        cluster.proxy(round % 5).expect("proxied").set_latency(slow);
        runtime().block_on(async {
            let lock = manager.lock(&resource("serial")).await.expect("lock");
            lock.release().await.expect("release");
            let name = resource("serial-cut");
            let attempt = manager.lock(&name);
            let _ = tokio::time::timeout(Duration::from_millis(5), attempt).await;
        });
        cluster.proxy(round % 5).expect("proxied").heal();
        works_in_a_new_runtime(&manager, &format!("runtime {round}"));
    }
}

/// A lock taken on one runtime is dropped on a thread that entered that
/// runtime's handle after the runtime shut down (as a `spawn_blocking`
/// closure or a sync helper thread outliving `shutdown_timeout` does).
/// docs/guarantees.md: such a lock "is released by the manager's next `settle()`
/// or acquisition". The cleanup job is now polled once in place before it
/// is spawned; that poll must not panic in the dropping thread.
#[test]
fn a_lock_dropped_after_its_runtime_shut_down_does_not_panic() {
    let cluster = common::cluster(3);
    let urls = cluster.urls();
    let name = resource("after-shutdown");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let manager = rt.block_on(async { builder(urls.clone()).build().expect("valid") });
    let lock = rt
        .block_on(manager.lock(&name).into_future())
        .expect("free");
    let handle = rt.handle().clone();
    rt.shutdown_timeout(Duration::from_millis(100));
    let dropper = std::thread::spawn(move || {
        let _entered = handle.enter();
        drop(lock);
    });
    let joined = dropper.join();
    let panic = joined.as_ref().err().map(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default()
    });
    // And the manager's next settle() on another runtime releases it.
    let rt2 = tokio::runtime::Runtime::new().expect("runtime");
    rt2.block_on(manager.settle());
    let released = rt2.block_on(common::eventually(Duration::from_secs(3), || {
        common::nothing_left(&urls, &name)
    }));
    assert!(
        panic.is_none(),
        "dropping a Lock on a thread inside a shut-down runtime's context panicked: {panic:?} \
         (released afterwards by settle(): {released})"
    );
    assert!(
        released,
        "the dropped lock was released by the next settle()"
    );
}
