//! Second holders at the node guard's edges, each tried on real nodes the
//! way an outside review found it: a coarse server unit read as exact, an
//! answer counted before the verdict of the observation sent ahead of it,
//! an observation lost with its request, keys that outlive the guard's
//! window, and one server behind two names. Each test fails without the
//! fix it is named for.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{builder, connect, reach_every_node, resource};
use quorumlock::testkit::{Restart, TestCluster};
use quorumlock::{Fencing, Lock, LockManager, NodeGuard};
use tokio::time::Instant;

/// Sleeps until the wall clock is `phase` (0..1) into a second.
fn sleep_until_phase(phase: f64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    let into = f64::from(now.subsec_nanos()) / 1e9;
    let wait = if into < phase {
        phase - into
    } else {
        1.0 - into + phase
    };
    std::thread::sleep(Duration::from_secs_f64(wait));
}

/// Tries `name` on `manager` (one attempt each, every 20 ms) until it is
/// granted or `limit` has passed; the lock and when it was granted.
async fn first_grant(
    manager: &LockManager,
    name: &str,
    limit: Duration,
) -> Option<(Lock, Instant)> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(lock) = manager.lock(name).no_wait().await {
            return Some((lock, Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// `uptime_in_seconds` is floor(now) − floor(start): a node started at
/// x.9 s and met at (x+1).05 s reports 1 s for 0.15 s. Taken as exact, the
/// restart quarantine ends 0.85 s early, inside the last holder's validity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restart_quarantine_ends_no_sooner_than_the_uptime_allows() {
    let ttl = Duration::from_secs(2);
    let cluster = TestCluster::start_with_args(3, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    // Older than the window, so that a fresh manager counts node 0 at once.
    tokio::time::sleep(ttl + Duration::from_millis(1_200)).await;
    let holder = builder(cluster.urls())
        .ttl(ttl)
        .fencing(Fencing::Off)
        .node_guard(NodeGuard::default().quarantine_window(Duration::ZERO))
        .build()
        .expect("valid settings");
    let name = resource("guard-uptime");
    reach_every_node(&holder, &common::direct_urls(&cluster)).await;
    // Granted late in a wall-clock second; two nodes crash and come back
    // empty before the second is over.
    sleep_until_phase(0.70);
    let held = holder.lock(&name).no_wait().await.expect("free");
    for node in [1, 2] {
        cluster
            .restart_with(node, &Restart::wiped())
            .expect("restart");
    }
    // Met just after the next second begins: the restarted nodes report up
    // to a second more than they have run.
    sleep_until_phase(0.05);
    let newcomer = builder(cluster.urls())
        .ttl(ttl)
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");
    let granted = first_grant(&newcomer, &name, ttl + Duration::from_secs(2)).await;
    let (second, at) = granted.expect("the lock is free once the first holder's validity ended");
    let left = held.remaining();
    assert!(
        !held.is_valid(),
        "a fresh manager was granted the lock while the first holder still had {left:?} of \
         validity: the restarted nodes' quarantine ended early (granted {:?} after the first)",
        at.duration_since(held.acquired_at())
    );
    second.release().await.expect("release");
}

/// The ways a manager `m` that has been idle past its clock interval meets
/// two nodes that were flushed meanwhile: the one request that carries
/// the due observation, and a request sent right behind it.
struct Flushed {
    cluster: TestCluster,
    manager: Arc<LockManager>,
    /// Held by another client on every node; gone from nodes 0 and 1.
    held: Lock,
    other: LockManager,
}

const INTERVAL: Duration = Duration::from_millis(200);

fn flushed_setup(extra_args: &[&str]) -> impl std::future::Future<Output = Flushed> {
    let cluster = TestCluster::start_proxied_with_args(3, extra_args)
        .unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    async move {
        let ttl = Duration::from_secs(10);
        let manager = builder(cluster.urls())
            .ttl(ttl)
            .fencing(Fencing::Off)
            .node_timeout(Duration::from_millis(300))
            .node_guard(NodeGuard::default().clock_interval(INTERVAL))
            .build()
            .expect("valid settings");
        reach_every_node(&manager, &common::direct_urls(&cluster)).await;
        let other = builder(cluster.urls())
            .ttl(ttl)
            .fencing(Fencing::Off)
            .build()
            .expect("valid settings");
        let held = other.lock(&resource("guard-held")).await.expect("free");
        let direct = common::direct_urls(&cluster);
        assert!(
            common::eventually(Duration::from_secs(2), || {
                common::nodes_holding(&direct, held.resource(), held.value()) == 3
            })
            .await,
            "the other client's lock reached only {} of 3 nodes",
            common::nodes_holding(&direct, held.resource(), held.value())
        );
        // Idle past the interval: the next key-setting request to each node
        // carries an observation.
        tokio::time::sleep(INTERVAL * 2).await;
        for node in [0, 1] {
            let mut direct = connect(&cluster.direct_url(node).expect("node"));
            redis::cmd("FLUSHALL")
                .query::<()>(&mut direct)
                .expect("FLUSHALL");
        }
        Flushed {
            cluster,
            manager: Arc::new(manager),
            held,
            other,
        }
    }
}

/// The request that claims the due observation is handled by a task on
/// another runtime, held up (as a busy runtime would) while the answer to
/// a request sent right behind it on the same connection comes back: that
/// answer must wait for the observation's verdict, which sees the flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_sent_behind_an_observation_waits_for_its_verdict() {
    let Flushed {
        cluster,
        manager,
        held,
        other: _other,
    } = flushed_setup(&[]).await;
    // Replies take 40 ms, so the held-up runtime has surely stopped before
    // the observation's reply arrives.
    for node in 0..3 {
        cluster
            .proxy(node)
            .expect("proxied")
            .set_latency_to_client(quorumlock::testkit::Delay {
                fixed: Duration::from_millis(40),
                jitter: Duration::ZERO,
            });
    }
    let observer = Arc::clone(&manager);
    let elsewhere = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let first = tokio::spawn(async move {
                observer
                    .lock(&resource("guard-first"))
                    .no_wait()
                    .await
                    .map(drop)
            });
            // One turn for the task: its requests (and the observation
            // they carry) go out; then this runtime is busy for a while.
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(800));
            first.await.expect("no panic")
        })
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let behind = manager.lock(held.resource()).no_wait().await;
    let first = tokio::task::spawn_blocking(move || elsewhere.join().expect("no panic"))
        .await
        .expect("joined");
    if let Ok(second) = &behind {
        panic!(
            "granted {} while another client held it with {:?} left: the answers of the \
             flushed nodes were counted before the verdict of the observation sent ahead of \
             them (first request: {first:?})",
            second.resource(),
            held.remaining()
        );
    }
    let quarantined: Vec<String> = manager
        .quarantined_nodes()
        .into_iter()
        .map(|(node, q)| format!("{node}: {}", q.reason.label()))
        .collect();
    assert_eq!(
        quarantined
            .iter()
            .filter(|q| q.ends_with("data_set"))
            .count(),
        2,
        "the observation saw both flushes: {quarantined:?}"
    );
}

/// The request that carries the due observation times out on the two
/// flushed nodes (they are busy): the observation is lost with it, and
/// the nodes must not count until one succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observation_that_times_out_leaves_the_node_unobserved() {
    let Flushed {
        cluster,
        manager,
        held,
        other: _other,
    } = flushed_setup(&["--enable-debug-command", "yes"]).await;
    let sleepers: Vec<_> = [0, 1]
        .map(|node| {
            let url = cluster.direct_url(node).expect("node");
            std::thread::spawn(move || {
                let mut direct = connect(&url);
                redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg("0.6")
                    .query::<()>(&mut direct)
                    .expect("DEBUG SLEEP");
            })
        })
        .into();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let first = manager.lock(&resource("guard-first")).no_wait().await;
    assert!(first.is_err(), "two of three nodes are busy: {first:?}");
    for sleeper in sleepers {
        tokio::task::spawn_blocking(move || sleeper.join().expect("no panic"))
            .await
            .expect("joined");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let behind = manager.lock(held.resource()).no_wait().await;
    if let Ok(second) = &behind {
        panic!(
            "granted {} while another client held it with {:?} left: the nodes whose \
             observation timed out were counted unobserved",
            second.resource(),
            held.remaining()
        );
    }
}
