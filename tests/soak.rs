//! Nemesis soak on a real five-node cluster: 16 clients contend for five
//! resources (half waiting in line with `lock_within`, some waits dropped
//! halfway; a quarter with `lock()`, every sixteenth hold of theirs a zombie
//! that stalls past its TTL and writes after a newer holder; a quarter, in
//! turn, waiting for two resources at once with `lock_many_within`,
//! reading, or holding one resource while waiting for a second, in the
//! resources' order) while a nemesis kills, pauses, restarts, slows,
//! blackholes, disconnects, speeds up or steps the clock of at most two
//! nodes at a time, or restarts them into `appendfsync everysec` and back
//! into `always`, or kill two and bring them back empty while a lock is
//! held (clock, persistence and wipe faults are the node guard's to
//! catch); the kinds come round-robin, each injection counts once its
//! effect is seen, and every kind must have taken effect. Every writer does a read-modify-write through the storage's
//! fence: a fenced read (`FencedRedis::read`, which claims the resource for
//! its token) of the resource's count of writes, then a write of that count
//! plus one, and an append to the resource's log (readers write nothing).
//! A zombie reads at the start of its hold and writes once a newer holder's
//! fenced read has returned, mostly before that holder writes: the order in
//! which checking writes alone loses an update. Afterwards:
//! no hold overlapping a writer's (readers may share), writers' tokens
//! increasing per resource, readers' tokens at least every earlier
//! writer's, no stale write accepted, every acknowledged write present,
//! each resource's count equal to its acknowledged writes (no lost update),
//! every zombie's write refused, the fence challenged by zombies at
//! least once per three seconds of soak, and refused by a fenced read
//! alone (before the newer holder wrote) at least once per six (a checker
//! that never sees its event passes forever), and no failed acquisition
//! that the faults do not explain (see `classify`), and some handovers
//! put at risk by a wipe (a node lost the holder's key while it held). `QUORUMLOCK_SOAK_SECS` sets
//! the length (default 30 s).
//!
//! Beside them, two election candidates campaign for one role; each term
//! is held (kept alive) for up to 2.5 TTLs, then its leader does the same
//! fenced read-modify-write, on the role's resource, and resigns. Terms
//! go through the same checks: no two leaders at once, terms increasing,
//! no stale write accepted.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::kind::Many;
use quorumlock::testkit::{ClusterOptions, Delay, Faults, Restart, TestCluster};
use quorumlock::{Error, Fence, FencedRedis, Fencing, FencingToken, Leadership, Lock, LockManager};
use tokio::time::Instant;

const CLIENTS: usize = 16;
const RESOURCES: [&str; 5] = ["soak:a", "soak:b", "soak:c", "soak:d", "soak:e"];
const TTL: Duration = Duration::from_secs(1);
/// The role the election candidates campaign for, and its resource.
const ROLE: &str = "soak-leader";
const LEADER: &str = "election:soak-leader";
const CANDIDATES: usize = 2;

/// Every resource the checks go through: the clients' and the role's.
fn checked() -> impl Iterator<Item = &'static str> {
    RESOURCES.into_iter().chain([LEADER])
}

/// One hold of a lock, on this process's monotonic clock.
#[derive(Debug, Clone)]
struct Hold {
    client: usize,
    resource: &'static str,
    /// A read lock's hold.
    shared: bool,
    token: u64,
    /// When `lock()` or `lock_within()` returned.
    got_at: Instant,
    /// The earlier of its validity's end and the moment release was called.
    until: Instant,
}

#[derive(Default)]
struct Tally {
    acquisitions: AtomicU64,
    contentions: AtomicU64,
    /// Waits (`lock_within`) dropped before they ended.
    waits_dropped: AtomicU64,
    /// Of the acquisitions: read locks, locks on two resources, and second
    /// locks taken while holding a first.
    reads: AtomicU64,
    pairs: AtomicU64,
    nested: AtomicU64,
    /// Terms led by the election candidates.
    terms: AtomicU64,
    unavailable: AtomicU64,
    /// Failed acquisitions in which the node guard did not count a node.
    quarantined: AtomicU64,
    fenced_out: AtomicU64,
    /// Writers' fenced reads refused (their lock was already overtaken).
    reads_fenced_out: AtomicU64,
    zombies_fenced: AtomicU64,
    /// Of `zombies_fenced`: refused while no newer holder had written the
    /// resource yet, by a newer holder's fenced read alone.
    zombies_fenced_by_read: AtomicU64,
    zombies_unchallenged: AtomicU64,
    zombie_writes_accepted: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    Pause,
    Restart,
    Slow,
    Blackhole,
    Disconnect,
    Refuse,
    /// The node's clock runs 2–4× fast until healed (the node guard must
    /// stop counting it before it expires a holder's key early).
    ClockSkew,
    /// The node's clock jumps 1–3 s forward (expiring keys at once).
    ClockStep,
    /// The node restarts with `appendfsync everysec`; healed, it restarts
    /// again with `always`: restarts the guard must judge by the old
    /// process's settings too (both are quarantined). Clean shutdowns, so
    /// nothing is lost: a node that loses data may lose a fencing counter,
    /// and fencing needs persistence (that a node restarted empty is not
    /// counted is shown by tests/node_changes.rs and the model check).
    Persistence,
    /// The node is killed and comes back at once without its data (as a
    /// node without persistence would), timed while a lock is held with
    /// time left: the holder's key is gone from it, and the guard must
    /// keep it out while the lock is valid (it sees the empty data set).
    Wipe,
}

const FAULTS: [Fault; 11] = [
    Fault::Kill,
    Fault::Pause,
    Fault::Restart,
    Fault::Slow,
    Fault::Blackhole,
    Fault::Disconnect,
    Fault::Refuse,
    Fault::ClockSkew,
    Fault::ClockStep,
    Fault::Persistence,
    Fault::Wipe,
];

/// Clients whose every `ZOMBIE_EVERY`-th hold is a zombie: the `lock()`
/// callers (`client % 4 == 0`). A zombie's lock has a short TTL, since it
/// keeps everyone out of its resource until the lock expires.
const ZOMBIE_EVERY: u64 = 16;
const ZOMBIE_TTL: Duration = Duration::from_millis(250);

/// The longest wait for two resources at once (a waiter for both reserves
/// the first while it waits for the second), and for the second of a
/// nested hold (the first is held meanwhile).
const PAIR_WAIT: Duration = Duration::from_millis(500);
const NESTED_WAIT: Duration = Duration::from_millis(200);

struct Soak {
    cluster: Arc<TestCluster>,
    /// The storage Redis (no faults), alive until the checks have read it.
    _storage: TestCluster,
    storage_url: String,
    holds: Mutex<Vec<Hold>>,
    /// Pushes to the storage log that were acknowledged: resource → entries.
    acked: Mutex<HashMap<&'static str, Vec<String>>>,
    /// Writes of each resource's count that were acknowledged (to anyone).
    acked_counts: Mutex<HashMap<&'static str, u64>>,
    /// Per resource (as in `RESOURCES`), the highest token whose fenced
    /// read has returned: what a zombie waits for before it writes.
    claimed: Vec<tokio::sync::watch::Sender<u64>>,
    tally: Tally,
    stop: AtomicBool,
    /// What the nemesis did and when, to explain a violation.
    timeline: Mutex<Vec<(Instant, String)>>,
    /// Quarantine reasons named by failed acquisitions, by label.
    quarantines: Mutex<BTreeMap<&'static str, u64>>,
    /// Failed acquisitions other than contention, by what failed (the
    /// error, or the node errors under it): see [`classify`].
    failures: Mutex<BTreeMap<String, u64>>,
    /// Failures no fault of the nemesis explains (a counter unusable, a
    /// reply no Redis gives, a script error): must stay empty.
    unexpected: Mutex<Vec<String>>,
    /// Writer holds in progress, by client: the resource and until when
    /// (at most) it is held; for timing the wipes.
    live: Mutex<HashMap<usize, (&'static str, Instant)>>,
    /// When each wipe (`Fault::Wipe`) killed its node.
    wipes: Mutex<Vec<(Instant, usize)>>,
}

fn soak_length(default: Duration) -> Duration {
    std::env::var("QUORUMLOCK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(default, Duration::from_secs)
}

/// Runs clients and the nemesis for `length`.
async fn run_soak(length: Duration) -> (Arc<Soak>, Injections) {
    let cluster = Arc::new(
        TestCluster::start_with(
            5,
            &ClusterOptions {
                proxied: true,
                fake_clocks: true,
                ..ClusterOptions::default()
            },
        )
        .expect("cluster"),
    );
    let storage = common::cluster(1);
    let soak = Arc::new(Soak {
        cluster: Arc::clone(&cluster),
        storage_url: storage.urls()[0].clone(),
        _storage: storage,
        holds: Mutex::default(),
        acked: Mutex::default(),
        acked_counts: Mutex::default(),
        claimed: checked()
            .map(|_| tokio::sync::watch::Sender::new(0))
            .collect(),
        tally: Tally::default(),
        stop: AtomicBool::new(false),
        timeline: Mutex::default(),
        quarantines: Mutex::default(),
        failures: Mutex::default(),
        unexpected: Mutex::default(),
        live: Mutex::default(),
        wipes: Mutex::default(),
    });
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let soak = Arc::clone(&soak);
        clients.push(tokio::spawn(run_client(soak, client)));
    }
    for candidate in 0..CANDIDATES {
        let soak = Arc::clone(&soak);
        clients.push(tokio::spawn(run_candidate(soak, CLIENTS + candidate)));
    }
    let nemesis = tokio::spawn(run_nemesis(Arc::clone(&soak), length));
    let faults = nemesis.await.expect("nemesis");
    soak.stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("client");
    }
    (soak, faults)
}

async fn run_client(soak: Arc<Soak>, client: usize) {
    let manager = manager(&soak);
    let storage = storage(&soak);
    let mut round = 0u64;
    while !soak.stop.load(Ordering::SeqCst) {
        round += 1;
        let resource = RESOURCES[fastrand::usize(..RESOURCES.len())];
        // The resource after it, wrapping: a pair is sorted by the library,
        // a nested hold takes the two in the resources' order.
        let next = RESOURCES
            [(RESOURCES.iter().position(|&r| r == resource).unwrap_or(0) + 1) % RESOURCES.len()];
        let (first, second) = if resource < next {
            (resource, next)
        } else {
            (next, resource)
        };
        // Every fourth client waits for two resources at once, reads, or
        // holds one while waiting for another, in turn.
        let kind = match (client % 4, round % 3) {
            (2, 0) => Kind::Pair(next),
            (2, 1) => Kind::Read,
            (2, _) => Kind::Nested,
            _ => Kind::One,
        };
        let wait = Duration::from_millis(fastrand::u64(50..1500));
        let zombie = client.is_multiple_of(4) && round.is_multiple_of(ZOMBIE_EVERY);
        // Odd clients wait in line (queued, woken by releases), now and
        // then dropping the wait halfway; the others make one attempt
        // (not queued: they may barge in ahead of the waiters).
        let writer = match kind {
            Kind::Read => {
                let Some(lock) = held(&soak, manager.read(resource).wait(wait).await).await else {
                    continue;
                };
                let got_at = Instant::now();
                soak.tally.acquisitions.fetch_add(1, Ordering::Relaxed);
                soak.tally.reads.fetch_add(1, Ordering::Relaxed);
                let token = lock.writer_token().expect("quorum fencing");
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..15))).await;
                let until = Instant::now().min(lock.valid_until());
                soak.holds.lock().expect("holds").push(Hold {
                    client,
                    resource,
                    shared: true,
                    token: token.get(),
                    got_at,
                    until,
                });
                let _ = lock.release().await;
                continue;
            }
            Kind::Pair(other) => {
                let wait = wait.min(PAIR_WAIT);
                let acquired = manager.lock_many(&[resource, other]).wait(wait).await;
                let Some(lock) = held(&soak, acquired).await else {
                    continue;
                };
                Writer::Pair(lock)
            }
            Kind::Nested => {
                let Some(lock) = held(&soak, manager.lock(first).no_wait().await).await else {
                    continue;
                };
                let got_at = Instant::now();
                soak.tally.acquisitions.fetch_add(1, Ordering::Relaxed);
                // Holding `first`, wait for `second` (a waiter for both may
                // be queued: it must not hold this one back on `second`),
                // within the first's validity mostly.
                let wait = wait.min(NESTED_WAIT);
                let inner = held(&soak, manager.lock(second).wait(wait).await).await;
                if let Some(inner) = inner {
                    soak.tally.acquisitions.fetch_add(1, Ordering::Relaxed);
                    soak.tally.nested.fetch_add(1, Ordering::Relaxed);
                    let inner_at = Instant::now();
                    let inner = Writer::One(inner);
                    hold_and_write(&soak, &storage, client, &[second], inner, inner_at, false)
                        .await;
                }
                // Its hold began when it was granted, before the wait.
                let lock = Writer::One(lock);
                hold_and_write(&soak, &storage, client, &[first], lock, got_at, false).await;
                continue;
            }
            // A zombie keeps others out until its lock expires: briefly.
            Kind::One if zombie => {
                let acquired = manager.lock(resource).ttl(ZOMBIE_TTL).wait(wait).await;
                let Some(lock) = held(&soak, acquired).await else {
                    continue;
                };
                Writer::One(lock)
            }
            Kind::One if client % 2 == 1 => {
                let cut = Duration::from_millis(fastrand::u64(20..2000));
                let acquired =
                    match tokio::time::timeout(cut, manager.lock(resource).wait(wait)).await {
                        Ok(acquired) => acquired,
                        Err(_) => {
                            soak.tally.waits_dropped.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                let Some(lock) = held(&soak, acquired).await else {
                    continue;
                };
                Writer::One(lock)
            }
            Kind::One => {
                let Some(lock) = held(&soak, manager.lock(resource).no_wait().await).await else {
                    continue;
                };
                Writer::One(lock)
            }
        };
        let got_at = Instant::now();
        soak.tally.acquisitions.fetch_add(1, Ordering::Relaxed);
        let resources: Vec<&'static str> = match kind {
            Kind::Pair(other) => {
                soak.tally.pairs.fetch_add(1, Ordering::Relaxed);
                vec![resource, other]
            }
            _ => vec![resource],
        };
        hold_and_write(&soak, &storage, client, &resources, writer, got_at, zombie).await;
    }
}

/// An election candidate (`client` numbers it after the clients): it
/// campaigns, leads for a while (its lock kept alive through the faults),
/// writes as a leader, and resigns.
async fn run_candidate(soak: Arc<Soak>, client: usize) {
    let manager = manager(&soak);
    let storage = storage(&soak);
    let election = manager.election(ROLE);
    let name = format!("candidate {client}");
    while !soak.stop.load(Ordering::SeqCst) {
        // Dropped now and then, as a service would: it leaves nothing.
        let campaign = election.campaign(&name);
        let leadership = match tokio::time::timeout(Duration::from_secs(2), campaign).await {
            Err(_) => continue,
            Ok(acquired) => match held(&soak, acquired).await {
                Some(leadership) => leadership,
                None => continue,
            },
        };
        let got_at = Instant::now();
        soak.tally.terms.fetch_add(1, Ordering::Relaxed);
        let lead_for = Duration::from_millis(fastrand::u64(0..2500));
        soak.live
            .lock()
            .expect("live")
            .insert(client, (LEADER, got_at + lead_for));
        tokio::select! {
            _ = leadership.lost() => {}
            () = tokio::time::sleep(lead_for) => {}
        }
        let leader = Writer::Leader(leadership);
        hold_and_write(&soak, &storage, client, &[LEADER], leader, got_at, false).await;
    }
}

fn manager(soak: &Soak) -> LockManager {
    // settings: the soak's own (100 ms node timeout, short TTLs), against which the nemesis times its faults
    LockManager::builder()
        .nodes(soak.cluster.urls())
        .ttl(TTL)
        .node_timeout(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(500))
        .fencing(Fencing::Quorum)
        .build()
        .expect("valid settings")
}

fn storage(soak: &Soak) -> FencedRedis {
    FencedRedis::new(&soak.storage_url)
        .expect("storage url")
        .with_timeout(Duration::from_secs(2))
}

/// A writer's lock: on one resource, or on a pair; or a role's leadership.
enum Writer {
    One(Lock),
    Pair(Lock<Many>),
    Leader(Leadership),
}

impl Writer {
    fn token(&self) -> FencingToken {
        match self {
            Writer::One(lock) => lock.token(),
            Writer::Pair(lock) => lock.token(),
            Writer::Leader(leadership) => Some(leadership.term()),
        }
        .expect("quorum fencing")
    }

    fn fence(&self, resource: &str) -> Fence {
        match self {
            Writer::One(lock) => lock.fence(),
            Writer::Pair(lock) => lock.fence_for(resource),
            Writer::Leader(leadership) => leadership.fence(),
        }
        .expect("a write lock on it")
    }

    fn valid_until(&self) -> Instant {
        match self {
            Writer::One(lock) => lock.valid_until(),
            Writer::Pair(lock) => lock.valid_until(),
            Writer::Leader(leadership) => leadership.lease().valid_until(),
        }
    }

    async fn release(self) -> quorumlock::Result<()> {
        match self {
            Writer::One(lock) => lock.release().await,
            Writer::Pair(lock) => lock.release().await,
            Writer::Leader(leadership) => leadership.resign().await,
        }
    }
}

/// The lock of a successful acquisition; a failed one is counted (and
/// after an unavailable one, a short pause).
async fn held<L>(soak: &Soak, acquired: Result<L, Error>) -> Option<L> {
    match acquired {
        Ok(lock) => Some(lock),
        Err(Error::Contended { .. } | Error::WaitTimedOut { .. } | Error::SplitVote { .. }) => {
            soak.tally.contentions.fetch_add(1, Ordering::Relaxed);
            None
        }
        Err(error) => {
            match classify(&error) {
                Ok(labels) => {
                    let mut failures = soak.failures.lock().expect("failures");
                    for label in labels {
                        *failures.entry(label).or_default() += 1;
                    }
                }
                Err(why) => soak.unexpected.lock().expect("unexpected").push(why),
            }
            let reasons = common::quarantine_labels(&error);
            if !reasons.is_empty() {
                soak.tally.quarantined.fetch_add(1, Ordering::Relaxed);
                let mut counted = soak.quarantines.lock().expect("quarantines");
                for reason in reasons {
                    *counted.entry(reason).or_default() += 1;
                }
            }
            soak.tally.unavailable.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
            None
        }
    }
}

/// Files a failed acquisition (not contention): the labels of what failed,
/// when the nemesis' faults explain it (nodes down, slow, cut off,
/// quarantined, redirected, restarting), or why not.
fn classify(error: &Error) -> Result<Vec<String>, String> {
    let nodes = match error {
        Error::QuorumUnavailable { errors, .. } => errors.as_slice(),
        Error::TooSlow { .. } => return Ok(vec!["too_slow".into()]),
        Error::CircuitOpen { .. } => return Ok(vec!["circuit_open".into()]),
        Error::SplitView { .. } => return Ok(vec!["split_view".into()]),
        other => return Err(format!("{other:?}")),
    };
    let mut labels = Vec::new();
    for node in nodes {
        use quorumlock::NodeErrorKind as K;
        let label = match &node.kind {
            K::Timeout(_) => "node:timeout".to_owned(),
            K::Connect(_) => "node:connect".to_owned(),
            K::Quarantined(q) => format!("node:quarantined:{}", q.reason.label()),
            K::Redirected(_) => "node:redirected".to_owned(),
            K::ScriptsMissing => "node:scripts_missing".to_owned(),
            K::KeyGone => "node:key_gone".to_owned(),
            K::Redis(said) => match expected_redis_error(said) {
                Some(what) => format!("node:redis:{what}"),
                None => return Err(format!("{error}: node {}: {}", node.node, node.kind)),
            },
            // A reply no Redis gives, a counter unusable, an ACL refusal,
            // or a kind added since: no fault here explains them.
            _ => return Err(format!("{error}: node {}: {}", node.node, node.kind)),
        };
        labels.push(label);
    }
    if labels.is_empty() {
        return Err(format!("{error} (no node errors)"));
    }
    Ok(labels)
}

/// What a Redis error says, when a fault explains it: a connection that
/// broke (killed, restarted, disconnected, refused) or a server still
/// loading its data after a restart.
fn expected_redis_error(said: &str) -> Option<&'static str> {
    let said = said.to_ascii_lowercase();
    [
        ("loading", "loading"),
        ("broken pipe", "connection"),
        ("connection reset", "connection"),
        ("connection refused", "connection"),
        ("connection closed", "connection"),
        ("closed the connection", "connection"),
        ("connection dropped", "connection"),
        // A request queued on the lock requests' own connection when it
        // broke (a node killed or restarted under it).
        ("connection broke", "connection"),
        ("unexpected end of file", "connection"),
        ("eof", "connection"),
        ("io error", "connection"),
        ("timed out", "connection"),
    ]
    .into_iter()
    .find(|(needle, _)| said.contains(needle))
    .map(|(_, what)| what)
}

/// A writer's hold of `resources` under `lock`, granted at `got_at`: a
/// read-modify-write of each resource's count with the lock's token (a
/// fenced read of each first; a zombie writes only after stalling past its
/// validity until a newer holder's fenced read of each has returned), then
/// it records the hold, and releases.
async fn hold_and_write(
    soak: &Soak,
    storage: &FencedRedis,
    client: usize,
    resources: &[&'static str],
    lock: Writer,
    got_at: Instant,
    zombie: bool,
) {
    let token = lock.token();
    soak.live
        .lock()
        .expect("live")
        .insert(client, (resources[0], lock.valid_until()));
    let fence = |resource| lock.fence(resource);
    // The counts read, `None` where the read was refused.
    let mut counts = Vec::new();
    for &resource in resources {
        counts.push(
            match storage.read(&fence(resource), &value_key(resource)).await {
                Ok(value) => {
                    claimed(soak, resource).send_if_modified(|highest| {
                        let raised = token.get() > *highest;
                        *highest = (*highest).max(token.get());
                        raised
                    });
                    Some(count_in(resource, value.as_deref()))
                }
                Err(Error::FencedOut { .. }) => {
                    soak.tally.reads_fenced_out.fetch_add(1, Ordering::Relaxed);
                    None
                }
                Err(other) => panic!("storage failed (it has no faults): {other}"),
            },
        );
    }
    // A zombie refused at its read is a holder overtaken early: it has
    // nothing to write. One whose resource nobody took over would not
    // write stale data, so it does not write at all.
    let read_any = counts.iter().any(Option::is_some);
    let challenged = if zombie && read_any {
        stall_past_ttl(soak, resources, token, lock.valid_until()).await
    } else {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..15))).await;
        true
    };
    if challenged {
        let entry = format!("{}:{client}", token.get());
        // One token, valid for each resource of the lock.
        for (&resource, count) in resources.iter().zip(counts) {
            let Some(count) = count else { continue };
            let value = format!("{entry}:{}", count + 1);
            let fence = fence(resource);
            let set = storage.set(&fence, &value_key(resource), &value).await;
            let pushed = match set {
                Ok(()) => Some(
                    storage
                        .push(&fence, &format!("{resource}:log"), &entry)
                        .await,
                ),
                Err(_) => None,
            };
            record_write(soak, storage, resource, &entry, zombie, set, pushed).await;
        }
    } else {
        soak.tally
            .zombies_unchallenged
            .fetch_add(1, Ordering::Relaxed);
    }
    let until = Instant::now().min(lock.valid_until());
    for &resource in resources {
        soak.holds.lock().expect("holds").push(Hold {
            client,
            resource,
            shared: false,
            token: token.get(),
            got_at,
            until,
        });
    }
    soak.live.lock().expect("live").remove(&client);
    // Errors are expected under faults: the keys then expire by TTL.
    let _ = lock.release().await;
}

/// The key of `resource`'s value: `token:client:count`, the count of
/// acknowledged writes of it.
fn value_key(resource: &str) -> String {
    format!("{resource}:value")
}

/// The count in a value (0 before the first write).
fn count_in(resource: &str, value: Option<&str>) -> u64 {
    value.map_or(0, |value| {
        value
            .rsplit(':')
            .next()
            .and_then(|count| count.parse().ok())
            .unwrap_or_else(|| panic!("{resource}: the value {value:?} holds no count"))
    })
}

/// The token of the holder that last wrote a value (0 before the first).
fn writer_in(value: Option<&str>) -> u64 {
    value
        .and_then(|value| value.split(':').next())
        .and_then(|token| token.parse().ok())
        .unwrap_or(0)
}

/// The highest token whose fenced read of `resource` has returned.
fn claimed<'a>(soak: &'a Soak, resource: &str) -> &'a tokio::sync::watch::Sender<u64> {
    let index = checked()
        .position(|r| r == resource)
        .expect("a soak resource");
    &soak.claimed[index]
}

/// What a client takes in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    One,
    /// The round's resource and this one, as one lock, waiting for both.
    Pair(&'static str),
    Read,
    /// One resource, then (held) the next one, waiting.
    Nested,
}

/// Counts a write's outcome (the count's `set`, then, if it was accepted,
/// the log's `push`); acknowledged ones must show up in the storage.
async fn record_write(
    soak: &Soak,
    storage: &FencedRedis,
    resource: &'static str,
    entry: &str,
    zombie: bool,
    set: Result<(), Error>,
    pushed: Option<Result<(), Error>>,
) {
    let t = &soak.tally;
    if set.is_ok() {
        // A zombie's too: it was acknowledged, so it must not be lost
        // either (it is counted as accepted below, which fails the soak).
        *soak
            .acked_counts
            .lock()
            .expect("acked counts")
            .entry(resource)
            .or_default() += 1;
    }
    match (set, zombie) {
        (Ok(()), true) => {
            t.zombie_writes_accepted.fetch_add(1, Ordering::Relaxed);
        }
        (Ok(()), false) => {}
        (Err(Error::FencedOut { highest, .. }), true) => {
            t.zombies_fenced.fetch_add(1, Ordering::Relaxed);
            // Values are written in token order: if the last one is still
            // below the token that refused the zombie, that token had
            // only read when it did (a newer write since only hides one).
            let value = storage.get(&value_key(resource)).await.expect("get");
            if writer_in(value.as_deref()) < highest.get() {
                t.zombies_fenced_by_read.fetch_add(1, Ordering::Relaxed);
            }
        }
        (Err(Error::FencedOut { .. }), false) => {
            t.fenced_out.fetch_add(1, Ordering::Relaxed);
        }
        (Err(other), _) => panic!("storage failed (it has no faults): {other}"),
    }
    match (pushed, zombie) {
        (None, _) => {}
        // Its set was accepted, and counted so.
        (Some(Ok(())), true) => {}
        (Some(Ok(())), false) => soak
            .acked
            .lock()
            .expect("acked")
            .entry(resource)
            .or_default()
            .push(entry.to_owned()),
        (Some(Err(Error::FencedOut { .. })), true) => {}
        (Some(Err(Error::FencedOut { .. })), false) => {
            t.fenced_out.fetch_add(1, Ordering::Relaxed);
        }
        (Some(Err(other)), _) => panic!("storage failed (it has no faults): {other}"),
    }
}

/// A zombie sleeps past its validity and waits (up to 5 s) until a newer
/// holder's fenced read of each of its resources has returned, so each of
/// its own writes is certainly stale, and mostly comes before that
/// holder's write (it sleeps up to 15 ms between the two). False if that
/// did not happen.
async fn stall_past_ttl(
    soak: &Soak,
    resources: &[&str],
    token: FencingToken,
    valid_until: Instant,
) -> bool {
    tokio::time::sleep_until(valid_until + Duration::from_millis(20)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    for resource in resources {
        let mut highest = claimed(soak, resource).subscribe();
        let overtaken = highest.wait_for(|&highest| highest > token.get());
        if !matches!(
            tokio::time::timeout_at(deadline, overtaken).await,
            Ok(Ok(_))
        ) {
            return false;
        }
    }
    true
}

/// What the nemesis did, per fault kind: injections tried, and those seen
/// to take effect (a node that no longer answers, a new process, a clock
/// that runs fast or jumped, a proxy that delays, drops or refuses).
#[derive(Debug, Default)]
struct Injections {
    tried: BTreeMap<Fault, u64>,
    took: BTreeMap<Fault, u64>,
    /// Injections that did not take effect, and why.
    missed: Vec<String>,
}

/// Injects one fault kind into one or two nodes at a time, holds it,
/// heals. Kinds come round-robin, in a new random order each round, so a
/// short soak still meets every kind; past `length` the nemesis goes on
/// (up to 30 s) with the kinds that have not taken effect yet.
async fn run_nemesis(soak: Arc<Soak>, length: Duration) -> Injections {
    let cluster = &soak.cluster;
    let mut seen = Injections::default();
    let end = Instant::now() + length;
    let overtime = end + Duration::from_secs(30);
    let mut deck: Vec<Fault> = Vec::new();
    loop {
        let now = Instant::now();
        let missing: Vec<Fault> = FAULTS
            .into_iter()
            .filter(|f| !seen.took.contains_key(f))
            .collect();
        if now >= overtime || (now >= end && missing.is_empty()) {
            break;
        }
        if now >= end {
            deck.retain(|f| missing.contains(f));
        }
        tokio::time::sleep(Duration::from_millis(fastrand::u64(100..400))).await;
        if deck.is_empty() {
            deck = if Instant::now() < end {
                FAULTS.to_vec()
            } else {
                missing
            };
            fastrand::shuffle(&mut deck);
        }
        // Past the end with every kind seen, the loop ends above.
        let Some(fault) = deck.pop() else { continue };
        if fault == Fault::Wipe {
            // While a lock is held with at least 200 ms left (up to 2 s).
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until && !held_a_while(&soak, Duration::from_millis(200)) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let mut nodes: Vec<usize> = (0..cluster.len()).collect();
        fastrand::shuffle(&mut nodes);
        // A wipe takes two: with the lock's key gone from two of five
        // nodes, the three others may not be enough to keep a second
        // holder out (with the guard off a 30 s run of wipes alone let
        // second leaders in); only the guard may.
        nodes.truncate(if fault == Fault::Wipe {
            2
        } else {
            fastrand::usize(1..=2)
        });
        let note = |what: String| {
            soak.timeline
                .lock()
                .expect("timeline")
                .push((Instant::now(), what))
        };
        for &node in &nodes {
            let took = tokio::task::block_in_place(|| {
                let before = Before::take(cluster, node, fault);
                let at = Instant::now();
                let setting = apply(cluster, node, fault);
                let took = before.took_effect(cluster, node, fault, setting);
                if fault == Fault::Wipe && took.is_ok() {
                    soak.wipes.lock().expect("wipes").push((at, node));
                }
                took
            });
            *seen.tried.entry(fault).or_insert(0) += 1;
            match took {
                Ok(()) => {
                    *seen.took.entry(fault).or_insert(0) += 1;
                    note(format!("{fault:?} node {node}"));
                }
                Err(why) => {
                    note(format!("{fault:?} node {node}, no effect: {why}"));
                    seen.missed.push(format!("{fault:?} node {node}: {why}"));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(fastrand::u64(200..1500))).await;
        for &node in &nodes {
            tokio::task::block_in_place(|| heal(cluster, node, fault));
            note(format!("healed {fault:?} node {node}"));
        }
    }
    seen
}

/// Whether some lock is held now with at least `left` of it to go.
fn held_a_while(soak: &Soak, left: Duration) -> bool {
    let now = Instant::now();
    soak.live
        .lock()
        .expect("live")
        .values()
        .any(|&(_, until)| until > now + left)
}

/// Handovers at risk from a wipe: consecutive writer holds A then B of a
/// resource where a node was wiped while A held it (its key there gone),
/// so that only the guard kept the wiped node from granting B early.
fn handovers_at_risk(soak: &Soak) -> usize {
    let holds = soak.holds.lock().expect("holds").clone();
    let wipes = soak.wipes.lock().expect("wipes").clone();
    let mut at_risk = 0;
    for resource in checked() {
        let mut writers: Vec<&Hold> = holds
            .iter()
            .filter(|h| h.resource == resource && !h.shared)
            .collect();
        writers.sort_by_key(|h| h.got_at);
        at_risk += writers
            .windows(2)
            .filter(|pair| {
                let a = pair[0];
                wipes.iter().any(|&(at, _)| a.got_at <= at && at < a.until)
            })
            .count();
    }
    at_risk
}

/// How much of a fault [`apply`] injected, where the check needs it.
#[derive(Debug, Clone, Copy)]
enum Setting {
    None,
    Delay(Duration),
    Rate(f64),
    Step(Duration),
}

/// A short-lived direct connection (or one through node `i`'s proxy),
/// every step bounded by `limit`.
fn probe(url: &str, limit: Duration) -> Result<redis::Connection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let connection = client
        .get_connection_with_timeout(limit)
        .map_err(|e| format!("connect: {e}"))?;
    connection
        .set_read_timeout(Some(limit))
        .and_then(|()| connection.set_write_timeout(Some(limit)))
        .map_err(|e| e.to_string())?;
    Ok(connection)
}

fn ask<T: redis::FromRedisValue>(
    connection: &mut redis::Connection,
    command: &redis::Cmd,
) -> Result<T, String> {
    command.query(connection).map_err(|e| e.to_string())
}

/// A node's wall clock (`TIME`), with the local monotonic instant it was
/// read at (halfway through the round trip).
fn node_time(url: &str) -> Result<(Duration, std::time::Instant), String> {
    let mut connection = probe(url, Duration::from_millis(500))?;
    let sent = std::time::Instant::now();
    let (secs, micros): (u64, u64) = ask(&mut connection, &redis::cmd("TIME"))?;
    let back = std::time::Instant::now();
    Ok((
        Duration::from_secs(secs) + Duration::from_micros(micros),
        sent + (back - sent) / 2,
    ))
}

fn run_id(url: &str) -> Result<String, String> {
    let mut connection = probe(url, Duration::from_millis(500))?;
    let info: String = ask(&mut connection, redis::cmd("INFO").arg("server"))?;
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
        .ok_or_else(|| "no run_id in INFO".to_owned())
}

/// What a fault's effect is measured against, taken just before it.
struct Before {
    run_id: Option<String>,
    time: Option<(Duration, std::time::Instant)>,
    /// A connection through the node's proxy, open before the fault.
    through_proxy: Option<redis::Connection>,
}

impl Before {
    fn take(cluster: &TestCluster, node: usize, fault: Fault) -> Self {
        let direct = cluster.direct_url(node).expect("a node");
        let proxied = cluster.url(node).expect("a node");
        let limit = Duration::from_millis(500);
        Self {
            run_id: matches!(fault, Fault::Restart | Fault::Persistence | Fault::Wipe)
                .then(|| run_id(&direct).ok())
                .flatten(),
            time: matches!(fault, Fault::ClockStep)
                .then(|| node_time(&direct).ok())
                .flatten(),
            through_proxy: matches!(fault, Fault::Disconnect | Fault::Refuse)
                .then(|| {
                    let mut connection = probe(&proxied, limit).ok()?;
                    ask::<String>(&mut connection, &redis::cmd("PING")).ok()?;
                    Some(connection)
                })
                .flatten(),
        }
    }

    /// Whether `fault`, injected into `node` with `setting`, took effect.
    fn took_effect(
        self,
        cluster: &TestCluster,
        node: usize,
        fault: Fault,
        setting: Setting,
    ) -> Result<(), String> {
        let direct = cluster.direct_url(node).expect("a node");
        let proxied = cluster.url(node).expect("a node");
        let short = Duration::from_millis(300);
        let answers = |url: &str| {
            probe(url, short).and_then(|mut c| ask::<String>(&mut c, &redis::cmd("PING")))
        };
        match (fault, setting) {
            (Fault::Kill | Fault::Pause, _) => match answers(&direct) {
                Ok(pong) => Err(format!("the node still answers PING ({pong})")),
                Err(_) => Ok(()),
            },
            (Fault::Blackhole, _) => match answers(&proxied) {
                Ok(pong) => Err(format!("the proxy still passes PING ({pong})")),
                Err(_) => Ok(()),
            },
            (Fault::Restart | Fault::Persistence | Fault::Wipe, _) => {
                let before = self.run_id.ok_or("no run_id read before")?;
                let after = run_id(&direct)?;
                if after == before {
                    return Err(format!("the same process (run_id {after}) after it"));
                }
                if fault == Fault::Persistence {
                    let mut connection = probe(&direct, Duration::from_millis(500))?;
                    let setting: Vec<String> = ask(
                        &mut connection,
                        redis::cmd("CONFIG").arg("GET").arg("appendfsync"),
                    )?;
                    if setting.get(1).map(String::as_str) != Some("everysec") {
                        return Err(format!("appendfsync is {setting:?}, not everysec"));
                    }
                }
                Ok(())
            }
            (Fault::Slow, Setting::Delay(delay)) => {
                let mut connection = probe(&proxied, Duration::from_secs(2))?;
                let sent = std::time::Instant::now();
                ask::<String>(&mut connection, &redis::cmd("PING"))?;
                let took = sent.elapsed();
                if took < delay {
                    return Err(format!("a PING took {took:?}, under the {delay:?} delay"));
                }
                Ok(())
            }
            (Fault::Disconnect | Fault::Refuse, _) => {
                let mut open = self.through_proxy.ok_or("no connection to drop")?;
                // The proxy drops its connections asynchronously: a
                // dropped one stays broken, so ask a few times.
                let mut answered = 0;
                while ask::<String>(&mut open, &redis::cmd("PING")).is_ok() {
                    answered += 1;
                    if answered == 10 {
                        return Err("a connection opened before still answers 1 s on".into());
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                if fault == Fault::Refuse
                    && let Ok(pong) = answers(&proxied)
                {
                    return Err(format!("a new connection was let through ({pong})"));
                }
                Ok(())
            }
            (Fault::ClockSkew, Setting::Rate(rate)) => {
                let (a, at_a) = node_time(&direct)?;
                std::thread::sleep(Duration::from_millis(200));
                let (b, at_b) = node_time(&direct)?;
                let seen = b.saturating_sub(a).as_secs_f64() / (at_b - at_a).as_secs_f64();
                if seen < 1.0 + (rate - 1.0) / 2.0 {
                    return Err(format!("its clock runs at {seen:.2}× (set to {rate:.2}×)"));
                }
                Ok(())
            }
            (Fault::ClockStep, Setting::Step(step)) => {
                let (a, at_a) = self.time.ok_or("no TIME read before")?;
                let (b, at_b) = node_time(&direct)?;
                let jumped = b.saturating_sub(a).saturating_sub(at_b - at_a);
                if jumped < step / 2 {
                    return Err(format!(
                        "its clock moved {jumped:?} beyond real time, not {step:?}"
                    ));
                }
                Ok(())
            }
            (fault, setting) => Err(format!("{fault:?} applied as {setting:?}")),
        }
    }
}

fn apply(cluster: &TestCluster, node: usize, fault: Fault) -> Setting {
    let proxy = cluster.proxy(node).expect("proxied");
    match fault {
        Fault::Kill => cluster.kill(node).expect("kill"),
        Fault::Pause => cluster.pause(node).expect("pause"),
        Fault::Restart => cluster.restart(node).expect("restart"),
        Fault::Wipe => cluster
            .restart_with(node, &Restart::wiped())
            .expect("restart wiped"),
        Fault::Slow => {
            let delay = Delay {
                fixed: Duration::from_millis(fastrand::u64(5..40)),
                jitter: Duration::from_millis(20),
            };
            proxy.set_latency(delay);
            return Setting::Delay(delay.fixed);
        }
        Fault::Blackhole => proxy.set_unresponsive(true),
        Fault::Disconnect => proxy.drop_connections(),
        Fault::Refuse => {
            proxy.set_refuse_new(true);
            proxy.drop_connections();
        }
        Fault::ClockSkew => {
            let rate = fastrand::f64() * 2.0 + 2.0;
            cluster.set_clock_rate(node, rate).expect("clock rate");
            return Setting::Rate(rate);
        }
        Fault::ClockStep => {
            let step = Duration::from_millis(fastrand::u64(1000..3000));
            cluster.step_clock(node, step, true).expect("clock step");
            return Setting::Step(step);
        }
        Fault::Persistence => cluster
            .restart_with(
                node,
                &Restart::keeping_data()
                    .graceful()
                    .args(&["--appendfsync", "everysec"]),
            )
            .expect("restart with everysec"),
    }
    Setting::None
}

fn heal(cluster: &TestCluster, node: usize, fault: Fault) {
    match fault {
        Fault::Kill => cluster.restart(node).expect("restart"),
        Fault::Pause => cluster.resume(node).expect("resume"),
        Fault::Restart | Fault::Wipe | Fault::Disconnect | Fault::ClockStep => {}
        Fault::ClockSkew => cluster.set_clock_rate(node, 1.0).expect("clock rate"),
        Fault::Persistence => cluster
            .restart_with(
                node,
                &Restart::keeping_data()
                    .graceful()
                    .args(&["--appendfsync", "always"]),
            )
            .expect("restart with always"),
        Fault::Slow | Fault::Blackhole | Fault::Refuse => {
            cluster
                .proxy(node)
                .expect("proxied")
                .set_faults(Faults::default());
        }
    }
}

/// Everything the checks found wrong, one line each.
async fn violations(soak: &Soak) -> Vec<String> {
    let mut found = Vec::new();
    let holds = soak.holds.lock().expect("holds").clone();
    let storage = FencedRedis::new(&soak.storage_url).expect("storage url");
    for resource in checked() {
        let mut mine: Vec<&Hold> = holds.iter().filter(|h| h.resource == resource).collect();
        mine.sort_by_key(|h| h.got_at);
        // Mutual exclusion (readers may share), writers' tokens in the
        // order of the holds, readers' at least every earlier writer's.
        let writers: Vec<&&Hold> = mine.iter().filter(|h| !h.shared).collect();
        for pair in writers.windows(2) {
            if pair[1].token <= pair[0].token {
                found.push(format!(
                    "{resource}: token {} (client {}) held after token {} (client {}, {:?} \
                     before); the nemesis in the 3 s before: {}",
                    pair[1].token,
                    pair[1].client,
                    pair[0].token,
                    pair[0].client,
                    pair[1].got_at - pair[0].got_at,
                    nemesis_before(soak, pair[1].got_at)
                ));
            }
        }
        for (i, hold) in mine.iter().enumerate() {
            for earlier in &mine[..i] {
                if hold.got_at < earlier.until && !(hold.shared && earlier.shared) {
                    found.push(format!(
                        "{resource}: client {} ({}, token {}) got the lock {:?} before client \
                         {} ({}, token {}) let go; the nemesis in the 3 s before: {}",
                        hold.client,
                        kind_of(hold),
                        hold.token,
                        earlier.until - hold.got_at,
                        earlier.client,
                        kind_of(earlier),
                        earlier.token,
                        nemesis_before(soak, hold.got_at)
                    ));
                }
                if hold.shared && !earlier.shared && hold.token < earlier.token {
                    found.push(format!(
                        "{resource}: reader token {} (client {}) below the earlier writer's {} \
                         (client {})",
                        hold.token, hold.client, earlier.token, earlier.client
                    ));
                }
            }
        }
        // The storage log: tokens never go back, and every ack is there.
        let log = storage
            .list(&format!("{resource}:log"))
            .await
            .expect("read the log");
        let tokens: Vec<u64> = log
            .iter()
            .map(|entry| {
                entry
                    .split(':')
                    .next()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0)
            })
            .collect();
        for pair in tokens.windows(2) {
            if pair[1] < pair[0] {
                found.push(format!(
                    "{resource}: stale write {} accepted after {}",
                    pair[1], pair[0]
                ));
            }
        }
        let acked = soak.acked.lock().expect("acked").get(resource).cloned();
        for entry in acked.into_iter().flatten() {
            if !log.contains(&entry) {
                found.push(format!("{resource}: acknowledged write {entry} missing"));
            }
        }
        // The count: every acknowledged read-modify-write is in it, none
        // overwritten by a write computed from an older read.
        let value = storage
            .get(&value_key(resource))
            .await
            .expect("read the value");
        let counted = count_in(resource, value.as_deref());
        let acked = soak
            .acked_counts
            .lock()
            .expect("acked counts")
            .get(resource)
            .copied()
            .unwrap_or(0);
        if counted != acked {
            found.push(format!(
                "{resource}: the count is {counted} (value {value:?}) after {acked} \
                 acknowledged read-modify-writes: {}",
                if counted < acked {
                    format!("{} lost", acked - counted)
                } else {
                    format!("{} not acknowledged", counted - acked)
                }
            ));
        }
    }
    found
}

/// What the nemesis did in the 3 s before `at`, with times relative to it.
fn nemesis_before(soak: &Soak, at: Instant) -> String {
    let timeline = soak.timeline.lock().expect("timeline");
    let events: Vec<String> = timeline
        .iter()
        .filter(|(when, _)| *when <= at && at - *when < Duration::from_secs(3))
        .map(|(when, what)| format!("-{:?} {what}", at - *when))
        .collect();
    events.join(", ")
}

fn kind_of(hold: &Hold) -> &'static str {
    if hold.shared { "reader" } else { "writer" }
}

fn summary(soak: &Soak, length: Duration, faults: &Injections, violations: usize) -> String {
    let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let t = &soak.tally;
    let faults: Vec<String> = faults
        .tried
        .iter()
        .map(|(k, n)| format!("{k:?}={}/{n}", faults.took.get(k).copied().unwrap_or(0)))
        .collect();
    format!(
        "soak: {}s, {CLIENTS} clients, acquisitions {} (reads {}, pairs {}, nested {}), \
         terms led {}, \
         contentions {}, waits dropped {}, unavailable {} \
         (naming quarantined nodes {} {:?}; what failed {:?}; unexpected {}), fenced-out writes \
         {} (reads {}), zombies fenced {} (by a read alone {}, unchallenged {}), faults (took \
         effect/tried) [{}], violations {}",
        length.as_secs(),
        count(&t.acquisitions),
        count(&t.reads),
        count(&t.pairs),
        count(&t.nested),
        count(&t.terms),
        count(&t.contentions),
        count(&t.waits_dropped),
        count(&t.unavailable),
        count(&t.quarantined),
        soak.quarantines.lock().expect("quarantines"),
        soak.failures.lock().expect("failures"),
        soak.unexpected.lock().expect("unexpected").len(),
        count(&t.fenced_out),
        count(&t.reads_fenced_out),
        count(&t.zombies_fenced),
        count(&t.zombies_fenced_by_read),
        count(&t.zombies_unchallenged),
        faults.join(" "),
        violations + count(&t.zombie_writes_accepted) as usize,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nemesis_soak_finds_no_violation() {
    // 30 s meets every fault kind (they come round-robin); the short run
    // checks the same properties over fewer faults.
    let full = Duration::from_secs(30);
    let length = soak_length(common::quick_or_long(Duration::from_secs(12), full));
    let (soak, faults) = run_soak(length).await;
    let found = violations(&soak).await;
    eprintln!("{}", summary(&soak, length, &faults, found.len()));
    assert!(found.is_empty(), "violations:\n{}", found.join("\n"));
    let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let t = &soak.tally;
    let accepted = count(&t.zombie_writes_accepted);
    assert_eq!(
        accepted,
        0,
        "{accepted} zombie writes were accepted ({} refused)",
        count(&t.zombies_fenced)
    );
    // The checks must have seen what they check: zombies challenging the
    // fence, also in the order only a fenced read refuses (the newer holder
    // read, had not written), nested waits and pairs, persistence faults.
    let challenges = count(&t.zombies_fenced);
    assert!(
        challenges >= length.as_secs() / 3,
        "the fence was challenged by only {challenges} zombies in {}s",
        length.as_secs()
    );
    let by_read = count(&t.zombies_fenced_by_read);
    assert!(
        by_read >= length.as_secs() / 6,
        "only {by_read} of {challenges} zombies wrote between a newer holder's fenced read and \
         its write in {}s",
        length.as_secs()
    );
    assert!(count(&t.acquisitions) > 100);
    assert!(
        count(&t.nested) > 0 && count(&t.pairs) > 0,
        "no nested or paired holds"
    );
    assert!(count(&t.terms) >= 2, "fewer than two terms led");
    // Failures the faults do not explain are bugs, not unavailability.
    let unexpected = soak.unexpected.lock().expect("unexpected").clone();
    assert!(
        unexpected.is_empty(),
        "{} failed acquisitions that no fault explains; the first ones: {:#?}",
        unexpected.len(),
        &unexpected[..unexpected.len().min(5)]
    );
    if length < full {
        eprintln!(
            "a {length:?} soak meets only some fault kinds: QUORUMLOCK_LONG=1 (CI) runs {full:?}              and requires every kind and a handover at risk"
        );
        return;
    }
    // Every fault kind took effect (an injection is counted only once
    // the node, its proxy or its clock is seen to have changed).
    let never: Vec<Fault> = FAULTS
        .into_iter()
        .filter(|f| !faults.took.contains_key(f))
        .collect();
    assert!(
        never.is_empty(),
        "fault kinds that never took effect: {never:?} (took effect {:?} of tried {:?}; \
         without effect: {:?})",
        faults.took,
        faults.tried,
        faults.missed
    );
    // The wipes put handovers at risk (a node lost a held lock's key while
    // it was held), so the overlap check above had something to refuse.
    let at_risk = handovers_at_risk(&soak);
    let wipes = soak.wipes.lock().expect("wipes").len();
    eprintln!("handovers at risk from {wipes} wipes: {at_risk}");
    assert!(
        at_risk > 0,
        "none of the {wipes} wipes hit a node while a writer held a lock on it, so no handover \
         was at risk"
    );
}
