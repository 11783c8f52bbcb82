//! `health()` moves healthy → degraded → unavailable → healthy as nodes
//! are killed and restarted, the change feed says so in that order, and
//! the gauges follow. One test function: the metrics recorder is
//! process-global.
#![cfg(feature = "metrics")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::recorded::{counter, drain, gauge};
use common::{builder, cluster, resource, trust_unpersisted};
use metrics_util::debugging::DebuggingRecorder;
use quorumlock::health::NodeStatus;
use quorumlock::metric_names::{
    BREAKER_OPEN, BREAKER_REJECTED_TOTAL, CONSECUTIVE_UNAVAILABLE, FALLBACK_TOTAL, HEALTH_STATE,
    NODES_UP, UNAVAILABLE_RETRIES_TOTAL,
};
use quorumlock::{Backoff, CircuitBreaker, Error, Fencing, HealthState, LockManager};

/// Takes and releases a lock, so that every node sees a request.
async fn touch(manager: &LockManager) -> bool {
    match manager.lock(&resource("health")).no_wait().await {
        Ok(lock) => lock.release().await.is_ok(),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_nodes_and_the_feed_and_gauges_say_so() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this binary");
    let cluster = cluster(5);
    let manager = trust_unpersisted(builder(cluster.urls()))
        // timing: the health states follow timed-out requests; 300 ms keeps the test's outages short
        .node_timeout(Duration::from_millis(300))
        .fencing(Fencing::Quorum)
        .build()
        .expect("valid");
    // Before any traffic nothing is known: not "healthy" (a service that
    // checks its health at start-up must not read that before any
    // connection exists).
    let health = manager.health();
    assert_eq!(
        (health.state, health.nodes_up, health.quorum),
        (HealthState::Unknown, 0, 3),
        "before any traffic: {health:?}"
    );
    assert!(
        health
            .nodes
            .iter()
            .all(|n| n.status == NodeStatus::NotAsked),
        "before any traffic: {health:?}"
    );

    // Every state the feed publishes, in order.
    let seen = Arc::new(Mutex::new(vec![health.state]));
    let mut feed = manager.health_changes();
    let recorder_task = tokio::spawn({
        let seen = Arc::clone(&seen);
        async move {
            while feed.changed().await.is_ok() {
                let state = feed.borrow_and_update().state;
                let mut seen = seen.lock().unwrap();
                if seen.last() != Some(&state) {
                    seen.push(state);
                }
            }
        }
    });
    let gauges = |snapshotter: &metrics_util::debugging::Snapshotter| {
        let series = drain(snapshotter);
        (
            gauge(&series, HEALTH_STATE, &[]),
            gauge(&series, NODES_UP, &[]),
            gauge(&series, CONSECUTIVE_UNAVAILABLE, &[]),
        )
    };

    assert!(touch(&manager).await, "five healthy nodes");
    // The lock is decided at a quorum: the last replies may come after.
    manager.settle().await;
    assert_eq!(manager.health().state, HealthState::Healthy);

    // One node down: degraded, locks still served.
    cluster.kill(4).expect("kill");
    assert!(touch(&manager).await, "four nodes serve locks");
    // A quorum may be decided before the dead node's error is in.
    let seen_down =
        common::eventually(Duration::from_secs(5), || manager.health().nodes_up == 4).await;
    assert!(
        seen_down,
        "node 4's failure never seen: {:?}",
        manager.health()
    );
    let health = manager.health();
    assert_eq!(
        (health.state, health.nodes_up),
        (HealthState::Degraded, 4),
        "{health:?}"
    );
    assert_eq!(health.nodes[4].status, NodeStatus::Failing, "{health:?}");
    let (state, up, _) = gauges(&snapshotter);
    assert_eq!((state, up), (Some(1.0), Some(4.0)), "gauges when degraded");

    // Three down: unavailable, and the attempts in a row are counted.
    cluster.kill(3).expect("kill");
    cluster.kill(2).expect("kill");
    assert!(!touch(&manager).await, "two of five nodes cannot lock");
    let health = manager.health();
    assert_eq!(
        (health.state, health.nodes_up),
        (HealthState::Unavailable, 2),
        "{health:?}"
    );
    assert!(health.consecutive_unavailable >= 1, "{health:?}");
    let (state, up, consecutive) = gauges(&snapshotter);
    assert_eq!(
        (state, up),
        (Some(2.0), Some(2.0)),
        "gauges when unavailable"
    );
    assert!(
        consecutive >= Some(1.0),
        "consecutive gauge {consecutive:?}"
    );

    // While down: `lock()` retries on its backoff (two steps in the test
    // settings), a fallback runs and is counted, and an open breaker
    // fails calls and counts them.
    let result = manager.lock(&resource("health-retried")).await;
    assert!(
        result.as_ref().is_err_and(|e| e.is_unavailable()),
        "{result:?}"
    );
    let ran = manager
        .lock(&resource("health-fallback"))
        .run_or_fallback(|_| async { 1 }, || async { 2 })
        .await
        .expect("the fallback runs");
    assert!(ran.is_fallback(), "{ran:?}");
    let eager = trust_unpersisted(builder(cluster.urls()))
        // timing: as above, the fallback runs after timed-out attempts
        .node_timeout(Duration::from_millis(300))
        .fencing(Fencing::Quorum)
        .unavailable_retry(Backoff::none())
        .circuit_breaker(CircuitBreaker::default().failures(1))
        .build()
        .expect("valid");
    let first = eager.lock(&resource("health-breaker")).no_wait().await;
    assert!(
        first.as_ref().is_err_and(|e| e.is_unavailable()),
        "{first:?}"
    );
    let second = eager.lock(&resource("health-breaker")).no_wait().await;
    assert!(
        matches!(second, Err(Error::CircuitOpen { .. })),
        "{second:?}"
    );
    let series = drain(&snapshotter);
    // Two retries by `lock()`, two by the fallback's `lock()`.
    assert_eq!(counter(&series, UNAVAILABLE_RETRIES_TOTAL, &[]), 4);
    assert_eq!(
        counter(&series, FALLBACK_TOTAL, &[("reason", "quorum_unavailable")]),
        1
    );
    assert_eq!(counter(&series, BREAKER_REJECTED_TOTAL, &[]), 1);
    assert_eq!(gauge(&series, BREAKER_OPEN, &[]), Some(1.0));
    drop(eager);

    // Back: healthy once traffic has reached every node again.
    for i in 2..5 {
        cluster.restart(i).expect("restart");
    }
    let recovered = common::eventually_async(Duration::from_secs(10), || async {
        touch(&manager).await && manager.health().state == HealthState::Healthy
    })
    .await;
    assert!(recovered, "not healthy again: {:?}", manager.health());
    let health = manager.health();
    assert_eq!(
        (health.nodes_up, health.consecutive_unavailable),
        (5, 0),
        "{health:?}"
    );
    // The end of a quarantine window (the restarted nodes') reaches the
    // gauges by a timer, a moment after `health()` sees it.
    let mut last = None;
    let settled = common::eventually(Duration::from_secs(2), || {
        let seen = gauges(&snapshotter);
        last = Some(seen);
        seen == (Some(0.0), Some(5.0), Some(0.0))
    })
    .await;
    assert!(
        settled,
        "gauges when healthy again: (state, up, in a row) {last:?}, health {:?}",
        manager.health()
    );

    // The feed's last word reaches the recorder task.
    common::eventually(Duration::from_secs(5), || {
        seen.lock().unwrap().last() == Some(&HealthState::Healthy)
    })
    .await;
    recorder_task.abort();
    let seen = seen.lock().unwrap().clone();
    let wanted = [
        HealthState::Unknown,
        HealthState::Healthy,
        HealthState::Degraded,
        HealthState::Unavailable,
        HealthState::Healthy,
    ];
    let mut rest = seen.iter();
    for state in wanted {
        assert!(
            rest.any(|s| *s == state),
            "the feed published {seen:?}, not {wanted:?} in this order"
        );
    }
}
