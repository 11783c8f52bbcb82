//! A failover inside a member that is a Redis Cluster is an unsafe
//! restart. The recipe: the shard master's link to its replica is cut
//! (`CLIENT KILL TYPE replica`, its reconnect refused), a lock is granted
//! by a bare majority that includes that master (the third member
//! refuses: briefly held by another), and the replica takes over at once
//! (`CLUSTER FAILOVER TAKEOVER`) without the lock key. With the node guard off a
//! second client is granted the held lock (the test bites); with it on,
//! the promoted replica is quarantined and the second client is refused.

mod common;

use std::time::{Duration, Instant};

use quorumlock::internals::{KeyKind, key_of};
use quorumlock::testkit::{ClusterMember, TestCluster};
use quorumlock::{Fencing, LockManager, NodeGuard};

use common::cluster::{names_master, port_of, query, replica_of, replication};

fn manager(urls: &[String], guarded: bool) -> LockManager {
    let builder = common::builder(urls.to_vec())
        .ttl(Duration::from_secs(20))
        .fencing(Fencing::Off);
    let builder = if guarded {
        builder
    } else {
        builder.node_guard(NodeGuard::disabled())
    };
    builder.build().expect("valid settings")
}

/// Whether a second client got the lock that the first still held,
/// after the failover recipe on a cluster member; the guard on or off.
async fn second_holder_after_failover(guarded: bool) -> bool {
    let member = ClusterMember::start(3, 1).expect("a 3-shard cluster with replicas");
    let standalone = TestCluster::start(2).expect("two standalone nodes");
    let mut urls = vec![member.url().expect("a URL")];
    urls.extend(standalone.urls());
    let first = manager(&urls, guarded);
    first
        .lock("warm-up")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");

    let resource = "failover:1";
    let key = key_of(KeyKind::Lock, resource);
    let master = member.master_of(&key).expect("a master");
    let replica = replica_of(&member, &master);
    // A bare majority: the last standalone node is held for a moment by
    // someone else, and refuses.
    let last = standalone.urls()[1].clone();
    let _: () = query(
        &last,
        redis::cmd("SET")
            .arg(&key)
            .arg("someone-else")
            .arg("PX")
            .arg(300),
    );
    // The replica's link is cut, and stays cut (its reconnect fails to
    // authenticate), so the grant below never reaches it.
    let _: () = query(
        &replica,
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("masterauth")
            .arg("wrong"),
    );
    let killed: i64 = query(
        &master,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
    );
    assert_eq!(killed, 1, "the master had {killed} replica links");
    let held = first
        .lock(resource)
        .no_wait()
        .await
        .expect("granted by the cluster member and one standalone node");
    let _: () = query(
        &replica,
        redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !replication(&replica).contains("role:master") {
        assert!(Instant::now() < deadline, "the replica did not take over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every node of the member names the new master (the client reads
    // the map from whichever node answers first).
    let slot = quorumlock::internals::slot(&key);
    let port = port_of(&replica);
    for url in member.nodes().urls() {
        while !names_master(&url, slot, port) {
            assert!(
                Instant::now() < deadline,
                "{url} never learned of the takeover"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let lost: Option<String> = query(&replica, redis::cmd("GET").arg(&key));
    assert_eq!(
        lost, None,
        "the recipe did not lose the key: the replica had it when it took over"
    );

    while query::<Option<String>>(&last, redis::cmd("GET").arg(&key)).is_some() {
        assert!(
            Instant::now() < deadline,
            "the other holder's key did not expire"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = manager(&urls, guarded);
    let outcome = second.lock(resource).no_wait().await;
    assert!(held.is_valid(), "the first lock ran out during the test");
    let overlapped = outcome.is_ok();
    eprintln!(
        "guard {}: the second client: {outcome:?}",
        if guarded { "on" } else { "off" }
    );
    if let Ok(lock) = outcome {
        lock.release().await.expect("release");
    } else if guarded {
        let quarantined = second.quarantined_nodes();
        assert!(
            quarantined
                .iter()
                .any(|(_, why)| why.to_string().contains("promoted replica")),
            "refused ({outcome:?}), but no node is quarantined as promoted: {quarantined:?}"
        );
    }
    held.release().await.ok();
    overlapped
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_shard_replica_is_not_counted() {
    assert!(
        second_holder_after_failover(false).await,
        "with the guard off the recipe should let a second holder in (else it tests nothing)"
    );
    assert!(
        !second_holder_after_failover(true).await,
        "with the guard on a second client was granted a held lock after a failover"
    );
}
