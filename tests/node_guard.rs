//! The node guard on real nodes: restarts without fsync, clocks that run
//! fast or jump (through the testkit's clock shim), evicting and replica
//! nodes are not counted toward a quorum; extensions put a key back on a
//! node that lost it; and the live counterpart of the simulation's
//! negative control: three of five clocks at 2× let contending clients
//! overlap without the guard, and never with it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{builder, quarantine_labels, resource, stored_value};
use quorumlock::guard::QuarantineReason;
use quorumlock::testkit::{ClusterOptions, TestCluster};
use quorumlock::{ClockCheck, Error, Fencing, LockManager, NodeGuard};
use tokio::time::Instant;

fn cluster(options: ClusterOptions) -> TestCluster {
    TestCluster::start_with(5, &options).unwrap_or_else(|e| panic!("cannot start a cluster: {e}"))
}

fn fake_clocks() -> TestCluster {
    cluster(ClusterOptions {
        fake_clocks: true,
        ..ClusterOptions::default()
    })
}

/// The reason label node `i` is quarantined for, if it is.
fn quarantine_of(manager: &LockManager, cluster: &TestCluster, i: usize) -> Option<&'static str> {
    let name = cluster.url(i).expect("node").replace("redis://", "");
    manager
        .quarantined_nodes()
        .into_iter()
        .find(|(node, _)| *node == name)
        .map(|(_, quarantine)| quarantine.reason.label())
}

/// Lock-and-release traffic (errors allowed) until `done` or `limit`;
/// returns how long it took, or `None`.
async fn traffic_until(
    manager: &LockManager,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> Option<Duration> {
    let started = Instant::now();
    let name = resource("guard-traffic");
    while started.elapsed() < limit {
        if let Ok(lock) = manager.lock(&name).no_wait().await {
            let _ = lock.release().await;
        }
        if done() {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_fsync_always_is_not_counted_for_the_window() {
    let window = Duration::from_secs(2);
    let cluster = cluster(ClusterOptions {
        extra_args: vec!["--appendfsync".into(), "everysec".into()],
        ..ClusterOptions::default()
    });
    // Met after they have run for the window: counted at once.
    tokio::time::sleep(window + Duration::from_millis(1100)).await;
    let manager = builder(cluster.urls())
        .ttl(window)
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    let first = manager
        .lock(&resource("guard-restart"))
        .await
        .expect("free");
    assert!(
        manager.quarantined_nodes().is_empty(),
        "{:?}",
        manager.quarantined_nodes()
    );
    first.release().await.expect("release");

    cluster.restart(1).expect("restart");
    let restarted = Instant::now();
    let seen = traffic_until(&manager, Duration::from_secs(1), || {
        quarantine_of(&manager, &cluster, 1) == Some("restart")
    })
    .await;
    assert!(
        seen.is_some(),
        "node 1 was not quarantined after its restart: {:?}",
        manager.quarantined_nodes()
    );
    // Not counted: with two others down, no quorum, and the error says why.
    cluster.kill(3).expect("kill");
    cluster.kill(4).expect("kill");
    let refused = manager.lock(&resource("guard-restart")).no_wait().await;
    match &refused {
        Err(error) => assert_eq!(quarantine_labels(error), ["restart"], "{error}"),
        Ok(lock) => panic!("a quorum counted the restarted node: {lock:?}"),
    }
    // Counted again once it has run for the window.
    let lock = loop {
        match manager.lock(&resource("guard-restart")).no_wait().await {
            Ok(lock) => break lock,
            Err(error) if restarted.elapsed() < window + Duration::from_secs(3) => {
                assert!(
                    !quarantine_labels(&error).is_empty() || restarted.elapsed() > window,
                    "{error}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("node 1 was never counted again: {error}"),
        }
    };
    let counted_after = restarted.elapsed();
    assert!(
        counted_after >= window - Duration::from_millis(50),
        "counted again {counted_after:?} after its restart, before the {window:?} window"
    );
    assert_eq!(
        stored_value(&cluster.url(1).expect("node"), lock.resource()).as_deref(),
        Some(lock.value()),
        "the lock is on node 1 again"
    );
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_fsync_always_is_counted_at_once() {
    let cluster = common::cluster(5);
    let manager = builder(cluster.urls())
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    // To meet the nodes, until each counts (a node's clock counts once
    // its rate is measured: on a loaded machine, after a later reading).
    let met = common::eventually_async(common::scaled(Duration::from_secs(5)), || async {
        drop(manager.lock(&resource("guard-always")).await);
        manager.quarantined_nodes().is_empty()
    })
    .await;
    assert!(
        met,
        "setup: nodes not counted: {:?}",
        manager.quarantined_nodes()
    );
    cluster.restart(1).expect("restart");
    cluster.kill(3).expect("kill");
    cluster.kill(4).expect("kill");
    // The first request finds the old connection broken; then node 1,
    // reconnected, must count at once.
    let lock = loop {
        match manager.lock(&resource("guard-always")).no_wait().await {
            Ok(lock) => break lock,
            Err(error) => {
                assert!(quarantine_labels(&error).is_empty(), "quarantined: {error}");
            }
        }
    };
    assert!(manager.quarantined_nodes().is_empty());
    lock.release().await.expect("release");
}

/// Detection of a clock fault on node 2 under steady traffic, then its
/// recovery a window after the clock is sane again.
async fn clock_fault_is_seen(
    check: ClockCheck,
    fault: impl FnOnce(&TestCluster),
    label: &str,
) -> Duration {
    let cluster = fake_clocks();
    let window = Duration::from_millis(1000);
    let manager = builder(cluster.urls())
        .ttl(window)
        .fencing(Fencing::Off)
        .node_guard(
            NodeGuard::default()
                .clock_interval(Duration::from_millis(50))
                .clock_check(check),
        )
        .build()
        .expect("valid settings");
    let warm = traffic_until(&manager, Duration::from_millis(300), || false).await;
    assert!(warm.is_none());
    assert!(
        manager.quarantined_nodes().is_empty(),
        "{:?}",
        manager.quarantined_nodes()
    );
    fault(&cluster);
    let detected = traffic_until(&manager, Duration::from_secs(2), || {
        quarantine_of(&manager, &cluster, 2).is_some()
    })
    .await
    .unwrap_or_else(|| panic!("the {label} on node 2 was not detected within 2 s"));
    assert_eq!(quarantine_of(&manager, &cluster, 2), Some(label));
    // Sane again (a step is over at once; a rate is set back): counted
    // again a window later, not before.
    cluster.set_clock_rate(2, 1.0).expect("rate");
    let sane = Instant::now();
    let back = traffic_until(&manager, window * 3, || {
        quarantine_of(&manager, &cluster, 2).is_none()
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "node 2 was still quarantined {:?} after its clock was sane",
            window * 3
        )
    });
    assert!(
        back + Duration::from_millis(100) >= window,
        "counted again {back:?} after the clock was sane, within the {window:?} window ({:?})",
        sane.elapsed()
    );
    detected
}

/// Node 2's clock jumps 10 s ahead.
fn step_node_2(cluster: &TestCluster) {
    cluster
        .step_clock(2, Duration::from_secs(10), true)
        .expect("step");
}

/// Node 2's clock runs at twice the speed.
fn double_node_2_rate(cluster: &TestCluster) {
    cluster.set_clock_rate(2, 2.0).expect("rate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_runs_at_twice_the_speed_is_quarantined() {
    let detected =
        clock_fault_is_seen(ClockCheck::EveryRequest, double_node_2_rate, "clock_rate").await;
    eprintln!("node_guard: 2x clock detected after {detected:?} of traffic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_step_is_quarantined() {
    let detected = clock_fault_is_seen(ClockCheck::EveryRequest, step_node_2, "clock_step").await;
    eprintln!("node_guard: +10 s step detected after {detected:?} of traffic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_clock_checks_still_quarantine_a_step_and_a_fast_clock() {
    let step = clock_fault_is_seen(ClockCheck::Sampled, step_node_2, "clock_step").await;
    let rate = clock_fault_is_seen(ClockCheck::Sampled, double_node_2_rate, "clock_rate").await;
    eprintln!(
        "node_guard: sampled checks saw a +10 s step after {step:?} and a 2x clock after {rate:?}"
    );
}

/// `TIME` calls node 0 has run so far.
fn time_calls(cluster: &TestCluster) -> u64 {
    common::command_calls(&cluster.url(0).expect("node"), "time")
}

/// Locks taken and released one after another, with the clock read by
/// every acquire or once per interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_clock_checks_read_the_clock_once_per_interval() {
    let cluster = cluster(ClusterOptions {
        extra_args: vec!["--appendonly".into(), "no".into()],
        ..ClusterOptions::default()
    });
    let interval = Duration::from_millis(100);
    let locks = 200;
    for check in [ClockCheck::EveryRequest, ClockCheck::Sampled] {
        let manager = builder(cluster.urls())
            .fencing(Fencing::Off)
            .node_guard(
                NodeGuard::default()
                    .trust_restarts()
                    .clock_interval(interval)
                    .clock_check(check),
            )
            .build()
            .expect("valid settings");
        // Connected (and observed, which reads the clock once) first.
        manager
            .lock(&resource("sampled-warm"))
            .await
            .expect("lock")
            .release()
            .await
            .expect("release");
        let before = time_calls(&cluster);
        let started = Instant::now();
        // At least three intervals, so that a sample falls due.
        let mut taken = 0;
        while taken < locks || started.elapsed() < 3 * interval {
            let lock = manager.lock(&resource("sampled")).await.expect("lock");
            lock.release().await.expect("release");
            taken += 1;
        }
        let (elapsed, calls) = (started.elapsed(), time_calls(&cluster) - before);
        match check {
            // One per acquire (more when a slow node made one try again,
            // fewer only when a round was decided before node 0's request
            // could go out).
            ClockCheck::EveryRequest => assert!(
                calls * 10 >= taken * 9,
                "{check:?}: {calls} TIME calls on node 0 for {taken} locks"
            ),
            _ => {
                let most = (elapsed.as_millis() / interval.as_millis()) as u64 + 2;
                assert!(
                    (1..=most).contains(&calls),
                    "{check:?}: {calls} TIME calls on node 0 for {taken} locks in {elapsed:?} \
                     (one per {interval:?}: at most {most})"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicting_and_replica_nodes_are_not_counted() {
    let evicting = TestCluster::start_with_args(
        3,
        &["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"],
    )
    .expect("cluster");
    let manager = builder(evicting.urls())
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    let error = manager
        .lock(&resource("guard-evict"))
        .no_wait()
        .await
        .expect_err("no node may count");
    // Decided as soon as two of three failed.
    let labels = quarantine_labels(&error);
    assert!(
        labels.len() >= 2 && labels.iter().all(|l| *l == "eviction"),
        "{error}"
    );
    let text = error.to_string();
    assert!(text.contains("set noeviction"), "{text}");

    let cluster = common::cluster(3);
    let primary_port = cluster
        .url(0)
        .expect("node")
        .rsplit(':')
        .next()
        .map(str::to_owned);
    let mut replica = common::connect(&cluster.url(2).expect("node"));
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary_port.expect("port"))
        .query(&mut replica)
        .expect("REPLICAOF");
    let manager = builder(cluster.urls())
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    let lock = manager
        .lock(&resource("guard-replica"))
        .await
        .expect("two masters of three");
    // The look at each node on connect may finish after the lock was
    // decided by the two masters.
    let replica_name = cluster.url(2).expect("node").replace("redis://", "");
    let seen = common::eventually(Duration::from_secs(5), || {
        manager.quarantined_nodes().len() == 1
    })
    .await;
    let names: Vec<String> = manager
        .quarantined_nodes()
        .into_iter()
        .map(|(n, q)| {
            assert!(matches!(q.reason, QuarantineReason::Replica { .. }), "{q}");
            n
        })
        .collect();
    assert!(seen, "the replica was never quarantined: {names:?}");
    assert_eq!(names, [replica_name]);
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_puts_the_key_back_on_a_node_that_lost_it() {
    // The window is the TTL (it covers every key the manager sets).
    let ttl = Duration::from_secs(2);
    let cluster = cluster(ClusterOptions {
        extra_args: vec!["--appendonly".into(), "no".into()],
        ..ClusterOptions::default()
    });
    tokio::time::sleep(ttl + Duration::from_millis(1100)).await;
    let manager = builder(cluster.urls())
        .ttl(ttl)
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    let mut lock = manager.lock(&resource("guard-repair")).await.expect("free");
    let url = |i: usize| cluster.url(i).expect("node");
    let (name, value) = (lock.resource().to_owned(), lock.value().to_owned());
    let holds = |i: usize| stored_value(&url(i), &name).as_deref() == Some(value.as_str());
    // Two nodes that stored it (a straggler may never have got the SET):
    // one loses everything, the other loses our key by someone's hand.
    let holders: Vec<usize> = (0..5).filter(|&i| holds(i)).collect();
    let [lost, deleted, ..] = holders[..] else {
        panic!("a quorum stores the lock: {holders:?}");
    };
    cluster.restart(lost).expect("restart");
    let _: i64 = redis::cmd("DEL")
        .arg(quorumlock::internals::lock_key(&name))
        .query(&mut common::connect(&url(deleted)))
        .expect("DEL");
    let restarted = Instant::now();
    // While the restarted node is quarantined (a window from its start),
    // extensions leave it alone; the lock lives on by them.
    while restarted.elapsed() + Duration::from_millis(300) < ttl {
        lock.extend(ttl).await.expect("a quorum extends");
        assert!(!holds(lost), "an extension set a key on a quarantined node");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // After the window, an extension puts our key back there, and not
    // where it was removed rather than lost.
    let mut back = false;
    while !back && restarted.elapsed() < ttl * 2 {
        lock.extend(ttl).await.expect("a quorum extends");
        back = holds(lost);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        back,
        "no extension put the key back on node {lost} {:?} after its restart",
        restarted.elapsed()
    );
    assert!(
        !holds(deleted),
        "an extension revived the key deleted on node {deleted}"
    );
    lock.release().await.expect("release");
    manager.settle().await;
    let left: Vec<usize> = (0..5).filter(|&i| holds(i)).collect();
    assert!(left.is_empty(), "release left the key on nodes {left:?}");
}

/// One hold, on this process's monotonic clock.
#[derive(Debug, Clone, Copy)]
struct Hold {
    client: usize,
    from: Instant,
    until: Instant,
}

/// Eight clients contend for one resource for `length` (TTL 600 ms, holds
/// of 400 ms) on five nodes of which three run at 2×. Returns the holds,
/// the overlapping pairs, and the acquisition errors by kind.
async fn contend_with_fast_clocks(
    guard: NodeGuard,
    length: Duration,
) -> (Vec<Hold>, usize, Vec<String>) {
    let cluster = Arc::new(fake_clocks());
    for i in 2..5 {
        cluster.set_clock_rate(i, 2.0).expect("rate");
    }
    let name = resource("guard-fast");
    let holds = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let end = Instant::now() + length;
    let mut clients = Vec::new();
    for client in 0..8 {
        let manager = builder(cluster.urls())
            .ttl(Duration::from_millis(600))
            // timing: eight clients on a 600 ms TTL under faults: rounds well inside the TTL (exclusion is the subject)
            .node_timeout(Duration::from_millis(100))
            .fencing(Fencing::Off)
            .node_guard(guard.clone())
            .build()
            .expect("valid settings");
        let (name, holds, errors) = (name.clone(), Arc::clone(&holds), Arc::clone(&errors));
        clients.push(tokio::spawn(async move {
            while Instant::now() < end {
                match manager.lock(&name).await {
                    Ok(lock) => {
                        let from = Instant::now();
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        let until = Instant::now().min(lock.valid_until());
                        holds.lock().expect("holds").push(Hold {
                            client,
                            from,
                            until,
                        });
                        let _ = lock.release().await;
                    }
                    Err(error) => {
                        let kind = match &error {
                            Error::QuorumUnavailable { .. }
                                if !quarantine_labels(&error).is_empty() =>
                            {
                                "unavailable: quarantined".to_owned()
                            }
                            other => format!("{other}"),
                        };
                        errors.lock().expect("errors").push(kind);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            manager.settle().await;
        }));
    }
    for client in clients {
        client.await.expect("client");
    }
    let holds = holds.lock().expect("holds").clone();
    let mut overlaps = 0;
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            if a.from < b.until && b.from < a.until {
                assert_ne!(a.client, b.client, "one client cannot hold twice at once");
                overlaps += 1;
            }
        }
    }
    let errors = errors.lock().expect("errors").clone();
    (holds, overlaps, errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_fast_clocks_overlap_holders_without_the_guard_and_never_with_it() {
    let length = Duration::from_secs(4);
    let (holds, overlaps, errors) = contend_with_fast_clocks(NodeGuard::disabled(), length).await;
    eprintln!(
        "node_guard: guard off, {length:?}: {} holds, {overlaps} overlapping pairs, {} failed acquisitions",
        holds.len(),
        errors.len()
    );
    assert!(
        overlaps > 0,
        "the negative control found no overlap in {} holds: the fast clocks did not bite",
        holds.len()
    );

    let (holds, overlaps, errors) = contend_with_fast_clocks(NodeGuard::default(), length).await;
    let quarantined = errors
        .iter()
        .filter(|e| *e == "unavailable: quarantined")
        .count();
    eprintln!(
        "node_guard: guard on, {length:?}: {} holds, {overlaps} overlapping pairs, {} failed \
         acquisitions ({quarantined} naming quarantined nodes)",
        holds.len(),
        errors.len()
    );
    assert_eq!(overlaps, 0, "holds overlapped with the guard on: {holds:?}");
    assert!(
        quarantined > 0,
        "no acquisition failed for quarantined nodes: {errors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_refuses_time_still_counts() {
    let cluster = common::cluster(3);
    // An ACL that forbids TIME to the user we connect as. (Forbidding
    // CONFIG too would quarantine these young nodes: an unknown fsync
    // policy is taken as not `always`.)
    for i in 0..3 {
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "default", "-time"])
            .query(&mut common::connect(&cluster.url(i).expect("node")))
            .expect("ACL SETUSER");
    }
    let manager = builder(cluster.urls())
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    for _ in 0..3 {
        let lock = manager
            .lock(&resource("guard-no-time"))
            .await
            .expect("TIME refused is no failure");
        lock.release().await.expect("release");
    }
    // With a waiter queued (by a client allowed TIME), the release still
    // succeeds; it only cannot tell the waiter, whose timer covers that.
    let name = resource("guard-no-time-queued");
    let lock = manager
        .lock(&name)
        .await
        .expect("TIME refused is no failure");
    for i in 0..3 {
        let mut conn = common::connect(&cluster.url(i).expect("node"));
        let _: () = redis::pipe()
            .cmd("ZADD")
            .arg(quorumlock::internals::key_of(
                quorumlock::internals::KeyKind::Waiters,
                &name,
            ))
            .arg(1)
            .arg(42)
            .cmd("ZADD")
            .arg(quorumlock::internals::key_of(
                quorumlock::internals::KeyKind::WaiterLeases,
                &name,
            ))
            .arg(u64::MAX >> 12)
            .arg(42)
            .query(&mut conn)
            .expect("ZADD");
    }
    lock.release()
        .await
        .expect("release with a waiter queued, without TIME");
    assert!(
        manager.quarantined_nodes().is_empty(),
        "{:?}",
        manager.quarantined_nodes()
    );
}

/// A `Write` that keeps what the subscriber writes.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// With `ClockCheck::Sampled`, a request that carries the guard's
/// observation but no `TIME` (the two are claimed on separate schedules)
/// is no node that "answers no TIME": that warning, given once per node,
/// is kept for nodes that really refuse it (an ACL without `+time`).
#[tokio::test(flavor = "current_thread")]
async fn sampled_clock_checks_do_not_claim_that_healthy_nodes_answer_no_time() {
    use tracing_subscriber::util::SubscriberInitExt;
    let captured = Captured::default();
    let writer = captured.clone();
    let _guard = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .set_default();
    let cluster = common::cluster(3);
    let manager = builder(cluster.urls())
        .ttl(Duration::from_secs(1))
        .node_guard(
            NodeGuard::default()
                .clock_check(ClockCheck::Sampled)
                .clock_interval(Duration::from_millis(20)),
        )
        .build()
        .expect("valid");
    // Back-to-back locks from four tasks: requests at any moment.
    let until = Instant::now() + Duration::from_secs(2);
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let manager = manager.clone();
            tokio::spawn(async move {
                let name = resource("sampled");
                while Instant::now() < until {
                    if let Ok(lock) = manager.lock(&name).no_wait().await {
                        let _ = lock.release().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("no panic");
    }
    let text = String::from_utf8_lossy(&captured.0.lock().expect("buffer")).into_owned();
    let false_alarms: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("answers no TIME"))
        .collect();
    assert!(
        false_alarms.is_empty(),
        "healthy nodes that answer TIME were reported as answering none ({} warnings): {:?}",
        false_alarms.len(),
        false_alarms
    );
}
