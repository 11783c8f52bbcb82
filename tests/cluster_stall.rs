//! A shard master that stalls (`SIGSTOP`, or `DEBUG SLEEP`: its main
//! thread stuck) while its replica takes over, then resumes, serves what
//! was queued to it before it learns it was replaced: a late grant that
//! its replica never had. Counted with one standalone node, it made a
//! second holder once a client that met the promoted master counted it, a
//! window later. A write on a shard master with replicas now counts only
//! once a replica acknowledged it (`WAIT 1` behind it), which the demoted
//! master's never is.
//!
//! Setup (as the outside review measured it): one member a Redis Cluster
//! of 3 masters with a replica each (`cluster-node-timeout` 1 s), two
//! standalone nodes, TTL 2 s. Client A reaches the second standalone
//! node through a proxy that stops answering, so its grant needs the
//! cluster member; client B reaches every node. The master stalls; its
//! replica takes over; B meets the promoted master (quarantined for a
//! window, 3 s, as a failover); A's request reaches the stalled master
//! 0.8 s before that window ends and is served as the master resumes,
//! 0.3 s later; B tries until it is granted. The checks: A's late attempt
//! is not granted, and A and B never both hold (without `WAIT`, B was
//! granted with a second of A's lock left). Five runs of each stall with
//! `QUORUMLOCK_LONG=1` (CI), one otherwise.

mod common;

use std::time::Duration;

use quorumlock::internals::{KeyKind, key_of, slot};
use quorumlock::testkit::{ClusterMember, ClusterOptions, TestCluster};
use quorumlock::{Backoff, Fencing, LockManager};
use tokio::time::Instant;

use common::cluster::{names_master, port_of, query, replica_of};

/// How the shard master stalls.
#[derive(Debug, Clone, Copy)]
enum Stall {
    /// `SIGSTOP`, then `SIGCONT`.
    Signal,
    /// `DEBUG SLEEP`: the main thread sleeps; nothing is signalled.
    DebugSleep,
}

const TTL: Duration = Duration::from_secs(2);

/// When B meets the promoted master, after the stall began: past the
/// failover (about 2.5 s with `cluster-node-timeout` 1 s). B counts it
/// again a window (3 s: the TTL and `cluster-node-timeout`) later.
const MEET: Duration = Duration::from_millis(5800);

/// How long `DEBUG SLEEP` keeps the master's main thread stuck: it wakes
/// about 0.7 s before B's quarantine of the promoted master ends.
const SLEEP: Duration = Duration::from_millis(8500);

/// One run: whether A and B both held at once (how long A's lock had
/// left when B was granted), and whether A's late attempt was granted.
struct Run {
    overlap: Option<Duration>,
    late_grant: bool,
    /// When B was granted, after it met the promoted master (`None`: not
    /// within 12 s, and the run shows nothing).
    b_granted: Option<Duration>,
}

fn manager(urls: Vec<String>, node_timeout: Duration) -> LockManager {
    // timing: A's round must still be open when the stalled master
    // resumes and answers (1.5 s); B's short (200 ms), so that it moves
    // to the promoted master soon after the stalled one stops answering
    common::builder(urls)
        .ttl(TTL)
        .node_timeout(node_timeout)
        .fencing(Fencing::CounterNode { node: 0 })
        .unavailable_retry(Backoff::none())
        .build()
        .expect("valid settings")
}

/// A resource whose keys live in `slot` (another name than `taken`).
fn in_slot(slot_number: u16, taken: &str) -> String {
    (0u64..)
        .map(|n| format!("stall:{{{n}}}"))
        .find(|name| name != taken && slot(&key_of(KeyKind::Lock, name)) == slot_number)
        .expect("some name hashes to every slot")
}

async fn one_run(stall: Stall) -> Run {
    let member = ClusterMember::start(3, 1).expect("a 3-shard cluster with a replica each");
    let standalone = TestCluster::start_with(
        2,
        &ClusterOptions {
            proxied: true,
            ..ClusterOptions::default()
        },
    )
    .expect("two standalone nodes behind proxies");
    let member_url = member.url().expect("a URL");
    let direct: Vec<String> = (0..2)
        .map(|i| standalone.direct_url(i).expect("direct"))
        .collect();
    // A reaches the second standalone node through its proxy.
    let a = manager(
        vec![
            member_url.clone(),
            direct[0].clone(),
            standalone.url(1).expect("proxy"),
        ],
        Duration::from_millis(1500),
    );
    let b = manager(
        vec![member_url, direct[0].clone(), direct[1].clone()],
        Duration::from_millis(200),
    );
    let resource = "stall:r".to_owned();
    let key = key_of(KeyKind::Lock, &resource);
    let the_slot = slot(&key);
    let master = member.master_of(&key).expect("a master");
    let replica = replica_of(&member, &master);
    let neighbour = in_slot(the_slot, &resource);
    // Both know the master (connections open, slot map read).
    for client in [&a, &b] {
        client
            .lock(&neighbour)
            .no_wait()
            .await
            .expect("a lock before the stall")
            .release()
            .await
            .expect("release");
    }
    standalone.proxy(1).expect("proxy").set_unresponsive(true);

    let index = member
        .nodes()
        .urls()
        .iter()
        .position(|url| *url == master)
        .expect("the master is a node of the member");
    let stalled_at = Instant::now();
    let sleeper = match stall {
        Stall::Signal => {
            member.nodes().pause(index).expect("SIGSTOP the master");
            None
        }
        Stall::DebugSleep => {
            let url = master.clone();
            Some(std::thread::spawn(move || {
                let _: redis::RedisResult<()> = redis::Client::open(url.as_str())
                    .and_then(|client| client.get_connection())
                    .and_then(|mut conn| {
                        redis::cmd("DEBUG")
                            .arg("SLEEP")
                            .arg(SLEEP.as_secs_f64())
                            .query(&mut conn)
                    });
            }))
        }
    };
    // The replica takes over (the master is out for over 1 s).
    loop {
        let promoted = query::<String>(&replica, redis::cmd("INFO").arg("replication"))
            .contains("role:master");
        if promoted && names_master(&replica, the_slot, port_of(&replica)) {
            break;
        }
        assert!(
            Instant::now() < stalled_at + MEET,
            "the replica had not taken over {MEET:?} after the master stalled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // B meets the promoted master (quarantined: a failover), on another
    // resource of the slot, so as to leave the lock free.
    let promoted = replica.trim_start_matches("redis://").to_owned();
    tokio::time::sleep_until(stalled_at + MEET).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let first_sight = loop {
        if let Ok(lock) = b.lock(&neighbour).no_wait().await {
            lock.release().await.ok();
        }
        let seen = b
            .quarantined_nodes()
            .into_iter()
            .find(|(node, _)| node.ends_with(&promoted));
        if let Some((_, quarantine)) = seen {
            break (Instant::now(), quarantine.remaining);
        }
        assert!(Instant::now() < deadline, "B never met the promoted master");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (first_sight, quarantine) = (
        first_sight.0,
        first_sight.1.expect("a failover's quarantine ends by time"),
    );
    // A asks so that the master resumes (300 ms on) shortly before B's
    // quarantine of the promoted master ends: a late grant would outlive
    // it by a second.
    let ask_at = match stall {
        Stall::Signal => first_sight + quarantine - Duration::from_millis(800),
        // Asleep, it wakes when it does.
        Stall::DebugSleep => stalled_at + SLEEP - Duration::from_millis(300),
    };
    tokio::time::sleep_until(ask_at).await;

    // A's request reaches the stalled master; it resumes 300 ms later.
    let late = tokio::spawn({
        let a = a.clone();
        let resource = resource.clone();
        async move { a.lock(&resource).no_wait().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    match stall {
        Stall::Signal => member.nodes().resume(index).expect("SIGCONT the master"),
        Stall::DebugSleep => {
            // It wakes by itself: wait for it.
            if let Some(sleeper) = sleeper {
                tokio::task::spawn_blocking(move || sleeper.join())
                    .await
                    .expect("joined")
                    .ok();
            }
        }
    }
    let a_lock = late.await.expect("no panic").ok();
    let late_grant = a_lock.is_some();

    // B tries until it is granted (a window after it met the promoted
    // master), at most 12 s after it met it.
    let until = first_sight + Duration::from_secs(12);
    let mut overlap = None;
    let mut b_granted = None;
    while Instant::now() < until {
        if let Ok(lock) = b.lock(&resource).no_wait().await {
            b_granted = Some(first_sight.elapsed());
            if let Some(a_lock) = &a_lock
                && a_lock.is_valid()
            {
                overlap = Some(a_lock.remaining());
            }
            lock.release().await.ok();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(a_lock);
    a.settle().await;
    b.settle().await;
    Run {
        overlap,
        late_grant,
        b_granted,
    }
}

async fn check(stall: Stall) {
    let runs = common::quick_or_long(1, 5);
    for run in 0..runs {
        let Run {
            overlap,
            late_grant,
            b_granted,
        } = one_run(stall).await;
        assert!(
            b_granted.is_some(),
            "{stall:?}, run {run}: B was never granted (within 12 s of meeting the promoted \
             master), so the run shows nothing"
        );
        assert!(
            overlap.is_none(),
            "{stall:?}, run {run}: B was granted while A's late lock had {overlap:?} left"
        );
        // A's other nodes: one granted, one did not answer. Its grant
        // needed the demoted master's.
        assert!(
            !late_grant,
            "{stall:?}, run {run}: A's late attempt was granted: the demoted master's grant counted"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_stopped_and_resumed_grants_nothing_that_counts() {
    check(Stall::Signal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_asleep_in_debug_sleep_grants_nothing_that_counts() {
    check(Stall::DebugSleep).await;
}

/// A shard whose one replica is stopped: no lock write there is
/// acknowledged, and the member fails with `Unreplicated`. `WAIT` waits
/// half the node timeout, so that its answer comes within the round (with
/// the whole of it, the answer came after the round gave up: a timeout,
/// and three in a row replaced the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_replica_is_stopped_fails_its_writes_as_unreplicated() {
    let member = ClusterMember::start(3, 1).expect("a 3-shard cluster with a replica each");
    let resource = "stall:unreplicated";
    let master = member
        .master_of(&key_of(KeyKind::Lock, resource))
        .expect("a master");
    let replica = replica_of(&member, &master);
    // settings: one member, so that its answer decides; fencing off (no
    // counter node to fail over to); a replica's acknowledgement may take
    // half the node timeout, which beside a disk-sync load is over 500 ms
    let manager = common::builder(vec![member.url().expect("a URL")])
        .node_timeout(common::scaled(Duration::from_secs(2)))
        .fencing(Fencing::Off)
        .unavailable_retry(Backoff::none())
        .build()
        .expect("valid settings");
    manager
        .lock(resource)
        .no_wait()
        .await
        .expect("granted while the replica runs")
        .release()
        .await
        .expect("release");
    let index = member
        .nodes()
        .urls()
        .iter()
        .position(|url| *url == replica)
        .expect("the replica is a node of the member");
    member.nodes().pause(index).expect("SIGSTOP the replica");
    let outcome = manager.lock(resource).no_wait().await;
    member.nodes().resume(index).expect("SIGCONT the replica");
    match &outcome {
        Err(quorumlock::Error::QuorumUnavailable { errors, .. })
            if errors
                .iter()
                .any(|e| matches!(e.kind, quorumlock::NodeErrorKind::Unreplicated(_))) => {}
        other => panic!("a write no replica can acknowledge: {other:?}"),
    }
}
