//! No single node stops new locks: with the default fencing
//! (`Fencing::CounterNode { node: 0 }`), node 0 killed, stalled, back
//! without its data, or cut off from some clients costs no grant while a
//! majority of the nodes is up, and fencing tokens keep rising per
//! resource in the order of the holders (see `counter_node_token`).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{builder, cluster, connect, resource};
use quorumlock::internals::fence_key;
use quorumlock::testkit::{ClusterOptions, Restart, TestCluster};
use quorumlock::{Backoff, Error, FencingToken, LockManager};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// A manager with the default fencing (counter node 0).
fn manager(urls: Vec<String>) -> LockManager {
    builder(urls).build().expect("valid settings")
}

/// One attempt (`no_wait`): its token, or what failed.
async fn one_attempt(manager: &LockManager, name: &str) -> Result<FencingToken, Error> {
    let lock = manager.lock(name).no_wait().await?;
    let token = lock.token().expect("fencing is on by default");
    lock.release().await.expect("release");
    Ok(token)
}

fn assert_rising(tokens: &[FencingToken], what: &str) {
    for pair in tokens.windows(2) {
        assert!(
            pair[0] < pair[1],
            "{what}: token {} then {} (all: {tokens:?})",
            pair[0],
            pair[1]
        );
    }
}

/// Node 0 killed (connections refused), then nodes 0 and 1: a manager
/// that locked before and one built after are each granted at their
/// first attempt, with tokens above every earlier one. (Before the
/// failover: `CounterNodeUnavailable`, 0 of 20 grants.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_granted_at_the_first_attempt_without_node_0() {
    let cluster = cluster(5);
    let name = resource("node-0-killed");
    let warm = manager(cluster.urls());
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(one_attempt(&warm, &name).await.expect("all nodes up"));
    }
    cluster.kill(0).expect("kill node 0");
    for down in ["node 0", "nodes 0 and 1"] {
        if down == "nodes 0 and 1" {
            cluster.kill(1).expect("kill node 1");
        }
        for _ in 0..3 {
            let token = one_attempt(&warm, &name)
                .await
                .unwrap_or_else(|e| panic!("{down} down, a warm manager's attempt: {e}"));
            tokens.push(token);
        }
        let fresh = manager(cluster.urls());
        let token = one_attempt(&fresh, &name)
            .await
            .unwrap_or_else(|e| panic!("{down} down, a fresh manager's first attempt: {e}"));
        tokens.push(token);
        fresh.settle().await;
    }
    assert_rising(&tokens, "across node 0's and node 1's loss");
    warm.settle().await;
}

/// A leader is elected with node 0 killed, in a term above the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_wins_without_node_0() {
    let cluster = cluster(5);
    let manager = manager(cluster.urls());
    let election = manager.election(&resource("failover-role"));
    let first = election.campaign("a").await.expect("all nodes up");
    let first_term = first.term();
    first.resign().await.expect("resign");
    cluster.kill(0).expect("kill node 0");
    let second = tokio::time::timeout(Duration::from_secs(10), election.campaign("b"))
        .await
        .expect("a campaign without node 0 is decided")
        .expect("a campaign without node 0 wins");
    assert!(
        second.term() > first_term,
        "term {} after term {first_term}",
        second.term()
    );
    second.resign().await.expect("resign");
    manager.settle().await;
}

/// Node 0 stalled (SIGSTOP: it answers nothing): every attempt waits for
/// it no longer than `node_timeout`, and is granted by the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_node_0_costs_no_grant() {
    let cluster = cluster(5);
    let name = resource("node-0-stalled");
    let manager = manager(cluster.urls());
    let mut tokens = vec![one_attempt(&manager, &name).await.expect("all up")];
    cluster.pause(0).expect("pause node 0");
    for _ in 0..3 {
        tokens.push(
            one_attempt(&manager, &name)
                .await
                .unwrap_or_else(|e| panic!("node 0 stalled: {e}")),
        );
    }
    cluster.resume(0).expect("resume node 0");
    tokens.push(one_attempt(&manager, &name).await.expect("all up again"));
    assert_rising(&tokens, "across node 0's stall");
    manager.settle().await;
}

/// Node 0 restarted without its data: the guard keeps it out for its
/// window, and meanwhile every lock is granted by the four others; once
/// it counts again, its counter (started again from its clock) issues
/// tokens above those. (Before: no grant for the whole window.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_0_back_without_its_data_leaves_no_gap_in_grants() {
    let cluster = cluster(5);
    let name = resource("node-0-wiped");
    let manager = manager(cluster.urls());
    let mut tokens = vec![one_attempt(&manager, &name).await.expect("all up")];
    cluster
        .restart_with(0, &Restart::wiped())
        .expect("restart node 0 empty");
    let node_0 = cluster.url(0).expect("node 0");
    // Until node 0 issues tokens again (its counter holds the token), at
    // most a minute: every attempt meanwhile must be granted.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let token = one_attempt(&manager, &name).await.unwrap_or_else(|e| {
            panic!("attempt {attempts} after node 0 came back empty, four nodes healthy: {e}")
        });
        tokens.push(token);
        let counter: Option<u64> = redis::cmd("GET")
            .arg(fence_key(&name))
            .query(&mut connect(&node_0))
            .expect("read node 0's counter");
        if counter == Some(token.get()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 0 never issued a token again in a minute ({attempts} attempts)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        attempts > 1,
        "node 0 issued the first token after its return: its quarantine was not met"
    );
    assert_rising(&tokens, "across node 0's return without its data");
    manager.settle().await;
}

/// Every node refuses connections (a wrong port): the error says that no
/// quorum answered, naming the nodes that failed by the time that was
/// clear (a node still connecting then is not waited for), not the
/// counter node alone.
#[tokio::test]
async fn no_node_reachable_is_quorum_unavailable_naming_each_node() {
    let ports: Vec<u16> = (0..3)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .expect("bind")
                .local_addr()
                .expect("port")
                .port()
        })
        .collect();
    let urls: Vec<String> = ports
        .iter()
        .map(|port| format!("redis://127.0.0.1:{port}"))
        .collect();
    let manager = builder(urls)
        .unavailable_retry(Backoff::none())
        .build()
        .expect("valid settings");
    match manager.lock(&resource("nowhere")).no_wait().await {
        Err(Error::QuorumUnavailable {
            errors,
            failed,
            total,
            ..
        }) => {
            assert!(failed >= 2 && total == 3, "{failed} of {total}: {errors:?}");
            assert!(errors.len() >= 2, "the failures are named: {errors:?}");
            for error in &errors {
                assert!(
                    ports
                        .iter()
                        .any(|port| error.node.ends_with(&format!(":{port}")))
                        && matches!(error.kind, quorumlock::NodeErrorKind::Connect(_)),
                    "a node error that is not one of the three refusing connections: {error:?}"
                );
            }
        }
        other => panic!("three unreachable nodes: {other:?}"),
    }
}

/// Node 0's clock three seconds ahead of the others' (more than the
/// failover margin): its tokens cannot count alone, since a token issued
/// without it might be lower. They go through a second round, and tokens
/// keep rising when node 0 is then killed. (Counting its tokens alone,
/// the first lock without it got a lower token.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_node_clock_ahead_of_the_others_does_not_turn_tokens_back() {
    let cluster = TestCluster::start_with(
        5,
        &ClusterOptions {
            fake_clocks: true,
            ..ClusterOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("cannot start a cluster with fake clocks: {e}"));
    cluster
        .step_clock(0, Duration::from_secs(3), true)
        .expect("step node 0's clock");
    let name = resource("clock-ahead");
    // Built after the step: the guard never saw node 0 jump.
    let manager = manager(cluster.urls());
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(one_attempt(&manager, &name).await.expect("all up"));
    }
    cluster.kill(0).expect("kill node 0");
    for _ in 0..3 {
        tokens.push(
            one_attempt(&manager, &name)
                .await
                .expect("granted without node 0"),
        );
    }
    assert_rising(&tokens, "node 0's clock ahead, then node 0 killed");
    manager.settle().await;
}

/// The nemesis: clients contend for three resources for at least 1 000
/// grants, each appending its token to its resource's log while it
/// holds; half of them reach node 0 through a proxy. Meanwhile node 0 is
/// killed and restarted with its data, restarted without it, and cut off
/// from the proxied half (they cannot reach it, the others can). Each
/// resource's log must be in strictly rising token order, and every phase
/// must see grants. Run on both wires (`QUORUMLOCK_WIRE`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_rise_while_node_0_is_killed_wiped_and_cut_off() {
    let cluster = Arc::new(
        TestCluster::start_with(
            5,
            &ClusterOptions {
                proxied: true,
                ..ClusterOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}")),
    );
    let direct: Vec<String> = (0..5)
        .map(|i| cluster.direct_url(i).expect("direct url"))
        .collect();
    let mut through_proxy = direct.clone();
    through_proxy[0] = cluster.url(0).expect("node 0's proxy");
    let resources: Vec<String> = (0..3).map(|i| resource(&format!("nemesis-{i}"))).collect();
    let logs: Arc<Mutex<BTreeMap<String, Vec<FencingToken>>>> = Arc::default();
    let phase = Arc::new(AtomicU64::new(0));
    let granted_in: Arc<[AtomicU64; PHASES.len()]> = Arc::new(Default::default());
    let stop = Arc::new(AtomicBool::new(false));

    let mut clients = Vec::new();
    for c in 0..6 {
        let urls = if c % 2 == 0 {
            direct.clone()
        } else {
            through_proxy.clone()
        };
        let manager = manager(urls);
        let (resources, logs, phase, granted_in, stop) = (
            resources.clone(),
            Arc::clone(&logs),
            Arc::clone(&phase),
            Arc::clone(&granted_in),
            Arc::clone(&stop),
        );
        clients.push(tokio::spawn(async move {
            let mut turn = c;
            while !stop.load(Ordering::SeqCst) {
                turn += 1;
                let name = &resources[turn % resources.len()];
                let Ok(lock) = manager.lock(name).wait(Duration::from_secs(5)).await else {
                    continue;
                };
                let token = lock.token().expect("fencing is on");
                logs.lock()
                    .await
                    .entry(name.clone())
                    .or_default()
                    .push(token);
                granted_in[phase.load(Ordering::SeqCst) as usize].fetch_add(1, Ordering::SeqCst);
                let _ = lock.release().await;
            }
            manager.settle().await;
        }));
    }

    let total = |granted_in: &[AtomicU64]| {
        granted_in
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .sum::<u64>()
    };
    // Each phase lasts until it saw its share of the grants (and at least
    // a few seconds, so that node 0's return and quarantine fall in it).
    for (i, (name, at_least)) in PHASES.iter().enumerate() {
        phase.store(i as u64, Ordering::SeqCst);
        match *name {
            "healthy" => {}
            "node 0 killed" => cluster.kill(0).expect("kill"),
            "node 0 back with its data" => cluster.restart(0).expect("restart"),
            "node 0 back without its data" => cluster
                .restart_with(0, &Restart::wiped())
                .expect("restart wiped"),
            "node 0 cut off from half the clients" => {
                let proxy = cluster.proxy(0).expect("node 0's proxy");
                proxy.set_unresponsive(true);
                proxy.drop_connections();
            }
            "node 0 reachable again" => cluster.proxy(0).expect("proxy").heal(),
            other => unreachable!("{other}"),
        }
        let began = Instant::now();
        let deadline = began + Duration::from_secs(120);
        while granted_in[i].load(Ordering::SeqCst) < *at_least
            || began.elapsed() < Duration::from_secs(2)
        {
            assert!(
                Instant::now() < deadline,
                "phase {name:?}: {} grants in two minutes, {at_least} wanted",
                granted_in[i].load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("client task");
    }
    let granted = total(&granted_in[..]);
    assert!(granted >= 1_000, "{granted} grants, 1 000 wanted");
    for (name, tokens) in logs.lock().await.iter() {
        assert_rising(tokens, name);
    }
    let per_phase: Vec<String> = PHASES
        .iter()
        .zip(granted_in.iter())
        .map(|((name, _), n)| format!("{name}: {}", n.load(Ordering::SeqCst)))
        .collect();
    eprintln!("{granted} grants, tokens rising per resource; {per_phase:?}");
}

/// The nemesis' phases, in order, and the grants each must see.
const PHASES: [(&str, u64); 6] = [
    ("healthy", 100),
    ("node 0 killed", 200),
    ("node 0 back with its data", 150),
    ("node 0 back without its data", 200),
    ("node 0 cut off from half the clients", 200),
    ("node 0 reachable again", 150),
];

/// A token's second round that fails is unavailability, never contention:
/// node 0 is down, the others grant, but two of them may not run the
/// store script (an ACL without `evalsha`; the guard is off, since its
/// observation is a script too). The store is then short of a majority:
/// one node not asked (node 0) and two failing. (It was reported as
/// `Contended`, the not-asked node counting as a refusal.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_second_round_is_unavailability_not_contention() {
    let cluster = cluster(5);
    for i in 1..5 {
        let denied: &[&str] = if i <= 2 { &["-evalsha"] } else { &[] };
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all"][..])
            .arg(denied)
            .query(&mut connect(&cluster.url(i).expect("node")))
            .expect("ACL SETUSER");
    }
    cluster.kill(0).expect("kill node 0");
    let urls: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| url.replace("redis://", "redis://locker:pw@"))
        .collect();
    let manager = builder(urls)
        .node_guard(quorumlock::NodeGuard::disabled())
        .unavailable_retry(Backoff::none())
        .build()
        .expect("valid settings");
    let name = resource("lost-store");
    match manager.lock(&name).no_wait().await {
        Err(Error::QuorumUnavailable { errors, .. }) => assert!(
            errors
                .iter()
                .any(|e| matches!(e.kind, quorumlock::NodeErrorKind::PermissionDenied(_))),
            "the denied store is named: {errors:?}"
        ),
        other => panic!("a store round short of a majority: {other:?}"),
    }
    // Rolled back where scripts may run (on nodes 1 and 2 the key
    // expires: the rollback is a script too).
    manager.settle().await;
    assert!(
        common::nothing_left(&cluster.urls()[3..], &name),
        "the attempt left keys: {:?}",
        common::lock_entries(&cluster.urls()[3..], &name)
    );
}

/// Node 0's clock three seconds ahead (its tokens cannot count alone) and
/// two other nodes down: a lock is granted by node 0 and the two left,
/// its token stored on all three. (Stored on the others alone, it needed
/// three of them: no lock could be taken.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_node_ahead_with_two_nodes_down_still_grants() {
    let cluster = TestCluster::start_with(
        5,
        &ClusterOptions {
            fake_clocks: true,
            ..ClusterOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("cannot start a cluster with fake clocks: {e}"));
    cluster
        .step_clock(0, Duration::from_secs(3), true)
        .expect("step node 0's clock");
    cluster.kill(3).expect("kill node 3");
    cluster.kill(4).expect("kill node 4");
    let manager = manager(cluster.urls());
    let name = resource("ahead-two-down");
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(
            one_attempt(&manager, &name)
                .await
                .expect("nodes 0, 1 and 2 are a majority"),
        );
    }
    assert_rising(&tokens, "node 0 ahead, nodes 3 and 4 down");
    manager.settle().await;
}

/// A reader after node 0 came back without its data: its token is at
/// least the writer's before (node 0's counter starts again from its
/// clock, and a reader's token does too). (It was 0.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_after_node_0_lost_its_data_is_not_below_the_writer_before() {
    let cluster = cluster(5);
    // The restart's quarantine is not the subject: the nodes are trusted
    // at once.
    let manager = common::trust_unpersisted(builder(cluster.urls()))
        .build()
        .expect("valid settings");
    let name = resource("reader-after-wipe");
    let written = one_attempt(&manager, &name).await.expect("all up");
    cluster
        .restart_with(0, &Restart::wiped())
        .expect("restart node 0 empty");
    let reader = manager.read(&name).no_wait().await.expect("free");
    let read = reader.writer_token().expect("fencing is on");
    assert!(
        read >= written,
        "reader's token {read} below the writer's {written} before it"
    );
    reader.release().await.expect("release");
    let after = one_attempt(&manager, &name).await.expect("all up");
    assert!(
        after > read,
        "writer's token {after} after the reader's {read}"
    );
    manager.settle().await;
}

/// With the node guard off no node's clock is read, so a token the
/// counter node issued cannot be placed against the others' clocks: it is
/// stored on the others too (a second round trip), and the counter node's
/// loss then needs no clock at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_guard_off_every_token_is_stored_on_a_majority() {
    let cluster = cluster(5);
    let manager = builder(cluster.urls())
        .node_guard(quorumlock::NodeGuard::disabled())
        .build()
        .expect("valid settings");
    let name = resource("guard-off");
    let token = one_attempt(&manager, &name).await.expect("all up");
    let stored = (1..5)
        .filter(|&i| {
            let counter: Option<u64> = redis::cmd("GET")
                .arg(fence_key(&name))
                .query(&mut connect(&cluster.url(i).expect("node")))
                .expect("read a counter");
            counter == Some(token.get())
        })
        .count();
    assert!(
        stored >= 2,
        "token {token} stored on {stored} of the other four nodes"
    );
    cluster.kill(0).expect("kill node 0");
    let after = one_attempt(&manager, &name)
        .await
        .expect("granted without node 0");
    assert!(after > token, "token {after} after {token}");
    manager.settle().await;
}
