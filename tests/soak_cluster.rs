//! Nemesis soak on members that are Redis Clusters: three members of three
//! shard masters with a replica each (replicas never fail over on their
//! own: `cluster-replica-no-failover yes`, as fencing requires), eight
//! clients waiting for five resources and doing a read-modify-write of
//! each resource's count through the storage's fence, while a nemesis, on
//! one member at a time: fails a shard over by hand (`CLUSTER FAILOVER`),
//! takes a shard over (`CLUSTER FAILOVER TAKEOVER`) once the replica has
//! caught up with its master's writes (paused for the moment), kills a
//! master (`SIGKILL`, once its replica caught up) and has its replica take
//! over, then brings the dead one back as a replica, or moves
//! the slot of a soak resource to another shard master with its keys
//! (`SETSLOT`, `MIGRATE`) while clients hold and wait for it. Afterwards:
//! no two holds of a resource overlap, tokens increase per resource in
//! the order of the holds, every count equals its acknowledged writes (no
//! lost update), and the nemesis did each kind of thing. (A takeover that
//! loses writes is `tests/cluster_failover.rs`: fencing counters cannot
//! survive it, see docs/scaling-out.md.) `QUORUMLOCK_SOAK_SECS` sets the
//! length (default 20 s).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::internals::{KeyKind, key_of, slot};
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
    Reshard,
}

const MOVES: [Move; 4] = [
    Move::ManualFailover,
    Move::CaughtUpTakeover,
    Move::CaughtUpKill,
    Move::Reshard,
];

/// The master URL and its replica's, for every shard of `member`.
fn shards(member: &ClusterMember) -> Vec<(String, String)> {
    let urls = member.nodes().urls();
    let mut out = Vec::new();
    for url in &urls {
        let Ok(info) = query::<String>(url, redis::cmd("INFO").arg("replication")) else {
            continue;
        };
        if !info.contains("role:master") {
            continue;
        }
        let replica = urls.iter().find(|other| {
            query::<String>(other, redis::cmd("INFO").arg("replication")).is_ok_and(|i| {
                i.contains("role:slave")
                    && i.contains(&format!("master_port:{}\r", port_of(url)))
                    && i.contains("master_link_status:up")
            })
        });
        if let Some(replica) = replica {
            out.push((url.clone(), replica.clone()));
        }
    }
    out
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port")
}

/// Waits (up to 10 s) until `url` says `role:master` and the member's
/// running nodes agree on the slot map again.
async fn settled(member: &ClusterMember, url: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let promoted = query::<String>(url, redis::cmd("INFO").arg("replication"))
            .is_ok_and(|i| i.contains("role:master"));
        // The nodes that run (a killed master is down meanwhile).
        let agree = member
            .nodes()
            .urls()
            .iter()
            .enumerate()
            .filter(|&(i, _)| member.nodes().is_running(i).unwrap_or(false))
            .all(|(_, node)| {
                query::<String>(node, redis::cmd("CLUSTER").arg("INFO"))
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            });
        if promoted && agree {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn manual_failover(member: &ClusterMember) -> Result<String, String> {
    let shards = shards(member);
    let (master, replica) = shards
        .get(fastrand::usize(..shards.len().max(1)))
        .ok_or("no shard with a replica in sync")?;
    query::<()>(replica, redis::cmd("CLUSTER").arg("FAILOVER"))
        .map_err(|e| format!("CLUSTER FAILOVER on {replica}: {e}"))?;
    if settled(member, replica).await {
        Ok(format!("manual failover {master} -> {replica}"))
    } else {
        Err(format!("{replica} did not take over from {master}"))
    }
}

/// Pauses the writers of `master` and waits (up to 3 s) until `replica`
/// has everything it wrote; the pause ends by itself after 5 s, or with
/// `CLIENT UNPAUSE`.
async fn pause_until_caught_up(master: &str, replica: &str) -> Result<(), String> {
    query::<()>(
        master,
        redis::cmd("CLIENT").arg("PAUSE").arg(5000).arg("WRITE"),
    )
    .map_err(|e| format!("CLIENT PAUSE on {master}: {e}"))?;
    let offset = |url: &str, field: &str| -> Option<u64> {
        let info = query::<String>(url, redis::cmd("INFO").arg("replication")).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().parse().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (sent, got) = (
            offset(master, "master_repl_offset:"),
            offset(replica, "slave_repl_offset:"),
        );
        if sent.is_some() && sent == got {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = query::<()>(master, redis::cmd("CLIENT").arg("UNPAUSE"));
            return Err(format!(
                "{replica} did not catch up: {sent:?} against {got:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A takeover that loses nothing: the master's writers are paused until
/// the replica has everything, then the replica takes over without the
/// master's agreement.
async fn caught_up_takeover(member: &ClusterMember) -> Result<String, String> {
    let shards = shards(member);
    let (master, replica) = shards
        .get(fastrand::usize(..shards.len().max(1)))
        .ok_or("no shard with a replica in sync")?;
    pause_until_caught_up(master, replica).await?;
    let taken = query::<()>(
        replica,
        redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"),
    );
    let _ = query::<()>(master, redis::cmd("CLIENT").arg("UNPAUSE"));
    taken.map_err(|e| format!("TAKEOVER on {replica}: {e}"))?;
    if settled(member, replica).await {
        Ok(format!("caught-up takeover {master} -> {replica}"))
    } else {
        Err(format!("{replica} did not take over from {master}"))
    }
}

/// A master dies (`SIGKILL`) once its replica has everything (a lost write
/// would repeat a fencing token: docs/scaling-out.md), the replica takes
/// over, and the dead master comes back as its replica. Clients meet a
/// dead master first: they must find the new one by themselves.
async fn caught_up_kill(member: &ClusterMember) -> Result<String, String> {
    let shards = shards(member);
    let (master, replica) = shards
        .get(fastrand::usize(..shards.len().max(1)))
        .ok_or("no shard with a replica in sync")?;
    let index = member
        .nodes()
        .urls()
        .iter()
        .position(|url| url == master)
        .ok_or("the master is not a node of the member")?;
    pause_until_caught_up(master, replica).await?;
    member
        .nodes()
        .kill(index)
        .map_err(|e| format!("kill {master}: {e}"))?;
    query::<()>(
        replica,
        redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"),
    )
    .map_err(|e| format!("TAKEOVER on {replica} after {master} died: {e}"))?;
    let took_over = settled(member, replica).await;
    member
        .nodes()
        .restart(index)
        .map_err(|e| format!("restart {master}: {e}"))?;
    // Set at run time only: the restarted node must not fail over on its own either.
    let _ = query::<()>(
        master,
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-replica-no-failover")
            .arg("yes"),
    );
    if took_over {
        Ok(format!("caught-up kill of {master}, {replica} took over"))
    } else {
        Err(format!(
            "{replica} did not take over from the dead {master}"
        ))
    }
}

/// Moves the slot of a random soak resource to another master of
/// `member`, keys and all.
async fn reshard(member: &ClusterMember) -> Result<String, String> {
    let resource = RESOURCES[fastrand::usize(..RESOURCES.len())];
    let key = key_of(KeyKind::Lock, resource);
    let slot = slot(&key);
    let from = member.master_of(&key).map_err(|e| e.to_string())?;
    let masters: Vec<String> = shards(member)
        .into_iter()
        .map(|(master, _)| master)
        .filter(|m| *m != from)
        .collect();
    let to = masters
        .get(fastrand::usize(..masters.len().max(1)))
        .ok_or("no other master")?
        .clone();
    let id = |url: &str| query::<String>(url, redis::cmd("CLUSTER").arg("MYID"));
    let fail = |e: redis::RedisError| format!("reshard of slot {slot}: {e}");
    let (from_id, to_id) = (id(&from).map_err(fail)?, id(&to).map_err(fail)?);
    let set = |url: &str, state: &str, node: &str| {
        query::<()>(
            url,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(node),
        )
    };
    set(&to, "IMPORTING", &from_id).map_err(fail)?;
    set(&from, "MIGRATING", &to_id).map_err(fail)?;
    loop {
        let keys: Vec<String> = query(
            &from,
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100),
        )
        .map_err(fail)?;
        if keys.is_empty() {
            break;
        }
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(port_of(&to))
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys);
        query::<redis::Value>(&from, &migrate).map_err(fail)?;
    }
    // Clients see the slot migrating for a moment.
    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..200))).await;
    // The two masters must take the new owner (the importing one first):
    // a refusal there leaves the slot half moved, no reshard done.
    set(&to, "NODE", &to_id).map_err(|e| format!("SETSLOT NODE on {to}: {}", fail(e)))?;
    set(&from, "NODE", &to_id).map_err(|e| format!("SETSLOT NODE on {from}: {}", fail(e)))?;
    for url in member.nodes().urls() {
        if url != to && url != from {
            // Replicas follow their masters' view; a refusal there is fine.
            let _ = set(&url, "NODE", &to_id);
        }
    }
    Ok(format!("slot {slot} ({resource}) {from} -> {to}"))
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
            Move::ManualFailover => manual_failover(member).await,
            Move::CaughtUpTakeover => caught_up_takeover(member).await,
            Move::CaughtUpKill => caught_up_kill(member).await,
            Move::Reshard => reshard(member).await,
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
    let length = soak_length(Duration::from_secs(20));
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
    for kind in MOVES {
        assert!(
            moves.get(&kind).copied().unwrap_or(0) > 0,
            "the nemesis never did {kind:?}: {moves:?}; timeline: {:?}",
            soak.timeline.lock().expect("timeline")
        );
    }
}
