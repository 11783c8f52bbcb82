//! Read-write locks on real clusters: readers share and exclude writers,
//! a checker records every hold under contention, a writer is not starved
//! by a stream of readers, readers expire independently, the quorum
//! intersection holds with nodes down, tokens, and cancellation.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{SETTLE_LIMIT, builder, cluster, lock_entries, nothing_left, resource};
use quorumlock::internals::Access;
use quorumlock::kind::Kind;
use quorumlock::{Error, Fencing, LockManager, Request};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

fn manager(urls: Vec<String>) -> LockManager {
    builder(urls).ttl(TTL).build().expect("valid settings")
}

/// Who is inside now. Clients enter after their lock was granted and leave
/// before releasing it, so what is inside at once held valid locks at once.
#[derive(Default)]
struct Inside {
    state: Mutex<(usize, usize)>, // (readers, writers)
    most_readers: AtomicUsize,
    violations: Mutex<Vec<String>>,
}

impl Inside {
    fn enter(&self, who: &str, access: Access) {
        let mut state = self.state.lock().unwrap();
        let (readers, writers) = *state;
        let clash = match access {
            Access::Shared => writers > 0,
            Access::Exclusive => writers > 0 || readers > 0,
        };
        if clash {
            self.violations.lock().unwrap().push(format!(
                "{who} ({access:?}) entered beside {readers} readers and {writers} writers"
            ));
        }
        match access {
            Access::Shared => state.0 += 1,
            Access::Exclusive => state.1 += 1,
        }
        self.most_readers.fetch_max(state.0, Ordering::SeqCst);
    }

    fn leave(&self, access: Access) {
        let mut state = self.state.lock().unwrap();
        match access {
            Access::Shared => state.0 -= 1,
            Access::Exclusive => state.1 -= 1,
        }
    }
}

/// Takes the lock `request` asks for, holds it 2 ms inside `inside`, and
/// releases it.
async fn hold<K: Kind>(
    request: Request<'_, K>,
    inside: &Inside,
    who: &str,
    access: Access,
) -> Result<(), Error> {
    let lock = request.await?;
    inside.enter(who, access);
    tokio::time::sleep(Duration::from_millis(2)).await;
    inside.leave(access);
    assert!(lock.is_valid(), "{who}: held past its validity");
    lock.release().await.expect("held");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_writers_exclude() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let manager = manager(urls.clone());
    let r = resource("rw-basics");

    let first = manager.read(&r).await.expect("free");
    let second = manager.read(&r).no_wait().await.expect("readers share");
    assert_ne!(first.value(), second.value());
    // One entry per reader, on a majority at least (a node whose request
    // was still on its way when the quorum answered may lack one).
    let mut expected = vec![first.value().to_owned(), second.value().to_owned()];
    expected.sort();
    let listed = common::readers_by_node(&urls, &r);
    assert!(
        listed
            .iter()
            .filter(|readers| **readers == expected)
            .count()
            >= 2,
        "readers listed per node: {listed:?}, expected {expected:?} on a majority"
    );
    for (what, attempt) in [
        ("lock", manager.lock(&r).no_wait().await.map(drop)),
        (
            "lock_many",
            manager
                .lock_many(&[r.as_str(), "other"])
                .no_wait()
                .await
                .map(drop),
        ),
    ] {
        match attempt {
            Err(Error::Contended { .. }) => {}
            other => panic!("{what} beside two readers: {other:?}"),
        }
    }
    first.release().await.expect("held");
    // One reader left: still no writer.
    assert!(matches!(
        manager.lock(&r).no_wait().await,
        Err(Error::Contended { .. })
    ));
    second.release().await.expect("held");
    assert!(nothing_left(&urls, &r), "{:?}", lock_entries(&urls, &r));

    let writer = manager
        .lock(&r)
        .no_wait()
        .await
        .expect("free after the readers");
    match manager.read(&r).no_wait().await {
        Err(Error::Contended { .. }) => {}
        other => panic!("a reader beside a writer: {other:?}"),
    }
    writer.release().await.expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_writer_overlaps_a_reader_or_another_writer() {
    let cluster = cluster(5);
    let r = Arc::new(resource("rw-checker"));
    let inside = Arc::new(Inside::default());
    let writes = Arc::new(AtomicUsize::new(0));
    let reads = Arc::new(AtomicUsize::new(0));
    let stop = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for client in 0..8 {
        let manager = manager(cluster.urls());
        let (r, inside, writes, reads) = (
            Arc::clone(&r),
            Arc::clone(&inside),
            Arc::clone(&writes),
            Arc::clone(&reads),
        );
        tasks.push(tokio::spawn(async move {
            let who = format!("client {client}");
            while Instant::now() < stop {
                // Two writers among six readers; half of each wait.
                let access = if client < 2 {
                    Access::Exclusive
                } else {
                    Access::Shared
                };
                let waits = client % 2 == 0;
                let wait = Duration::from_secs(20);
                let held = match (access, waits) {
                    (Access::Exclusive, true) => {
                        hold(manager.lock(&r).wait(wait), &inside, &who, access).await
                    }
                    (Access::Exclusive, false) => {
                        hold(manager.lock(&r).no_wait(), &inside, &who, access).await
                    }
                    (Access::Shared, true) => {
                        hold(manager.read(&r).wait(wait), &inside, &who, access).await
                    }
                    (Access::Shared, false) => {
                        hold(manager.read(&r).no_wait(), &inside, &who, access).await
                    }
                };
                match held {
                    Ok(()) => {}
                    // Not waiting, the one attempt may be refused.
                    Err(Error::Contended { .. }) if !waits => continue,
                    Err(e) => panic!("{who}: {e}"),
                }
                match access {
                    Access::Shared => reads.fetch_add(1, Ordering::SeqCst),
                    Access::Exclusive => writes.fetch_add(1, Ordering::SeqCst),
                };
            }
        }));
    }
    for task in tasks {
        task.await.expect("no panic");
    }
    let violations = inside.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "holds overlapped: {violations:?}");
    let (reads, writes) = (reads.load(Ordering::SeqCst), writes.load(Ordering::SeqCst));
    assert!(
        reads > 0 && writes > 0,
        "both sides must progress: {reads} reads, {writes} writes"
    );
    assert!(
        inside.most_readers.load(Ordering::SeqCst) > 1,
        "readers never shared the resource ({reads} reads)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_writer_is_not_starved_by_a_stream_of_readers() {
    let cluster = cluster(5);
    let r = Arc::new(resource("rw-starve"));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    // Six readers, each holding 30 ms and coming straight back: without a
    // rule, some reader always holds the resource.
    for _ in 0..6 {
        let manager = manager(cluster.urls());
        let (r, stop, reads) = (Arc::clone(&r), Arc::clone(&stop), Arc::clone(&reads));
        readers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let lock = manager
                    .read(&r)
                    .wait(Duration::from_secs(30))
                    .await
                    .expect("a reader waits its turn");
                tokio::time::sleep(Duration::from_millis(30)).await;
                lock.release().await.expect("held");
                reads.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reads_before = reads.load(Ordering::SeqCst);
    let writer = manager(cluster.urls());
    let started = Instant::now();
    let outcome = writer.lock(&r).wait(Duration::from_secs(20)).await;
    let waited = started.elapsed();
    let lock = outcome.unwrap_or_else(|e| {
        panic!("the writer starved for {waited:?} ({reads_before} reads before it came): {e}")
    });
    println!("writer waited {waited:?} behind a stream of 6 readers");
    // Readers resume after it.
    lock.release().await.expect("held");
    let reads_at_write = reads.load(Ordering::SeqCst);
    assert!(
        common::eventually(Duration::from_secs(10), || reads.load(Ordering::SeqCst)
            > reads_at_write)
        .await,
        "readers did not resume after the writer"
    );
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        reader.await.expect("no panic");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_expire_independently() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let manager = manager(urls.clone());
    let r = resource("rw-expiry");
    let mut short = manager
        .read(&r)
        .ttl(Duration::from_millis(600))
        .await
        .expect("free");
    let long = manager.read(&r).await.expect("readers share");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!short.is_valid());
    match short.extend(TTL).await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("an expired reader was extended: {other:?}"),
    }
    // The long reader still keeps writers out.
    assert!(matches!(
        manager.lock(&r).no_wait().await,
        Err(Error::Contended { .. })
    ));
    // The next reader's script drops the expired entry.
    let next = manager.read(&r).no_wait().await.expect("readers share");
    let mut expected = vec![long.value().to_owned(), next.value().to_owned()];
    expected.sort();
    // Wherever the new reader's request has landed, the expired entry is
    // gone (a majority at least has it by now).
    let listed = common::readers_by_node(&urls, &r);
    assert!(
        listed
            .iter()
            .filter(|readers| **readers == expected)
            .count()
            >= 2
            && listed
                .iter()
                .filter(|readers| readers.contains(&next.value().to_owned()))
                .all(|readers| !readers.contains(&short.value().to_owned())),
        "readers per node: {listed:?}; expected {expected:?}, without the expired one"
    );
    next.release().await.expect("held");
    long.release().await.expect("held");
    // A release returns once a quorum answered; the rest finish behind it.
    assert!(manager.settle().await);
    assert!(nothing_left(&urls, &r), "{:?}", lock_entries(&urls, &r));
    // Once the last reader expires, the key goes by itself.
    let _dropped_without_release = std::mem::ManuallyDrop::new(
        manager
            .read(&r)
            .ttl(Duration::from_millis(600))
            .await
            .expect("free"),
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(nothing_left(&urls, &r), "{:?}", lock_entries(&urls, &r));
    manager
        .lock(&r)
        .no_wait()
        .await
        .expect("free")
        .release()
        .await
        .expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_majority_and_a_writer_majority_share_a_node() {
    // The reader is granted by nodes 0-2 (3 and 4 are down); then 3 and 4
    // come back empty and node 0 goes down. A writer reaches 1-4: the two
    // empty nodes grant, 1 and 2 still hold the reader and refuse, so it
    // has 2 of 5 and is refused.
    let cluster = cluster(5);
    let urls = cluster.urls();
    // Quorum fencing: no counter node whose loss would decide alone.
    let quorum_fenced = || {
        builder(urls.clone())
            .ttl(TTL)
            .fencing(Fencing::Quorum)
            .build()
            .expect("valid")
    };
    let manager = quorum_fenced();
    let r = resource("rw-intersect");
    cluster.kill(3).expect("kill");
    cluster.kill(4).expect("kill");
    let reader = manager.read(&r).await.expect("three of five up");
    cluster.restart(3).expect("restart");
    cluster.restart(4).expect("restart");
    cluster.kill(0).expect("kill");
    let writer = quorum_fenced();
    match writer.lock(&r).no_wait().await {
        Err(Error::Contended { refused, .. }) => assert_eq!(refused, 2, "nodes 1 and 2 refuse"),
        other => panic!("a writer beside a valid reader: {other:?}"),
    }
    assert!(writer.settle().await);
    // The refused writer's keys on 3 and 4 are rolled back.
    for url in &urls[3..] {
        assert_eq!(
            common::lock_entry(url, &r),
            None,
            "writer key left on {url}"
        );
    }
    cluster.restart(0).expect("restart");
    // Node 0's old connection may fail the release there; the cleanup
    // goes on in the background until every node answered.
    let _ = reader.release().await;
    assert!(
        common::eventually(Duration::from_secs(10), || nothing_left(&urls, &r)).await,
        "the reader's entries stayed: {:?}",
        lock_entries(&urls, &r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_get_the_latest_writers_token_in_both_modes() {
    let cluster = cluster(5);
    for fencing in [Fencing::CounterNode { node: 0 }, Fencing::Quorum] {
        let manager = common::fenced(cluster.urls(), TTL, fencing);
        let r = resource("rw-tokens");
        // Before any writer: the node's clock, below every later writer's
        // token (a counter lost with a node's data reads the same way).
        let before = micros_since_1970();
        let none_yet = manager.read(&r).await.expect("free");
        let none = none_yet.writer_token().expect("fencing on").get();
        assert!(
            none >= before && none <= micros_since_1970(),
            "{fencing:?}: a reader before any writer got {none}, not the node's clock"
        );
        none_yet.release().await.expect("held");
        let mut last = none;
        for _ in 0..3 {
            let writer = manager.lock(&r).await.expect("free");
            let token = writer.token().expect("fencing on").get();
            assert!(
                token > last,
                "{fencing:?}: writer tokens {last} then {token}"
            );
            last = token;
            writer.release().await.expect("held");
            let reader = manager.read(&r).await.expect("free");
            // At least the writer's (its token, where every node the
            // reader asked stores it; on a loaded machine a node the
            // writer's second round had not reached yet lacks its counter,
            // and the reader takes that node's clock, above it).
            let seen = reader.writer_token().map(|t| t.get());
            assert!(
                seen.is_some_and(|seen| seen >= last),
                "{fencing:?}: a reader after the writer with {last} got {seen:?}"
            );
            reader.release().await.expect("held");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_reads_leave_nothing_behind() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let manager = manager(urls.clone());
    let other = self::manager(urls.clone());
    let r = resource("rw-dropped");
    // Not waiting: every cut point of one attempt.
    for cut_us in [0, 100, 300, 600, 1_000, 2_000, 5_000] {
        let _ = tokio::time::timeout(Duration::from_micros(cut_us), manager.read(&r)).await;
        let settled = tokio::time::timeout(SETTLE_LIMIT, manager.settle()).await;
        assert_eq!(settled, Ok(true), "settle after a read cut at {cut_us} µs");
        assert!(
            nothing_left(&urls, &r),
            "a read cut at {cut_us} µs left {:?}",
            lock_entries(&urls, &r)
        );
    }
    // Waiting behind a writer: queue entries go too.
    let writer = other.lock(&r).await.expect("free");
    for cut_ms in [0, 1, 5, 30, 100] {
        let outcome =
            tokio::time::timeout(Duration::from_millis(cut_ms), manager.read(&r).wait(TTL)).await;
        assert!(outcome.is_err(), "the writer holds: the wait cannot finish");
        let settled = tokio::time::timeout(SETTLE_LIMIT, manager.settle()).await;
        assert_eq!(settled, Ok(true), "settle after a wait cut at {cut_ms} ms");
        for url in &urls {
            assert_eq!(
                common::queued_on(url, &r),
                0,
                "a read wait cut at {cut_ms} ms left an entry on {url}"
            );
        }
    }
    writer.release().await.expect("held");
    let reader = manager
        .read(&r)
        .no_wait()
        .await
        .expect("nothing left behind");
    reader.release().await.expect("held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_wakes_the_waiting_readers_together() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let writer = manager(urls.clone());
    let r = Arc::new(resource("rw-wake"));
    let lock = writer.lock(&r).await.expect("free");
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let manager = manager(urls.clone());
        let r = Arc::clone(&r);
        waiting.push(tokio::spawn(async move {
            let lock = manager.read(&r).wait(TTL).await.expect("granted");
            let at = Instant::now();
            // Hold on, so the readers overlap if they are let in together.
            tokio::time::sleep(Duration::from_millis(300)).await;
            lock.release().await.expect("held");
            at
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    lock.release().await.expect("held");
    for reader in waiting {
        let granted = reader.await.expect("no panic");
        let after = granted - released;
        // Woken by the release, long before the writer's 10 s expiry.
        assert!(
            after < Duration::from_secs(3),
            "a reader got in {after:?} after the writer's release"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_is_extended_and_kept_alive_on_its_own() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    // Two-second TTLs: extensions every TTL/3 fit the 500 ms node timeout.
    let ttl = Duration::from_secs(2);
    let manager = builder(urls.clone()).ttl(ttl).build().expect("valid");
    let r = resource("rw-keep");
    let mut extended = manager.read(&r).await.expect("free");
    extended
        .extend(ttl * 10)
        .await
        .expect("a live reader extends");
    assert!(
        extended.remaining() > ttl * 5,
        "the extension was not applied: {:?}",
        extended.remaining()
    );
    extended.release().await.expect("held");
    let writer = builder(urls.clone()).build().expect("valid");
    let writer = &writer;
    let name = r.clone();
    let refused_throughout = manager
        .read(&r)
        .run(|lease| async move {
            let mut refused = 0;
            // Two and a half TTLs: only extensions keep this reader.
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                assert!(lease.is_valid(), "the reader's lease ran out");
                if matches!(
                    writer.lock(&name).no_wait().await,
                    Err(Error::Contended { .. })
                ) {
                    refused += 1;
                }
            }
            refused
        })
        .await
        .expect("kept alive");
    assert_eq!(
        refused_throughout, 5,
        "a writer got in beside the kept-alive reader"
    );
    assert!(manager.settle().await);
    assert!(nothing_left(&urls, &r), "{:?}", lock_entries(&urls, &r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_is_woken_by_the_last_reader_only() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let manager = manager(urls.clone());
    let r = resource("rw-last-reader");
    // Connections up first, so every reader's request goes to every node
    // (node 0, listened to below, must hold all three).
    let warm_up = manager.read(&resource("warm-up")).await.expect("free");
    warm_up.release().await.expect("held");
    let readers = [
        manager.read(&r).await.expect("free"),
        manager.read(&r).await.expect("readers share"),
        manager.read(&r).await.expect("readers share"),
    ];
    let writer = self::manager(urls.clone());
    // Every node counted before the writer queues (a fresh manager leaves
    // out a node whose clock rate it is still measuring, and its next
    // attempt may come only at a timer).
    writer.connect().await.expect("the writer's nodes count");
    let waiting = tokio::spawn({
        let r = r.clone();
        async move { writer.lock(&r).wait(TTL).await }
    });
    let writers_queued = |url: &str| -> usize {
        redis::cmd("ZCARD")
            .arg(quorumlock::internals::key_of(
                quorumlock::internals::KeyKind::WaitingWriters,
                &r,
            ))
            .query(&mut common::connect(url))
            .expect("ZCARD")
    };
    assert!(
        common::eventually(Duration::from_secs(10), || urls
            .iter()
            .all(|url| writers_queued(url) == 1))
        .await,
        "the writer never queued on every node"
    );
    // Listen to the wake-up channel on one node, as the writer's manager does.
    let notices = Arc::new(Mutex::new(Vec::<String>::new()));
    let listening = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listener = std::thread::spawn({
        let (url, channel) = (urls[0].clone(), quorumlock::internals::wake_channel(&r));
        let (notices, listening) = (Arc::clone(&notices), Arc::clone(&listening));
        move || {
            let mut conn = common::connect(&url);
            let mut pubsub = conn.as_pubsub();
            pubsub.subscribe(&channel).expect("subscribe");
            pubsub
                .set_read_timeout(Some(Duration::from_millis(100)))
                .expect("timeout");
            listening.store(true, Ordering::SeqCst);
            let stop = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < stop {
                if let Ok(message) = pubsub.get_message() {
                    let text: String = message.get_payload().expect("text");
                    notices.lock().unwrap().push(text);
                    return;
                }
            }
        }
    });
    assert!(common::eventually(Duration::from_secs(5), || listening.load(Ordering::SeqCst)).await);
    let [first, second, last] = readers;
    first.release().await.expect("held");
    second.release().await.expect("held");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        notices.lock().unwrap().clone(),
        Vec::<String>::new(),
        "the writer was woken while readers still held the resource"
    );
    let released = Instant::now();
    last.release().await.expect("held");
    let lock = waiting.await.expect("no panic").expect("the writer got in");
    let after = released.elapsed();
    listener.join().expect("listener");
    assert_eq!(
        notices.lock().unwrap().len(),
        1,
        "the last reader's release woke it"
    );
    assert!(
        after < Duration::from_secs(5),
        "woken by the release, not the 10 s expiry: {after:?}"
    );
    lock.release().await.expect("held");
}

/// An exclusive lock whose keys expired, released after a reader took the
/// resource: the nodes hold a read lock (a sorted set) under the key, which
/// is "not ours", not a failure of the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_an_expired_lock_over_a_read_lock_is_not_held() {
    let cluster = cluster(3);
    let manager = manager(cluster.urls());
    let r = resource("rw-expired-writer");

    let writer = manager
        .lock(&r)
        .ttl(Duration::from_millis(600))
        .await
        .expect("free");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let reader = manager.read(&r).await.expect("the writer's keys expired");
    match writer.release().await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("releasing over a read lock: expected NotHeld, got {other:?}"),
    }
    assert!(manager.settle().await, "background work finished");
    let health = manager.health();
    assert_eq!(
        health.nodes_up, 3,
        "no node counts as failing after the release: {health:?}"
    );
    reader.release().await.expect("the reader was untouched");
}

/// A readers' key whose expiry someone took away (`PERSIST`), after its
/// readers died, would keep every writer out for good (a lone exclusive
/// lock is one SET NX, which a key of any kind refuses). The writer's
/// script drops the dead entries and takes the lock: a waiting `lock()` in
/// either token mode, and in quorum mode a single attempt too (every node
/// runs a script there). Without the repair, `lock()` waited until the
/// test's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_key_without_its_expiry_does_not_keep_writers_out() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    for fencing in [Fencing::CounterNode { node: 0 }, Fencing::Quorum] {
        // timing: the dead reader's 600 ms TTL needs both of quorum
        // fencing's round trips well inside it
        let manager = builder(urls.clone())
            .ttl(TTL)
            .node_timeout(Duration::from_millis(250))
            .fencing(fencing)
            .build()
            .expect("valid settings");
        let r = resource("rw-persisted");
        leave_a_dead_reader(&manager, &urls, &r).await;
        let writer = tokio::time::timeout(Duration::from_secs(5), manager.lock(&r)).await;
        let writer = writer
            .unwrap_or_else(|_| {
                panic!(
                    "{fencing:?}: a writer was kept out 5 s by dead readers: {:?}",
                    common::readers_by_node(&urls, &r)
                )
            })
            .expect("lock");
        writer.release().await.expect("held");
        if fencing == Fencing::Quorum {
            leave_a_dead_reader(&manager, &urls, &r).await;
            let attempt = manager.lock(&r).no_wait().await;
            attempt
                .unwrap_or_else(|error| {
                    panic!(
                        "a single attempt was kept out by dead readers: {error}; {:?}",
                        common::readers_by_node(&urls, &r)
                    )
                })
                .release()
                .await
                .expect("held");
        }
        assert!(manager.settle().await);
        // The writer's first attempt is a plain SET NX, which repairs
        // nothing; its next (the script) may be decided before it reaches a
        // slow node, which then keeps the dead reader: nobody holds it.
        let clean = urls
            .iter()
            .filter(|url| common::lock_entry(url, &r).is_none())
            .count();
        assert!(
            clean > urls.len() / 2 && urls.iter().all(|url| live_readers(url, &r) == 0),
            "the releases left a holder, or fewer than a quorum clean: {:?}",
            lock_entries(&urls, &r)
        );
    }
}

/// Holders of `r`'s lock key on one node whose time is not up: an
/// exclusive holder counts one, each live reader one.
fn live_readers(url: &str, r: &str) -> i64 {
    redis::Script::new(
        r#"local t = redis.call("TIME")
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        local kind = redis.call("TYPE", KEYS[1])["ok"]
        if kind == "none" then return 0 end
        if kind ~= "zset" then return 1 end
        return redis.call("ZCOUNT", KEYS[1], "(" .. now, "+inf")"#,
    )
    .key(quorumlock::internals::lock_key(r))
    .invoke(&mut common::connect(url))
    .unwrap_or_else(|e| panic!("reading {r} on {url}: {e}"))
}

/// A reader of `r` that dies holding it (dropped without a release), its
/// key's expiry taken away on every node, and its entry expired.
async fn leave_a_dead_reader(manager: &LockManager, urls: &[String], r: &str) {
    std::mem::forget(
        manager
            .read(r)
            .ttl(Duration::from_millis(600))
            .await
            .expect("free"),
    );
    for url in urls {
        let _: i64 = redis::cmd("PERSIST")
            .arg(quorumlock::internals::lock_key(r))
            .query(&mut common::connect(url))
            .expect("PERSIST");
    }
    tokio::time::sleep(Duration::from_millis(900)).await;
}

fn micros_since_1970() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

/// A read lock or a multi-resource lock that wins at its first attempt
/// where others wait (both are queued attempts from the first) leaves the
/// queue at once, as a winner after waiting does: it no longer waits, so
/// `holders()` must not count it and a break must wake the next waiter,
/// not wait out its lease (found in review: a writer behind such a reader
/// was granted 6 991 ms after `force_unlock`, when the reader's lease ran
/// out). The other waiter here is written by hand: a writer whose ticket
/// is later than any attempt's, so it keeps no one out, with a long lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_winner_leaves_the_queue_it_was_put_in() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let manager = builder(urls.clone()).build().expect("valid settings");
    // Its ticket far in the future (µs, exact as a Lua number), its lease
    // too (ms).
    let late_writer =
        |name: &str| common::queue_writer_by_hand(&urls, name, u64::MAX >> 12, 4 << 40);
    let waiters_on_every_node = |name: &str| {
        urls.iter()
            .map(|url| common::queued_on(url, name))
            .collect::<Vec<_>>()
    };

    let read = resource("first-win-read");
    late_writer(&read);
    let reader = manager
        .read(&read)
        .await
        .expect("the late writer is behind");
    assert!(manager.settle().await);
    assert_eq!(
        waiters_on_every_node(&read),
        vec![1; urls.len()],
        "the reader holds, yet it is still in line beside the writer on some node"
    );
    let seen = manager.holders(&read).await.expect("read");
    assert_eq!(
        seen.waiters, 1,
        "waiters counted while a reader holds: {seen:?}"
    );
    reader.release().await.expect("held");

    let (a, b) = (resource("first-win-a"), resource("first-win-b"));
    late_writer(&b);
    let both = manager
        .lock_many([a.as_str(), b.as_str()])
        .await
        .expect("the late writer is behind");
    assert!(manager.settle().await);
    assert_eq!(
        waiters_on_every_node(&b),
        vec![1; urls.len()],
        "the holder of [a, b] is still in b's line on some node"
    );
    both.release().await.expect("held");
    assert!(manager.settle().await);
}
