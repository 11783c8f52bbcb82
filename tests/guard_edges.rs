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
        .node_guard(NodeGuard::default().trust_restarts())
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

/// `m`'s clock interval is `interval`.
fn flushed_setup(
    extra_args: &[&str],
    interval: Duration,
) -> impl std::future::Future<Output = Flushed> {
    let cluster = TestCluster::start_proxied_with_args(3, extra_args)
        .unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    async move {
        let ttl = Duration::from_secs(10);
        let manager = builder(cluster.urls())
            .ttl(ttl)
            .fencing(Fencing::Off)
            // timing: the guard's clock interval is the subject; 300 ms keeps a round inside one interval
            .node_timeout(Duration::from_millis(300))
            .node_guard(NodeGuard::default().clock_interval(interval))
            .build()
            .expect("valid settings");
        reach_every_node(&manager, &common::direct_urls(&cluster)).await;
        let other = builder(cluster.urls())
            .ttl(ttl)
            .fencing(Fencing::Off)
            .build()
            .expect("valid settings");
        reach_every_node(&other, &common::direct_urls(&cluster)).await;
        let direct = common::direct_urls(&cluster);
        let held = common::hold_on_every_node(&other, &resource("guard-held"), &direct).await;
        // Idle past the interval: the next key-setting request to each node
        // carries an observation.
        tokio::time::sleep(interval + interval / 5).await;
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
    } = flushed_setup(&[], Duration::from_millis(200)).await;
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
/// flushed nodes (busy for 0.4 s, as with a slow `FLUSHALL SYNC` or a long
/// script): the observation is lost with it, and the nodes must not count
/// until one succeeds, also well within the next clock interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observation_that_times_out_leaves_the_node_unobserved() {
    let Flushed {
        cluster,
        manager,
        held,
        other: _other,
    } = flushed_setup(&["--enable-debug-command", "yes"], Duration::from_secs(1)).await;
    let sleepers: Vec<_> = [0, 1]
        .map(|node| {
            let url = cluster.direct_url(node).expect("node");
            std::thread::spawn(move || {
                let mut direct = connect(&url);
                redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg("0.4")
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

/// At most once per interval (`at_least`) across a restart of a majority
/// that kept nothing: the keys were to live for the interval, so the
/// restarted nodes must not count for as long, whatever the TTL; neither
/// for the host that ran the job nor for a host that never met the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_taken_at_least_an_interval_does_not_run_again_after_a_restart() {
    let ttl = Duration::from_secs(1);
    let interval = Duration::from_secs(4);
    let cluster = TestCluster::start_with_args(3, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    // Older than the interval (the keys' life): every host counts every
    // node at once.
    tokio::time::sleep(interval + Duration::from_millis(1_200)).await;
    let host = |cluster: &TestCluster| {
        builder(cluster.urls())
            .ttl(ttl)
            .fencing(Fencing::Off)
            .build()
            .expect("valid settings")
    };
    let (a, b) = (host(&cluster), host(&cluster));
    let job = resource("guard-hourly");
    /// The job's recipe on one host: when it ran, if it ran.
    async fn run(manager: &LockManager, job: &str, interval: Duration) -> Option<Instant> {
        let lock = manager.lock(job).no_wait().at_least(interval).await.ok()?;
        let at = lock.acquired_at();
        lock.release().await.expect("held: released early, kept");
        Some(at)
    }
    let ran = run(&a, &job, interval).await.expect("nobody ran it yet");
    for node in [0, 1] {
        cluster
            .restart_with(node, &Restart::wiped())
            .expect("restart");
    }
    // Both hosts fire every 100 ms until well past the interval.
    let mut again = None;
    while again.is_none() && ran.elapsed() < interval + Duration::from_secs(2) {
        for host in [&a, &b] {
            if let Some(at) = run(host, &job, interval).await {
                again = Some(at);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = again.expect("the job runs again after its interval");
    let after = again.duration_since(ran);
    // A node's clock may run fast by the drift factor (1 %).
    assert!(
        after >= interval - interval / 100,
        "the job ran again {after:?} after it ran, within its {interval:?} interval: the \
         restarted nodes were counted while the keys were to live on"
    );
}

/// One server behind two names (here a proxy; a DNS alias or a virtual
/// address does the same, and no name check at `build()` can see it): its
/// answers must count once. A second `SET NX` on it is refused, but an
/// extension succeeds under both names: with the third node down, a lock
/// extended on one process alone would believe a quorum of three keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_behind_two_names_counts_once() {
    let cluster =
        TestCluster::start_proxied(2).unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    let urls = vec![
        cluster.direct_url(0).expect("node"),
        cluster.url(0).expect("proxy"),
        cluster.direct_url(1).expect("node"),
    ];
    let manager = builder(urls)
        .fencing(Fencing::Off)
        .build()
        .expect("three names, as far as build() can tell");
    // Meets every name (the first lock connects and observes them).
    if let Ok(warm) = manager.lock(&resource("guard-warm")).no_wait().await {
        warm.release().await.expect("release");
    }
    let mut lock = manager
        .lock(&resource("guard-twice"))
        .no_wait()
        .await
        .expect("both servers up: granted");
    cluster.kill(1).expect("kill");
    match lock.extend(Duration::from_secs(5)).await {
        Ok(()) => panic!(
            "extended on one process behind two names, with the other server down: {:?} of \
             validity claimed",
            lock.remaining()
        ),
        Err(error) => assert!(
            error.to_string().contains("same run_id"),
            "refused, but the error does not name the server counted twice: {error}"
        ),
    }
}
