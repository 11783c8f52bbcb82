//! Quorum members that are Redis Clusters (`redis+cluster://`): three
//! members of three shard masters each, with the node guard on. Every lock
//! kind runs, resources spread over the shards, a lock on several
//! resources needs one hash tag, and a slot that moves to another shard
//! while a lock is held is followed: a stale map's request is redirected
//! (the member fails that round, nothing is set), the map is read again,
//! and extend and release reach the key where it went. One set-up for the
//! whole file (nine processes on two cores), its steps in order.

mod common;

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quorumlock::internals::{KeyKind, key_of, slot};
use quorumlock::testkit::ClusterMember;
use quorumlock::{Error, LockManager, NodeErrorKind};

use common::cluster::{finish_slot_move, query, start_slot_move};

fn manager(urls: &[String]) -> LockManager {
    common::builder(urls.to_vec())
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid settings")
}

/// The masters of `member`, by URL, with how many keys each holds.
fn keys_by_master(member: &ClusterMember) -> BTreeMap<String, i64> {
    member
        .nodes()
        .urls()
        .iter()
        .map(|url| (url.clone(), query::<i64>(url, &redis::cmd("DBSIZE"))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_members_that_are_redis_clusters() {
    let members: Vec<ClusterMember> = (0..3)
        .map(|_| ClusterMember::start(3, 0).expect("a 3-master cluster"))
        .collect();
    let urls: Vec<String> = members.iter().map(|m| m.url().expect("a URL")).collect();
    let manager = manager(&urls);

    every_kind_runs_and_spreads_over_the_shards(&manager, &members).await;
    names_with_braces_run_every_script(&manager).await;
    several_resources_need_one_hash_tag(&manager).await;
    a_waiter_is_woken_past_a_dead_first_node(&members[1]).await;
    a_slot_that_moves_under_a_held_lock_is_followed(&urls, &members).await;
    assert!(
        manager.quarantined_nodes().is_empty(),
        "the guard quarantined shard masters: {:?}",
        manager.quarantined_nodes()
    );
}

async fn every_kind_runs_and_spreads_over_the_shards(
    manager: &LockManager,
    members: &[ClusterMember],
) {
    for i in 0..24 {
        let name = format!("spread:{i}");
        let mut lock = manager
            .lock(&name)
            .await
            .unwrap_or_else(|e| panic!("lock {name}: {e}"));
        assert!(lock.token().is_some(), "{name}: no token");
        // Held: a second attempt is refused on every member.
        let refused = manager.lock(&name).no_wait().await;
        assert!(
            matches!(refused, Err(Error::Contended { .. })),
            "{name} was granted twice: {refused:?}"
        );
        lock.extend(Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("extend {name}: {e}"));
        // Keep a few held, so that the shards hold keys to count.
        if i % 3 == 0 {
            std::mem::forget(lock);
        } else {
            lock.release()
                .await
                .unwrap_or_else(|e| panic!("release {name}: {e}"));
        }
    }
    // The same resource again: its token is higher.
    let first = manager.lock("spread:1").await.expect("lock");
    let again_token = first.token().expect("a token");
    first.release().await.expect("release");
    let again = manager.lock("spread:1").await.expect("lock");
    assert!(again.token().expect("a token") > again_token);
    again.release().await.expect("release");

    for (m, member) in members.iter().enumerate() {
        let counts = keys_by_master(member);
        let busy = counts.values().filter(|&&keys| keys > 2).count();
        assert_eq!(
            busy, 3,
            "member {m}: every shard master should hold some of the 24 resources' keys; \
             keys by master: {counts:?}"
        );
    }

    // Readers share; a writer waits, queued, and is woken by their release.
    let reader_a = manager.read("doc:{7}").await.expect("read");
    let reader_b = manager.read("doc:{7}").await.expect("a second reader");
    let refused = manager.lock("doc:{7}").no_wait().await;
    assert!(
        matches!(refused, Err(Error::Contended { .. })),
        "{refused:?}"
    );
    let waiter = {
        let manager = manager.clone();
        tokio::spawn(async move {
            manager
                .lock("doc:{7}")
                .wait(Duration::from_secs(10))
                .await
                .map(|lock| lock.token())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    reader_a.release().await.expect("release");
    reader_b.release().await.expect("release");
    let token = waiter
        .await
        .expect("the waiter ran")
        .expect("the writer got the lock once the readers left");
    assert!(token.is_some());

    // Several resources with one tag live in one slot: one script.
    let many = manager
        .lock_many(["{order:9}:items", "{order:9}:payment"])
        .await
        .expect("resources with one tag");
    many.release().await.expect("release");
}

/// Random names of `{`, `}`, `:` and letters (`{}`, unclosed and nested
/// braces): the exclusive, waiting and read scripts run on the shard
/// masters, which refuse a script whose keys span slots.
async fn names_with_braces_run_every_script(manager: &LockManager) {
    const ALPHABET: &[u8] = b"{}:ab";
    for _ in 0..16 {
        let length = fastrand::usize(1..10);
        let mut name: String = (0..length)
            .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
            .collect();
        if name.starts_with('}') {
            name.insert(0, 'x');
        }
        let name = format!("{name}:{}", fastrand::u32(..));
        let lock = manager
            .lock(&name)
            .await
            .unwrap_or_else(|e| panic!("lock {name:?}: {e}"));
        let waiter = manager.lock(&name).wait(Duration::from_secs(5));
        let release = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            lock.release()
                .await
                .unwrap_or_else(|e| panic!("release {name:?}: {e}"));
        };
        let (next, ()) = tokio::join!(waiter.into_future(), release);
        next.unwrap_or_else(|e| panic!("wait for {name:?}: {e}"))
            .release()
            .await
            .expect("release");
        let reader = manager
            .read(&name)
            .await
            .unwrap_or_else(|e| panic!("read {name:?}: {e}"));
        reader.release().await.expect("release");
    }
}

async fn several_resources_need_one_hash_tag(manager: &LockManager) {
    let refused = manager.lock_many(["account:1", "account:2"]).await;
    match refused {
        Err(Error::InvalidArgument {
            argument: "resources",
            reason,
        }) => assert!(reason.contains("hash tag"), "{reason}"),
        other => panic!("a lock on two slots of a cluster member: {other:?}"),
    }
}

/// A member whose URL names a dead address first: the slot map comes from
/// the next node, and a waiter subscribes there and is woken by the
/// release (not by the holder's 10 s TTL running out).
async fn a_waiter_is_woken_past_a_dead_first_node(member: &ClusterMember) {
    let url = member.url().expect("a URL").replacen(
        "redis+cluster://",
        "redis+cluster://127.0.0.1:1,",
        1,
    );
    let manager = common::builder(vec![url])
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid settings");
    let holder = manager.lock("woken:1").await.expect("lock");
    let waiter = manager.lock("woken:1").wait(Duration::from_secs(20));
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.release().await.expect("release");
        std::time::Instant::now()
    };
    let (next, released_at) = tokio::join!(waiter.into_future(), release);
    let woken_after = released_at.elapsed();
    next.expect("the waiter got the lock")
        .release()
        .await
        .expect("release");
    assert!(
        woken_after < Duration::from_secs(2),
        "the waiter got the lock {woken_after:?} after the release: not woken by it"
    );
}

/// Moves `slot` of `member` from the master at `from` to the one at
/// `to`, keys included (`SETSLOT … MIGRATING/IMPORTING`, `MIGRATE`,
/// `SETSLOT … NODE`); `between` runs while the slot is migrating.
async fn move_slot<F: std::future::Future<Output = ()>>(
    member: &ClusterMember,
    slot: u16,
    from: &str,
    to: &str,
    between: F,
) {
    start_slot_move(member, slot, from, to);
    between.await;
    finish_slot_move(member, slot, from, to);
}

async fn a_slot_that_moves_under_a_held_lock_is_followed(
    urls: &[String],
    members: &[ClusterMember],
) {
    // Managers that all know the slot maps already. The stale side is
    // not used again until the slot has moved: a redirect read during the
    // move (a straggler's, perhaps after it) would refresh its map. Taking
    // the slot moves the new owner's config epoch on, and the guard then
    // counts it again only a window later (checked at the end); these
    // managers, here to follow the slot, count it at once.
    let trusting = || {
        common::trust_unpersisted(common::builder(urls.to_vec()))
            .ttl(Duration::from_secs(10))
            .build()
            .expect("valid settings")
    };
    let (holder_side, other_side, stale_side) = (trusting(), trusting(), trusting());
    for manager in [&holder_side, &other_side, &stale_side] {
        manager
            .lock("warm-up")
            .await
            .expect("lock")
            .release()
            .await
            .expect("release");
    }
    let resource = "moving:1";
    let lock_key = key_of(KeyKind::Lock, resource);
    let member = &members[0];
    let from = member.master_of(&lock_key).expect("an owner");
    let to = member
        .nodes()
        .urls()
        .into_iter()
        .find(|url| *url != from)
        .expect("another master");
    let mut lock = holder_side.lock(resource).await.expect("lock");
    let asked = same_slot_as(&lock_key, "asked");
    let value: String = query(&from, redis::cmd("GET").arg(&lock_key));

    let moved = move_slot(member, slot(&lock_key), &from, &to, async {
        // Migrating: the old master answers ASK (the key left); the
        // holder extends (with two members, or three through ASKING).
        lock.extend(Duration::from_secs(10))
            .await
            .expect("extend while the slot migrates");
        // Another client is refused: held on members 1 and 2, and member
        // 0 sets nothing for it.
        let refused = other_side.lock(resource).no_wait().await;
        assert!(
            matches!(
                refused,
                Err(Error::Contended { .. } | Error::QuorumUnavailable { .. })
            ),
            "a second holder while the slot migrates: {refused:?}"
        );
        // A client of member 0 alone (quorum 1): a resource of the
        // migrating slot fails there, redirected, and nothing is sent
        // twice (the importing master would refuse our scripts anyway,
        // TRYAGAIN, until all of a resource's keys have moved).
        let solo = common::builder(vec![urls[0].clone()])
            .ttl(Duration::from_secs(10))
            .build()
            .expect("valid settings");
        let in_slot = || -> i64 {
            query(
                &to,
                redis::cmd("CLUSTER")
                    .arg("COUNTKEYSINSLOT")
                    .arg(slot(&lock_key)),
            )
        };
        let before = in_slot();
        let refused = solo.lock(&asked).no_wait().await;
        match &refused {
            Err(Error::QuorumUnavailable { errors, .. }) => assert!(
                errors.iter().any(|e| matches!(
                    &e.kind,
                    NodeErrorKind::Redirected(said) if said.starts_with("ASK")
                )),
                "{errors:?}"
            ),
            other => panic!("a lock of a migrating slot on member 0 alone: {other:?}"),
        }
        assert_eq!(in_slot(), before, "the redirected attempt set something");
    });
    moved.await;
    let there: Option<String> = query(&to, redis::cmd("GET").arg(&lock_key));
    assert_eq!(
        there.as_deref(),
        Some(value.as_str()),
        "the key moved with its slot"
    );

    // Another resource of the moved slot, from a manager whose map is now
    // stale: the counter member (0) answers MOVED and sets nothing, and
    // the lock is granted by members 1 and 2 without it (its token stored
    // on both); member 0's map is read again and the next lock lands on
    // the slot's new master.
    let neighbour = same_slot_as(&lock_key, "neighbour");
    let without_member_0 = stale_side
        .lock(&neighbour)
        .no_wait()
        .await
        .expect("granted by members 1 and 2 without the counter member");
    let nowhere: Option<String> = query(
        &to,
        redis::cmd("GET").arg(key_of(KeyKind::Lock, &neighbour)),
    );
    assert_eq!(
        nowhere, None,
        "the redirected request set nothing on member 0"
    );
    without_member_0.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let neighbour_lock = stale_side
        .lock(&neighbour)
        .no_wait()
        .await
        .expect("the map was read again");
    let on_new_owner: Option<String> = query(
        &to,
        redis::cmd("GET").arg(key_of(KeyKind::Lock, &neighbour)),
    );
    assert!(
        on_new_owner.is_some(),
        "the lock went to the slot's new master"
    );
    neighbour_lock.release().await.expect("release");

    // The holder extends (its map is read again after the first MOVED)
    // and releases: the key is gone where it went, and nothing was left
    // on the old master. An extension is judged by the key's absolute
    // expiry against when it was sent, so that a slow disk cannot fail it
    // (a PTTL read 1 s late did, under a disk-sync load): 10 s after it if
    // it landed there. Without load it lands at the third extension after
    // the move, not the second as this comment once said (the old check,
    // PTTL above 9 s, passed on the extension made during the migration):
    // an open finding, see the closing note of issue 43.
    let now_ms = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as i64
    };
    let mut landed = Vec::new();
    for _ in 0..5 {
        let sent = now_ms();
        lock.extend(Duration::from_secs(10)).await.expect("extend");
        let expires_at: i64 = query(&to, redis::cmd("PEXPIRETIME").arg(&lock_key));
        landed.push(expires_at - sent);
        if expires_at >= sent + 9_850 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        landed.last().is_some_and(|&ms| ms >= 9_850),
        "no extension reached the new master in five tries, 300 ms apart: its key expired \
         this many ms after each was sent: {landed:?}"
    );
    lock.release().await.expect("release");
    holder_side.settle().await;
    let left: Option<String> = query(&to, redis::cmd("GET").arg(&lock_key));
    assert_eq!(left, None, "the slot's new master still holds {lock_key}");
    let on_old: i64 = query(
        &from,
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot(&lock_key)),
    );
    assert_eq!(on_old, 0, "the old master holds keys of the moved slot");

    // A manager with the default guard: the master that took the slot
    // wrote a new data-set mark (its epoch moved on, as in a failback),
    // so it is not counted for a window.
    let cautious = manager(urls);
    let refused = cautious.lock(&neighbour).no_wait().await;
    let to_name = to.replace("redis://", "");
    assert!(
        cautious
            .quarantined_nodes()
            .iter()
            .any(|(node, _)| node.ends_with(&to_name)),
        "the master that took the slot is counted at once ({refused:?}): {:?}",
        cautious.quarantined_nodes()
    );
}

/// A resource named `prefix:N` whose lock key lives in the same slot as
/// `key`.
fn same_slot_as(key: &str, prefix: &str) -> String {
    let target = slot(key);
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .find(|name| slot(&key_of(KeyKind::Lock, name)) == target)
        .expect("some name shares the slot")
}
