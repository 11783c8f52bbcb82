//! Locks under node faults: crashed, paused, restarted, and down at start.
//! Every test runs two clients side by side, one without fencing and one
//! with quorum fencing, the modes in which no single node is needed.
//! (Counter-node fencing needs its counter node; see tests/fencing.rs.)
//! Timing bounds are generous on purpose: the point is "no hang", not speed.

mod common;

use std::time::Duration;

use common::{builder, cluster, resource, stored_value};
use quorumlock::{Error, Fencing, LockManager};
use tokio::time::Instant;

/// Generous, so that a slow disk is never mistaken for a failed node.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// One manager per mode that tolerates any minority of nodes failing.
fn fault_managers(urls: &[String]) -> Vec<LockManager> {
    [Fencing::Off, Fencing::Quorum]
        .into_iter()
        .map(|fencing| {
            builder(urls.to_vec())
                // timing: the helper's 500 ms, with a connect timeout to match, for the faults injected
                .node_timeout(NODE_TIMEOUT)
                .connect_timeout(Duration::from_millis(500))
                .fencing(fencing)
                .build()
                .expect("valid settings")
        })
        .collect()
}

/// Takes and releases a lock `times` times with each manager, returning the
/// slowest acquire.
async fn lock_cycles(managers: &[LockManager], name: &str, times: usize) -> Duration {
    let mut slowest = Duration::ZERO;
    for manager in managers {
        for _ in 0..times {
            let started = Instant::now();
            let lock = manager
                .lock(name)
                .await
                .unwrap_or_else(|e| panic!("a quorum is up ({manager:?}): {e}"));
            slowest = slowest.max(started.elapsed());
            lock.release().await.expect("release");
        }
    }
    slowest
}

#[tokio::test]
async fn two_of_five_killed_locks_still_work() {
    let cluster = cluster(5);
    let managers = fault_managers(&cluster.urls());
    let name = resource("two-down");
    lock_cycles(&managers, &name, 2).await;

    cluster.kill(0).expect("kill");
    cluster.kill(3).expect("kill");
    lock_cycles(&managers, &name, 10).await;
}

#[tokio::test]
async fn three_of_five_killed_is_unavailable_without_hanging() {
    let cluster = cluster(5);
    let managers = fault_managers(&cluster.urls());
    let name = resource("three-down");
    lock_cycles(&managers, &name, 2).await; // connections are established

    for i in [0, 2, 4] {
        cluster.kill(i).expect("kill");
    }
    for manager in &managers {
        let started = Instant::now();
        let result = manager.lock(&name).await;
        let took = started.elapsed();
        match result {
            Err(Error::QuorumUnavailable {
                failed,
                answered,
                needed,
                total,
                errors,
                ..
            }) => {
                assert_eq!((failed, needed, total), (3, 3, 5));
                assert!(answered <= 2, "answered {answered}");
                assert_eq!(errors.len(), 3, "{errors:?}");
            }
            other => panic!("expected QuorumUnavailable, got {other:?}"),
        }
        // attempts × (node_timeout + delay + jitter), plus a wide margin.
        let bound = 3 * (NODE_TIMEOUT + Duration::from_millis(30)) + Duration::from_secs(2);
        assert!(took < bound, "took {took:?}, bound {bound:?}");
    }
}

#[tokio::test]
async fn a_paused_node_costs_no_waiting_and_is_used_again_after_resume() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let managers = fault_managers(&urls);
    let name = resource("paused");
    lock_cycles(&managers, &name, 2).await;

    cluster.pause(1).expect("pause");
    let slowest = lock_cycles(&managers, &name, 10).await;
    let bound = NODE_TIMEOUT + Duration::from_secs(1);
    assert!(
        slowest < bound,
        "slowest acquire {slowest:?}, bound {bound:?}"
    );

    cluster.resume(1).expect("resume");
    for manager in &managers {
        assert!(
            holds_on_node_eventually(manager, &name, &urls[1]).await,
            "the resumed node holds keys again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_paused_nodes_are_tolerated() {
    let cluster = cluster(5);
    let managers = fault_managers(&cluster.urls());
    let name = resource("two-paused");
    cluster.pause(0).expect("pause");
    cluster.pause(4).expect("pause");
    // Also covers connecting to a paused node: the handshake never
    // finishes, and requests still give up at node_timeout.
    let slowest = lock_cycles(&managers, &name, 5).await;
    let bound = NODE_TIMEOUT + Duration::from_secs(1);
    assert!(
        slowest < bound,
        "slowest acquire {slowest:?}, bound {bound:?}"
    );
    cluster.resume(0).expect("resume");
    cluster.resume(4).expect("resume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_reconnected() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let managers = fault_managers(&urls);
    let name = resource("restart");
    lock_cycles(&managers, &name, 2).await;

    cluster.restart(2).expect("restart");
    for manager in &managers {
        assert!(
            holds_on_node_eventually(manager, &name, &urls[2]).await,
            "the restarted node holds keys again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_built_while_two_nodes_are_down_uses_them_once_up() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    cluster.kill(1).expect("kill");
    cluster.kill(3).expect("kill");

    let managers = fault_managers(&urls);
    let name = resource("late-nodes");
    lock_cycles(&managers, &name, 3).await;

    cluster.restart(1).expect("start");
    cluster.restart(3).expect("start");
    for manager in &managers {
        for url in [&urls[1], &urls[3]] {
            assert!(
                holds_on_node_eventually(manager, &name, url).await,
                "{url} is used once it is up"
            );
        }
    }
}

/// Locks repeatedly until a held lock's value shows up on `url`.
async fn holds_on_node_eventually(manager: &LockManager, name: &str, url: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let lock = manager.lock(name).await.expect("a quorum is up");
        let seen = stored_value(url, name).as_deref() == Some(lock.value());
        lock.release().await.expect("release");
        if seen {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// All five nodes stop for 400 ms while `lock()` runs with the default
/// settings (50 ms node timeout, 3 attempts): whatever `lock()` returns,
/// no attempt may leave its keys behind once the nodes are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_paused_during_lock_leaves_no_orphan_keys() {
    let cluster = std::sync::Arc::new(cluster(5));
    let urls = cluster.urls();
    for run in 0..3 {
        // settings: the library's defaults (50 ms, three attempts) are the subject
        let manager = LockManager::builder()
            .nodes(urls.clone())
            .build()
            .expect("defaults are valid");
        let name = resource("all-paused");
        // Warm the connections, as a running service would have them.
        common::reach_every_node(&manager, &urls).await;
        for i in 0..5 {
            cluster.pause(i).expect("pause");
        }
        let resumer = {
            let cluster = std::sync::Arc::clone(&cluster);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(400)).await;
                for i in 0..5 {
                    cluster.resume(i).expect("resume");
                }
            })
        };
        let outcome = manager.lock(&name).await;
        resumer.await.expect("resumed");
        if let Ok(lock) = outcome {
            lock.release().await.ok();
        }
        manager.settle().await;
        let left = || {
            urls.iter()
                .filter_map(|url| stored_value(url, &name).map(|v| (url.clone(), v)))
                .collect::<Vec<_>>()
        };
        // Rollbacks queued behind the SETs run once the nodes resume.
        let clean = common::eventually(Duration::from_secs(2), || left().is_empty()).await;
        assert!(
            clean,
            "run {run}: keys left 2 s after the nodes resumed (10 s TTL, nobody holds the \
             lock): {:?}",
            left()
        );
        let other = fault_managers(&urls).remove(0);
        match other.lock(&name).no_wait().await {
            Ok(lock) => lock.release().await.expect("release"),
            Err(error) => panic!("run {run}: the next client was refused: {error}"),
        }
    }
}

/// A node whose connection stalls (data held, nothing answered, nothing
/// closed) is never needed for a decision while four others answer, so
/// its requests are always stragglers. They must still count as timed
/// out, so that the connection is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_is_replaced_under_extend_only_traffic() {
    // No AOF: the subject is the stalled node, not the others' disks.
    let cluster =
        quorumlock::testkit::TestCluster::start_proxied_with_args(5, &["--appendonly", "no"])
            .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    let manager = common::trust_unpersisted(builder(cluster.urls()))
        .ttl(Duration::from_secs(10))
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    // Every node connected and observed first: the stall begins after.
    let direct: Vec<String> = (0..5)
        .map(|i| cluster.direct_url(i).expect("node"))
        .collect();
    common::reach_every_node(&manager, &direct).await;
    let mut lock = manager.lock(&resource("stall")).await.expect("free");
    let proxy = cluster.proxy(4).expect("proxied");
    let before = proxy.connections_accepted();
    proxy.set_unresponsive(true);
    let started = Instant::now();
    let mut replaced = false;
    while started.elapsed() < Duration::from_secs(5) && !replaced {
        lock.extend(Duration::from_secs(10))
            .await
            .expect("four nodes answer");
        tokio::time::sleep(Duration::from_millis(50)).await;
        replaced = proxy.connections_accepted() > before;
    }
    assert!(
        replaced,
        "the stalled connection to node 4 was never replaced: {} connection(s) accepted in 5 s \
         of extensions, each of which timed out on that node (health now: {:?}; quarantined: {:?})",
        proxy.connections_accepted(),
        manager.health(),
        manager.quarantined_nodes()
    );
    proxy.heal();
    lock.release().await.expect("release");
}

/// For the release tests: keys that outlive a node's restart (20 s TTL),
/// so that only the release's retries remove them there; no fencing.
fn releasing_manager(urls: Vec<String>) -> LockManager {
    builder(urls)
        .ttl(Duration::from_secs(20))
        // timing: the helper's 500 ms (shared with the fault managers)
        .node_timeout(NODE_TIMEOUT)
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings")
}

/// A node that was down when a lock was released, and comes back with the
/// key (AOF), has it deleted once it is up, not after the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_missed_by_a_down_node_is_retried_when_it_returns() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let manager = releasing_manager(urls.clone());
    let name = resource("returning");
    // Connections up first: a straggler whose connection is not ready when
    // the quorum is reached never gets the SET, and with two of them the
    // lock would be on three nodes, two after the kill below.
    common::reach_every_node(&manager, &urls).await;
    let lock = manager.lock(&name).await.expect("free");
    let value = lock.value().to_owned();
    // The lock returns once three nodes said yes; a slow disk may hold the
    // others' SETs back. Killing one of only three holders would leave the
    // release no quorum: wait for a fourth.
    let spread = common::eventually(Duration::from_secs(5), || {
        common::nodes_holding(&urls, &name, &value) >= 4
    })
    .await;
    assert!(
        spread,
        "the lock reached only {} of 5 nodes within 5 s",
        common::nodes_holding(&urls, &name, &value)
    );
    // A node that stored it.
    let node = (0..urls.len())
        .find(|&i| stored_value(&urls[i], &name).as_deref() == Some(value.as_str()))
        .expect("a quorum stores the lock");
    cluster.kill(node).expect("kill");
    lock.release().await.expect("four nodes release");
    cluster.restart(node).expect("restart");
    assert_eq!(
        stored_value(&urls[node], &name).as_deref(),
        Some(value.as_str()),
        "the restarted node {node} replayed our key from its AOF"
    );
    // The release is retried at most a second apart, each on a new
    // connection once the old one is seen broken: a loaded machine took
    // over 5 s to get one through.
    let within = common::scaled(Duration::from_secs(10));
    let deleted = common::eventually(within, || stored_value(&urls[node], &name).is_none()).await;
    assert!(
        deleted,
        "the returning node {node} kept the released lock's key (20 s TTL) for {within:?}: {:?}",
        stored_value(&urls[node], &name)
    );
}

/// The release is decided by four nodes before the fifth answers; the
/// fifth then fails it (its server died with the delete in flight) and
/// comes back with the key from its AOF. The failure came after the
/// decision, so the caller never saw it: the round itself must hand the
/// node to the background retries, or the key outlives the release by a
/// whole TTL (found beside a CPU load, where a killed node's error came
/// after the quorum's answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_fails_on_a_node_after_its_decision_is_retried_there() {
    let cluster = quorumlock::testkit::TestCluster::start_proxied(5)
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    let manager = releasing_manager(cluster.urls());
    let direct: Vec<String> = (0..5)
        .map(|i| cluster.direct_url(i).expect("node"))
        .collect();
    let name = resource("late-failure");
    let lock = common::hold_on_every_node(&manager, &name, &direct).await;
    let value = lock.value().to_owned();
    // Node 4's delete is held in the network while the others decide.
    let late = cluster.proxy(4).expect("proxied");
    late.set_unresponsive(true);
    lock.release().await.expect("four nodes release");
    assert_eq!(
        stored_value(&direct[4], &name).as_deref(),
        Some(value.as_str()),
        "node 4 was cut off, yet its key went with the release"
    );
    // Its server dies with the delete unanswered (the held bytes go with
    // the connections), and comes back with the key.
    cluster.kill(4).expect("kill");
    late.drop_connections();
    cluster.restart(4).expect("restart");
    late.heal();
    assert_eq!(
        stored_value(&direct[4], &name).as_deref(),
        Some(value.as_str()),
        "the restarted node 4 replayed our key from its AOF"
    );
    let within = common::scaled(Duration::from_secs(10));
    let deleted = common::eventually(within, || stored_value(&direct[4], &name).is_none()).await;
    assert!(
        deleted,
        "node 4 kept the released lock's key (20 s TTL) for {within:?} after it came back: {:?}",
        stored_value(&direct[4], &name)
    );
}

/// A repairing extension goes out on a newer connection than the lock's
/// SET (the node restarted without persistence: the SET's connection is
/// dead), is held up in the network, and that connection is replaced
/// (three timeouts) before the release, which then goes on a third one.
/// The release must also go behind the held-up repairs, on their own
/// connection: otherwise they land after it and put the key back, an
/// orphan for a TTL that nobody holds and nobody releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_goes_behind_a_repair_sent_on_a_connection_replaced_since() {
    let cluster =
        quorumlock::testkit::TestCluster::start_proxied_with_args(5, &["--appendonly", "no"])
            .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    let manager = common::trust_unpersisted(builder(cluster.urls()))
        .ttl(Duration::from_secs(4))
        // timing: 300 ms lets the test replace a connection within one 4 s TTL
        .node_timeout(Duration::from_millis(300))
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    let name = resource("repair-replaced");
    let mut lock = manager.lock(&name).await.expect("free");
    let node_4 = cluster.direct_url(4).expect("node");
    // Node 4 comes back empty; an extension puts the key back there, on a
    // new connection.
    cluster.restart(4).expect("restart");
    let mut repaired = false;
    let until = Instant::now() + Duration::from_secs(3);
    while !repaired && Instant::now() < until {
        let _ = lock.extend(Duration::from_secs(4)).await;
        repaired = stored_value(&node_4, &name).as_deref() == Some(lock.value());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(repaired, "no extension put the key back on node 4");
    // Requests to node 4 now take 2 s: repairing extensions time out
    // there, and after three misses its connection is replaced (seen as a
    // new connection at the proxy, opened by the next request). Under a
    // busy CPU a miss may be counted late, or the guard may stop counting
    // the node first (its clock goes unsampled) and then the misses are
    // its background observations', one per clock interval: extend until
    // the connection is replaced, within a bound.
    let proxy = cluster.proxy(4).expect("proxied");
    let before = proxy.connections_accepted();
    proxy.set_latency_to_node(quorumlock::testkit::Delay::fixed(Duration::from_secs(2)));
    let mut slow_extensions = 0;
    let until = Instant::now() + common::scaled(Duration::from_secs(10));
    while proxy.connections_accepted() == before && Instant::now() < until {
        lock.extend(Duration::from_secs(4))
            .await
            .expect("four nodes answer");
        slow_extensions += 1;
        tokio::time::sleep(Duration::from_millis(350)).await;
    }
    assert!(
        proxy.connections_accepted() > before,
        "node 4's slow connection was not replaced within {:?} ({slow_extensions} extensions, \
         each of them slow there or skipped): {} connection(s) accepted, {before} before",
        common::scaled(Duration::from_secs(10)),
        proxy.connections_accepted()
    );
    proxy.heal();
    // The delete of node 4's key, by hand: the held-up repairs must find it
    // missing, as they would after a fast release.
    let _: i64 = redis::cmd("DEL")
        .arg(quorumlock::internals::lock_key(&name))
        .query(&mut common::connect(&node_4))
        .expect("DEL");
    lock.release().await.expect("released");
    // The held-up repairs arrive now; the release behind them too.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        common::lock_entry(&node_4, &name),
        None,
        "a repair sent before the release landed after it: an orphan key on node 4"
    );
}
