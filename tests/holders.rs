//! Who holds a lock (`LockManager::holders`, holder descriptions) and
//! force-unlock (`LockManager::force_unlock`), on real nodes.

mod common;

use std::time::Duration;

use quorumlock::{Error, FencedRedis, HolderKind, MAX_HOLDER_LEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_lock_reports_its_holders() {
    let cluster = common::cluster(5);
    let manager = common::manager(cluster.urls());
    let name = common::resource("holders");

    let free = manager.holders(&name).await.expect("read");
    assert!(free.free && free.holders.is_empty(), "{free:?}");
    assert_eq!((free.answered, free.nodes), (5, 5));

    let lock = manager
        .lock(&name)
        .holder("host-a pid 7: nightly")
        .await
        .expect("free");
    assert_eq!(lock.holder(), Some("host-a pid 7: nightly"));
    let held = manager.holders(&name).await.expect("read");
    let holder = held.exclusive().expect("a quorum stores the holder");
    assert_eq!(holder.description.as_deref(), Some("host-a pid 7: nightly"));
    assert_eq!(holder.value, lock.value());
    assert!(holder.nodes >= 3, "{held:?}");
    let left = holder.valid_for.expect("expires");
    assert!(
        left <= lock.ttl() && left > lock.ttl() / 2,
        "validity {left:?} of a {:?} TTL just taken",
        lock.ttl()
    );
    assert!(!held.free);
    assert_eq!(
        held.counter,
        lock.token().map(|t| t.get()),
        "the counter is the token just issued"
    );
    lock.release().await.expect("release");

    // Readers: each one, with its own description (or none).
    let first = manager
        .read(&name)
        .holder("reader one")
        .await
        .expect("free");
    let second = manager.read(&name).await.expect("readers share");
    let read = manager.holders(&name).await.expect("read");
    assert_eq!(read.holders.len(), 2, "{read:?}");
    assert!(read.holders.iter().all(|h| h.kind == HolderKind::Reader));
    let mut descriptions: Vec<Option<&str>> = read
        .holders
        .iter()
        .map(|h| h.description.as_deref())
        .collect();
    descriptions.sort_unstable();
    assert_eq!(descriptions, [None, Some("reader one")]);
    first.release().await.expect("release");
    second.release().await.expect("release");

    // A lock on several resources shows on each of them.
    let other = common::resource("holders-other");
    let both = manager
        .lock_many([name.as_str(), other.as_str()])
        .holder("transfer")
        .await
        .expect("free");
    for resource in [&name, &other] {
        let holding = manager.holders(resource).await.expect("read");
        let holder = holding.exclusive().expect("held");
        assert_eq!(
            holder.description.as_deref(),
            Some("transfer"),
            "{resource}"
        );
    }
    both.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_description_is_bounded_and_printable() {
    let cluster = common::cluster(3);
    let manager = common::manager(cluster.urls());
    let name = common::resource("holders-bad");
    let long = manager
        .lock(&name)
        .holder("x".repeat(MAX_HOLDER_LEN + 1))
        .await;
    match long {
        Err(Error::InvalidArgument { argument, reason }) => {
            assert_eq!(argument, "holder");
            assert!(reason.contains("257 bytes"), "{reason}");
        }
        other => panic!("a too long description must be refused, got {other:?}"),
    }
    let control = manager.read(&name).holder("two\nlines").await;
    assert!(
        matches!(
            control,
            Err(Error::InvalidArgument {
                argument: "holder",
                ..
            })
        ),
        "{control:?}"
    );
    // Nothing was taken.
    assert!(manager.holders(&name).await.expect("read").free);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_needs_a_quorum_of_answers() {
    let cluster = common::cluster(3);
    let manager = common::manager(cluster.urls());
    let name = common::resource("holders-down");
    cluster.kill(0).expect("kill");
    cluster.kill(1).expect("kill");
    match manager.holders(&name).await {
        Err(Error::QuorumUnavailable {
            answered, needed, ..
        }) => assert_eq!((answered, needed), (1, 2)),
        other => panic!("one node of three cannot tell, got {other:?}"),
    }
}

/// A broken lock: the holder sees the loss at its next extension, the next
/// holder's token is above the one `force_unlock` printed, and once the
/// next holder has written, the broken holder's write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_holder_loses_and_its_stale_write_is_refused() {
    let cluster = common::cluster(5);
    let storage_node = common::cluster(1);
    let storage = FencedRedis::new(&storage_node.urls()[0]).expect("storage");
    let manager = common::fenced(
        cluster.urls(),
        Duration::from_secs(3),
        quorumlock::Fencing::CounterNode { node: 0 },
    );
    let name = common::resource("broken");
    let stuck = manager
        .lock(&name)
        .holder("stuck job")
        .await
        .expect("free")
        .keep_alive()
        .expect("keep alive");
    let lease = stuck.lease();
    let stale_fence = lease.fence().expect("fence");

    let shown = manager.holders(&name).await.expect("read");
    let broken = manager.force_unlock(&shown).await.expect("break");
    assert!(broken.deleted >= 3, "{broken:?}");
    assert_eq!(broken.answered, 5);
    assert_eq!(
        broken.counter,
        lease.token().map(|t| t.get()),
        "the broken holder's token is the highest issued"
    );
    assert!(manager.holders(&name).await.expect("read").free);

    // The holder learns of it at its next extension (every TTL/3 = 1 s).
    let lost = tokio::time::timeout(Duration::from_secs(3), stuck.lost())
        .await
        .expect("the loss is seen within one extension interval");
    assert!(!lease.is_valid(), "lost: {lost}");

    let next = manager
        .lock(&name)
        .no_wait()
        .await
        .expect("the next holder gets it");
    let next_fence = next.fence().expect("fence");
    assert!(
        next_fence.token().get() > broken.counter.expect("counter"),
        "next token {} after the printed {:?}",
        next_fence.token(),
        broken.counter
    );
    storage
        .set(&next_fence, "report", "next")
        .await
        .expect("the next holder writes");
    match storage.set(&stale_fence, "report", "stale").await {
        Err(Error::FencedOut { .. }) => {}
        other => panic!("the broken holder's write must be refused, got {other:?}"),
    }
    next.release().await.expect("release");
    drop(stuck);
}

/// A waiter queued behind a stuck holder is woken by the break, not by
/// the holder's 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_break() {
    let cluster = common::cluster(3);
    let manager = common::manager(cluster.urls());
    let name = common::resource("break-wakes");
    let stuck = manager
        .lock(&name)
        .ttl(Duration::from_secs(30))
        .await
        .expect("free");
    let waiter = {
        let manager = manager.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let lock = manager.lock(&name).wait(Duration::from_secs(20)).await?;
            let acquired = tokio::time::Instant::now();
            lock.release().await?;
            Ok::<_, Error>(acquired)
        })
    };
    // The waiter queues, then the operator breaks the lock.
    for _ in 0..200 {
        if common::queued_on(&cluster.urls()[0], &name) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let broke = tokio::time::Instant::now();
    let shown = manager.holders(&name).await.expect("read");
    manager.force_unlock(&shown).await.expect("break");
    let acquired = waiter.await.expect("no panic").expect("acquired");
    let after = acquired.saturating_duration_since(broke);
    assert!(
        after < Duration::from_secs(2),
        "the waiter got the lock {after:?} after the break"
    );
    assert!(matches!(stuck.release().await, Err(Error::NotHeld { .. })));
}

/// The review's case: an operator reads who holds a lock (A), decides to
/// break it; meanwhile A releases and B gets the lock. The break must
/// delete what was shown (A's), not B's: B goes on holding, and a third
/// client is refused. The unconditional form breaks B, as it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_deletes_only_the_holder_it_showed() {
    let cluster = common::cluster(3);
    let manager = common::manager(cluster.urls());
    let name = common::resource("break-shown");
    let a = manager.lock(&name).await.expect("free");
    let shown = manager.holders(&name).await.expect("read");
    assert_eq!(
        shown.exclusive().map(|h| h.value.as_str()),
        Some(a.value()),
        "the operator sees A"
    );
    a.release().await.expect("A releases");
    let b = manager.lock(&name).no_wait().await.expect("B takes it");
    let broken = manager.force_unlock(&shown).await.expect("break");
    assert_eq!(broken.deleted, 0, "B's entries were deleted: {broken:?}");
    assert!(b.is_valid());
    match manager.lock(&name).no_wait().await {
        Err(Error::Contended { .. }) => {}
        other => panic!("a third client while B holds the lock: {other:?}"),
    }
    // Unconditionally: B is broken, as the name says.
    let anyone = manager
        .force_unlock(quorumlock::Break::WhoeverHolds(&name))
        .await
        .expect("break");
    assert!(anyone.deleted >= 2, "{anyone:?}");
    assert!(manager.holders(&name).await.expect("read").free);
    drop(b);
}

/// The review's other case: the operator's read meets B mid-acquire (its
/// key on one node of three, its requests to the other two held up), so
/// it shows no holder, only a key on one node; then B is granted on all
/// three. A break of what was shown must leave B alone (it deleted B on
/// 3 of 3 when it broke every value any node stored), and a third client
/// is refused while B holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_leaves_a_holder_it_met_mid_acquire() {
    use quorumlock::testkit::{ClusterOptions, Delay, TestCluster};

    let cluster = TestCluster::start_with(
        3,
        &ClusterOptions {
            proxied: true,
            ..ClusterOptions::default()
        },
    )
    .expect("three nodes behind proxies");
    let direct = common::direct_urls(&cluster);
    let operator = common::manager(direct.clone());
    let name = common::resource("break-mid-acquire");
    // timing: B's requests to nodes 1 and 2 take 600 ms on the way
    // there; its round must stay open for them
    let b_manager = common::builder(cluster.urls())
        .node_timeout(Duration::from_secs(3))
        .build()
        .expect("valid settings");
    // B knows every node (connected, observed, its clock's rate
    // measured: on a loaded machine that can take a while) before the
    // delay.
    b_manager.connect().await.expect("connect");
    b_manager
        .lock(&common::resource("warm-up"))
        .await
        .expect("free")
        .release()
        .await
        .expect("release");
    for i in [1, 2] {
        cluster
            .proxy(i)
            .expect("proxy")
            .set_latency_to_node(Delay::fixed(Duration::from_millis(600)));
    }
    let b = tokio::spawn({
        let name = name.clone();
        async move { b_manager.lock(&name).no_wait().await }
    });
    let deadline = tokio::time::Instant::now() + common::scaled(Duration::from_millis(500));
    while common::stored_value(&direct[0], &name).is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B's key never reached node 0"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let shown = operator.holders(&name).await.expect("read");
    assert!(
        shown.holders.is_empty() && shown.seen.len() == 1,
        "the read was to meet B on node 0 only: {shown:?}"
    );
    let b = b.await.expect("no panic").expect("B is granted");
    let broken = operator.force_unlock(&shown).await.expect("break");
    assert_eq!(
        broken.deleted, 0,
        "the break deleted B, which it never showed as a holder: {broken:?}"
    );
    assert!(b.is_valid(), "B's lock ran out during the test");
    // B was granted by the first two answers; its SET on the third node
    // may land a moment later.
    let on_every_node = common::eventually(common::scaled(Duration::from_secs(2)), || {
        direct
            .iter()
            .all(|url| common::stored_value(url, &name).as_deref() == Some(b.value()))
    })
    .await;
    let now = operator.holders(&name).await.expect("read");
    assert!(
        on_every_node
            && now.exclusive().map(|h| (h.value.as_str(), h.nodes)) == Some((b.value(), 3)),
        "B holds on every node: {now:?}"
    );
    match operator.lock(&name).no_wait().await {
        Err(Error::Contended { .. }) => {}
        other => panic!("a third client while B holds the lock: {other:?}"),
    }
    b.release().await.expect("B releases");
}
