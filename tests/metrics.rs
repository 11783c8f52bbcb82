//! The documented metrics move as documented, read through a recording
//! recorder. One test function: the recorder is process-global, and each
//! snapshot drains what was recorded since the last.
#![cfg(feature = "metrics")]

mod common;

use std::time::Duration;

use common::recorded::{counter, drain, gauge, matching, samples};
use common::{builder, cluster, resource};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use quorumlock::metric_names::*;
use quorumlock::{Error, Fencing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_for_success_contention_and_loss() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this binary");

    let cluster = cluster(5);
    let manager = builder(cluster.urls())
        .ttl(Duration::from_millis(1_500))
        // timing: the metrics of timed-out requests are counted; 300 ms keeps them short
        .node_timeout(Duration::from_millis(300))
        .fencing(Fencing::Off)
        .build()
        .expect("valid");
    let name = resource("metrics");

    // Success.
    drain(&snapshotter);
    manager
        .lock(&name)
        .await
        .expect("free")
        .release()
        .await
        .expect("release");
    let seen = drain(&snapshotter);
    assert_eq!(counter(&seen, ACQUIRED_TOTAL, &[]), 1);
    assert_eq!(samples(&seen, LOCK_WAIT_SECONDS, &[]), 1);
    assert_eq!(
        samples(&seen, ACQUIRE_ATTEMPT_SECONDS, &[("outcome", "acquired")]),
        1
    );

    // Contention: one attempt, refused.
    let held = manager.lock(&name).await.expect("free");
    drain(&snapshotter);
    assert!(matches!(
        manager.lock(&name).no_wait().await,
        Err(Error::Contended { .. })
    ));
    let seen = drain(&snapshotter);
    assert_eq!(
        counter(&seen, ACQUIRE_FAILED_TOTAL, &[("reason", "contended")]),
        1
    );
    assert_eq!(
        samples(&seen, ACQUIRE_ATTEMPT_SECONDS, &[("outcome", "contended")]),
        1
    );
    assert_eq!(counter(&seen, ACQUIRED_TOTAL, &[]), 0);
    held.release().await.expect("release");

    // Waiting: woken by the release; the wait histogram includes the wait.
    let held = manager.lock(&name).await.expect("free");
    drain(&snapshotter);
    let waiting = tokio::spawn({
        let (manager, name) = (manager.clone(), name.clone());
        async move { manager.lock(&name).wait(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    held.release().await.expect("release");
    let lock = waiting
        .await
        .expect("no panic")
        .expect("woken by the release");
    let seen = drain(&snapshotter);
    assert!(
        counter(&seen, WAIT_WAKEUPS_TOTAL, &[("cause", "notification")]) >= 1,
        "no wake-up by notification recorded"
    );
    let waits: Vec<f64> = matching(&seen, LOCK_WAIT_SECONDS, &[])
        .flat_map(|s| match &s.value {
            DebugValue::Histogram(values) => {
                values.iter().map(|v| v.into_inner()).collect::<Vec<f64>>()
            }
            other => panic!("{LOCK_WAIT_SECONDS} is not a histogram: {other:?}"),
        })
        .collect();
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert!(
        waits[0] >= 0.35,
        "the wait histogram recorded {} s for a wait of over 0.4 s",
        waits[0]
    );
    lock.release().await.expect("release");

    // Woken by the expiry of a crashed holder's keys, then a deadline.
    for url in cluster.urls() {
        let _: () = redis::cmd("SET")
            .arg(quorumlock::internals::lock_key(&name))
            .arg("crashed")
            .arg("PX")
            .arg(500)
            .query(&mut common::connect(&url))
            .expect("SET");
    }
    drain(&snapshotter);
    let lock = manager
        .lock(&name)
        .wait(Duration::from_secs(10))
        .await
        .expect("free once the keys expire");
    let seen = drain(&snapshotter);
    assert!(counter(&seen, WAIT_WAKEUPS_TOTAL, &[("cause", "expiry")]) >= 1);
    let timed_out = manager.lock(&name).wait(Duration::from_millis(300)).await;
    assert!(
        matches!(timed_out, Err(Error::WaitTimedOut { .. })),
        "{timed_out:?}"
    );
    let seen = drain(&snapshotter);
    assert_eq!(
        counter(&seen, ACQUIRE_FAILED_TOTAL, &[("reason", "wait_timed_out")]),
        1
    );
    lock.release().await.expect("release");

    // Extension, then loss: three nodes die under a kept-alive lock.
    drain(&snapshotter);
    let killed = cluster.url(1).expect("url").replace("redis://", "");
    let result = manager
        .lock(&name)
        .run(|_| async {
            // Two extensions, one every 500 ms.
            tokio::time::sleep(Duration::from_millis(1_200)).await;
            for i in [1, 2, 3] {
                cluster.kill(i).expect("kill");
            }
            std::future::pending::<()>().await
        })
        .await;
    assert!(matches!(result, Err(Error::Lost { .. })), "{result:?}");
    let seen = drain(&snapshotter);
    assert!(counter(&seen, EXTENDED_TOTAL, &[]) >= 2);
    assert!(counter(&seen, EXTEND_FAILED_TOTAL, &[]) >= 1);
    let lost = counter(&seen, LOST_TOTAL, &[("reason", "extend_failed")])
        + counter(&seen, LOST_TOTAL, &[("reason", "expired")]);
    assert_eq!(lost, 1);
    assert!(counter(&seen, NODE_ERRORS_TOTAL, &[("node", killed.as_str())]) >= 1);

    // A paused node's requests time out, labelled by node. The lost lock's
    // cleanup found nodes 1-3 dead; after it, nodes are retried once their
    // 100 ms reconnect backoff is over.
    manager.settle().await;
    cluster.restart(1).expect("restart");
    cluster.restart(2).expect("restart");
    tokio::time::sleep(Duration::from_millis(150)).await;
    cluster.pause(4).expect("pause");
    let paused = cluster.url(4).expect("url").replace("redis://", "");
    drain(&snapshotter);
    // Another resource: the lost lock's keys on the restarted nodes live
    // on until their TTL, as they should.
    let lock = manager
        .lock(&resource("metrics-paused"))
        .await
        .expect("quorum up");
    lock.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(500)).await; // stragglers time out
    let seen = drain(&snapshotter);
    assert!(
        counter(
            &seen,
            NODE_ERRORS_TOTAL,
            &[("node", paused.as_str()), ("kind", "timeout")]
        ) >= 1
    );
    cluster.resume(4).expect("resume");

    // A node the guard quarantines (a memory limit with an evicting
    // policy, seen on the next connect): gauge up, transition counted, and
    // its vote is a `quarantined` node error.
    let mut node = common::connect(&cluster.url(0).expect("url"));
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("64mb")
        .query(&mut node)
        .expect("CONFIG SET");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query(&mut node)
        .expect("CONFIG SET");
    let fresh = builder(cluster.urls())
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    drain(&snapshotter);
    // Every node connected and looked at first (a loaded machine's first
    // locks were served by the other four before node 0's look ended).
    fresh.connect().await.expect("four nodes count");
    // Twice: the first lock may go out before the connect-time look at the
    // node has finished (its answer then counts); the second cannot.
    for _ in 0..2 {
        let lock = fresh
            .lock(&resource("metrics-quarantine"))
            .await
            .expect("four nodes count");
        lock.release().await.expect("release");
    }
    let seen = drain(&snapshotter);
    let evicting = cluster.url(0).expect("url").replace("redis://", "");
    let node_label = [("node", evicting.as_str()), ("reason", "eviction")];
    assert_eq!(
        gauge(&seen, NODE_QUARANTINED, &node_label),
        Some(1.0),
        "the quarantine gauge of node 0"
    );
    let entered = [
        ("node", evicting.as_str()),
        ("reason", "eviction"),
        ("to", "entered"),
    ];
    assert_eq!(counter(&seen, QUARANTINE_TRANSITIONS_TOTAL, &entered), 1);
    assert!(
        counter(
            &seen,
            NODE_ERRORS_TOTAL,
            &[("node", evicting.as_str()), ("kind", "quarantined")]
        ) >= 1
    );
}
