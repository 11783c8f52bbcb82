//! When the lock service is down: unavailable attempts are retried on the
//! backoff schedule and contended ones are not (attempts counted and gaps
//! measured on a live node with MONITOR), and the circuit breaker opens
//! after K, fails fast without touching the network (the fault proxies'
//! connection counts), probes after the cool-down, and closes.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{builder, cluster, resource, trust_unpersisted};
use quorumlock::health::BreakerState;
use quorumlock::internals::lock_key;
use quorumlock::testkit::TestCluster;
use quorumlock::{Backoff, CircuitBreaker, Error, Fencing, HealthState, LockManager};
use tokio::time::Instant;

/// The commands one node runs, with the server's timestamps (MONITOR).
struct Monitor {
    seen: Arc<Mutex<Vec<(f64, String)>>>,
    stream: TcpStream,
}

impl Monitor {
    fn start(url: &str) -> Monitor {
        let address = url.trim_start_matches("redis://");
        let mut stream = TcpStream::connect(address).expect("connect for MONITOR");
        stream.write_all(b"MONITOR\r\n").expect("send MONITOR");
        let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
        let mut first = String::new();
        reader.read_line(&mut first).expect("MONITOR's reply");
        assert_eq!(first.trim(), "+OK", "MONITOR refused: {first}");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&seen);
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { return };
                // `+1733241234.123456 [0 127.0.0.1:5555] "SET" "key" ...`
                let stamp = line
                    .trim_start_matches('+')
                    .split(' ')
                    .next()
                    .and_then(|s| s.parse::<f64>().ok());
                if let Some(stamp) = stamp {
                    lines.lock().unwrap().push((stamp, line));
                }
            }
        });
        Monitor { seen, stream }
    }

    /// Server times (seconds) of the attempts (`SET … NX`) at `resource`'s
    /// lock key. The queue's key-keeping also sets the key (a marker kept
    /// for a waiter): the holder's release did, in ci25, when it ran
    /// before the timed-out waiter's dequeue (done in the background).
    fn sets_of(&self, resource: &str) -> Vec<f64> {
        self.sets_of_other_than(resource, "")
    }

    /// As `sets_of`, leaving out those that set the value `skip`.
    fn sets_of_other_than(&self, resource: &str, skip: &str) -> Vec<f64> {
        let key = format!("\"{}\"", lock_key(resource));
        let skip = format!("\"{skip}\"");
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, line)| {
                line.contains("\"SET\"")
                    && line.contains("\"NX\"")
                    && line.contains(&key)
                    && !line.contains(&skip)
            })
            .map(|&(stamp, _)| stamp)
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

fn gaps_ms(stamps: &[f64]) -> Vec<f64> {
    stamps.windows(2).map(|w| (w[1] - w[0]) * 1e3).collect()
}

const STEPS_MS: [u64; 3] = [300, 600, 900];
const JITTER: f64 = 0.1;
const CONTENDED_WAIT: Duration = Duration::from_millis(400);
/// How much earlier than the client sent it a node may seem to have run a
/// command: the previous one ran late (a busy disk under `appendfsync
/// always`).
const NODE_SLACK_MS: f64 = 100.0;

fn scheduled(urls: Vec<String>) -> LockManager {
    trust_unpersisted(builder(urls))
        .fencing(Fencing::Off)
        // timing: the backoff's schedule is the subject; 300 ms keeps each attempt well below its steps
        .node_timeout(Duration::from_millis(300))
        .unavailable_retry(Backoff::steps(STEPS_MS.map(Duration::from_millis)).jitter(JITTER))
        .build()
        .expect("valid settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailability_is_retried_on_the_schedule_and_contention_is_not() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let manager = scheduled(urls.clone());
    let holder = scheduled(urls.clone());
    let monitor = Monitor::start(&urls[0]);
    // Until node 0 sees the manager's requests: a round decided before a
    // node's connection is ready never sends it the request.
    let warm = common::eventually_async(Duration::from_secs(10), || async {
        let r = resource("warm-up");
        let lock = manager.lock(&r).await.expect("free");
        lock.release().await.expect("held");
        tokio::time::sleep(Duration::from_millis(20)).await;
        !monitor.sets_of(&r).is_empty()
    })
    .await;
    assert!(warm, "node 0 never saw the manager's SET");

    // Contention is waited out (queued, woken by the release, or until the
    // holder's keys expire), never on the unavailability schedule: a wait
    // of 400 ms on a held resource makes its attempts close together and
    // times out.
    let held = resource("held");
    let lock = holder.lock(&held).await.expect("free");
    let holder_value = lock.value().to_owned();
    let started = Instant::now();
    let result = manager.lock(&held).wait(CONTENDED_WAIT).await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(Error::WaitTimedOut { .. })),
        "{result:?}"
    );
    lock.release().await.expect("held");

    // Unavailability: three of five nodes down.
    for i in 2..5 {
        cluster.kill(i).expect("kill");
    }
    let down = resource("down");
    let started = Instant::now();
    let result = manager.lock(&down).await;
    let unavailable_took = started.elapsed();
    assert!(
        matches!(result, Err(Error::QuorumUnavailable { .. })),
        "{result:?}"
    );
    // `no_wait` makes one attempt, whatever the failure.
    let once = resource("once");
    let result = manager.lock(&once).no_wait().await;
    assert!(
        matches!(result, Err(Error::QuorumUnavailable { .. })),
        "{result:?}"
    );
    // A wait gives unavailability the same schedule, well before its deadline.
    let started = Instant::now();
    let result = manager
        .lock(&resource("waiting"))
        .wait(Duration::from_secs(30))
        .await;
    let wait_took = started.elapsed();
    assert!(
        matches!(result, Err(Error::QuorumUnavailable { .. })),
        "{result:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;

    let contended = monitor.sets_of_other_than(&held, &holder_value);
    let contended_gaps = gaps_ms(&contended);
    eprintln!("contended: {took:?}, SET gaps {contended_gaps:.1?} ms");
    assert!(!contended.is_empty(), "no attempt seen: {contended:?}");
    // (Gaps are the node's: a SET it ran late, behind a slow fsync, makes
    // the next gap look shorter than the client's pause by as much.)
    let smallest_step = STEPS_MS[0] as f64 * (1.0 - JITTER);
    for gap in &contended_gaps {
        assert!(
            *gap < smallest_step - NODE_SLACK_MS,
            "contended attempts {contended_gaps:.1?} ms apart: the backoff's pauses, where a \
             waiter tries again when woken or when the holder's keys expire"
        );
    }

    let sets = monitor.sets_of(&down);
    let gaps = gaps_ms(&sets);
    eprintln!(
        "unavailable: {unavailable_took:?}, SET gaps {gaps:.1?} ms (steps {STEPS_MS:?} ± 10 %)"
    );
    assert_eq!(sets.len(), 1 + STEPS_MS.len(), "attempts seen: {sets:?}");
    for (gap, step) in gaps.iter().zip(STEPS_MS) {
        let step = step as f64;
        // Not sooner than the step allows (less the node's own delays);
        // later only by the attempt's own time and the scheduler.
        assert!(
            *gap >= step * (1.0 - JITTER) - NODE_SLACK_MS && *gap <= step * (1.0 + JITTER) + 500.0,
            "gaps {gaps:.1?} ms for steps {STEPS_MS:?} ± {JITTER}"
        );
    }
    assert_eq!(monitor.sets_of(&once).len(), 1, "no_wait retried");
    assert!(
        wait_took >= Duration::from_millis(1620) && wait_took < Duration::from_secs(10),
        "the wait gave up after {wait_took:?}"
    );
}

/// The fault proxies' accepted connections, summed.
fn connections(cluster: &TestCluster) -> u64 {
    (0..cluster.len())
        .map(|i| cluster.proxy(i).expect("proxy").connections_accepted())
        .sum()
}

const COOL_DOWN: Duration = Duration::from_millis(2000);
/// Longer than the nodes' reconnect backoff (100 ms): without the breaker,
/// each call would try to connect again.
const SPACING: Duration = Duration::from_millis(150);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_after_k_fails_fast_without_io_then_probes_and_closes() {
    let cluster = TestCluster::start_proxied(3).expect("proxied cluster");
    let node_timeout = Duration::from_millis(300);
    let with_breaker = || {
        trust_unpersisted(builder(cluster.urls()))
            .fencing(Fencing::Off)
            // timing: the breaker counts timed-out attempts; their length is part of what it measures
            .node_timeout(node_timeout)
            .unavailable_retry(Backoff::none())
            .circuit_breaker(CircuitBreaker::default().failures(3).cool_down(COOL_DOWN))
            .build()
            .expect("valid settings")
    };
    let holder = trust_unpersisted(builder(common::direct_urls(&cluster)))
        .fencing(Fencing::Off)
        .build()
        .expect("valid settings");

    // Contended outcomes never open it, however many in a row.
    let contender = with_breaker();
    let held = resource("held");
    let lock = holder.lock(&held).await.expect("free");
    for _ in 0..10 {
        let result = contender.lock(&held).no_wait().await;
        assert!(matches!(result, Err(Error::Contended { .. })), "{result:?}");
    }
    lock.release().await.expect("held");
    let health = contender.health();
    assert_eq!(
        (health.breaker, health.consecutive_unavailable),
        (BreakerState::Closed, 0),
        "{health:?}"
    );

    // The nodes refuse connections. (A manager that never connected: one
    // with open connections would leave rollbacks of its first failed
    // attempts to retry in the background, which reconnect too.)
    for i in 0..cluster.len() {
        cluster.proxy(i).expect("proxy").set_refuse_new(true);
    }
    let manager = with_breaker();
    assert_eq!(manager.health().breaker, BreakerState::Closed);
    let r = resource("breaker");
    for k in 1..=3 {
        tokio::time::sleep(SPACING).await;
        let before = connections(&cluster);
        let result = manager.lock(&r).await;
        assert!(
            matches!(result, Err(Error::QuorumUnavailable { .. })),
            "attempt {k}: {result:?}"
        );
        // The control: an unavailable attempt goes to the network.
        assert!(
            connections(&cluster) > before,
            "attempt {k} tried no connection"
        );
    }
    let opened = Instant::now();
    let health = manager.health();
    assert!(
        matches!(health.breaker, BreakerState::Open { .. }),
        "{health:?}"
    );
    assert_eq!(health.state, HealthState::Unavailable);

    // Open: every call fails at once, and nothing reaches the proxies.
    // (The last attempt was decided by two failures: the third node's
    // connect may still be on its way; wait until the count stands still.)
    let mut before = connections(&cluster);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = connections(&cluster);
        if now == before {
            break;
        }
        before = now;
    }
    let mut fail_fast = Vec::new();
    while opened.elapsed() + SPACING + Duration::from_millis(200) < COOL_DOWN {
        tokio::time::sleep(SPACING).await;
        let started = Instant::now();
        let result = manager.lock(&r).await;
        fail_fast.push(started.elapsed());
        match result {
            Err(Error::CircuitOpen {
                failures,
                retry_in,
                probing,
            }) => {
                assert_eq!((failures, probing), (3, false));
                assert!(retry_in <= COOL_DOWN, "retry in {retry_in:?}");
            }
            other => panic!("expected CircuitOpen, got {other:?}"),
        }
    }
    assert!(fail_fast.len() >= 5, "only {} calls", fail_fast.len());
    assert_eq!(
        connections(&cluster),
        before,
        "the open breaker let calls reach the proxies"
    );
    fail_fast.sort();
    eprintln!(
        "open breaker: {} calls, median {:?}, slowest {:?}",
        fail_fast.len(),
        fail_fast[fail_fast.len() / 2],
        fail_fast.last().unwrap()
    );
    assert!(
        *fail_fast.last().unwrap() < node_timeout,
        "a refused call took {:?}: it waited on something",
        fail_fast.last().unwrap()
    );

    // After the cool-down, one probe: still down, so open again.
    tokio::time::sleep_until(opened + COOL_DOWN).await;
    let before = connections(&cluster);
    let result = manager.lock(&r).await;
    assert!(
        matches!(result, Err(Error::QuorumUnavailable { .. })),
        "the probe: {result:?}"
    );
    assert!(connections(&cluster) > before, "the probe did not go out");
    let reopened = Instant::now();
    assert!(
        matches!(manager.lock(&r).await, Err(Error::CircuitOpen { .. })),
        "not open again after a failed probe"
    );

    // The nodes come back; after the cool-down the probe wins and closes it.
    for i in 0..cluster.len() {
        cluster.proxy(i).expect("proxy").heal();
    }
    tokio::time::sleep_until(reopened + COOL_DOWN).await;
    // The probe must reconnect to the nodes within `node_timeout`; on a
    // slow machine it may not, and the breaker then waits another
    // cool-down: probes until one wins.
    let probe_started = Instant::now();
    let mut probes = 0;
    let lock = loop {
        probes += 1;
        match manager.lock(&r).await {
            Ok(lock) => break lock,
            Err(Error::CircuitOpen { retry_in, .. }) if probes < 5 => {
                tokio::time::sleep(retry_in).await;
            }
            Err(Error::QuorumUnavailable { .. }) if probes < 5 => {}
            Err(other) => panic!("probe {probes} after the nodes came back: {other:?}"),
        }
    };
    eprintln!(
        "closing probe acquired after {probes} call(s), {:?} after the cool-down ended",
        probe_started.elapsed(),
    );
    lock.release().await.expect("held");
    assert_eq!(manager.health().breaker, BreakerState::Closed);
    let lock = manager.lock(&r).await.expect("closed: calls go through");
    lock.release().await.expect("held");
    assert!(manager.settle().await);
}

/// Managers on the proxies of `cluster` with this backoff, and a holder
/// that reaches the nodes directly.
fn waiter_and_holder(cluster: &TestCluster, backoff: Backoff, ttl: Duration) -> [LockManager; 2] {
    let waiter = trust_unpersisted(builder(cluster.urls()))
        .fencing(Fencing::Off)
        .ttl(ttl)
        .unavailable_retry(backoff)
        .build()
        .expect("valid settings");
    let holder = trust_unpersisted(builder(common::direct_urls(cluster)))
        .fencing(Fencing::Off)
        .ttl(ttl)
        .build()
        .expect("valid settings");
    [waiter, holder]
}

/// Whether `manager`'s health feed reports `Unavailable` before `limit`.
fn saw_unavailable(manager: &LockManager) -> tokio::task::JoinHandle<bool> {
    let mut feed = manager.health_changes();
    tokio::spawn(async move {
        loop {
            if feed.borrow_and_update().state == HealthState::Unavailable {
                return true;
            }
            if feed.changed().await.is_err() {
                return false;
            }
        }
    })
}

fn outage(cluster: &TestCluster, nodes: std::ops::Range<usize>, on: bool) {
    for i in nodes {
        let proxy = cluster.proxy(i).expect("proxy");
        if on {
            proxy.set_refuse_new(true);
            proxy.drop_connections();
        } else {
            proxy.heal();
        }
    }
}

/// The backoff counts from the outage, not from the start of the wait: a
/// waiter that has waited longer than `give_up_after` for a holder still
/// rides out a short outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_rides_out_a_short_outage() {
    let cluster = TestCluster::start_proxied(5).expect("proxied cluster");
    // A budget of 1.5 s from the outage (0.7 s long): beside a CPU and
    // disk load, nodes took over 0.3 s after it to be observed again.
    let backoff =
        Backoff::steps([Duration::from_millis(150); 20]).give_up_after(Duration::from_millis(1500));
    let [waiter, holder] = waiter_and_holder(&cluster, backoff, Duration::from_secs(3));
    let r = resource("long-wait");
    let lock = holder.lock(&r).await.expect("free");
    let started = Instant::now();
    let waiting = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.lock(&r).wait(Duration::from_secs(20)).await }
    });
    let unavailable = saw_unavailable(&waiter);
    // The holder's keys expire at 3 s, and the waiter tries then: the
    // nodes are unreachable from 2.7 s to 3.4 s. It has waited 3 s by
    // then, past `give_up_after`.
    tokio::time::sleep_until(started + Duration::from_millis(2700)).await;
    outage(&cluster, 0..5, true);
    tokio::time::sleep_until(started + Duration::from_millis(3400)).await;
    outage(&cluster, 0..5, false);
    let acquired = waiting.await.expect("no panic");
    let lock_b =
        acquired.unwrap_or_else(|e| panic!("the wait gave up after {:?}: {e}", started.elapsed()));
    assert!(
        tokio::time::timeout(Duration::from_secs(1), unavailable)
            .await
            .is_ok_and(|seen| seen.unwrap_or(false)),
        "the waiter never met the outage"
    );
    lock_b.release().await.expect("held");
    drop(lock);
}

/// A waiter that met an outage sleeps its backoff out: the rollbacks of its
/// own failed attempts ring it (it is first in the queue), and must not
/// make it use up the schedule at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_waiter_is_not_rung_through_its_backoff() {
    let cluster = TestCluster::start_proxied(5).expect("proxied cluster");
    let backoff = Backoff::steps([Duration::from_millis(250); 8]);
    let [waiter, holder] = waiter_and_holder(&cluster, backoff, Duration::from_secs(10));
    let r = resource("rung");
    let lock = holder.lock(&r).await.expect("free");
    let waiting = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.lock(&r).wait(Duration::from_secs(20)).await }
    });
    let direct = common::direct_urls(&cluster);
    let queued = common::eventually(Duration::from_secs(10), || {
        direct
            .iter()
            .filter(|url| common::queued_on(url, &r) == 1)
            .count()
            >= 3
    })
    .await;
    assert!(queued, "the waiter never queued on a majority");
    let unavailable = saw_unavailable(&waiter);
    // Three nodes become unreachable for the waiter; the holder releases
    // everywhere, and the two nodes left ring the waiter: its attempts
    // are granted on two, fail, and their rollbacks ring it again.
    outage(&cluster, 0..3, true);
    let released = Instant::now();
    lock.release().await.expect("held");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    outage(&cluster, 0..3, false);
    let acquired = waiting.await.expect("no panic");
    let lock = acquired.unwrap_or_else(|e| {
        panic!(
            "the wait gave up {:?} after the release: {e}",
            released.elapsed()
        )
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(1), unavailable)
            .await
            .is_ok_and(|seen| seen.unwrap_or(false)),
        "the waiter never met the outage"
    );
    lock.release().await.expect("held");
}

/// Three of five nodes paused (they time out rather than refuse), and a
/// `try_lock` loop on a free resource: each attempt that fails rolls back
/// on the two live nodes in the background. The next attempt must not
/// reach them before that rollback and be refused by the manager's own
/// leftover key: it would be reported `Contended` (someone holds a
/// resource nobody holds), `is_unavailable()` would be false for half the
/// calls, and a breaker would never open (each `Contended` resets its
/// count).
/// (One thread: the rollback task cannot run before the next attempt
/// unless the attempt waits for it, so the race is lost every time.)
#[tokio::test(flavor = "current_thread")]
async fn an_attempt_is_never_refused_by_the_managers_own_rollback() {
    let cluster = common::cluster(5);
    for i in 2..5 {
        cluster.pause(i).expect("pause");
    }
    let outage = |breaker: Option<CircuitBreaker>| {
        // settings: the library's defaults (50 ms, three attempts) are the subject of the race
        let builder = LockManager::builder()
            .nodes(cluster.urls())
            .fencing(Fencing::Off)
            .unavailable_retry(Backoff::none());
        match breaker {
            Some(breaker) => builder.circuit_breaker(breaker),
            None => builder,
        }
        .build()
        .expect("valid settings")
    };
    let manager = outage(None);
    let name = resource("own-rollback");
    let mut outcomes = Vec::new();
    for _ in 0..30 {
        let result = manager.lock(&name).no_wait().await;
        outcomes.push(match &result {
            Ok(_) => "granted".to_owned(),
            Err(error) if error.is_unavailable() => "unavailable".to_owned(),
            Err(error) => format!("{error:?}"),
        });
    }
    let other: Vec<&String> = outcomes.iter().filter(|o| *o != "unavailable").collect();
    assert!(
        other.is_empty(),
        "with three of five nodes paused, a free resource must be unavailable every time; \
         {} of 30 attempts said otherwise: {other:?}",
        other.len()
    );

    let with_breaker = outage(Some(
        CircuitBreaker::default().failures(3).cool_down(COOL_DOWN),
    ));
    let mut seen = Vec::new();
    for _ in 0..30 {
        match with_breaker.lock(&name).no_wait().await {
            Err(Error::CircuitOpen { .. }) => break,
            other => seen.push(format!("{other:?}")),
        }
    }
    assert!(
        seen.len() <= 3,
        "the breaker (3 failures) did not open after 3 attempts under a try_lock loop in an \
         outage: {seen:?}"
    );
    for i in 2..5 {
        cluster.resume(i).expect("resume");
    }
}
