//! `LockManager::connect`: the connections a first request would open, and
//! the guard's first look at each node, done at startup, so that a deploy's
//! first lock does not spend its `node_timeout` connecting; and the nodes
//! that could not serve, named, when too few can.

mod common;

use std::time::Duration;

use quorumlock::health::NodeStatus;
use quorumlock::{Error, HealthState, NodeErrorKind};
use tokio::time::Instant;

/// Connections each node serves now (its `CLIENT LIST`), asked over
/// `probes`, which stay open (counted in each).
fn clients_of(probes: &mut [redis::Connection]) -> Vec<usize> {
    probes
        .iter_mut()
        .map(|probe| {
            let listed: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query(probe)
                .expect("CLIENT LIST");
            listed.lines().count()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_opens_every_nodes_connections_before_the_first_request() {
    let cluster = common::cluster(5);
    let urls = cluster.urls();
    let mut probes: Vec<_> = urls.iter().map(|url| common::connect(url)).collect();
    let before = clients_of(&mut probes);
    let manager = common::with_defaults(urls.clone());
    assert_eq!(manager.health().state, HealthState::Unknown);

    let health = manager.connect().await.expect("five healthy nodes");
    assert_eq!(
        (health.state, health.nodes_up),
        (HealthState::Healthy, 5),
        "{health:?}"
    );
    let after = clients_of(&mut probes);
    for (i, (before, after)) in before.iter().zip(&after).enumerate() {
        assert!(
            after > before,
            "node {i}: {before} clients before connect, {after} after: no connection opened"
        );
    }
    // The first lock finds them open: no new connection.
    manager
        .lock(&common::resource("first"))
        .no_wait()
        .await
        .expect("the first lock")
        .release()
        .await
        .expect("release");
    let then = clients_of(&mut probes);
    assert_eq!(then, after, "the first lock opened connections of its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_names_the_nodes_down_and_fails_only_without_a_quorum() {
    let cluster = common::cluster(5);
    // Node 0 (the counter node of the defaults) is one of them.
    cluster.kill(0).expect("kill");
    cluster.kill(3).expect("kill");
    let manager = common::with_defaults(cluster.urls());
    let health = manager.connect().await.expect("three of five serve");
    assert_eq!(
        (health.state, health.nodes_up),
        (HealthState::Degraded, 3),
        "{health:?}"
    );
    let failing: Vec<usize> = health
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, node)| node.status == NodeStatus::Failing)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(failing, [0, 3], "{health:?}");
    manager
        .lock(&common::resource("degraded"))
        .no_wait()
        .await
        .expect("a quorum serves without node 0")
        .release()
        .await
        .expect("release");

    cluster.kill(4).expect("kill");
    let fresh = common::with_defaults(cluster.urls());
    let started = Instant::now();
    let error = fresh.connect().await.expect_err("two of five cannot serve");
    let took = started.elapsed();
    match &error {
        Error::QuorumUnavailable {
            resource,
            failed,
            needed,
            errors,
            ..
        } => {
            assert_eq!((resource.as_str(), *failed, *needed), ("(connect)", 3, 3));
            assert!(
                errors
                    .iter()
                    .all(|e| matches!(e.kind, NodeErrorKind::Connect(_))),
                "{error}"
            );
        }
        other => panic!("expected QuorumUnavailable, got {other:?}"),
    }
    // Refused connects fail at once; the bound is the connect's own.
    assert!(
        took < common::scaled(Duration::from_secs(2)),
        "connect took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_reaches_every_master_of_a_cluster_member() {
    let member = quorumlock::testkit::ClusterMember::start(3, 0).expect("a 3-master cluster");
    let masters = member.nodes().urls();
    let mut probes: Vec<_> = masters.iter().map(|url| common::connect(url)).collect();
    let before = clients_of(&mut probes);
    let manager = common::with_defaults(vec![member.url().expect("the member's URL")]);
    let health = manager.connect().await.expect("the member serves");
    assert_eq!(health.state, HealthState::Healthy, "{health:?}");
    let after = clients_of(&mut probes);
    for (i, (before, after)) in before.iter().zip(&after).enumerate() {
        assert!(
            after > before,
            "master {i}: {before} clients before connect, {after} after: no connection opened"
        );
    }
}
