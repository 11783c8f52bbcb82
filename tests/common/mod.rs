//! Helpers shared by the integration tests: clusters, managers with
//! test-friendly settings, and direct reads of the nodes.
#![allow(dead_code)] // each test binary uses a different subset

pub mod cluster;
pub mod command_log;
#[cfg(feature = "metrics")]
pub mod recorded;

use std::time::Duration;

use quorumlock::internals::lock_key;
use quorumlock::testkit::{NodeSet, TestCluster, local_or_env};
use quorumlock::{Backoff, LockManager, LockManagerBuilder, NodeGuard};
use tokio::time::Instant;

/// Starts a local cluster or fails the test with the testkit's message
/// (which says how to install redis-server when it is missing).
pub fn cluster(n: usize) -> TestCluster {
    TestCluster::start(n).unwrap_or_else(|e| panic!("cannot start a {n}-node test cluster: {e}"))
}

/// Five healthy nodes for tests that inject no faults: the nodes in
/// `QUORUMLOCK_NODES` when set, else a local cluster owned by the result.
pub fn healthy_nodes() -> NodeSet {
    local_or_env(5).unwrap_or_else(|e| panic!("cannot get nodes to test against: {e}"))
}

/// The suite's one rule for managers (`tests/suite_rules.rs` checks it): a
/// manager a test builds for setup, or for anything that is not the timing
/// under test, comes from [`builder`] (or a helper built on it), whose
/// timeouts a loaded machine meets. A test that sets `node_timeout` or
/// builds its own manager says why in a `timing:` or `settings:` comment
/// just above, and a bound on how long something may take comes from
/// [`scaled`].
///
/// How much slower than a quiet two-core machine this one may be:
/// `QUORUMLOCK_TEST_SLOWDOWN` (a factor, 1 when unset; `.ci/run` sets it
/// for the suite it runs beside a CPU and disk load).
pub fn slowdown() -> f64 {
    std::env::var("QUORUMLOCK_TEST_SLOWDOWN")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|factor| *factor >= 1.0)
        .unwrap_or(1.0)
}

/// Whether the long variants run (`QUORUMLOCK_LONG=1`, which `.ci/run`
/// sets): the soaks at full length, attacks repeated many times, the deep
/// model-check scenarios. `cargo test` alone runs the short ones, which
/// check the same properties with fewer events.
pub fn long_suite() -> bool {
    std::env::var("QUORUMLOCK_LONG").is_ok_and(|v| v == "1")
}

/// `quick`, or `long` when the long variants run (see [`long_suite`]).
pub fn quick_or_long<T>(quick: T, long: T) -> T {
    if long_suite() { long } else { quick }
}

/// A bound on how long something under test may take, measured on a quiet
/// machine, stretched by [`slowdown`]. For waits and timeouts only: what a
/// safety check compares (an overlap, a token, a validity) stays exact.
pub fn scaled(quiet: Duration) -> Duration {
    quiet.mul_f64(slowdown())
}

/// Settings generous enough for a loaded 2-core CI machine: with AOF
/// `appendfsync always`, one write can wait over 100 ms for a disk that
/// another process keeps busy with fsyncs.
pub fn builder(urls: Vec<String>) -> LockManagerBuilder {
    LockManager::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(5))
        .node_timeout(Duration::from_millis(500))
        .unavailable_retry(Backoff::steps([Duration::from_millis(20); 2]).jitter(0.5))
}

/// A manager with the library's default settings (its 50 ms node timeout
/// included), for a test of what the defaults promise, not for setup.
pub fn with_defaults(urls: Vec<String>) -> LockManager {
    // settings: the defaults are what such a test checks.
    LockManager::builder()
        .nodes(urls)
        .build()
        .expect("valid settings")
}

/// For clusters without AOF (the disk is not the subject): the node guard
/// rightly does not count nodes that keep no data until they have run for
/// the longest TTL; tests that restart nothing trust them at once.
pub fn trust_unpersisted(builder: LockManagerBuilder) -> LockManagerBuilder {
    builder.node_guard(NodeGuard::default().trust_restarts())
}

/// A manager with `ttl` and the given token mode, else as [`builder`].
pub fn fenced(urls: Vec<String>, ttl: Duration, fencing: quorumlock::Fencing) -> LockManager {
    builder(urls)
        .ttl(ttl)
        .fencing(fencing)
        .build()
        .expect("valid test settings")
}

pub fn manager(urls: Vec<String>) -> LockManager {
    builder(urls).build().expect("valid test settings")
}

/// The quarantine reasons (labels) the node errors of a failed acquisition
/// name.
pub fn quarantine_labels(error: &quorumlock::Error) -> Vec<&'static str> {
    let errors = match error {
        quorumlock::Error::QuorumUnavailable { errors, .. } => errors.as_slice(),
        _ => &[],
    };
    errors
        .iter()
        .filter_map(|e| match &e.kind {
            quorumlock::NodeErrorKind::Quarantined(q) => Some(q.reason.label()),
            _ => None,
        })
        .collect()
}

/// A resource name no other test uses.
pub fn resource(name: &str) -> String {
    format!("{name}:{}", uuid::Uuid::new_v4().simple())
}

/// A direct, synchronous connection to one node, to look behind the library.
pub fn connect(url: &str) -> redis::Connection {
    let client = redis::Client::open(url).expect("test URL parses");
    client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("cannot reach {url}: {e}"))
}

/// The value stored under `resource`'s lock key on one node, read directly
/// (see [`lock_entry`] for read locks).
pub fn stored_value(url: &str, resource: &str) -> Option<String> {
    lock_entry(url, resource).map(|(value, _)| value)
}

/// How many of `urls` store `value` for `resource`.
pub fn nodes_holding(urls: &[String], resource: &str, value: &str) -> usize {
    urls.iter()
        .filter(|url| stored_value(url, resource).as_deref() == Some(value))
        .count()
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Like [`eventually`], for checks that await.
pub async fn eventually_async<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes and releases a warm-up lock until one of them reached every node
/// in `direct_urls` (read on the nodes themselves): every node is then
/// connected and observed, so no node is left out of a later round for
/// want of a connection. `health()` cannot tell this: a node that was never
/// asked is reported up. A request that has not gone out when its round
/// is decided never goes, so one lock may miss a node still connecting.
pub async fn reach_every_node(manager: &LockManager, direct_urls: &[String]) {
    // Every node connected, observed and its clock rate measured first
    // (its outcome is what the loop below checks).
    let _ = manager.connect().await;
    let reached = eventually_async(Duration::from_secs(10), || async {
        // A fresh name each time: a release that failed leaves no key in
        // the way of the next try.
        let name = resource("warm");
        let Ok(lock) = manager.lock(&name).no_wait().await else {
            return false;
        };
        let value = lock.value().to_owned();
        let everywhere = eventually(Duration::from_millis(500), || {
            nodes_holding(direct_urls, &name, &value) == direct_urls.len()
        })
        .await;
        let _ = lock.release().await;
        everywhere
    })
    .await;
    assert!(
        reached,
        "no warm-up lock reached all {} nodes in 10 s (health: {:?}, quarantined: {:?})",
        direct_urls.len(),
        manager.health(),
        manager.quarantined_nodes()
    );
}

/// `manager`'s lock on `name`, once its key is on every node in
/// `direct_urls`: for a test that then decides which nodes lose it. The
/// lock returns at a quorum; a node whose write was slow past its node
/// timeout (a disk-sync load) may never get the key, so a lock that does
/// not spread is released and taken again, for up to a scaled 10 s.
pub async fn hold_on_every_node(
    manager: &LockManager,
    name: &str,
    direct_urls: &[String],
) -> quorumlock::Lock {
    let budget = scaled(Duration::from_secs(10));
    let until = Instant::now() + budget;
    loop {
        let lock = manager
            .lock(name)
            .wait(scaled(Duration::from_secs(5)))
            .await
            .unwrap_or_else(|e| panic!("setup: the lock on {name} was not granted: {e}"));
        let everywhere = eventually(Duration::from_secs(2), || {
            nodes_holding(direct_urls, name, lock.value()) == direct_urls.len()
        })
        .await;
        if everywhere {
            return lock;
        }
        let seen = lock_entries(direct_urls, name);
        eprintln!("setup: the lock on {name} did not reach every node ({seen:?}); again");
        let _ = lock.release().await;
        assert!(
            Instant::now() < until,
            "setup: no lock on {name} reached all {} nodes within {budget:?}; the last one: \
             {seen:?}",
            direct_urls.len()
        );
    }
}

/// How many times the node at `url` has run `command` (lower case, as
/// `INFO commandstats` names it) since its stats were last reset: 0 if
/// never. Commands a script runs count too.
pub fn command_calls(url: &str, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut connect(url))
        .unwrap_or_else(|e| panic!("INFO commandstats on {url}: {e}"));
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

/// What one node stores for `resource`'s lock key: its value (for a read
/// lock, `readers [..]` with the readers' values) and PTTL in ms, read in
/// one round trip (`None` when the key is absent). A key kept for waiters
/// (`<value>\0<ms>`, see `holders.lua`) reads as its holder's value and
/// the time its holder's key has left, and as absent once that is up or
/// for `\0` (no holder).
pub fn lock_entry(url: &str, resource: &str) -> Option<(String, i64)> {
    let key = lock_key(resource);
    let (kind, value, readers, pttl): (String, Option<String>, Vec<String>, i64) =
        redis::Script::new(
            r#"local kind = redis.call("TYPE", KEYS[1])["ok"]
            local value, readers = false, {}
            local pttl = redis.call("PTTL", KEYS[1])
            if kind == "string" then
                value = redis.call("GET", KEYS[1])
                local at = string.find(value, "\0", 1, true)
                if at then
                    local t = redis.call("TIME")
                    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
                    pttl = (tonumber(string.sub(value, at + 1)) or 0) - now
                    value = string.sub(value, 1, at - 1)
                    if value == "" or pttl < 0 then kind = "none" end
                end
            end
            if kind == "zset" then readers = redis.call("ZRANGE", KEYS[1], 0, -1) end
            return {kind, value, readers, pttl}"#,
        )
        .key(&key)
        .invoke(&mut connect(url))
        .unwrap_or_else(|e| panic!("reading {key} on {url}: {e}"));
    match kind.as_str() {
        "none" => None,
        "zset" => Some((format!("readers {readers:?}"), pttl)),
        _ => value.map(|value| (value, pttl)),
    }
}

/// Waiter entries queued for `resource` on one node.
pub fn queued_on(url: &str, resource: &str) -> usize {
    redis::cmd("ZCARD")
        .arg(quorumlock::internals::key_of(
            quorumlock::internals::KeyKind::Waiters,
            resource,
        ))
        .query(&mut connect(url))
        .unwrap_or_else(|e| panic!("ZCARD on {url}: {e}"))
}

/// Queues a waiting writer (id "7") for `resource` on every node at
/// `direct_urls` by hand, with `ticket` (µs since 1970: its place) and its
/// lease running to `lease_until_ms` (node time, ms since 1970): a live
/// waiter that runs no script of its own.
pub fn queue_writer_by_hand(
    direct_urls: &[String],
    resource: &str,
    ticket: u64,
    lease_until_ms: u64,
) {
    use quorumlock::internals::{KeyKind, key_of};
    for url in direct_urls {
        let mut connection = connect(url);
        for (kind, score) in [
            (KeyKind::Waiters, ticket),
            (KeyKind::WaitingWriters, ticket),
            (KeyKind::WaiterLeases, lease_until_ms),
        ] {
            let _: () = redis::cmd("ZADD")
                .arg(key_of(kind, resource))
                .arg(score)
                .arg("7")
                .query(&mut connection)
                .unwrap_or_else(|e| panic!("ZADD on {url}: {e}"));
        }
    }
}

/// The readers of `resource` on each node, sorted, in node order.
pub fn readers_by_node(urls: &[String], resource: &str) -> Vec<Vec<String>> {
    urls.iter()
        .map(|url| {
            let mut readers = readers_on(url, resource);
            readers.sort();
            readers
        })
        .collect()
}

/// The readers (their lock values) in `resource`'s read lock on one node,
/// expired entries included until a script drops them.
pub fn readers_on(url: &str, resource: &str) -> Vec<String> {
    let key = lock_key(resource);
    let mut conn = connect(url);
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query(&mut conn)
        .unwrap_or_else(|e| panic!("TYPE on {url}: {e}"));
    if kind != "zset" {
        return Vec::new();
    }
    redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap_or_else(|e| panic!("ZRANGE on {url}: {e}"))
}

/// Every node's entry for `resource`, in node order, for assertion messages.
pub fn lock_entries(urls: &[String], resource: &str) -> Vec<Option<(String, i64)>> {
    urls.iter().map(|url| lock_entry(url, resource)).collect()
}

/// Whether no node stores any lock key for `resource`.
pub fn nothing_left(urls: &[String], resource: &str) -> bool {
    lock_entries(urls, resource).iter().all(Option::is_none)
}

/// How long a majority of nodes will still keep `value` for `resource`:
/// the quorum-th longest PTTL among the nodes holding it (zero when fewer
/// than a quorum hold it).
pub fn majority_keeps(urls: &[String], resource: &str, value: &str) -> (Duration, String) {
    let entries = lock_entries(urls, resource);
    let mut pttls: Vec<u64> = entries
        .iter()
        .flatten()
        .filter(|(stored, _)| stored == value)
        .map(|&(_, pttl)| u64::try_from(pttl).unwrap_or(0))
        .collect();
    pttls.sort_unstable_by(|a, b| b.cmp(a));
    let quorum = urls.len() / 2 + 1;
    let keeps = pttls.get(quorum - 1).copied().unwrap_or(0);
    (Duration::from_millis(keeps), format!("{entries:?}"))
}

/// Asserts that `lock` claims no more validity than a majority of nodes
/// keep its key, less the drift allowance the lock subtracted: on one
/// host a node keeps the key at least that much longer than the lock
/// believes (it set the key after the lock's clock started). Each node's
/// PTTL is compared with the lock's claim read right after its reply
/// (both run down together), so a slow read or connect favours neither
/// side, and only the reply's way back (microseconds on loopback) favours
/// the lock; PTTL is in whole ms, and a node's wall clock may run against
/// our monotonic one by 0.1 %: those are allowed, and named in the
/// message, which shows every node's numbers.
pub fn assert_not_overvalued(lock: &quorumlock::Lock, urls: &[String], context: &str) {
    let drift = quorumlock::internals::drift(lock.ttl(), 0.01);
    let rounding = Duration::from_millis(1) + lock.ttl() / 1000;
    let mut keeping = 0;
    let mut seen = Vec::new();
    for url in urls {
        let entry = lock_entry(url, lock.resource());
        let claim = lock.remaining();
        match entry {
            Some((value, pttl)) if value == lock.value() => {
                let keeps = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
                let enough = claim + drift <= keeps + rounding;
                keeping += usize::from(enough);
                seen.push(format!(
                    "{url}: keeps {keeps:?}, the lock claims {claim:?}{}",
                    if enough { "" } else { " (too much)" }
                ));
            }
            other => seen.push(format!("{url}: {other:?}")),
        }
    }
    assert!(
        keeping > urls.len() / 2,
        "{context}: fewer than a majority keep the key for the lock's claim plus its drift \
         allowance {drift:?} (PTTL's whole ms and clock rates allow {rounding:?} more): \
         {seen:#?}"
    );
}

/// What `settle()` promises with a 250 ms node timeout (2 × node_timeout +
/// 1 s), plus room for a busy machine to schedule it.
pub const SETTLE_LIMIT: Duration = Duration::from_millis(2 * 250 + 1_000 + 2_000);

/// The nodes' own URLs, bypassing a proxied cluster's proxies.
pub fn direct_urls(cluster: &TestCluster) -> Vec<String> {
    (0..cluster.len())
        .map(|i| cluster.direct_url(i).expect("index"))
        .collect()
}
