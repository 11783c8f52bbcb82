//! Cancel safety of every public async operation, on five real nodes behind
//! fault proxies that add a few milliseconds of latency each way.
//!
//! Each operation is dropped after k polls and after k milliseconds, for a
//! sweep of k that covers every await (for quorum fencing also the gap
//! between its two rounds). After each drop:
//! (a)+(c) `settle()` returns within its bound, and then no key of the
//!         dropped attempt is left on any node (read directly, not through
//!         the proxies);
//! (b)     a `Lock` never claims more validity than a majority of nodes
//!         will keep its key (`remaining()` against the nodes' PTTLs);
//! (d)     another client acquires the resource at once.
//! The TTLs are long (10 s and more), so "gone" always means "rolled back
//! or released", never "expired".

mod common;

use std::future::{Future, IntoFuture};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use common::{
    SETTLE_LIMIT, assert_not_overvalued, builder, direct_urls, lock_entries, nothing_left,
    resource, trust_unpersisted,
};
use quorumlock::kind::Kind;
use quorumlock::testkit::{Delay, TestCluster};
use quorumlock::{Error, Fence, FencedRedis, Fencing, FencingToken, Lock, LockManager};
use tokio::time::Instant;

/// Generous for a loaded machine: the subject here is cleanup, not speed.
const NODE_TIMEOUT: Duration = Duration::from_millis(250);
const TTL: Duration = Duration::from_secs(10);

/// Where an operation is cut off.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Dropped when still pending after this many polls (0 = after the first).
    Polls(usize),
    /// Dropped when still pending after this long.
    Millis(u64),
}

fn cuts() -> Vec<Cut> {
    let polls = (0..=10).map(Cut::Polls);
    let millis = [1, 3, 6, 10, 15, 25, 40].into_iter().map(Cut::Millis);
    polls.chain(millis).collect()
}

/// Releases the lock an acquisition that finished took.
async fn release<K: Kind>(outcome: Option<quorumlock::Result<Lock<K>>>) -> quorumlock::Result<()> {
    match outcome {
        None => Ok(()),
        Some(Ok(lock)) => {
            lock.release().await.expect("release a finished lock");
            Ok(())
        }
        Some(Err(error)) => Err(error),
    }
}

/// Runs `operation` until it finishes or `cut` says stop; `None` when it
/// was dropped unfinished.
async fn run_until<F: IntoFuture>(operation: F, cut: Cut) -> Option<F::Output> {
    let operation = operation.into_future();
    match cut {
        Cut::Millis(ms) => tokio::time::timeout(Duration::from_millis(ms), operation)
            .await
            .ok(),
        Cut::Polls(polls) => {
            let mut operation = pin!(operation);
            let mut pending = 0;
            std::future::poll_fn(|cx| match operation.as_mut().poll(cx) {
                Poll::Ready(output) => Poll::Ready(Some(output)),
                Poll::Pending if pending >= polls => Poll::Ready(None),
                Poll::Pending => {
                    pending += 1;
                    Poll::Pending
                }
            })
            .await
        }
    }
}

/// Five nodes (no AOF: the disk is not the subject) behind proxies adding
/// 1–4 ms each way, so every request is in flight for a while.
fn slow_cluster() -> TestCluster {
    let cluster = TestCluster::start_proxied_with_args(5, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    let delay = Delay {
        fixed: Duration::from_millis(1),
        jitter: Duration::from_millis(3),
    };
    for i in 0..cluster.len() {
        cluster.proxy(i).expect("proxied").set_latency(delay);
    }
    cluster
}

fn manager(cluster: &TestCluster, fencing: Fencing) -> LockManager {
    trust_unpersisted(builder(cluster.urls()))
        .ttl(TTL)
        // timing: each cut lands inside a round through the delayed proxies; 250 ms bounds it past their delay
        .node_timeout(NODE_TIMEOUT)
        .fencing(fencing)
        .build()
        .expect("valid settings")
}

/// (a)–(d) after an operation on `name` was cut (or finished): settle is
/// bounded, nothing is left, and another client gets in at once.
async fn assert_cleaned_up(
    manager: &LockManager,
    other: &LockManager,
    direct: &[String],
    name: &str,
    context: &str,
) {
    let started = Instant::now();
    tokio::time::timeout(SETTLE_LIMIT, manager.settle())
        .await
        .unwrap_or_else(|_| panic!("{context}: settle() still waiting after {SETTLE_LIMIT:?}"));
    let settled_in = started.elapsed();
    assert!(
        nothing_left(direct, name),
        "{context}: settle() returned after {settled_in:?} but keys are left: {:?}",
        lock_entries(direct, name)
    );
    match other.lock(name).no_wait().await {
        Ok(lock) => lock.release().await.expect("release the probe lock"),
        Err(error) => panic!("{context}: the next client was not let in at once: {error}"),
    }
    other.settle().await;
}

/// What is left of a finished operation: a lock is checked against its
/// keys and released; an error on this healthy cluster is a failure.
async fn finish(outcome: Option<quorumlock::Result<Lock>>, direct: &[String], context: &str) {
    match outcome {
        None => {}
        Some(Ok(lock)) => {
            assert_not_overvalued(&lock, direct, context);
            lock.release().await.expect("release a finished lock");
        }
        Some(Err(error)) => panic!("{context}: failed on a healthy cluster: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquisitions_leave_nothing_behind() {
    let cluster = slow_cluster();
    let direct = direct_urls(&cluster);
    for fencing in [Fencing::CounterNode { node: 0 }, Fencing::Quorum] {
        let manager = manager(&cluster, fencing);
        let other = self::manager(&cluster, fencing);
        for cut in cuts() {
            for op in ["lock", "lock no_wait", "lock ttl", "lock ttl no_wait"] {
                let name = resource("cancel-acquire");
                let context = format!("{op} with {fencing:?} cut at {cut:?}");
                let outcome = match op {
                    "lock" => run_until(manager.lock(&name), cut).await,
                    "lock no_wait" => run_until(manager.lock(&name).no_wait(), cut).await,
                    "lock ttl" => run_until(manager.lock(&name).ttl(2 * TTL), cut).await,
                    _ => run_until(manager.lock(&name).ttl(2 * TTL).no_wait(), cut).await,
                };
                finish(outcome, &direct, &context).await;
                assert_cleaned_up(&manager, &other, &direct, &name, &context).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_multi_resource_and_read_acquisitions_leave_nothing_behind() {
    let cluster = slow_cluster();
    let direct = direct_urls(&cluster);
    for fencing in [Fencing::CounterNode { node: 0 }, Fencing::Quorum] {
        let manager = manager(&cluster, fencing);
        let other = self::manager(&cluster, fencing);
        for cut in cuts() {
            for op in ["lock_many", "lock_many no_wait", "read", "read no_wait"] {
                let names = [resource("cancel-many-a"), resource("cancel-many-b")];
                let context = format!("{op} with {fencing:?} cut at {cut:?}");
                let released = match op {
                    "lock_many" => release(run_until(manager.lock_many(&names), cut).await).await,
                    "lock_many no_wait" => {
                        release(run_until(manager.lock_many(&names).no_wait(), cut).await).await
                    }
                    "read" => release(run_until(manager.read(&names[0]), cut).await).await,
                    _ => release(run_until(manager.read(&names[0]).no_wait(), cut).await).await,
                };
                if let Err(error) = released {
                    panic!("{context}: failed on a healthy cluster: {error}");
                }
                for name in &names {
                    assert_cleaned_up(&manager, &other, &direct, name, &context).await;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_with_lock_leaves_nothing_behind() {
    let cluster = slow_cluster();
    let direct = direct_urls(&cluster);
    let manager = manager(&cluster, Fencing::Quorum);
    let other = self::manager(&cluster, Fencing::Quorum);
    for cut in cuts().into_iter().chain([Cut::Millis(60), Cut::Millis(90)]) {
        let name = resource("cancel-with-lock");
        let context = format!("with_lock cut at {cut:?}");
        let work = manager.lock(&name).run(|lease| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            lease.token()
        });
        if let Some(result) = run_until(work, cut).await {
            result.unwrap_or_else(|e| panic!("{context}: failed on a healthy cluster: {e}"));
        }
        assert_cleaned_up(&manager, &other, &direct, &name, &context).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_extend_never_leaves_the_lock_looking_longer_than_its_keys() {
    let cluster = slow_cluster();
    let direct = direct_urls(&cluster);
    let manager = manager(&cluster, Fencing::CounterNode { node: 0 });
    let other = self::manager(&cluster, Fencing::CounterNode { node: 0 });
    for cut in cuts() {
        let name = resource("cancel-extend");
        let context = format!("extend to 500 ms cut at {cut:?}");
        let mut lock = manager
            .lock(&name)
            .ttl(Duration::from_secs(30))
            .await
            .expect("free");
        let outcome = run_until(lock.extend(Duration::from_millis(500)), cut).await;
        if let Some(result) = outcome {
            result.unwrap_or_else(|e| panic!("{context}: failed on a healthy cluster: {e}"));
        }
        // Requests still in the proxies land over the next few ms: watch
        // the lock and its keys meanwhile.
        for _ in 0..6 {
            assert_not_overvalued(&lock, &direct, &context);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(lock);
        assert_cleaned_up(&manager, &other, &direct, &name, &context).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_release_still_releases() {
    let cluster = slow_cluster();
    let direct = direct_urls(&cluster);
    let manager = manager(&cluster, Fencing::CounterNode { node: 0 });
    let other = self::manager(&cluster, Fencing::CounterNode { node: 0 });
    for cut in cuts() {
        let name = resource("cancel-release");
        let context = format!("release cut at {cut:?}");
        let lock = manager.lock(&name).await.expect("free");
        if let Some(result) = run_until(lock.release(), cut).await {
            result.unwrap_or_else(|e| panic!("{context}: failed on a healthy cluster: {e}"));
        }
        assert_cleaned_up(&manager, &other, &direct, &name, &context).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_keep_alive_stop_and_release_leave_nothing_behind() {
    let cluster = slow_cluster();
    let direct = direct_urls(&cluster);
    // 1.5 s TTL, extended every 500 ms: each cut lands while an extension
    // is in flight or about to start.
    let manager = trust_unpersisted(builder(cluster.urls()))
        .ttl(Duration::from_millis(1_500))
        // timing: a 1.5 s TTL extended every 500 ms needs rounds well inside it
        .node_timeout(NODE_TIMEOUT)
        .build()
        .expect("valid settings");
    let other = self::manager(&cluster, Fencing::CounterNode { node: 0 });
    // The three ways to let go run side by side, one resource each.
    for cut in cuts() {
        let cases = ["stop", "release", "drop"].map(|op| {
            let (manager, other, direct) = (&manager, &other, &direct);
            async move {
                let name = resource("cancel-keep-alive");
                let context = format!("KeepAlive::{op} cut at {cut:?}");
                let keep = manager
                    .lock(&name)
                    .await
                    .expect("free")
                    .keep_alive()
                    .expect("runtime");
                tokio::time::sleep(Duration::from_millis(495)).await;
                match op {
                    "stop" => {
                        if let Some(result) = run_until(keep.stop(), cut).await {
                            let lock = result.unwrap_or_else(|e| panic!("{context}: {e}"));
                            assert_not_overvalued(&lock, direct, &context);
                            drop(lock);
                        }
                    }
                    "release" => {
                        if let Some(result) = run_until(keep.release(), cut).await {
                            result.unwrap_or_else(|e| panic!("{context}: {e}"));
                        }
                    }
                    _ => drop(keep),
                }
                assert_cleaned_up(manager, other, direct, &name, &context).await;
            }
        });
        futures::future::join_all(cases).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_waits_for_the_release_of_a_dropped_keep_alive() {
    let cluster = slow_cluster();
    let direct = direct_urls(&cluster);
    let manager = manager(&cluster, Fencing::CounterNode { node: 0 });
    for round in 0..5 {
        let name = resource("settle-keep-alive");
        let keep = manager
            .lock(&name)
            .await
            .expect("free")
            .keep_alive()
            .expect("runtime");
        drop(keep);
        tokio::time::timeout(SETTLE_LIMIT, manager.settle())
            .await
            .expect("settle is bounded");
        assert!(
            nothing_left(&direct, &name),
            "round {round}: settle() returned while the dropped keep-alive's keys were still \
             set: {:?}",
            lock_entries(&direct, &name)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_settle_changes_nothing() {
    let cluster = slow_cluster();
    let direct = direct_urls(&cluster);
    let manager = manager(&cluster, Fencing::CounterNode { node: 0 });
    let other = self::manager(&cluster, Fencing::CounterNode { node: 0 });
    for cut in cuts() {
        let name = resource("cancel-settle");
        let context = format!("settle cut at {cut:?}");
        drop(manager.lock(&name).await.expect("free"));
        let _ = run_until(manager.settle(), cut).await;
        assert_cleaned_up(&manager, &other, &direct, &name, &context).await;
    }
}

/// A fenced read dropped at any point leaves the resource claimed for its
/// token or not claimed, and nothing else changed: the data stands, and
/// the read's holder (and only newer ones) can go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_fenced_reads_claim_whole_or_not_at_all() {
    let storage_node = TestCluster::start_proxied_with_args(1, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a storage node: {e}"));
    let delay = Delay {
        fixed: Duration::from_millis(1),
        jitter: Duration::from_millis(3),
    };
    storage_node.proxy(0).expect("proxied").set_latency(delay);
    let storage = FencedRedis::new(&storage_node.url(0).expect("url")).expect("url parses");
    let name = resource("cancel-fenced-read");
    let (key, log) = (format!("{name}:value"), format!("{name}:log"));
    let first = Fence::new(name.clone(), FencingToken::new(1)).expect("a name");
    storage.set(&first, &key, "data").await.expect("set");
    storage.push(&first, &log, "entry").await.expect("push");
    let mut highest_before = Some(FencingToken::new(1));
    for (i, cut) in cuts().into_iter().enumerate() {
        let token = FencingToken::new(10 * (i as u64 + 1));
        let fence = Fence::new(name.clone(), token).expect("a name");
        let context = format!("fenced read of token {token} cut at {cut:?}");
        let read = if i % 2 == 0 {
            run_until(storage.read(&fence, &key), cut).await.map(drop)
        } else {
            run_until(storage.read_list(&fence, &log), cut)
                .await
                .map(drop)
        };
        // The script runs whole or not at all; wait for one in flight.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let highest = storage.highest_token(&name).await.expect("highest");
        assert!(
            highest == Some(token) || (read.is_none() && highest == highest_before),
            "{context}: highest {highest:?} (before: {highest_before:?}, finished: {})",
            read.is_some()
        );
        assert_eq!(
            storage.get(&key).await.expect("get").as_deref(),
            Some("data"),
            "{context}"
        );
        assert_eq!(
            storage.list(&log).await.expect("list"),
            ["entry"],
            "{context}"
        );
        // Nothing hangs afterwards: the holder reads again and claims;
        // an older token is refused.
        assert_eq!(
            storage
                .read(&fence, &key)
                .await
                .expect("read again")
                .as_deref(),
            Some("data"),
            "{context}"
        );
        let older = Fence::new(name.clone(), FencingToken::new(token.get() - 1)).expect("a name");
        assert!(
            matches!(
                storage.read(&older, &key).await,
                Err(Error::FencedOut { .. })
            ),
            "{context}: a lower token passed"
        );
        highest_before = Some(token);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_fenced_writes_are_all_or_nothing() {
    let storage_node = TestCluster::start_proxied_with_args(1, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a storage node: {e}"));
    let delay = Delay {
        fixed: Duration::from_millis(1),
        jitter: Duration::from_millis(3),
    };
    storage_node.proxy(0).expect("proxied").set_latency(delay);
    let storage = FencedRedis::new(&storage_node.url(0).expect("url")).expect("url parses");
    let name = resource("cancel-fenced");
    let (key, log) = (format!("{name}:value"), format!("{name}:log"));
    let mut last = (None::<String>, None::<FencingToken>, 0usize);
    for (i, cut) in cuts().into_iter().enumerate() {
        let token = FencingToken::new(10 * (i as u64 + 1));
        let fence = Fence::new(name.clone(), token).expect("a name");
        let value = format!("v{token}");
        let context = format!("fenced write of token {token} cut at {cut:?}");
        let set = run_until(storage.set(&fence, &key, &value), cut).await;
        let push = run_until(storage.push(&fence, &log, &value), cut).await;
        for result in [set, push].into_iter().flatten() {
            result.unwrap_or_else(|e| panic!("{context}: failed: {e}"));
        }
        // The script runs whole or not at all; wait for writes in flight.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stored = storage.get(&key).await.expect("get");
        let highest = storage.highest_token(&name).await.expect("highest");
        let entries = storage.list(&log).await.expect("list").len();
        let (old_value, old_highest, old_entries) = &last;
        assert!(
            (stored.as_deref() == Some(value.as_str()) || stored == *old_value)
                && (highest == Some(token) || highest == *old_highest)
                && (entries == old_entries + 1 || entries == *old_entries),
            "{context}: value {stored:?}, highest {highest:?}, {entries} log entries; before: \
             {last:?}"
        );
        // Nothing hangs afterwards, and the token rule still holds.
        storage
            .set(&fence, &key, &value)
            .await
            .unwrap_or_else(|e| panic!("{context}: rewrite: {e}"));
        let older = Fence::new(name.clone(), FencingToken::new(token.get() - 1)).expect("a name");
        let stale = storage.set(&older, &key, "stale");
        assert!(
            matches!(stale.await, Err(Error::FencedOut { .. })),
            "{context}: a lower token passed"
        );
        last = (
            Some(value),
            Some(token),
            storage.list(&log).await.expect("list").len(),
        );
    }
}
