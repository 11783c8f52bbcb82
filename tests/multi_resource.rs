//! Locks on several resources at once, on real clusters: all or nothing
//! under contention, crossing orders, exclusion with single locks, a node
//! down, fencing in both modes, and cancellation.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{SETTLE_LIMIT, builder, cluster, lock_entries, nothing_left, resource};
use quorumlock::{Error, Fence, FencedRedis, Fencing, FencingToken, LockManager};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

/// Records every hold of every resource and complains when one is held
/// twice. A client enters after its lock was granted and leaves before it
/// releases, so two holds in here at once are two valid locks at once.
#[derive(Default)]
struct Holds {
    holders: Mutex<HashMap<String, usize>>,
    violations: Mutex<Vec<String>>,
    /// Tokens per resource, in the order the holds began.
    tokens: Mutex<HashMap<String, Vec<u64>>>,
}

impl Holds {
    fn enter(&self, who: usize, resources: &[String], token: Option<FencingToken>) {
        let mut holders = self.holders.lock().unwrap();
        for r in resources {
            let count = holders.entry(r.clone()).or_default();
            *count += 1;
            if *count > 1 {
                self.violations.lock().unwrap().push(format!(
                    "client {who} entered {r} while {} held it",
                    *count - 1
                ));
            }
            if let Some(token) = token {
                let mut tokens = self.tokens.lock().unwrap();
                tokens.entry(r.clone()).or_default().push(token.get());
            }
        }
    }

    fn leave(&self, resources: &[String]) {
        let mut holders = self.holders.lock().unwrap();
        for r in resources {
            *holders.get_mut(r).expect("entered") -= 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_sets_are_all_or_nothing_and_everyone_progresses() {
    let cluster = cluster(5);
    let names: Vec<String> = (0..6).map(|i| resource(&format!("many-{i}"))).collect();
    let holds = Arc::new(Holds::default());
    let stop = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for client in 0..8 {
        // Sets of 2–4 of the 6 resources, overlapping, in scrambled orders.
        let size = 2 + client % 3;
        let set: Vec<String> = (0..size)
            .map(|k| names[(client * 5 + k * 7) % names.len()].clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .rev()
            .collect();
        let manager = builder(cluster.urls()).ttl(TTL).build().expect("valid");
        let holds = Arc::clone(&holds);
        tasks.push(tokio::spawn(async move {
            let mut acquired = 0;
            while Instant::now() < stop {
                // Half the clients wait in the queues, half retry.
                let lock = if client % 2 == 0 {
                    manager.lock_many(&set).wait(Duration::from_secs(20)).await
                } else {
                    manager.lock_many(&set).await
                };
                let lock = lock.unwrap_or_else(|e| panic!("client {client} on {set:?}: {e}"));
                holds.enter(client, &set, lock.token());
                tokio::time::sleep(Duration::from_millis(1)).await;
                holds.leave(&set);
                assert!(lock.is_valid(), "client {client}: held past its validity");
                lock.release().await.expect("held");
                acquired += 1;
            }
            // What the attempts left to the background (rollbacks of lost
            // attempts, dequeues) is done before the keys are looked at.
            let settled = tokio::time::timeout(common::scaled(SETTLE_LIMIT), manager.settle())
                .await
                .is_ok();
            (client, set, acquired, settled)
        }));
    }
    let mut progress = Vec::new();
    for task in tasks {
        progress.push(task.await.expect("no panic"));
    }
    assert!(
        progress.iter().all(|&(.., settled)| settled),
        "a client's background cleanup did not settle within {:?}: {progress:?}",
        common::scaled(SETTLE_LIMIT)
    );
    let violations = holds.violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "resources held twice: {violations:?}"
    );
    assert!(
        progress.iter().all(|&(_, _, acquired, _)| acquired > 0),
        "a client never got its resources: {progress:?}"
    );
    for (r, tokens) in holds.tokens.lock().unwrap().iter() {
        assert!(
            tokens.windows(2).all(|pair| pair[0] < pair[1]),
            "tokens of {r} did not strictly increase in order of holding: {tokens:?}"
        );
    }
    for r in &names {
        assert!(
            nothing_left(&cluster.urls(), r),
            "{r} left behind once every client settled: {:?}",
            lock_entries(&cluster.urls(), r)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crossing_orders_cannot_deadlock() {
    let cluster = cluster(5);
    let (a, b) = (resource("cross-a"), resource("cross-b"));
    let rounds = 40;
    let mut tasks = Vec::new();
    for (client, order) in [[a.clone(), b.clone()], [b.clone(), a.clone()]]
        .into_iter()
        .enumerate()
    {
        let manager = builder(cluster.urls()).ttl(TTL).build().expect("valid");
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                let lock = manager
                    .lock_many(&order)
                    .wait(Duration::from_secs(20))
                    .await
                    .unwrap_or_else(|e| panic!("client {client}, round {round}: {e}"));
                lock.release().await.expect("held");
            }
        }));
    }
    let both = futures::future::join_all(tasks);
    let finished = tokio::time::timeout(Duration::from_secs(60), both).await;
    let outcomes = finished.expect("two clients in crossing orders did not finish 40 rounds each");
    for outcome in outcomes {
        outcome.expect("no panic");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_and_single_locks_on_a_name_exclude_each_other() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let manager = builder(urls.clone()).ttl(TTL).build().expect("valid");
    let (a, b, c) = (resource("x-a"), resource("x-b"), resource("x-c"));

    let many = manager.lock_many(&[&a, &b]).await.expect("free");
    assert_eq!(
        many.resources().collect::<Vec<_>>(),
        [a.as_str(), b.as_str()]
    );
    for (what, attempt) in [
        ("lock a", manager.lock(&a).no_wait().await.map(drop)),
        ("read b", manager.read(&b).no_wait().await.map(drop)),
        (
            "many b, c",
            manager.lock_many(&[&b, &c]).no_wait().await.map(drop),
        ),
    ] {
        match attempt {
            Err(Error::Contended { .. }) => {}
            other => panic!("{what} while [a, b] is held: {other:?}"),
        }
    }
    // All or nothing on each node: the refused [b, c] left no key on c.
    assert!(nothing_left(&urls, &c), "c: {:?}", lock_entries(&urls, &c));
    many.release().await.expect("held");

    // And the other way round: a single lock keeps a multi lock out.
    let single = manager.lock(&b).await.expect("free again");
    match manager.lock_many(&[&a, &b]).no_wait().await {
        Err(Error::Contended { .. }) => {}
        other => panic!("[a, b] while b is held: {other:?}"),
    }
    assert!(nothing_left(&urls, &a), "a: {:?}", lock_entries(&urls, &a));
    single.release().await.expect("held");
    let again = manager
        .lock_many(&[&b, &a])
        .no_wait()
        .await
        .expect("both free");
    again.release().await.expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lists_are_typed_errors() {
    let cluster = cluster(3);
    let manager = builder(cluster.urls()).build().expect("valid");
    let empty: [&str; 0] = [];
    for (list, expected) in [
        (&["a", "b", "a"][..], "named twice"),
        (&empty[..], "empty"),
        (&["a", ""][..], "empty"),
    ] {
        match manager.lock_many(list).no_wait().await {
            Err(Error::InvalidArgument { reason, .. }) => assert!(
                reason.contains(expected),
                "{list:?}: the reason should say {expected:?}: {reason}"
            ),
            other => panic!("{list:?}: {other:?}"),
        }
    }
    let too_many: Vec<String> = (0..=quorumlock::MAX_RESOURCES)
        .map(|i| i.to_string())
        .collect();
    assert!(matches!(
        manager.lock_many(&too_many).no_wait().await,
        Err(Error::InvalidArgument { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_down_still_lock_extend_and_release() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    for fencing in [Fencing::CounterNode { node: 0 }, Fencing::Quorum] {
        let manager = common::fenced(urls.clone(), TTL, fencing);
        let names = [resource("down-a"), resource("down-b"), resource("down-c")];
        cluster.kill(3).expect("kill");
        cluster.kill(4).expect("kill");
        let mut lock = manager
            .lock_many(&names)
            .await
            .unwrap_or_else(|e| panic!("{fencing:?}, two of five down: {e}"));
        lock.extend(TTL * 2).await.expect("extend with a quorum up");
        assert!(lock.remaining() > TTL, "the extension was not applied");
        lock.release().await.expect("release with a quorum up");
        cluster.restart(3).expect("restart");
        cluster.restart(4).expect("restart");
        for name in &names {
            assert!(
                nothing_left(&urls, name),
                "{name}: {:?}",
                lock_entries(&urls, name)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_above_every_earlier_token_of_each_resource_in_both_modes() {
    let cluster = cluster(5);
    for fencing in [Fencing::CounterNode { node: 0 }, Fencing::Quorum] {
        let manager = common::fenced(cluster.urls(), TTL, fencing);
        let (a, b) = (resource("fence-a"), resource("fence-b"));
        // Push a's counter ahead of b's.
        let mut last_a = 0;
        for _ in 0..5 {
            let lock = manager.lock(&a).await.expect("free");
            last_a = lock.token().expect("fencing on").get();
            lock.release().await.expect("held");
        }
        let lock_b = manager.lock(&b).await.expect("free");
        let last_b = lock_b.token().expect("fencing on").get();
        lock_b.release().await.expect("held");

        let both = manager.lock_many(&[&b, &a]).await.expect("free");
        let token = both.token().expect("fencing on");
        assert!(
            token.get() > last_a && token.get() > last_b,
            "{fencing:?}: [a, b] got {token} after a's {last_a} and b's {last_b}"
        );
        // Storage checks it per resource, and a stale single holder of
        // either resource is fenced out afterwards.
        let storage = FencedRedis::new(&cluster.urls()[0]).expect("storage URL");
        let fence_a = both.fence_for(&a).expect("one of the lock's resources");
        assert_eq!((fence_a.resource(), fence_a.token()), (a.as_str(), token));
        storage
            .set(&fence_a, "balance:a", "90")
            .await
            .expect("fresh token");
        storage
            .set(
                &both.fence_for(&b).expect("one of its resources"),
                "balance:b",
                "110",
            )
            .await
            .expect("fresh token");
        let stale = Fence::new(b.clone(), FencingToken::new(last_b)).expect("a name");
        match storage.set(&stale, "balance:b", "0").await {
            Err(Error::FencedOut { .. }) => {}
            other => panic!("{fencing:?}: b's earlier holder was not fenced out: {other:?}"),
        }
        both.release().await.expect("held");
        let next_b = manager.lock(&b).await.expect("free");
        assert!(
            next_b.token().expect("fencing on") > token,
            "{fencing:?}: b's next holder must come after [a, b]'s {token}"
        );
        next_b.release().await.expect("held");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_many_keeps_every_resource_alive() {
    let cluster = cluster(3);
    let manager = builder(cluster.urls())
        .ttl(Duration::from_secs(2))
        .build()
        .expect("valid");
    let (a, b) = (resource("keep-a"), resource("keep-b"));
    let other = builder(cluster.urls()).build().expect("valid");
    let other = &other;
    let b_name = b.clone();
    let seen = manager
        .lock_many(&[&a, &b])
        .run(|lease| async move {
            // Two and a half TTLs: only extensions keep it.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let refused = matches!(
                other.lock(&b_name).no_wait().await,
                Err(Error::Contended { .. })
            );
            (lease.resources().collect::<Vec<_>>().join(", "), refused)
        })
        .await
        .expect("kept alive");
    assert!(seen.1, "b was free while [a, b] was kept alive");
    assert!(seen.0.contains(&a) && seen.0.contains(&b), "{}", seen.0);
    assert!(manager.settle().await);
    assert!(nothing_left(&cluster.urls(), &a) && nothing_left(&cluster.urls(), &b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_multi_waiter_leaves_nothing_behind() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let holder = builder(urls.clone()).ttl(TTL).build().expect("valid");
    let waiter = builder(urls.clone()).ttl(TTL).build().expect("valid");
    let (a, b) = (resource("drop-a"), resource("drop-b"));
    let held = holder.lock(&b).await.expect("free");
    for cut_ms in [0, 1, 2, 5, 10, 30, 100] {
        let outcome = tokio::time::timeout(
            Duration::from_millis(cut_ms),
            waiter.lock_many(&[&a, &b]).wait(TTL),
        )
        .await;
        assert!(outcome.is_err(), "b is held: the wait cannot finish");
        let settled = tokio::time::timeout(SETTLE_LIMIT, waiter.settle()).await;
        assert_eq!(settled, Ok(true), "settle after a cut at {cut_ms} ms");
        for url in &urls {
            for r in [&a, &b] {
                assert_eq!(
                    common::queued_on(url, r),
                    0,
                    "a wait cut at {cut_ms} ms left an entry for {r} on {url}"
                );
            }
        }
        assert!(
            nothing_left(&urls, &a),
            "cut at {cut_ms} ms: a: {:?}",
            lock_entries(&urls, &a)
        );
    }
    held.release().await.expect("held");
    let both = waiter
        .lock_many(&[&a, &b])
        .no_wait()
        .await
        .expect("nothing left behind");
    both.release().await.expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_for_two_is_woken_when_the_last_one_is_released() {
    let cluster = cluster(3);
    let manager = |_| -> LockManager { builder(cluster.urls()).ttl(TTL).build().expect("valid") };
    let (holder, waiter) = (manager(0), manager(1));
    let (a, b) = (resource("wake-a"), resource("wake-b"));
    let lock_a = holder.lock(&a).await.expect("free");
    let lock_b = holder.lock(&b).await.expect("free");
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let lock = waiter.lock_many(&[&a, &b]).wait(TTL).await;
        (lock.map(|lock| lock.resources().count()), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock_a.release().await.expect("held");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "granted while b was still held");
    let released = Instant::now();
    lock_b.release().await.expect("held");
    let (granted, waited) = waiting.await.expect("no panic");
    assert_eq!(granted.expect("granted once both were free"), 2);
    // Woken by the release, not by the 10 s expiry.
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the waiter took {:?} after the last release (waited {waited:?} in all)",
        released.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_never_overwritten() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let manager = builder(urls.clone()).ttl(TTL).build().expect("valid");
    let (a, b) = (resource("foreign-a"), resource("foreign-b"));
    // Someone else's data where a's lock key would go.
    for url in &urls {
        let _: () = redis::cmd("HSET")
            .arg(quorumlock::internals::lock_key(&a))
            .arg("field")
            .arg("value")
            .query(&mut common::connect(url))
            .expect("HSET");
    }
    for (what, attempt) in [
        (
            "lock_many",
            manager.lock_many(&[&a, &b]).no_wait().await.map(drop),
        ),
        ("read", manager.read(&a).no_wait().await.map(drop)),
        ("lock", manager.lock(&a).no_wait().await.map(drop)),
    ] {
        match attempt {
            Err(Error::Contended { .. }) => {}
            other => panic!("{what} over a hash: {other:?}"),
        }
    }
    assert!(manager.settle().await);
    for url in &urls {
        let field: Option<String> = redis::cmd("HGET")
            .arg(quorumlock::internals::lock_key(&a))
            .arg("field")
            .query(&mut common::connect(url))
            .expect("HGET");
        assert_eq!(
            field.as_deref(),
            Some("value"),
            "the hash on {url} was touched"
        );
    }
    assert!(nothing_left(&urls, &b), "b: {:?}", lock_entries(&urls, &b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_counter_is_named_and_nothing_is_locked() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    for fencing in [Fencing::CounterNode { node: 0 }, Fencing::Quorum] {
        let manager = common::fenced(urls.clone(), TTL, fencing);
        let (a, b) = (resource("counter-a"), resource("counter-b"));
        for url in &urls {
            let _: () = redis::cmd("SET")
                .arg(quorumlock::internals::fence_key(&b))
                .arg("garbage")
                .query(&mut common::connect(url))
                .expect("SET");
        }
        match manager.lock_many(&[&a, &b]).no_wait().await {
            Err(Error::InvalidCounter { key, problem, .. }) => {
                assert_eq!(
                    key,
                    quorumlock::internals::fence_key(&b),
                    "{fencing:?}: {problem}"
                );
                assert!(problem.contains("garbage"), "{fencing:?}: {problem}");
            }
            other => panic!("{fencing:?}: {other:?}"),
        }
        assert!(manager.settle().await);
        for name in [&a, &b] {
            assert!(
                nothing_left(&urls, name),
                "{name}: {:?}",
                lock_entries(&urls, name)
            );
        }
    }
}

/// The review's nested hold: H holds `a`, M waits for [a, b], then H waits
/// for `b` (a consistent a-before-b order). `b` is free, and M cannot use
/// it before H releases `a`: M must not hold H (or readers of `b`) back
/// there. Before the fix M was queued on both, H timed out after its full
/// wait, and every reader of `b` was refused while `a` stayed held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_waiting_for_a_free_resource_is_not_held_back_by_a_waiter_for_both() {
    let cluster = cluster(5);
    let manager = || -> LockManager { builder(cluster.urls()).ttl(TTL).build().expect("valid") };
    let (holder, multi, reader) = (manager(), manager(), manager());
    let (a, b) = (resource("nested-a"), resource("nested-b"));
    let lock_a = holder.lock(&a).await.expect("free");
    let waiting = tokio::spawn({
        let (a, b) = (a.clone(), b.clone());
        async move { multi.lock_many(&[&a, &b]).wait(TTL).await }
    });
    // M is queued (on `a`) by now, on the nodes its first attempt reached
    // before the round was decided.
    let queued = common::eventually(Duration::from_secs(5), || {
        cluster
            .urls()
            .iter()
            .filter(|url| common::queued_on(url, &a) == 1)
            .count()
            >= 3
    })
    .await;
    assert!(
        queued,
        "the waiter for [a, b] never queued on a: {:?} (finished: {})",
        cluster
            .urls()
            .iter()
            .map(|url| common::queued_on(url, &a))
            .collect::<Vec<_>>(),
        waiting.is_finished()
    );
    let read = reader
        .read(&b)
        .no_wait()
        .await
        .expect("no one holds b, and no writer waiting for it could use it");
    read.release().await.expect("held");

    let asked = Instant::now();
    let lock_b = holder
        .lock(&b)
        .wait(Duration::from_secs(3))
        .await
        .unwrap_or_else(|e| panic!("the holder of a, waiting for the free b: {e}"));
    let took = asked.elapsed();
    eprintln!("the holder of a took b after {took:?} beside a waiter for [a, b]");
    assert!(
        took < Duration::from_secs(1),
        "a free b took {took:?} for the holder of a"
    );
    assert!(!waiting.is_finished(), "M was granted while H held a and b");
    for url in cluster.urls() {
        assert_eq!(common::queued_on(&url, &b), 0, "M queued on b at {url}");
    }
    lock_a.release().await.expect("held");
    lock_b.release().await.expect("held");
    let both = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("M is woken by the releases")
        .expect("no panic")
        .expect("M gets both");
    assert_eq!(both.resources().count(), 2);
    both.release().await.expect("held");
}

/// A waiter for [a, b] under a stream of waiting lockers of `b` (four
/// clients, each holding 50 ms and asking again at once): it keeps its
/// place on `b` (by its ticket) while it reserves the free `a`, so it is
/// served after the holds queued before it, not starved.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_for_two_is_not_starved_by_a_stream_on_one() {
    let cluster = cluster(5);
    let (a, b) = (resource("stream-a"), resource("stream-b"));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut stream = Vec::new();
    for _ in 0..4 {
        let manager = builder(cluster.urls()).ttl(TTL).build().expect("valid");
        let (b, stop) = (b.clone(), Arc::clone(&stop));
        stream.push(tokio::spawn(async move {
            let mut holds = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(lock) = manager.lock(&b).wait(TTL).await {
                    holds += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let _ = lock.release().await;
                }
            }
            holds
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let multi = builder(cluster.urls()).ttl(TTL).build().expect("valid");
    let asked = Instant::now();
    let both = multi
        .lock_many(&[&a, &b])
        .wait(Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("the waiter for [a, b] under the stream: {e}"));
    let took = asked.elapsed();
    both.release().await.expect("held");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut holds = 0;
    for client in stream {
        holds += client.await.expect("no panic");
    }
    assert!(holds > 10, "the stream held b only {holds} times");
    // Served after at most the four holds queued before it (50 ms each),
    // plus round trips: 5 s is a wide margin for a loaded machine.
    assert!(
        took < Duration::from_secs(5),
        "the waiter for [a, b] got in after {took:?} ({holds} holds of b by the stream)"
    );
    eprintln!("waiter for [a, b] under a stream on b: in after {took:?}; {holds} holds of b");
}
