//! Nemesis soak on members that are Redis Clusters: three members of three
//! shard masters with a replica each (replicas never fail over on their
//! own: `cluster-replica-no-failover yes`, as fencing requires), eight
//! clients waiting for five resources and doing a read-modify-write of
//! each resource's count through the storage's fence, while a nemesis, on
//! one member at a time: fails a shard over by hand (`CLUSTER FAILOVER`),
//! takes a shard over (`CLUSTER FAILOVER TAKEOVER`) once the replica has
//! caught up with its master's writes (paused for the moment), kills a
//! master (`SIGKILL`, once its replica caught up) and has its replica take
//! over, then brings the dead one back as a replica, stops a master
//! (`SIGSTOP`) until its replica, allowed to for this, takes over on its
//! own, then resumes it (it serves what was queued to it before it learns
//! it was replaced: writes no replica acknowledges, which count nowhere),
//! or moves
//! the slot of a soak resource to another shard master with its keys
//! (`SETSLOT`, `MIGRATE`) while clients hold and wait for it. Afterwards:
//! no two holds of a resource overlap, tokens increase per resource in
//! the order of the holds, every count equals its acknowledged writes (no
//! lost update), and the nemesis did each kind of thing. (A takeover that
//! loses writes is `tests/cluster_failover.rs`: fencing counters cannot
//! survive it, see docs/scaling-out.md.) `QUORUMLOCK_SOAK_SECS` sets the
//! length (default 8 s, 25 s with `QUORUMLOCK_LONG=1`).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::internals::{KeyKind, key_of};
use quorumlock::testkit::{ClusterMember, TestCluster};
use quorumlock::{Error, FencedRedis, LockManager, NodeGuard};
use tokio::time::Instant;

const CLIENTS: usize = 8;
const RESOURCES: [&str; 5] = ["csoak:a", "csoak:b", "csoak:c", "csoak:d", "csoak:e"];
const TTL: Duration = Duration::from_secs(1);
/// The longest TTL plus the clusters' node timeout (1 s), with room: see
/// docs/scaling-out.md.
const QUARANTINE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
struct Hold {
    resource: &'static str,
    token: u64,
    got_at: Instant,
    until: Instant,
}

#[derive(Default)]
struct Soak {
    holds: Mutex<Vec<Hold>>,
    acked: Mutex<HashMap<&'static str, u64>>,
    acquisitions: AtomicU64,
    unavailable: AtomicU64,
    /// When each acquisition failed for want of a quorum.
    failed_at: Mutex<Vec<Instant>>,
    /// When each move began, and which it was (done or not).
    moves_at: Mutex<Vec<(Instant, Move)>>,
    fenced_out: AtomicU64,
    stop: AtomicBool,
    timeline: Mutex<Vec<(Instant, String)>>,
}

fn soak_length(default: Duration) -> Duration {
    std::env::var("QUORUMLOCK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(default, Duration::from_secs)
}

fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let mut conn = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(2))?;
    cmd.query(&mut conn)
}

fn value_key(resource: &str) -> String {
    format!("{resource}:value")
}

async fn run_client(soak: Arc<Soak>, manager: LockManager, storage: FencedRedis) {
    while !soak.stop.load(Ordering::SeqCst) {
        let resource = RESOURCES[fastrand::usize(..RESOURCES.len())];
        let lock = match manager
            .lock(resource)
            .ttl(TTL)
            .wait(Duration::from_secs(2))
            .await
        {
            Ok(lock) => lock,
            Err(Error::WaitTimedOut { .. } | Error::Contended { .. }) => continue,
            Err(_) => {
                soak.unavailable.fetch_add(1, Ordering::Relaxed);
                soak.failed_at
                    .lock()
                    .expect("failed_at")
                    .push(Instant::now());
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let got_at = Instant::now();
        soak.acquisitions.fetch_add(1, Ordering::Relaxed);
        let token = lock.token().expect("fencing is on").get();
        let fence = lock.fence().expect("an exclusive lock");
        match storage.read(&fence, &value_key(resource)).await {
            Ok(value) => {
                let count: u64 = value.and_then(|v| v.parse().ok()).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..10))).await;
                match storage
                    .set(&fence, &value_key(resource), (count + 1).to_string())
                    .await
                {
                    Ok(()) => {
                        *soak
                            .acked
                            .lock()
                            .expect("acked")
                            .entry(resource)
                            .or_default() += 1
                    }
                    Err(Error::FencedOut { .. }) => {
                        soak.fenced_out.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(other) => panic!("storage failed (it has no faults): {other}"),
                }
            }
            Err(Error::FencedOut { .. }) => {
                soak.fenced_out.fetch_add(1, Ordering::Relaxed);
            }
            Err(other) => panic!("storage failed (it has no faults): {other}"),
        }
        let until = Instant::now().min(lock.valid_until());
        soak.holds.lock().expect("holds").push(Hold {
            resource,
            token,
            got_at,
            until,
        });
        let _ = lock.release().await;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Move {
    ManualFailover,
    CaughtUpTakeover,
    CaughtUpKill,
    /// A master stopped past its failover, then resumed: it serves what
    /// was queued to it before it learns it was replaced.
    StalledTakeover,
    Reshard,
}

const MOVES: [Move; 5] = [
    Move::ManualFailover,
    Move::CaughtUpTakeover,
    Move::CaughtUpKill,
    Move::StalledTakeover,
    Move::Reshard,
];

/// A shard of `member` whose replica is in sync, at random.
fn random_shard(member: &ClusterMember) -> Result<(String, String), String> {
    let shards = member.shards();
    shards
        .get(fastrand::usize(..shards.len().max(1)))
        .cloned()
        .ok_or_else(|| "no shard with a replica in sync".to_owned())
}

/// `kind` (a failover, a takeover or a kill) on a random shard of `member`.
async fn shard_move(member: &ClusterMember, kind: Move) -> Result<String, String> {
    let (master, replica) = random_shard(member)?;
    let done = match kind {
        Move::ManualFailover => member.manual_failover(&master, &replica).await,
        Move::CaughtUpTakeover => member.caught_up_takeover(&master, &replica).await,
        Move::CaughtUpKill => member.caught_up_kill(&master, &replica).await,
        Move::StalledTakeover => member.stalled_takeover(&master, &replica).await,
        Move::Reshard => unreachable!("a reshard moves a slot, not a shard's master"),
    };
    done.map_err(|e| e.to_string())
}

/// Moves the slot of a random soak resource to another master of
/// `member`, keys and all, while clients hold and wait for it.
async fn reshard(member: &ClusterMember) -> Result<String, String> {
    let resource = RESOURCES[fastrand::usize(..RESOURCES.len())];
    let key = key_of(KeyKind::Lock, resource);
    let from = member.master_of(&key).map_err(|e| e.to_string())?;
    let masters: Vec<String> = member
        .shards()
        .into_iter()
        .map(|(master, _)| master)
        .filter(|m| *m != from)
        .collect();
    let to = masters
        .get(fastrand::usize(..masters.len().max(1)))
        .ok_or("no other master")?;
    // Clients see the slot migrating for a moment.
    let migrating = Duration::from_millis(fastrand::u64(0..200));
    member
        .move_slot_of(&key, to, migrating)
        .await
        .map(|note| format!("{note} ({resource})"))
        .map_err(|e| e.to_string())
}

async fn run_nemesis(
    soak: &Soak,
    members: &[ClusterMember],
    length: Duration,
) -> BTreeMap<Move, u64> {
    let mut done = BTreeMap::new();
    let end = Instant::now() + length;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(300..1200))).await;
        let member = &members[fastrand::usize(..members.len())];
        let kind = MOVES[fastrand::usize(..MOVES.len())];
        soak.moves_at
            .lock()
            .expect("moves_at")
            .push((Instant::now(), kind));
        let outcome = match kind {
            Move::Reshard => reshard(member).await,
            _ => shard_move(member, kind).await,
        };
        let note = match outcome {
            Ok(note) => {
                *done.entry(kind).or_insert(0) += 1;
                note
            }
            Err(why) => format!("{kind:?} not done: {why}"),
        };
        soak.timeline
            .lock()
            .expect("timeline")
            .push((Instant::now(), note));
    }
    done
}

/// Per kind of move: how many were made, and the failed acquisitions
/// between its start and the next move's (what each kind of fault costs,
/// in acquisitions that found no quorum; roughly: a window, 3 s here,
/// outlasts the gap to the next move, whose count gets the rest).
fn unavailability_by_move(soak: &Soak) -> BTreeMap<Move, (u64, u64)> {
    let moves = soak.moves_at.lock().expect("moves_at").clone();
    let failed = soak.failed_at.lock().expect("failed_at").clone();
    let mut out: BTreeMap<Move, (u64, u64)> = BTreeMap::new();
    for (i, (start, kind)) in moves.iter().enumerate() {
        let end = moves.get(i + 1).map(|(at, _)| *at);
        let during = failed
            .iter()
            .filter(|at| *at >= start && end.is_none_or(|end| **at < end))
            .count() as u64;
        let entry = out.entry(*kind).or_default();
        entry.0 += 1;
        entry.1 += during;
    }
    out
}

fn violations(soak: &Soak, storage_url: &str) -> Vec<String> {
    let mut found = Vec::new();
    let holds = soak.holds.lock().expect("holds").clone();
    let mut by_resource: HashMap<&str, Vec<&Hold>> = HashMap::new();
    for hold in &holds {
        by_resource.entry(hold.resource).or_default().push(hold);
    }
    for (resource, mut holds) in by_resource {
        holds.sort_by_key(|h| h.got_at);
        for pair in holds.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.got_at < a.until {
                found.push(format!(
                    "{resource}: holds overlap: token {} until {:?}, token {} from {:?}",
                    a.token, a.until, b.token, b.got_at
                ));
            }
            if b.token <= a.token {
                found.push(format!(
                    "{resource}: token {} after token {} (not increasing)",
                    b.token, a.token
                ));
            }
        }
    }
    let acked = soak.acked.lock().expect("acked").clone();
    for resource in RESOURCES {
        let stored: Option<String> =
            query(storage_url, redis::cmd("GET").arg(value_key(resource))).expect("storage");
        let stored: u64 = stored.and_then(|v| v.parse().ok()).unwrap_or(0);
        let expected = acked.get(resource).copied().unwrap_or(0);
        if stored != expected {
            found.push(format!(
                "{resource}: count {stored}, but {expected} writes were acknowledged (lost update)"
            ));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_members_survive_failovers_and_reshards() {
    // 25 s meets every kind of move; the short run checks the same
    // properties over fewer.
    let full = Duration::from_secs(25);
    let length = soak_length(common::quick_or_long(Duration::from_secs(8), full));
    let members: Vec<ClusterMember> = (0..3)
        .map(|_| ClusterMember::start(3, 1).expect("a 3-shard cluster with replicas"))
        .collect();
    for member in &members {
        for url in member.nodes().urls() {
            query::<()>(
                &url,
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("cluster-replica-no-failover")
                    .arg("yes"),
            )
            .expect("CONFIG SET");
        }
    }
    let urls: Vec<String> = members.iter().map(|m| m.url().expect("url")).collect();
    let storage_nodes = TestCluster::start(1).expect("storage");
    let storage_url = storage_nodes.urls()[0].clone();
    let soak = Arc::new(Soak::default());
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let manager = common::builder(urls.clone())
            .node_guard(NodeGuard::default().quarantine_window(QUARANTINE))
            .build()
            .expect("valid settings");
        let storage = FencedRedis::new(&storage_url).expect("storage");
        clients.push(tokio::spawn(run_client(
            Arc::clone(&soak),
            manager,
            storage,
        )));
    }
    let moves = run_nemesis(&soak, &members, length).await;
    soak.stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("client");
    }
    let found = violations(&soak, &storage_url);
    let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "cluster soak {length:?}: {} acquisitions, {} unavailable, {} fenced out, moves {moves:?}, \
         {} violations",
        count(&soak.acquisitions),
        count(&soak.unavailable),
        count(&soak.fenced_out),
        found.len()
    );
    for (kind, (made, failed)) in unavailability_by_move(&soak) {
        eprintln!(
            "  {kind:?}: {made} made, {failed} failed acquisitions until the next move \
             ({:.0} per move)",
            failed as f64 / made.max(1) as f64
        );
    }
    if !found.is_empty() {
        let timeline = soak.timeline.lock().expect("timeline");
        for (at, what) in timeline.iter() {
            eprintln!("  {at:?} {what}");
        }
    }
    assert!(found.is_empty(), "violations:\n{}", found.join("\n"));
    assert!(count(&soak.acquisitions) > 100, "too few acquisitions");
    if length < full {
        eprintln!("a {length:?} soak meets only some moves: QUORUMLOCK_LONG=1 (CI) runs {full:?}");
        return;
    }
    for kind in MOVES {
        assert!(
            moves.get(&kind).copied().unwrap_or(0) > 0,
            "the nemesis never did {kind:?}: {moves:?}; timeline: {:?}",
            soak.timeline.lock().expect("timeline")
        );
    }
}
