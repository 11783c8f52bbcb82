//! Ways a node comes back with less than it acknowledged, on real
//! `redis-server` processes, and the node guard seeing each one: a restart
//! into `appendfsync always` after running without it, persistence changed
//! at run time and then a crash, `FLUSHALL`, an older snapshot loaded, a
//! `REPLICAOF` round trip, a node that cannot be observed, a clock stepped
//! across a restart, a fast clock met for the first time, a data-set mark
//! overwritten, and a replica promoted behind the same address. In each, a
//! holder's key is gone from nodes that a second client then asks: the
//! second client must never be granted the lock while the first holds it.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{builder, connect, quarantine_labels, resource};
use quorumlock::testkit::{ClusterOptions, FaultProxy, Restart, TestCluster};
use quorumlock::{Fencing, Lock, LockManager, NodeGuard};
use tokio::time::Instant;

/// The TTL of the holder's lock, and the quarantine window of every
/// manager here (their longest TTL).
const TTL: Duration = Duration::from_secs(3);

/// A manager with the default node guard and quorum fencing.
fn manager(urls: Vec<String>) -> LockManager {
    builder(urls)
        .ttl(TTL)
        .fencing(Fencing::Quorum)
        .build()
        .expect("valid settings")
}

fn cluster_with(args: &[&str]) -> TestCluster {
    TestCluster::start_with_args(5, args).unwrap_or_else(|e| panic!("cannot start nodes: {e}"))
}

/// Waits until the nodes' processes are older than the window, so that a
/// first meeting trusts even nodes that do not persist every write.
async fn age_past_the_window() {
    // Uptime is in whole seconds.
    tokio::time::sleep(TTL + Duration::from_millis(1100)).await;
}

/// What a contender saw while the holder held its lock.
#[derive(Debug, Default)]
struct Contention {
    attempts: u32,
    /// Locks granted to the contender while the holder's was valid.
    granted: u32,
    /// The quarantine reasons its failures named, or its manager listed.
    quarantined: BTreeSet<&'static str>,
}

/// `try_lock` on `name` every 50 ms while `holder` is valid (to 100 ms
/// before its end); each grant is released at once.
async fn contend(contender: &LockManager, name: &str, holder: &Lock) -> Contention {
    let mut seen = Contention::default();
    while holder.remaining() > Duration::from_millis(100) {
        seen.attempts += 1;
        match contender.lock(name).no_wait().await {
            Ok(lock) => {
                if holder.remaining() > Duration::ZERO {
                    seen.granted += 1;
                }
                let _ = lock.release().await;
            }
            Err(error) => seen.quarantined.extend(quarantine_labels(&error)),
        }
        // A refusal by the holder's nodes does not name the others.
        seen.quarantined.extend(
            contender
                .quarantined_nodes()
                .iter()
                .map(|(_, quarantine)| quarantine.reason.label()),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen
}

/// `manager`'s lock on `name`, once its key is on every node (a fresh
/// manager's first lock may leave out nodes whose connection was not ready
/// when its round was decided): the test decides which nodes lose it.
async fn hold_everywhere(manager: &LockManager, name: &str, urls: &[String]) -> Lock {
    traffic(manager, Duration::from_millis(100)).await;
    common::hold_on_every_node(manager, name, urls).await
}

/// Deletes `name`'s lock key on nodes `from`, as if the holder's SET had
/// never reached them: it then holds a bare majority.
fn drop_key_on(urls: &[String], name: &str, from: &[usize]) {
    for &i in from {
        let _: i64 = redis::cmd("DEL")
            .arg(quorumlock::internals::lock_key(name))
            .query(&mut connect(&urls[i]))
            .expect("DEL");
    }
}

/// Lock-and-release traffic on another resource for `period`, so that a
/// manager's nodes are observed again (once per clock interval) in it.
async fn traffic(manager: &LockManager, period: Duration) {
    let name = resource("traffic");
    let until = Instant::now() + period;
    while Instant::now() < until {
        if let Ok(lock) = manager.lock(&name).no_wait().await {
            let _ = lock.release().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// More than one observation interval (the clock interval: a tenth of
/// the default TTL here).
const OBSERVED_AGAIN: Duration = Duration::from_millis(2 * 300 + 100);

fn assert_kept_out(seen: &Contention, reason: &str, context: &str) {
    assert_eq!(
        seen.granted, 0,
        "{context}: the contender was granted the lock {} times in {} attempts while the holder \
         held it (quarantine reasons seen: {:?})",
        seen.granted, seen.attempts, seen.quarantined
    );
    assert!(
        seen.quarantined.contains(reason),
        "{context}: no attempt named a `{reason}` quarantine in {} attempts: {:?}",
        seen.attempts,
        seen.quarantined
    );
}

/// The review's case: five nodes without persistence; three are killed
/// and come back empty with `appendfsync always`, as `doctor` recommends.
/// Judged by the new process alone, they were trusted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_into_fsync_always_after_running_without_it_is_quarantined() {
    let cluster = cluster_with(&["--appendonly", "no"]);
    age_past_the_window().await;
    let (a, b) = (manager(cluster.urls()), manager(cluster.urls()));
    let name = resource("into-always");
    // B meets the old processes.
    traffic(&b, Duration::from_millis(100)).await;
    let held = hold_everywhere(&a, &name, &cluster.urls()).await;
    for i in 0..3 {
        cluster
            .restart_with(
                i,
                &Restart::wiped().args(&["--appendonly", "yes", "--appendfsync", "always"]),
            )
            .expect("restart");
    }
    let seen = contend(&b, &name, &held).await;
    assert_kept_out(&seen, "restart", "three nodes back empty, now with always");
}

/// The same change of settings, with the data kept: the old process wrote
/// its AOF once a second, so its last writes may be gone although the
/// restarted node loaded the file; only what was known of the old process
/// tells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_everysec_is_quarantined_though_the_new_process_persists_every_write() {
    let cluster = cluster_with(&["--appendfsync", "everysec"]);
    age_past_the_window().await;
    let (a, b) = (manager(cluster.urls()), manager(cluster.urls()));
    let name = resource("everysec-to-always");
    traffic(&b, Duration::from_millis(100)).await;
    let held = hold_everywhere(&a, &name, &cluster.urls()).await;
    // The holder's key is on two nodes that keep it, and on three that
    // (as a crash within the second would) lose it.
    for i in 0..3 {
        drop_key_on(&cluster.urls(), &name, &[i]);
        cluster
            .restart_with(
                i,
                &Restart::keeping_data().args(&["--appendfsync", "always"]),
            )
            .expect("restart");
    }
    let seen = contend(&b, &name, &held).await;
    assert_kept_out(&seen, "restart", "restarted after running with everysec");
}

/// `CONFIG SET appendonly no` on a live node, one more write, a crash, and
/// a restart with the old configuration: the new process reports
/// `appendfsync always`, and the write is gone. Seen because a node that
/// counts is observed again while it is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistence_switched_off_at_run_time_then_a_crash_is_seen() {
    let cluster = cluster_with(&[]);
    let (a, b) = (manager(cluster.urls()), manager(cluster.urls()));
    let name = resource("switched-off");
    // Both meet the nodes while they persist every write.
    traffic(&a, Duration::from_millis(100)).await;
    traffic(&b, Duration::from_millis(100)).await;
    for i in 0..3 {
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "appendonly", "no"])
            .query(&mut connect(&cluster.url(i).expect("node")))
            .expect("CONFIG SET");
    }
    // B uses the nodes while they run so.
    traffic(&b, OBSERVED_AGAIN).await;
    let held = hold_everywhere(&a, &name, &cluster.urls()).await;
    for i in 0..3 {
        cluster
            .restart(i)
            .expect("restart with the old configuration");
    }
    let lost = (0..3)
        .filter(|&i| common::stored_value(&cluster.url(i).expect("node"), &name).is_none())
        .count();
    assert_eq!(
        lost, 3,
        "the restarted nodes came back without the holder's key"
    );
    let seen = contend(&b, &name, &held).await;
    assert_kept_out(&seen, "restart", "appendonly switched off, then a crash");
}

/// `CONFIG SET appendonly yes` on live nodes that ran without: nothing is
/// on disk until the AOF rewrite that it starts has ended (here it takes
/// seconds, as for a big data set). A crash before then, and the nodes
/// come back persisting every write, with less than they acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appendonly_switched_on_then_a_crash_before_its_rewrite_ends_is_seen() {
    let cluster = cluster_with(&["--appendonly", "no"]);
    age_past_the_window().await;
    let (a, b) = (manager(cluster.urls()), manager(cluster.urls()));
    let name = resource("switched-on");
    traffic(&b, Duration::from_millis(100)).await;
    let held = hold_everywhere(&a, &name, &cluster.urls()).await;
    for i in 0..3 {
        let mut node = connect(&cluster.url(i).expect("node"));
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "rdb-key-save-delay", "300000"])
            .query(&mut node)
            .expect("CONFIG SET");
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "appendonly", "yes"])
            .query(&mut node)
            .expect("CONFIG SET");
    }
    // B uses the nodes while they say `appendonly yes`, rewrite pending.
    traffic(&b, OBSERVED_AGAIN).await;
    for i in 0..3 {
        let persistence: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut connect(&cluster.url(i).expect("node")))
            .expect("INFO");
        assert!(
            persistence.contains("aof_rewrite_in_progress:1"),
            "node {i}'s first rewrite ended too soon for the test: {persistence}"
        );
        cluster
            .restart_with(
                i,
                &Restart::keeping_data().args(&["--appendonly", "yes", "--appendfsync", "always"]),
            )
            .expect("restart");
    }
    let seen = contend(&b, &name, &held).await;
    assert_kept_out(
        &seen,
        "restart",
        "appendonly switched on, a crash before its first rewrite ended",
    );
}

/// Nodes that persist every write, throughout, come back without their
/// data directory (a lost disk, another machine behind the address): the
/// settings say nothing is lost; the data-set mark, gone, says otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_without_its_data_directory_is_quarantined() {
    let cluster = cluster_with(&[]);
    let (a, b) = (manager(cluster.urls()), manager(cluster.urls()));
    let name = resource("wiped");
    traffic(&b, Duration::from_millis(100)).await;
    let held = hold_everywhere(&a, &name, &cluster.urls()).await;
    for i in 0..3 {
        cluster.restart_with(i, &Restart::wiped()).expect("restart");
    }
    let seen = contend(&b, &name, &held).await;
    assert_kept_out(&seen, "restart", "three nodes back without their data");
}

/// `FLUSHALL` on a node that holds one of a bare majority's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_node_is_quarantined() {
    let cluster = cluster_with(&[]);
    let (a, b) = (manager(cluster.urls()), manager(cluster.urls()));
    let name = resource("flushed");
    traffic(&b, Duration::from_millis(100)).await;
    let held = hold_everywhere(&a, &name, &cluster.urls()).await;
    drop_key_on(&cluster.urls(), &name, &[3, 4]);
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut connect(&cluster.url(2).expect("node")))
        .expect("FLUSHALL");
    tokio::time::sleep(OBSERVED_AGAIN).await;
    let seen = contend(&b, &name, &held).await;
    assert_kept_out(&seen, "data_set", "node 2 flushed");
}

/// `DEBUG RELOAD NOSAVE`: the node loads a snapshot older than what it
/// acknowledged since (the number the observations raise went back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_snapshot_loaded_is_quarantined() {
    let cluster = cluster_with(&["--enable-debug-command", "yes"]);
    let (a, b) = (manager(cluster.urls()), manager(cluster.urls()));
    let name = resource("older-copy");
    traffic(&b, Duration::from_millis(100)).await;
    let mut node_2 = connect(&cluster.url(2).expect("node"));
    let _: () = redis::cmd("SAVE").query(&mut node_2).expect("SAVE");
    // Until B raised the data set's number past the snapshot's (a manager
    // raises it at most once a second): B then knows more history than
    // the snapshot holds.
    let seq = |node: &mut redis::Connection| -> u64 {
        redis::cmd("GET")
            .arg(quorumlock::internals::judge::DATA_SET_SEQ_KEY)
            .query::<Option<u64>>(node)
            .expect("GET")
            .unwrap_or(0)
    };
    let saved = seq(&mut node_2);
    let until = Instant::now() + Duration::from_secs(10);
    while seq(&mut node_2) <= saved {
        assert!(
            Instant::now() < until,
            "setup: B never raised the number past {saved}"
        );
        traffic(&b, Duration::from_millis(100)).await;
    }
    let held = hold_everywhere(&a, &name, &cluster.urls()).await;
    drop_key_on(&cluster.urls(), &name, &[3, 4]);
    let _: () = redis::cmd("DEBUG")
        .arg(&["RELOAD", "NOSAVE"])
        .query(&mut node_2)
        .expect("DEBUG RELOAD");
    tokio::time::sleep(OBSERVED_AGAIN).await;
    let seen = contend(&b, &name, &held).await;
    assert_kept_out(&seen, "data_set", "node 2 loaded an older snapshot");
}

/// `REPLICAOF` another master, then `REPLICAOF NO ONE`: the node dropped
/// its keys for the other's while our connections stayed open and its
/// `run_id` stayed the same. Once with the contender asking all along
/// (it meets `READONLY` while the node is a replica), once with it idle
/// through the round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_replicated_another_master_is_quarantined() {
    for contender_idle in [true, false] {
        let cluster = cluster_with(&[]);
        // Syncs a replica at once (not after the diskless sync's delay).
        let other = TestCluster::start_with_args(1, &["--repl-diskless-sync-delay", "0"])
            .expect("another master");
        let (a, b) = (manager(cluster.urls()), manager(cluster.urls()));
        let name = resource("replicated");
        traffic(&b, Duration::from_millis(100)).await;
        let held = hold_everywhere(&a, &name, &cluster.urls()).await;
        drop_key_on(&cluster.urls(), &name, &[3, 4]);
        let round_trip = async {
            let mut node_2 = connect(&cluster.url(2).expect("node"));
            let port = other
                .url(0)
                .expect("node")
                .rsplit(':')
                .next()
                .map(str::to_owned);
            let _: () = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(port.expect("port"))
                .query(&mut node_2)
                .expect("REPLICAOF");
            let synced = common::eventually_async(Duration::from_secs(10), || async {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut connect(&cluster.url(2).expect("node")))
                    .expect("INFO");
                info.contains("master_link_status:up")
            })
            .await;
            assert!(synced, "node 2 never synced from the other master");
            if !contender_idle {
                // The contender asking all along meets the replica (its
                // writes answer READONLY) before it is promoted: a round
                // trip within one observation interval is not seen (see
                // docs/operations.md, the node changes table).
                let met = common::eventually(Duration::from_secs(5), || {
                    !b.quarantined_nodes().is_empty()
                })
                .await;
                assert!(met, "setup: the contender met node 2 as a replica");
            }
            let _: () = redis::cmd("REPLICAOF")
                .arg(&["NO", "ONE"])
                .query(&mut node_2)
                .expect("REPLICAOF NO ONE");
        };
        let seen = if contender_idle {
            round_trip.await;
            tokio::time::sleep(OBSERVED_AGAIN).await;
            contend(&b, &name, &held).await
        } else {
            let (_, seen) = tokio::join!(round_trip, contend(&b, &name, &held));
            seen
        };
        assert!(
            common::stored_value(&cluster.url(2).expect("node"), &name).is_none(),
            "the resync dropped the holder's key"
        );
        let context = format!("REPLICAOF and back, contender idle: {contender_idle}");
        assert_kept_out(&seen, "data_set", &context);
    }
}

/// A lock user whose ACL lacks `+info`: restarts and lost data sets cannot
/// be seen, so its nodes are not counted (fail safe), and the error says
/// why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_cannot_be_observed_are_not_counted() {
    let cluster = common::cluster(3);
    for i in 0..3 {
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "default", "-info"])
            .query(&mut connect(&cluster.url(i).expect("node")))
            .expect("ACL SETUSER");
    }
    let manager = manager(cluster.urls());
    let error = manager
        .lock(&resource("unobservable"))
        .no_wait()
        .await
        .expect_err("no node can be observed");
    let labels = quarantine_labels(&error);
    assert!(
        labels.len() >= 2 && labels.iter().all(|label| *label == "unobserved"),
        "the nodes are quarantined as unobserved: {error}"
    );
    // Allowed INFO again: observed, counted.
    for i in 0..3 {
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "default", "+info"])
            .query(&mut connect(&cluster.url(i).expect("node")))
            .expect("ACL SETUSER");
    }
    let counted = common::eventually_async(Duration::from_secs(5), || async {
        match manager.lock(&resource("unobservable")).no_wait().await {
            Ok(lock) => lock.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(counted, "{:?}", manager.quarantined_nodes());
}

/// A node that just restarted without persistence is busy (another
/// client's script runs past `busy-reply-threshold`) while a new manager
/// meets it: every command, INFO included, answers `-BUSY`. An
/// observation that failed must not count the node unseen: once it
/// answers, it is judged as any first meeting (here: too young).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_busy_at_first_sight_is_judged_once_it_answers() {
    let cluster = cluster_with(&["--appendonly", "no", "--busy-reply-threshold", "100"]);
    age_past_the_window().await;
    // Node 2 has been up for at most the time since this.
    let restarting = Instant::now();
    cluster.restart(2).expect("restart");
    let busy_node = cluster.url(2).expect("node");
    let busy = std::thread::spawn(move || {
        // Spins for 1.2 s of the node's time.
        let _: Result<i64, _> = redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] \
                 repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > 1200000 \
                 return 1",
            )
            .arg(0)
            .query(&mut connect(&busy_node));
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let newcomer = manager(cluster.urls());
    cluster.kill(3).expect("kill");
    cluster.kill(4).expect("kill");
    let name = resource("busy");
    if let Ok(lock) = newcomer.lock(&name).no_wait().await {
        panic!("a busy node was counted: {lock:?}");
    }
    busy.join().expect("the busy script ends");
    let up_at_end = restarting.elapsed();
    // Node 2 answers again; without it there is no quorum, and until a TTL
    // after its restart (the quarantine window is at least that) it has
    // run for less than the window. Beside a load the busy script may end
    // late: the attempts stop at the TTL, and a grant counts against the
    // guard only when node 2 was surely younger than that.
    let mut labels = BTreeSet::new();
    let until = (Instant::now() + Duration::from_millis(600)).min(restarting + TTL);
    while Instant::now() < until {
        let attempt = newcomer.lock(&name).no_wait().await;
        let up_at_most = restarting.elapsed();
        match attempt {
            Ok(lock) if up_at_most < TTL => panic!(
                "a node that restarted without persistence at most {up_at_most:?} ago (the \
                 quarantine window is at least the TTL, {TTL:?}) was counted: {lock:?}"
            ),
            Ok(_) => break,
            Err(error) => labels.extend(quarantine_labels(&error)),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        labels.contains("restart"),
        "no attempt after the busy script ended was refused for node 2's restart: labels seen \
         {labels:?}, the busy script ended {:?} after the restart began (the window: {TTL:?} at \
         least)",
        up_at_end
    );
}

/// The node's clock is stepped an hour forward right after a restart, so
/// its uptime claims an hour: the restart quarantine must not end early.
/// Seen twice over: an age reaching back before the old process's last
/// answer is impossible, and the old process's clock samples are kept, so
/// the step shows. Each refusal in the window must be for node 2's
/// restart quarantine, and after the window node 2 must count again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_across_a_restart_does_not_shorten_the_quarantine() {
    let cluster = TestCluster::start_with(
        5,
        &ClusterOptions {
            fake_clocks: true,
            extra_args: vec!["--appendonly".into(), "no".into()],
            ..ClusterOptions::default()
        },
    )
    .expect("cluster");
    age_past_the_window().await;
    let b = manager(cluster.urls());
    traffic(&b, Duration::from_millis(100)).await;
    // Idle longer than the window, so that the old process's last answer
    // is no bound.
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    cluster.restart(2).expect("restart");
    let restarted = Instant::now();
    cluster
        .step_clock(2, Duration::from_secs(3600), true)
        .expect("step");
    // The node reads its clock every 100 ms (hz 10).
    tokio::time::sleep(Duration::from_millis(150)).await;
    cluster.kill(3).expect("kill");
    cluster.kill(4).expect("kill");
    let name = resource("stepped");
    let stepped = cluster.urls()[2].clone();
    let port = stepped.rsplit(':').next().expect("a port").to_owned();
    let node_2 = |manager: &LockManager| -> Vec<&'static str> {
        manager
            .quarantined_nodes()
            .iter()
            .filter(|(node, _)| node.ends_with(&format!(":{port}")))
            .map(|(_, quarantine)| quarantine.reason.label())
            .collect()
    };
    // Refusals, and whether node 2 was quarantined for its restart at
    // each: from the first that says so to the window's end, every one
    // must (the first may come before the node was observed again).
    let mut refusals: Vec<(Duration, Vec<&'static str>)> = Vec::new();
    while restarted.elapsed() < TTL - Duration::from_millis(300) {
        match b.lock(&name).no_wait().await {
            Ok(lock) => panic!(
                "node 2 was counted {:?} after restarting empty (its uptime says an hour): \
                 {lock:?}",
                restarted.elapsed()
            ),
            Err(error) => {
                let why = node_2(&b);
                let seen_before = refusals.iter().any(|(_, w)| w.contains(&"restart"));
                assert!(
                    why.contains(&"restart") || !seen_before,
                    "refused {:?} after the restart ({error}), but node 2 is no longer \
                     quarantined for its restart: {why:?}; quarantined: {:?}",
                    restarted.elapsed(),
                    b.quarantined_nodes()
                );
                refusals.push((restarted.elapsed(), why));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Refused because node 2 was not counted for its restart, not for
    // another reason.
    let first = refusals.iter().find(|(_, why)| why.contains(&"restart"));
    assert!(
        refusals
            .last()
            .is_some_and(|(_, why)| why.contains(&"restart")),
        "refusals within the window did not end with node 2 quarantined for its restart: {} \
         refusals, the last (time since the restart, node 2's quarantine) {:?}, the first naming \
         the restart {first:?}",
        refusals.len(),
        refusals.last()
    );
    eprintln!(
        "{} refusals in the window; node 2 quarantined for its restart from {:?} on",
        refusals.len(),
        first.map(|(at, _)| at)
    );
    // After the window node 2 counts again: nodes 0 to 2 are all that is
    // up, so a grant needs it. (Generous bound: it is no timing test.)
    let until = restarted + TTL + Duration::from_secs(10);
    let last = loop {
        let attempt = b.lock(&name).no_wait().await;
        match attempt {
            Ok(lock) => {
                lock.release().await.expect("release");
                break None;
            }
            Err(error) if Instant::now() >= until => break Some(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(
        last.is_none(),
        "node 2 was not counted again {:?} after its restart (window {TTL:?}): the last \
         attempt gave {last:?}; node 2's quarantine: {:?}",
        restarted.elapsed(),
        node_2(&b)
    );
}

/// A node whose clock runs twice as fast, met for the first time: a
/// second clock reading on connect shows it before the first lock counts
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_clock_met_for_the_first_time_is_not_counted_by_the_first_lock() {
    let cluster = TestCluster::start_with(
        5,
        &ClusterOptions {
            fake_clocks: true,
            ..ClusterOptions::default()
        },
    )
    .expect("cluster");
    cluster.set_clock_rate(2, 2.0).expect("rate");
    cluster.kill(3).expect("kill");
    cluster.kill(4).expect("kill");
    let newcomer = builder(cluster.urls())
        .ttl(TTL)
        .node_guard(NodeGuard::default())
        .build()
        .expect("valid settings");
    match newcomer.lock(&resource("fast-first")).no_wait().await {
        Ok(lock) => panic!("the first lock counted a node whose clock runs 2×: {lock:?}"),
        Err(error) => assert_eq!(quarantine_labels(&error), ["clock_rate"], "{error}"),
    }
}

/// Someone overwrites the data-set mark of node 2 with text that is not a
/// mark (a hand-written mark with a typo: `SET quorumlock:node new-0`). The
/// observation replaces it (another data set, quarantined for a window), so
/// a later `FLUSHALL` on node 2 is still seen. It used to be left alone:
/// the manager then remembered no data set, the flush passed unseen, and
/// the contender was granted a lock the holder still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_mark_blinds_the_guard_to_a_later_flushall() {
    let cluster = cluster_with(&[]);
    let urls = cluster.urls();
    let (a, b) = (manager(urls.clone()), manager(urls.clone()));
    traffic(&b, Duration::from_millis(300)).await;
    let _: () = redis::cmd("SET")
        .arg(quorumlock::internals::judge::DATA_SET_KEY)
        .arg("new-0")
        .query(&mut connect(&urls[2]))
        .expect("SET");
    // B sees the mark "gone", waits out its window, and counts node 2 again.
    traffic(&b, TTL + OBSERVED_AGAIN).await;
    assert!(
        b.quarantined_nodes().is_empty(),
        "setup: node 2 is counted again after the window: {:?}",
        b.quarantined_nodes()
    );
    let name = resource("tampered");
    let held = hold_everywhere(&a, &name, &urls).await;
    drop_key_on(&urls, &name, &[3, 4]);
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut connect(&urls[2]))
        .expect("FLUSHALL");
    tokio::time::sleep(OBSERVED_AGAIN).await;
    let seen = contend(&b, &name, &held).await;
    assert_kept_out(
        &seen,
        "data_set",
        "node 2's mark overwritten with a non-mark, then flushed",
    );
}

/// A stable address in front of a Redis master that can be switched to
/// another server (a virtual IP, a DNS name or a Kubernetes service in
/// front of a Sentinel-managed pair): switching closes every connection.
struct Vip {
    listen: std::net::SocketAddr,
    upstream: std::sync::Arc<std::sync::Mutex<std::net::SocketAddr>>,
    generation: tokio::sync::watch::Sender<u64>,
    _thread: std::thread::JoinHandle<()>,
}

impl Vip {
    fn start(upstream: std::net::SocketAddr) -> Self {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let listen = std_listener.local_addr().expect("addr");
        let upstream = std::sync::Arc::new(std::sync::Mutex::new(upstream));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let (target, gen_tx) = (upstream.clone(), generation.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
                loop {
                    let Ok((mut client, _)) = listener.accept().await else {
                        return;
                    };
                    let to = *target.lock().expect("upstream");
                    let mut changed = gen_tx.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut node) = tokio::net::TcpStream::connect(to).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut node) => {}
                            _ = changed.changed() => {}
                        }
                    });
                }
            });
        });
        Self {
            listen,
            upstream,
            generation,
            _thread: thread,
        }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.listen)
    }

    fn switch_to(&self, upstream: std::net::SocketAddr) {
        *self.upstream.lock().expect("upstream") = upstream;
        self.generation.send_modify(|g| *g += 1);
    }
}

fn addr_of(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("redis://")
        .parse()
        .expect("loopback address")
}

fn info(url: &str, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(&mut connect(url))
        .expect("INFO")
}

/// Node 0 of three is a master with a replica (both `appendonly yes`,
/// `appendfsync always`), reached through one stable address. The replica
/// falls behind (its link to the master stalls), a holder takes a lock
/// whose key is on node 0 and node 1 only, node 0 crashes, and the replica
/// is promoted behind the same address, as Sentinel plus a virtual IP does:
/// it never got the holder's key. The contender, which knew node 0, meets a
/// new `run_id` whose process persists every write and whose data-set mark
/// is the same (replicated): it must still see another server (one that ran
/// before the old one last answered, or a promoted replica) and quarantine
/// it. It used to trust it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_behind_the_same_address_is_not_trusted_at_once() {
    let cluster = common::cluster(3);
    let replica =
        TestCluster::start_with_args(1, &["--repl-diskless-sync-delay", "0"]).expect("replica");
    let replica_url = replica.url(0).expect("replica");
    // The replication link goes through a proxy that can stall it.
    let link = FaultProxy::start(addr_of(&cluster.url(0).expect("node"))).expect("proxy");
    let link_port = link.url().rsplit(':').next().expect("port").to_owned();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(&link_port)
        .query(&mut connect(&replica_url))
        .expect("REPLICAOF");
    let synced = common::eventually(Duration::from_secs(10), || {
        let text = info(&replica_url, "replication");
        let persistence = info(&replica_url, "persistence");
        text.contains("master_link_status:up")
            && persistence.contains("aof_rewrite_in_progress:0")
            && persistence.contains("aof_rewrite_scheduled:0")
    })
    .await;
    assert!(synced, "setup: the replica synced");

    let vip = Vip::start(addr_of(&cluster.url(0).expect("node")));
    let urls = vec![
        vip.url(),
        cluster.url(1).expect("node"),
        cluster.url(2).expect("node"),
    ];
    let (holder, contender) = (manager(urls.clone()), manager(urls.clone()));
    traffic(&contender, Duration::from_millis(300)).await;
    // Let the replica catch up with everything so far, then stall it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    link.set_unresponsive(true);
    let name = resource("failover");
    let held = hold_everywhere(&holder, &name, &urls).await;
    drop_key_on(&urls, &name, &[2]);
    // Node 0 crashes; the replica is promoted and takes over the address.
    cluster.kill(0).expect("kill");
    let _: () = redis::cmd("REPLICAOF")
        .arg(&["NO", "ONE"])
        .query(&mut connect(&replica_url))
        .expect("REPLICAOF NO ONE");
    vip.switch_to(addr_of(&replica_url));
    assert!(
        common::stored_value(&replica_url, &name).is_none(),
        "setup: the promoted replica lacks the holder's key"
    );
    let seen = contend(&contender, &name, &held).await;
    assert_kept_out(
        &seen,
        "restart",
        "a replica promoted behind node 0's address",
    );
}
