//! Waiting for a busy lock (`lock_within`), on real five-node clusters:
//! woken by the release, by the holder's expiry when no notice comes, at
//! the deadline with a typed error; no queue entry or subscription left by
//! a dropped waiter; with two nodes down; served in arrival order; and
//! mutual exclusion with increasing tokens throughout.
//!
//! Timing assertions compare against bounds many times larger than the
//! expected figure (a notice must beat a 10 s expiry, not a 50 ms one), so
//! a slow disk or CPU cannot fail them.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{
    SETTLE_LIMIT, builder, cluster, direct_urls, eventually, queued_on, resource, stored_value,
    trust_unpersisted,
};
use quorumlock::internals::{lock_key, wake_channel};
use quorumlock::testkit::{Delay, TestCluster};
use quorumlock::{Backoff, Error, Fencing, LockManager};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

fn waiting_manager(urls: Vec<String>) -> LockManager {
    builder(urls).ttl(TTL).build().expect("valid settings")
}

/// Subscribers of `resource`'s wake-up channel on one node.
fn subscribers_on(url: &str, resource: &str) -> usize {
    let (_, count): (String, usize) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(wake_channel(resource))
        .query(&mut common::connect(url))
        .unwrap_or_else(|e| panic!("PUBSUB NUMSUB on {url}: {e}"));
    count
}

/// Sets the lock key directly on every node, as a holder that then
/// crashes would leave it: no release will ever come.
fn crashed_holder(urls: &[String], resource: &str, ttl: Duration) {
    for url in urls {
        let _: () = redis::cmd("SET")
            .arg(lock_key(resource))
            .arg("crashed-holder")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query(&mut common::connect(url))
            .unwrap_or_else(|e| panic!("SET on {url}: {e}"));
    }
}

/// Whether `waiters` entries are queued on a majority of the nodes. (Not
/// on all: a node that the holder's SET never reached grants a waiter's
/// attempt, which then loses and is rolled back there, unqueued.)
async fn queued_on_a_majority(urls: &[String], resource: &str, waiters: usize) -> bool {
    eventually(Duration::from_secs(10), || {
        let queued = urls
            .iter()
            .filter(|url| queued_on(url, resource) == waiters)
            .count();
        queued > urls.len() / 2
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_long_before_the_keys_would_expire() {
    let cluster = cluster(5);
    let holder = waiting_manager(cluster.urls());
    let waiter = waiting_manager(cluster.urls());
    let r = resource("notified");
    let lock = holder.lock(&r).await.expect("free resource");
    let waiting = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move {
            let lock = waiter.lock(&r).wait(Duration::from_secs(20)).await;
            (lock, Instant::now())
        }
    });
    assert!(
        queued_on_a_majority(&cluster.urls(), &r, 1).await,
        "the waiter never queued on every node"
    );
    // Queue keys expire by themselves if every waiter dies.
    for url in cluster.urls() {
        let key = quorumlock::internals::key_of(quorumlock::internals::KeyKind::Waiters, &r);
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query(&mut common::connect(&url))
            .expect("PTTL");
        assert!(pttl == -2 || pttl > 0, "queue key on {url} has PTTL {pttl}");
    }
    let released = Instant::now();
    lock.release().await.expect("held");
    let (lock, acquired) = waiting.await.expect("no panic");
    let lock = lock.expect("acquired after the release");
    let gap = acquired - released;
    // Its keys would have lived ~10 s; the notice brings it in at once.
    assert!(
        gap < Duration::from_secs(3),
        "the waiter took the lock {gap:?} after the release (the holder's keys had ~10 s left)"
    );
    lock.release().await.expect("held");
    assert!(waiter.settle().await);
    for url in cluster.urls() {
        assert_eq!(queued_on(&url, &r), 0, "queue left on {url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_release_the_waiter_wakes_when_the_keys_expire() {
    let cluster = cluster(5);
    let waiter = waiting_manager(cluster.urls());
    let r = resource("expiry");
    let expiry = Duration::from_millis(1500);
    crashed_holder(&cluster.urls(), &r, expiry);
    let started = Instant::now();
    let lock = waiter
        .lock(&r)
        .wait(Duration::from_secs(20))
        .await
        .expect("acquired once the crashed holder's keys expire");
    let waited = started.elapsed();
    assert!(
        waited >= expiry - Duration::from_millis(100),
        "acquired after {waited:?}, before the keys (PX {expiry:?}) could have expired"
    );
    // Woken by the bound the refusals gave, not by a 20 s wait or a poll
    // schedule: expiry plus a round trip, with room for a slow machine.
    assert!(
        waited < expiry + Duration::from_millis(1500),
        "acquired only {waited:?} after starting to wait on keys that expired after {expiry:?}"
    );
    lock.release().await.expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_deadline_the_wait_fails_with_a_typed_error() {
    let cluster = cluster(5);
    let holder = waiting_manager(cluster.urls());
    let waiter = waiting_manager(cluster.urls());
    let r = resource("deadline");
    let lock = holder.lock(&r).await.expect("free resource");
    let wait = Duration::from_millis(600);
    let started = Instant::now();
    let error = waiter
        .lock(&r)
        .wait(wait)
        .await
        .expect_err("held by another client throughout");
    let waited = started.elapsed();
    match &error {
        Error::WaitTimedOut {
            resource,
            free_in: Some(free_in),
            attempts,
            ..
        } => {
            assert_eq!(resource, &r);
            assert!(*attempts >= 1, "{error}");
            assert!(
                *free_in > Duration::from_secs(7) && *free_in <= TTL,
                "the holder's keys had ~9 s left, the error says {free_in:?}: {error}"
            );
        }
        other => panic!("expected WaitTimedOut with a bound, got {other:?}"),
    }
    assert!(error.to_string().contains("still held"), "{error}");
    assert!(
        waited >= wait,
        "gave up after {waited:?}, before the {wait:?} wait"
    );
    // An attempt in flight at the deadline is bounded by node_timeout (500 ms).
    assert!(
        waited < wait + Duration::from_millis(1500),
        "gave up {waited:?} after starting a {wait:?} wait"
    );
    assert!(waiter.settle().await);
    for url in cluster.urls() {
        assert_eq!(
            queued_on(&url, &r),
            0,
            "the timed-out waiter is still queued on {url}"
        );
    }
    lock.release().await.expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_lost_with_its_connection_costs_at_most_the_expiry_bound() {
    let cluster = TestCluster::start_proxied(5).expect("proxied cluster");
    let direct = direct_urls(&cluster);
    let holder = waiting_manager(direct.clone());
    // The waiter's attempts during the 300 ms outage below find no quorum:
    // its backoff must outlast the outage for the wait to go on.
    let waiter = builder(cluster.urls())
        .ttl(TTL)
        .unavailable_retry(Backoff::steps([Duration::from_millis(100); 20]))
        .build()
        .expect("valid settings");
    let r = resource("missed");
    let ttl = Duration::from_millis(2500);
    let lock = holder.lock(&r).ttl(ttl).await.expect("free resource");
    let keys_expire = Instant::now() + ttl;
    let waiting = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move {
            let lock = waiter.lock(&r).wait(Duration::from_secs(20)).await;
            (lock, Instant::now())
        }
    });
    assert!(
        eventually(Duration::from_secs(10), || direct
            .iter()
            .filter(|url| queued_on(url, &r) == 1)
            .count()
            >= 3)
        .await,
        "the waiter never queued on a majority"
    );
    assert!(
        eventually(Duration::from_secs(5), || direct
            .iter()
            .all(|url| subscribers_on(url, &r) == 1))
        .await,
        "the waiter's manager never subscribed on every node"
    );
    // The proxies drop the waiter's connections, its subscriptions among
    // them, and refuse new ones while the holder releases (directly): the
    // notice is lost.
    for i in 0..cluster.len() {
        let proxy = cluster.proxy(i).expect("proxy");
        proxy.set_refuse_new(true);
        proxy.drop_connections();
    }
    lock.release().await.expect("held");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..cluster.len() {
        cluster.proxy(i).expect("proxy").heal();
    }
    let (lock, acquired) = waiting.await.expect("no panic");
    let lock = lock.expect("acquired within the expiry bound");
    let late = acquired.saturating_duration_since(keys_expire);
    assert!(
        late < Duration::from_millis(1500),
        "acquired {late:?} after the holder's keys would have expired"
    );
    lock.release().await.expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_subscription_connection_is_made_up_for_at_once() {
    let cluster = cluster(5);
    let holder = waiting_manager(cluster.urls());
    let waiter = waiting_manager(cluster.urls());
    let r = resource("resubscribed");
    let lock = holder.lock(&r).await.expect("free resource");
    let waiting = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.lock(&r).wait(Duration::from_secs(20)).await }
    });
    assert!(
        queued_on_a_majority(&cluster.urls(), &r, 1).await,
        "never queued"
    );
    assert!(
        eventually(Duration::from_secs(5), || cluster
            .urls()
            .iter()
            .all(|url| subscribers_on(url, &r) == 1))
        .await,
        "the waiter's manager never subscribed on every node"
    );
    // Cut every subscription connection, then release while they are down.
    for url in cluster.urls() {
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query(&mut common::connect(&url))
            .expect("CLIENT KILL");
    }
    let released = Instant::now();
    lock.release().await.expect("held");
    let lock = waiting.await.expect("no panic").expect("acquired");
    assert!(
        released.elapsed() < Duration::from_secs(4),
        "acquired {:?} after the release; the keys had ~10 s left",
        released.elapsed()
    );
    // The manager subscribes again.
    lock.release().await.expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_leaves_no_entry_and_no_subscription() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let holder = waiting_manager(urls.clone());
    let waiter = waiting_manager(urls.clone());
    let r = resource("dropped-waiter");
    let lock = holder.lock(&r).await.expect("free resource");
    let held_before: Vec<_> = urls.iter().map(|url| stored_value(url, &r)).collect();
    for cut_ms in [0, 1, 2, 5, 10, 30, 100] {
        let outcome =
            tokio::time::timeout(Duration::from_millis(cut_ms), waiter.lock(&r).wait(TTL)).await;
        assert!(
            outcome.is_err(),
            "the resource is held: the wait cannot finish"
        );
        assert!(
            waiter.settle().await,
            "settle gave up after a wait cut at {cut_ms} ms"
        );
        for url in &urls {
            assert_eq!(
                queued_on(url, &r),
                0,
                "a wait dropped after {cut_ms} ms left its entry on {url}"
            );
        }
    }
    assert!(
        eventually(SETTLE_LIMIT, || urls
            .iter()
            .all(|url| subscribers_on(url, &r) == 0))
        .await,
        "subscriptions left: {:?}",
        urls.iter()
            .map(|url| subscribers_on(url, &r))
            .collect::<Vec<_>>()
    );
    // Still the holder's, wherever it was before.
    assert_eq!(
        urls.iter()
            .map(|url| stored_value(url, &r))
            .collect::<Vec<_>>(),
        held_before,
        "the dropped waits changed the lock keys"
    );
    lock.release().await.expect("held");
    // And free for the next client at once.
    let next = waiter
        .lock(&r)
        .no_wait()
        .await
        .expect("nothing left behind");
    next.release().await.expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_down_while_waiting_still_hands_over() {
    let cluster = cluster(5);
    let holder = builder(cluster.urls())
        .ttl(TTL)
        .fencing(Fencing::Quorum)
        .build()
        .expect("valid");
    let waiter = builder(cluster.urls())
        .ttl(TTL)
        .fencing(Fencing::Quorum)
        .build()
        .expect("valid");
    let r = resource("two-down");
    let lock = holder.lock(&r).await.expect("free resource");
    let token = lock.token().expect("quorum fencing");
    let waiting = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.lock(&r).wait(Duration::from_secs(20)).await }
    });
    assert!(
        queued_on_a_majority(&cluster.urls(), &r, 1).await,
        "never queued"
    );
    // Two nodes go down; three that hold the lock stay up (a straggler
    // whose connection was not ready may never have got the holder's SET,
    // and then the waiter's attempts may set their own key there for a
    // moment: only the holder's value counts).
    let urls = cluster.urls();
    let (mut victims, holders): (Vec<usize>, Vec<usize>) =
        (0..5).partition(|&i| stored_value(&urls[i], &r).as_deref() != Some(lock.value()));
    victims.extend(holders.into_iter().rev());
    for &i in &victims[..2] {
        cluster.kill(i).expect("kill");
    }
    let released = Instant::now();
    lock.release().await.expect("a quorum is up");
    let next = waiting
        .await
        .expect("no panic")
        .expect("acquired on three nodes");
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "acquired {:?} after the release (keys had ~10 s left)",
        released.elapsed()
    );
    assert!(next.token().expect("quorum fencing") > token);
    next.release().await.expect("a quorum is up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let managers = [waiting_manager(urls.clone()), waiting_manager(urls.clone())];
    let r = resource("fifo");
    let lock = managers[0].lock(&r).await.expect("free resource");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    let count = 8;
    for i in 0..count {
        let manager = managers[i % 2].clone();
        let (name, order) = (r.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let lock = manager
                .lock(&name)
                .wait(Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("waiter {i}: {e}"));
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            lock.release().await.expect("held");
        }));
        // Arrival order: each one queued (on a majority) before the next.
        assert!(
            queued_on_a_majority(&urls, &r, i + 1).await,
            "waiter {i} never queued"
        );
    }
    lock.release().await.expect("held");
    for waiter in waiters {
        waiter.await.expect("no panic");
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..count).collect::<Vec<_>>(), "order of service");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_waiters_never_overlap_and_tokens_increase() {
    let cluster = cluster(5);
    let managers: Vec<_> = (0..2).map(|_| waiting_manager(cluster.urls())).collect();
    let r = resource("exclusion");
    let holding = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for i in 0..12 {
        let manager = managers[i % 2].clone();
        let (r, holding, overlaps, tokens) = (
            r.clone(),
            Arc::clone(&holding),
            Arc::clone(&overlaps),
            Arc::clone(&tokens),
        );
        tasks.push(tokio::spawn(async move {
            let mut acquired = 0;
            while Instant::now() < stop {
                let lock = match manager.lock(&r).wait(Duration::from_secs(20)).await {
                    Ok(lock) => lock,
                    Err(e) => panic!("waiter {i}: {e}"),
                };
                if holding.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokens
                    .lock()
                    .unwrap()
                    .push(lock.token().expect("counter fencing"));
                tokio::time::sleep(Duration::from_millis(1)).await;
                holding.store(false, Ordering::SeqCst);
                lock.release().await.expect("held");
                acquired += 1;
            }
            acquired
        }));
    }
    let mut per_waiter = Vec::new();
    for task in tasks {
        per_waiter.push(task.await.expect("no panic"));
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "holds overlapped");
    let tokens = tokens.lock().unwrap().clone();
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens did not strictly increase in order of acquisition: {tokens:?}"
    );
    assert!(
        per_waiter.iter().all(|&n| n > 0),
        "a waiter never got the lock: {per_waiter:?}"
    );
}

/// A holder "crashes" (its lock is forgotten, never released) with its key
/// on a bare majority of the nodes, and eight waiters on four managers wait
/// for the resource. The head waiter's attempts win the two free nodes and
/// are rolled back, and each rollback rings it again. Its pauses between
/// such rings once doubled past the holder's expiry, so the next holder
/// came up to ~640 ms late in a third of the runs (a second mode, not
/// noise); those rings no longer wake it at all (they come from nodes that
/// did not refuse it), and its timer does. The successor must come within
/// a few round trips of the expiry, every run: 30 runs with
/// `QUORUMLOCK_LONG=1` (CI), 8 otherwise, measured from the earliest moment
/// the holder's key can expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_successor_comes_at_the_expiry_every_run() {
    // No AOF: the subject is the waiters' timing, not the disk.
    let cluster = TestCluster::start_with_args(5, &["--appendonly", "no"]).expect("cluster");
    let urls = cluster.urls();
    let manager = || -> LockManager {
        common::trust_unpersisted(builder(urls.clone()))
            .fencing(Fencing::Off)
            // timing: the successor's time after the expiry is the subject; 100 ms keeps each round short against it
            .node_timeout(Duration::from_millis(100))
            .build()
            .expect("valid settings")
    };
    let holder = manager();
    let waiters: Vec<LockManager> = (0..4).map(|_| manager()).collect();
    let ttl = Duration::from_millis(400);
    let mut delays = Vec::new();
    // 30 runs look for a second mode (CI); a quick run, for the first.
    let runs = common::quick_or_long(8, 30);
    for run in 0..runs {
        let name = resource(&format!("crashed-{run}"));
        let asked = Instant::now();
        let lock = holder.lock(&name).ttl(ttl).await.expect("free");
        // On nodes 0..3 only.
        for url in &urls[3..] {
            let _: i64 = redis::cmd("DEL")
                .arg(lock_key(&name))
                .query(&mut common::connect(url))
                .expect("DEL");
        }
        std::mem::forget(lock);
        let expires = asked + ttl;
        let mut tasks = Vec::new();
        for w in 0..8 {
            let (manager, name) = (waiters[w % 4].clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let lock = manager
                    .lock(&name)
                    .wait(Duration::from_secs(10))
                    .await
                    .expect("the resource frees when the holder's key expires");
                let at = Instant::now();
                lock.release().await.expect("held");
                at
            }));
        }
        let mut first = None;
        for task in tasks {
            let at = task.await.expect("no panic");
            first = Some(first.map_or(at, |f: Instant| f.min(at)));
        }
        delays.push(
            first
                .expect("eight waiters")
                .saturating_duration_since(expires),
        );
    }
    delays.sort();
    eprintln!(
        "successor after the expiry, {runs} runs: median {:?}, max {:?}",
        delays[runs / 2],
        delays[runs - 1]
    );
    assert!(
        delays[runs - 1] < common::scaled(Duration::from_millis(150)),
        "the successor came up to {:?} after the holder's key expired (sorted: {delays:?})",
        delays[runs - 1]
    );
}

/// The hot-key stall (issue 43). A waiter whose attempts win on some nodes
/// and lose on others is rung by its own rollbacks: each one leaves the key
/// free on its node, kept for the waiter, and the node says so. Counted as
/// news, those rings made it try again, and, rung twice in a row, back off
/// 10 ms, doubling up to 640 ms: the release it waited for then found it
/// asleep while the queue kept the lock for it (with 64 waiters, 1 run in 8
/// stalled for about 350 ms). Here the holder's key is gone from nodes 3
/// and 4, a ring from every node sets the waiter off, and the holder keeps
/// the lock 3 s: once those rings' tries are over, the waiter must not
/// keep trying on its echoes (nodes 3 and 4 run three scripts each per
/// try: the attempt and its rollbacks), also after a renewal of its place, and
/// must take the lock at once when the release comes. (Before the fix, over
/// 1.5 s from the rings: 34 scripts, and 0.43 s late. Counting from the
/// rings, a slow disk spread them over several tries: 20 scripts in ci29.
/// With 2 s leases, a renewal's echo set off a second try: 20 scripts in
/// 2.5 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rung_by_its_own_rollbacks_takes_the_release_at_once() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    // No counter node: a refusal by node 0 alone would decide an attempt
    // before it reached nodes 3 and 4.
    let manager = || {
        builder(urls.clone())
            .ttl(TTL)
            .fencing(Fencing::Off)
            .build()
            .expect("valid settings")
    };
    let (holder, waiter) = (manager(), manager());
    // Connected to every node first: a request still connecting when the
    // round is decided is never sent.
    for m in [&holder, &waiter] {
        let warm = m.lock(&resource("warm")).no_wait().await.expect("free");
        warm.release().await.expect("held");
    }
    let r = resource("echoes");
    let lock = holder.lock(&r).no_wait().await.expect("free resource");
    let waiting = tokio::spawn({
        let r = r.clone();
        async move {
            let lock = waiter.lock(&r).wait(Duration::from_secs(30)).await;
            (lock, Instant::now())
        }
    });
    let queued = eventually(Duration::from_secs(10), || {
        urls.iter().all(|url| queued_on(url, &r) == 1)
    })
    .await;
    if !queued {
        let per_node: Vec<usize> = urls.iter().map(|url| queued_on(url, &r)).collect();
        let ended = if waiting.is_finished() {
            format!("{:?}", waiting.await.expect("no panic").0)
        } else {
            "still waiting".to_owned()
        };
        panic!("the waiter never queued on every node: queued per node {per_node:?}; {ended}");
    }
    let queue = quorumlock::internals::key_of(quorumlock::internals::KeyKind::Waiters, &r);
    let ids: Vec<String> = redis::cmd("ZRANGE")
        .arg(&queue)
        .arg(0)
        .arg(0)
        .query(&mut common::connect(&urls[0]))
        .expect("ZRANGE");
    let id = ids.first().expect("the waiter is queued on node 0").clone();
    // The holder's key lost on nodes 3 and 4: the waiter's attempts win there.
    for url in &urls[3..] {
        let _: i64 = redis::cmd("DEL")
            .arg(lock_key(&r))
            .query(&mut common::connect(url))
            .expect("DEL");
    }
    let scripts_on_3_and_4 = || -> u64 {
        urls[3..]
            .iter()
            .map(|url| common::command_calls(url, "evalsha"))
            .sum()
    };
    // What a release would send from every node: the waiter tries again.
    for url in &urls {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(wake_channel(&r))
            .arg(&id)
            .query(&mut common::connect(url))
            .expect("PUBLISH");
    }
    // Those rings' tries play out; then nothing new happens for 0.9 s, in
    // which the waiter renews its place once at most (every half lease,
    // 1 s): one try, whose rollbacks' rings are echoes too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let scripts_before = scripts_on_3_and_4();
    tokio::time::sleep(Duration::from_millis(900)).await;
    let scripts = scripts_on_3_and_4() - scripts_before;
    let released = Instant::now();
    lock.release().await.expect("held");
    let (lock, acquired) = waiting.await.expect("no panic");
    let lock = lock.expect("acquired after the release");
    let late = acquired - released;
    assert!(
        scripts <= 6,
        "nodes 3 and 4 ran {scripts} scripts in the 0.9 s after the rings' tries, with nothing \
         new but a renewal at most (a try is 6 there: the attempt and its rollbacks; it took \
         the lock {late:?} after the release): the waiter kept trying on its own rollbacks' \
         rings"
    );
    assert!(
        late < Duration::from_millis(200),
        "the waiter took the lock {late:?} after the release: asleep on a back-off?"
    );
    lock.release().await.expect("held");
}

/// A zero wait is one attempt, not queued, as `no_wait` (found in review:
/// it was a queued attempt, so every node that refused it queued the
/// waiter until a background dequeue, holding back whoever came after).
/// Requests take 300 ms to reach the nodes here, so a dequeue would land
/// 300 ms after the call returned: read directly, the nodes must hold no
/// entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_wait_is_one_attempt_that_joins_no_queue() {
    let cluster = TestCluster::start_proxied_with_args(3, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    let manager = trust_unpersisted(builder(cluster.urls()))
        // timing: longer than the helper's: the check 300 ms after the call must not race a slow round
        .node_timeout(Duration::from_millis(1500))
        .build()
        .expect("valid settings");
    let direct = direct_urls(&cluster);
    let name = resource("review-zero-wait");
    let held = manager.lock(&name).no_wait().await.expect("free");
    for i in 0..cluster.len() {
        cluster
            .proxy(i)
            .expect("proxied")
            .set_latency_to_node(Delay {
                fixed: Duration::from_millis(300),
                jitter: Duration::ZERO,
            });
    }
    let zero = manager.lock(&name).wait(Duration::ZERO).await;
    assert!(
        matches!(zero, Err(Error::Contended { attempts: 1, .. })),
        "held: {zero:?}"
    );
    let queued: Vec<usize> = direct.iter().map(|url| queued_on(url, &name)).collect();
    for i in 0..cluster.len() {
        cluster.proxy(i).expect("proxied").heal();
    }
    drop(held);
    manager.settle().await;
    assert_eq!(
        queued,
        vec![0; direct.len()],
        "a zero wait left its queue entry on the nodes"
    );
}

/// A holder that crashed leaves the lock to the first waiter, not to
/// whoever comes next: while the waiter is queued (its lease live) the
/// holder's key is kept past its own expiry, so a plain attempt
/// (`no_wait()`, and every lock's first attempt) is refused there, and a
/// later waiter queues behind. The waiter, cut off from every node across
/// the expiry (its proxies hold its traffic), gets the lock when it is
/// heard again. `holders()` reads a kept key as its holder's (with the
/// holder's own time left) and as free once that is up.
/// Failed before its fix: the newcomer's `no_wait()` took the lock the
/// moment the holder's key expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_pass_a_waiter_when_the_holders_key_expires() {
    let cluster = TestCluster::start_proxied_with_args(3, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    let direct = direct_urls(&cluster);
    let settings = |urls: Vec<String>| {
        trust_unpersisted(builder(urls))
            .ttl(Duration::from_secs(6))
            // timing: 300 ms keeps the cut-off waiter's attempts short against the holder's key's expiry
            .node_timeout(Duration::from_millis(300))
            .build()
            .expect("valid settings")
    };
    let newcomer = settings(direct.clone());
    // Cut off, the waiter's attempts fail as unavailable: it keeps trying.
    let waiting = trust_unpersisted(builder(cluster.urls()))
        .ttl(Duration::from_secs(6))
        .node_timeout(Duration::from_millis(300))
        .unavailable_retry(Backoff::steps([Duration::from_millis(200); 100]))
        .build()
        .expect("valid settings");
    // Every node connected first: a request not yet sent when its round
    // is decided never goes, and the waiter must queue on every node.
    common::reach_every_node(&waiting, &direct).await;
    // Cut off, the waiter keeps its place for its lease (2 s from its
    // last attempt heard): the holder's key expires 600 ms after it is
    // set, and the waiter must have queued before that. On a machine too
    // slow for that, the waiter (it took the lock at the expiry) is
    // dropped and the setup tried again on a new resource.
    let held_for = Duration::from_millis(600);
    let mut setup = None;
    for _ in 0..10 {
        let name = resource("kept-for-the-waiter");
        crashed_holder(&direct, &name, held_for);
        let expires = Instant::now() + held_for;
        let waiter = {
            let (manager, name) = (waiting.clone(), name.clone());
            tokio::spawn(async move { manager.lock(&name).wait(Duration::from_secs(30)).await })
        };
        let everywhere = eventually(held_for / 2, || {
            direct.iter().all(|url| queued_on(url, &name) == 1)
        })
        .await;
        if everywhere {
            for i in 0..cluster.len() {
                cluster.proxy(i).expect("proxied").set_unresponsive(true);
            }
            setup = Some((name, expires, waiter));
            break;
        }
        waiter.abort();
        let _ = waiter.await;
        assert!(waiting.settle().await);
    }
    let (name, expires, waiter) = setup.expect("the waiter queued within 300 ms in 10 tries");
    let seen = newcomer.holders(&name).await.expect("read");
    let holder = seen.exclusive().expect("the crashed holder holds");
    assert!(
        holder.value == "crashed-holder" && holder.valid_for.is_some_and(|left| left <= held_for),
        "a kept key reads as its holder's, with the holder's own time left: {seen:?}"
    );
    tokio::time::sleep_until(expires + Duration::from_millis(100)).await;
    let taken = newcomer.lock(&name).no_wait().await;
    assert!(
        matches!(taken, Err(Error::Contended { .. })),
        "a newcomer passed the queued waiter once the holder's key expired: {taken:?}"
    );
    for url in &direct {
        let set: Option<String> = redis::cmd("SET")
            .arg(lock_key(&name))
            .arg("barging")
            .arg("NX")
            .arg("PX")
            .arg(5000)
            .query(&mut common::connect(url))
            .expect("SET");
        assert_eq!(set, None, "a plain SET NX on {url} passed the queue");
    }
    let seen = newcomer.holders(&name).await.expect("read");
    assert!(
        seen.free && seen.waiters == 1,
        "the holder's time is up: free, for the waiter: {seen:?}"
    );
    let later = newcomer.lock(&name).wait(Duration::from_millis(200)).await;
    assert!(
        matches!(later, Err(Error::WaitTimedOut { .. })),
        "a later waiter must queue behind the first: {later:?}"
    );
    for i in 0..cluster.len() {
        cluster.proxy(i).expect("proxied").set_unresponsive(false);
    }
    let lock = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter gets the lock once it is heard again")
        .expect("no panic")
        .expect("granted");
    lock.release().await.expect("held");
    assert!(waiting.settle().await && newcomer.settle().await);
}

/// A waiter that dies while queued (SIGKILL: no cleanup runs) holds up
/// the next one for at most its lease, 2 s, whatever TTL it asked for its
/// lock (found in review: a `quorumlock run --ttl 30s` waiter killed in
/// line kept a free lock from the next waiter for 29.2 s, its TTL). Prints
/// "dead waiter → next grant" per TTL (docs/performance.md quotes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_holds_the_line_for_its_lease_not_its_ttl() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let manager = builder(urls.clone()).build().expect("valid settings");
    // Every node counted, so that the holder's key is on all five.
    common::reach_every_node(&manager, &urls).await;
    for ttl in ["2s", "30s", "5m"] {
        let name = resource(&format!("dead-waiter-{ttl}"));
        // Held until released: the waiter's guard may keep the fresh
        // nodes out for its window first (they started with an empty data
        // set), and the holder must still hold when it queues.
        let holder = manager
            .lock(&name)
            .ttl(Duration::from_secs(120))
            .await
            .expect("free");
        let mut waiter = std::process::Command::new(env!("CARGO_BIN_EXE_quorumlock"))
            .args(["run", "--nodes", &urls.join(","), &name, "--ttl", ttl])
            .args(["--wait", "10m", "--", "true"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn quorumlock run");
        // Queued wherever the holder's key is (a majority at least).
        let holding: Vec<&String> = urls
            .iter()
            .filter(|url| common::nodes_holding(&[(*url).clone()], &name, holder.value()) == 1)
            .collect();
        assert!(
            holding.len() >= 3,
            "the holder's key is on {} nodes",
            holding.len()
        );
        let queued = eventually(common::scaled(Duration::from_secs(30)), || {
            holding.iter().all(|url| queued_on(url, &name) == 1)
        })
        .await;
        assert!(
            queued,
            "the --ttl {ttl} waiter never queued on the {} nodes that hold the key: {:?}",
            holding.len(),
            urls.iter().map(|u| queued_on(u, &name)).collect::<Vec<_>>()
        );
        waiter.kill().expect("SIGKILL the waiter");
        waiter.wait().expect("reaped");
        holder.release().await.expect("held");
        let released = Instant::now();
        let next = manager
            .lock(&name)
            .wait(Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the next waiter behind a dead --ttl {ttl} waiter, {:?} after the release: {e}",
                    released.elapsed()
                )
            });
        let after = released.elapsed();
        eprintln!("dead waiter (--ttl {ttl}) -> next grant: {after:?}");
        // Its lease (2 s) ran from its last renewal, before the release;
        // the rest is the next waiter's timer and the load's delays.
        let bound = Duration::from_secs(2) + common::scaled(Duration::from_secs(3));
        assert!(
            after <= bound,
            "the next waiter was granted {after:?} after the release, behind a dead \
             --ttl {ttl} waiter (its lease is 2 s; bound {bound:?})"
        );
        next.release().await.expect("held");
    }
    assert!(manager.settle().await);
}
