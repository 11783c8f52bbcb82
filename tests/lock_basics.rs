//! Acquire, extend and release on a healthy five-node cluster.

mod common;

use std::time::Duration;

use common::{connect, eventually, healthy_nodes, manager, nodes_holding, resource, stored_value};
use quorumlock::{Error, NotHeldReason};

#[tokio::test]
async fn acquire_extend_release_round_trip() {
    let nodes = healthy_nodes();
    let urls = nodes.urls.clone();
    let manager = manager(urls.clone());
    let name = resource("round-trip");

    let mut lock = manager.lock(&name).await.expect("free resource");
    assert_eq!(lock.resource(), name);
    assert!(lock.is_valid());
    assert!(lock.remaining() <= Duration::from_secs(5));
    assert!(
        lock.remaining() > Duration::from_secs(4),
        "{:?}",
        lock.remaining()
    );
    assert!(
        nodes_holding(&urls, &name, lock.value()) >= manager.quorum(),
        "a quorum of nodes stores the lock value"
    );

    let before = lock.valid_until();
    tokio::time::sleep(Duration::from_millis(50)).await;
    lock.extend(Duration::from_secs(8))
        .await
        .expect("extend a held lock");
    assert!(lock.valid_until() > before);
    assert!(
        lock.remaining() > Duration::from_secs(7),
        "{:?}",
        lock.remaining()
    );
    assert_eq!(lock.ttl(), Duration::from_secs(8));
    let value = lock.value().to_owned();

    lock.release().await.expect("release a held lock");
    assert!(
        eventually(Duration::from_secs(2), || nodes_holding(
            &urls, &name, &value
        ) == 0)
        .await,
        "every node's key is deleted"
    );
}

#[tokio::test]
async fn second_acquire_refused_while_held_then_granted_after_release() {
    let nodes = healthy_nodes();
    let first = manager(nodes.urls.clone());
    let second = manager(nodes.urls.clone());
    let name = resource("held");

    let lock = first.lock(&name).await.expect("free resource");
    match second.lock(&name).no_wait().await {
        Err(Error::Contended {
            refused,
            total,
            attempts,
            free_in,
            ..
        }) => {
            assert_eq!(total, nodes.urls.len());
            assert_eq!(attempts, 1);
            // The retry-after hint: the holder's keys' time left, within
            // its TTL (the helper's 5 s), read after the refusal.
            let ttl = lock.ttl();
            assert!(
                free_in.is_some_and(|left| left <= ttl && left > ttl / 5),
                "free_in {free_in:?} for a lock of {ttl:?} taken a moment ago"
            );
            // With counter-node fencing (the default) the counter node's
            // refusal alone decides; otherwise a majority must refuse.
            assert!(refused >= 1, "refused {refused}");
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    // A waiting request waits its wait out, and says it timed out.
    match second.lock(&name).wait(Duration::from_millis(300)).await {
        Err(Error::WaitTimedOut { attempts, .. }) => assert!(attempts >= 1, "{attempts}"),
        other => panic!("expected WaitTimedOut, got {other:?}"),
    }

    lock.release().await.expect("release");
    let again = second
        .lock(&name)
        .no_wait()
        .await
        .expect("free after release");
    again.release().await.expect("release");
}

#[tokio::test]
async fn lock_is_free_again_after_it_expires() {
    let nodes = healthy_nodes();
    let manager = manager(nodes.urls.clone());
    let name = resource("expiry");

    let lock = manager
        .lock(&name)
        .ttl(Duration::from_millis(1_000))
        .await
        .expect("free resource");
    assert!(matches!(
        manager.lock(&name).no_wait().await,
        Err(Error::Contended { .. })
    ));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(!lock.is_valid());
    assert_eq!(lock.remaining(), Duration::ZERO);
    let next = manager
        .lock(&name)
        .no_wait()
        .await
        .expect("free after expiry");
    next.release().await.expect("release");
    drop(lock);
}

#[tokio::test]
async fn expired_holder_release_never_deletes_the_next_holders_key() {
    let nodes = healthy_nodes();
    let urls = nodes.urls.clone();
    let manager = manager(urls.clone());
    let name = resource("stale-release");

    let stale = manager
        .lock(&name)
        .ttl(Duration::from_millis(1_000))
        .await
        .expect("free resource");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let current = manager
        .lock(&name)
        .no_wait()
        .await
        .expect("free after expiry");
    let held_on = nodes_holding(&urls, &name, current.value());
    assert!(held_on >= manager.quorum());

    match stale.release().await {
        Err(Error::NotHeld { reason, .. }) => assert_eq!(reason, NotHeldReason::Expired),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    manager.settle().await; // the stale release has reached every node
    // (A straggling SET of the current holder may still add a node.)
    assert!(
        nodes_holding(&urls, &name, current.value()) >= held_on,
        "the current holder's keys survive"
    );
    assert!(current.is_valid());
    current.release().await.expect("release");
}

#[tokio::test]
async fn extend_is_refused_once_validity_ran_out() {
    let nodes = healthy_nodes();
    let manager = manager(nodes.urls.clone());
    let name = resource("late-extend");

    let mut lock = manager
        .lock(&name)
        .ttl(Duration::from_millis(1_000))
        .await
        .expect("free resource");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    match lock.extend(Duration::from_secs(5)).await {
        Err(Error::NotHeld { reason, .. }) => assert_eq!(reason, NotHeldReason::Expired),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    // The refusal happened locally: nothing was revived on the nodes.
    let next = manager.lock(&name).no_wait().await.expect("still free");
    next.release().await.expect("release");
}

#[tokio::test]
async fn extend_reports_a_lock_whose_keys_vanished() {
    let nodes = healthy_nodes();
    let urls = nodes.urls.clone();
    let manager = manager(urls.clone());
    let name = resource("vanished");
    // Connections to every node first: a node whose connection is not
    // ready when the quorum is reached never gets the SET, and the
    // extension may then set it there (safe while the lock is valid),
    // which with enough such nodes makes a quorum again.
    let warm = common::eventually_async(Duration::from_secs(10), || async {
        let r = resource("warm-up");
        let lock = manager.lock(&r).await.expect("free");
        let everywhere = urls
            .iter()
            .all(|url| common::stored_value(url, &r).is_some());
        lock.release().await.expect("held");
        everywhere
    })
    .await;
    assert!(warm, "a lock never reached every node");

    let mut lock = manager.lock(&name).await.expect("free resource");
    // Gone from every node but one that holds it. (Not just from a
    // quorum: a straggler the SET never reached is set again by the
    // extension, which is safe while the lock is valid, and with a key
    // left on two other nodes would make a quorum again.)
    let kept = urls
        .iter()
        .rposition(|url| common::stored_value(url, &name).is_some())
        .expect("held somewhere");
    for (_, url) in urls.iter().enumerate().filter(|&(i, _)| i != kept) {
        let _: () = redis::cmd("DEL")
            .arg(quorumlock::internals::lock_key(&name))
            .query(&mut connect(url))
            .expect("DEL");
    }
    match lock.extend(Duration::from_secs(5)).await {
        Err(Error::NotHeld { reason, .. }) => assert_eq!(reason, NotHeldReason::Lost),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert!(!lock.is_valid(), "a lost lock is no longer valid");
    assert!(matches!(
        lock.release().await,
        Err(Error::NotHeld {
            reason: NotHeldReason::Lost,
            ..
        })
    ));
}

#[tokio::test]
async fn dropping_an_unreleased_lock_releases_it_in_the_background() {
    let nodes = healthy_nodes();
    let urls = nodes.urls.clone();
    let manager = manager(urls.clone());
    let name = resource("dropped");

    let lock = manager.lock(&name).await.expect("free resource");
    let value = lock.value().to_owned();
    drop(lock);
    assert!(
        eventually(Duration::from_secs(2), || nodes_holding(
            &urls, &name, &value
        ) == 0)
        .await,
        "keys deleted well before the 5 s TTL"
    );
    let next = manager
        .lock(&name)
        .no_wait()
        .await
        .expect("free after drop");
    next.release().await.expect("release");
}

#[tokio::test]
async fn failed_attempts_leave_no_keys_behind() {
    let nodes = healthy_nodes();
    let urls = nodes.urls.clone();
    let manager = manager(urls.clone());
    let name = resource("rollback");

    // Pre-set the key on a quorum as another holder: every attempt loses,
    // yet wins on the other nodes, which the rollback must clean.
    let (taken, free) = urls.split_at(manager.quorum());
    for url in taken {
        let _: () = redis::cmd("SET")
            .arg(quorumlock::internals::lock_key(&name))
            .arg("someone-else")
            .arg("PX")
            .arg(10_000)
            .query(&mut connect(url))
            .expect("SET");
    }
    let once = manager.lock(&name).no_wait().await;
    assert!(
        matches!(once, Err(Error::Contended { attempts: 1, .. })),
        "{once:?}"
    );
    let waited = manager.lock(&name).wait(Duration::from_millis(300)).await;
    assert!(
        matches!(waited, Err(Error::WaitTimedOut { .. })),
        "{waited:?}"
    );
    assert!(
        eventually(Duration::from_secs(2), || {
            free.iter().all(|url| stored_value(url, &name).is_none())
        })
        .await,
        "the minority keys of failed attempts are rolled back"
    );
    for url in taken {
        assert_eq!(stored_value(url, &name).as_deref(), Some("someone-else"));
    }
}

/// Many more locks in flight than redis-rs queues per connection by
/// default (50): a SET that waited for room there could join the queue
/// after the release sent behind it, and leave its key on the node until
/// the TTL. Nodes without an append-only file, and a generous node
/// timeout, so a slow disk or CPU cannot leave a straggler behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_locks_in_flight_leave_no_keys_behind() {
    let cluster = quorumlock::testkit::TestCluster::start_with_args(5, &["--appendonly", "no"])
        .unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    let urls = cluster.urls();
    let manager = common::builder(urls.clone())
        .ttl(Duration::from_secs(60))
        // settings: many locks in flight at once on a loaded machine: what is left is the subject, not timing
        .node_timeout(Duration::from_secs(2))
        .node_guard(quorumlock::NodeGuard::default().trust_restarts())
        .build()
        .expect("valid settings");
    let prefix = resource("in-flight");
    let (tasks, locks_each) = (160, 50);
    let workers: Vec<_> = (0..tasks)
        .map(|task| {
            let (manager, prefix) = (manager.clone(), prefix.clone());
            tokio::spawn(async move {
                for i in 0..locks_each {
                    let lock = manager
                        .lock(&format!("{prefix}:{task}:{i}"))
                        .await
                        .expect("lock");
                    lock.release().await.expect("release");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
    assert!(
        manager.settle().await,
        "background releases still running when settle() gave up"
    );
    for (i, url) in urls.iter().enumerate() {
        // Every lock key of the run (`quorumlock:{<prefix>:<task>:<i>}:lock`;
        // braces are no glob characters).
        let pattern = format!("quorumlock:{{{prefix}:*}}:lock");
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query(&mut connect(url))
            .expect("KEYS");
        assert!(
            left.is_empty(),
            "node {i} still holds {} of the {} released locks' keys, e.g. {:?}",
            left.len(),
            tasks * locks_each,
            &left[..left.len().min(3)]
        );
    }
}

#[tokio::test]
async fn bad_arguments_are_typed_errors() {
    let nodes = healthy_nodes();
    let manager = manager(nodes.urls.clone());
    assert!(matches!(
        manager.lock("").await,
        Err(Error::InvalidArgument {
            argument: "resource",
            ..
        })
    ));
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(100), // not above node_timeout (500 ms) + drift
        Duration::from_secs(u64::MAX / 2),
    ] {
        assert!(
            matches!(
                manager.lock("r").ttl(ttl).await,
                Err(Error::InvalidArgument {
                    argument: "ttl",
                    ..
                })
            ),
            "ttl {ttl:?}"
        );
    }
    let mut lock = manager.lock(&resource("bad-extend")).await.expect("lock");
    assert!(matches!(
        lock.extend(Duration::ZERO).await,
        Err(Error::InvalidArgument {
            argument: "ttl",
            ..
        })
    ));
    assert!(
        lock.is_valid(),
        "a rejected argument does not touch the lock"
    );
    lock.release().await.expect("release");
}

/// A shorter extension lowers the lock's validity, never the keys' expiry:
/// a late extension could otherwise cut a key below what a later, longer
/// one promised.
#[tokio::test]
async fn a_shorter_extension_lowers_validity_not_the_keys() {
    let nodes = healthy_nodes();
    let urls = nodes.urls.clone();
    let manager = manager(urls.clone());
    let name = resource("shorter-extend");
    let mut lock = manager
        .lock(&name)
        .ttl(Duration::from_secs(30))
        .await
        .expect("free");
    lock.extend(Duration::from_secs(2)).await.expect("extend");
    assert!(
        lock.remaining() <= Duration::from_secs(2),
        "{:?}",
        lock.remaining()
    );
    let (keeps, entries) = common::majority_keeps(&urls, &name, lock.value());
    assert!(
        keeps > Duration::from_secs(20),
        "the keys were shortened: a majority keeps them {keeps:?} ({entries})"
    );
    lock.release().await.expect("release");
}

/// A waiter queue key of a foreign type (someone wrote a string there):
/// the release deletes the lock key first, then works on the queue. The
/// queue work must not turn a release that worked into a failure (whose
/// retry then says "not held"), for a plain lock, a read lock and a lock
/// on two resources alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_queue_key_does_not_fail_a_release_that_worked() {
    let cluster = common::cluster(3);
    let manager = manager(cluster.urls());
    let foreign_queue = |name: &str| {
        for url in cluster.urls() {
            let _: () = redis::cmd("SET")
                .arg(quorumlock::internals::key_of(
                    quorumlock::internals::KeyKind::Waiters,
                    name,
                ))
                .arg("not a queue")
                .query(&mut common::connect(&url))
                .expect("SET");
        }
    };
    let (plain, read, a, b) = (
        resource("foreign-plain"),
        resource("foreign-read"),
        resource("foreign-a"),
        resource("foreign-b"),
    );
    let lock = manager.lock(&plain).await.expect("free");
    foreign_queue(&plain);
    lock.release()
        .await
        .expect("the lock was released: its key is gone");
    assert!(common::nothing_left(&cluster.urls(), &plain));

    let lock = manager.read(&read).await.expect("free");
    foreign_queue(&read);
    lock.release().await.expect("the read lock was released");
    assert!(common::nothing_left(&cluster.urls(), &read));

    let lock = manager.lock_many(&[&a, &b]).await.expect("free");
    foreign_queue(&a);
    lock.release().await.expect("both were released");
    assert!(common::nothing_left(&cluster.urls(), &a) && common::nothing_left(&cluster.urls(), &b));
}
