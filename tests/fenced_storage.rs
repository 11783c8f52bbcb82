//! The storage-side check on a real storage Redis: lower tokens are
//! rejected once a higher one was accepted, equal tokens pass, and
//! concurrent writers end with the highest token's value; a fenced read
//! claims the resource for its token, so a zombie's write between a newer
//! holder's read and its write is refused (with a plain read it is
//! accepted, then lost); data keys in the fence's own namespace are
//! refused.

mod common;

use std::time::Duration;

use common::{cluster, resource};
use quorumlock::internals::FENCED_TOKEN_PREFIX;
use quorumlock::{Error, Fence, FencedRedis, Fencing, FencingToken};
use tokio::time::Instant;

fn token(n: u64) -> FencingToken {
    FencingToken::new(n)
}

/// The fence of token `n` for `resource`.
fn fence(resource: &str, n: u64) -> Fence {
    Fence::new(resource, token(n)).expect("a resource name")
}

#[tokio::test]
async fn a_lower_token_is_rejected_after_a_higher_one() {
    let storage_node = cluster(1);
    let storage = FencedRedis::new(&storage_node.urls()[0]).expect("valid url");
    let name = resource("fenced");
    let key = format!("{name}:data");

    assert_eq!(storage.highest_token(&name).await.expect("read"), None);
    storage
        .set(&fence(&name, 5), &key, "from 5")
        .await
        .expect("first write");
    match storage.set(&fence(&name, 3), &key, "from 3").await {
        Err(Error::FencedOut {
            offered, highest, ..
        }) => assert_eq!((offered, highest), (token(3), token(5))),
        other => panic!("expected FencedOut, got {other:?}"),
    }
    assert!(matches!(
        storage.delete(&fence(&name, 4), &key).await,
        Err(Error::FencedOut { .. })
    ));
    assert_eq!(
        storage.get(&key).await.expect("read").as_deref(),
        Some("from 5")
    );

    // The same holder writes again with its token: accepted.
    storage
        .set(&fence(&name, 5), &key, "again 5")
        .await
        .expect("equal token");
    assert_eq!(
        storage.get(&key).await.expect("read").as_deref(),
        Some("again 5")
    );
    // A newer holder moves the fence forward; deletes are fenced too.
    storage
        .delete(&fence(&name, 6), &key)
        .await
        .expect("newer delete");
    assert_eq!(storage.get(&key).await.expect("read"), None);
    assert_eq!(
        storage.highest_token(&name).await.expect("read"),
        Some(token(6))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_end_with_the_highest_tokens_value() {
    let storage_node = cluster(1);
    let url = storage_node.urls()[0].clone();
    let name = resource("race");
    let key = format!("{name}:data");

    let mut tokens: Vec<u64> = (1..=64).collect();
    fastrand::shuffle(&mut tokens);
    let mut tasks = Vec::new();
    for chunk in tokens.chunks(4) {
        let storage = FencedRedis::new(&url).expect("valid url");
        let (chunk, name, key) = (chunk.to_vec(), name.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut accepted = 0;
            for t in chunk {
                match storage.set(&fence(&name, t), &key, t.to_string()).await {
                    Ok(()) => accepted += 1,
                    Err(Error::FencedOut { highest, .. }) => assert!(highest.get() > t),
                    Err(other) => panic!("storage failed: {other}"),
                }
            }
            accepted
        }));
    }
    let mut accepted = 0;
    for task in tasks {
        accepted += task.await.expect("no panic");
    }
    let storage = FencedRedis::new(&url).expect("valid url");
    assert!(accepted >= 1);
    assert_eq!(
        storage.get(&key).await.expect("read").as_deref(),
        Some("64")
    );
    assert_eq!(
        storage.highest_token(&name).await.expect("read"),
        Some(token(64))
    );
}

#[tokio::test]
async fn bad_input_and_a_dead_storage_are_typed_errors() {
    assert!(matches!(
        FencedRedis::new("not a url"),
        Err(Error::InvalidArgument {
            argument: "url",
            ..
        })
    ));
    let storage_node = cluster(1);
    let storage = FencedRedis::new(&storage_node.urls()[0])
        .expect("valid url")
        .with_timeout(Duration::from_millis(200));
    assert!(matches!(
        Fence::new("", token(1)),
        Err(Error::InvalidArgument {
            argument: "resource",
            ..
        })
    ));

    storage_node.pause(0).expect("pause");
    let started = Instant::now();
    assert!(matches!(
        storage.set(&fence("r", 1), "k", "v").await,
        Err(Error::Node(_))
    ));
    assert!(started.elapsed() < Duration::from_secs(2), "bounded wait");
    storage_node.resume(0).expect("resume");
    storage_node.kill(0).expect("kill");
    assert!(matches!(
        storage.set(&fence("r", 1), "k", "v").await,
        Err(Error::Node(_))
    ));
}

/// Tokens beyond 2^53 compare exactly (Lua numbers are doubles: 2^53 and
/// 2^53 + 1 look equal), up to `u64::MAX`.
#[tokio::test]
async fn tokens_compare_exactly_up_to_u64_max() {
    let storage_node = cluster(1);
    let storage = FencedRedis::new(&storage_node.urls()[0]).expect("valid url");
    let name = resource("big-tokens");
    let key = format!("{name}:value");
    let big = (1u64 << 53) + 1;
    storage
        .set(&fence(&name, big), &key, "newer")
        .await
        .expect("first write");
    match storage.set(&fence(&name, big - 1), &key, "older").await {
        Err(Error::FencedOut {
            offered, highest, ..
        }) => {
            assert_eq!(offered, token(big - 1));
            assert_eq!(highest, token(big), "the highest token, exactly");
        }
        other => panic!("token {} passed after {big}: {other:?}", big - 1),
    }
    assert_eq!(
        storage.get(&key).await.expect("get").as_deref(),
        Some("newer")
    );
    for n in [u64::MAX - 1, u64::MAX] {
        storage
            .set(&fence(&name, n), &key, n.to_string())
            .await
            .unwrap_or_else(|e| panic!("token {n}: {e}"));
        assert_eq!(
            storage.highest_token(&name).await.expect("highest"),
            Some(token(n))
        );
    }
    match storage
        .set(&fence(&name, u64::MAX - 1), &key, "older")
        .await
    {
        Err(Error::FencedOut { highest, .. }) => assert_eq!(highest, token(u64::MAX)),
        other => panic!("u64::MAX - 1 passed after u64::MAX: {other:?}"),
    }
}

/// A push onto a key that is no list fails whole: the highest token is not
/// recorded either.
#[tokio::test]
async fn a_failing_push_records_no_token() {
    let storage_node = cluster(1);
    let storage = FencedRedis::new(&storage_node.urls()[0]).expect("valid url");
    let name = resource("wrong-type");
    let key = format!("{name}:value");
    storage
        .set(&fence(&name, 1), &key, "a string")
        .await
        .expect("set");
    let pushed = storage.push(&fence(&name, 5), &key, "entry").await;
    assert!(pushed.is_err(), "a push onto a string: {pushed:?}");
    assert_eq!(
        storage.highest_token(&name).await.expect("highest"),
        Some(token(1)),
        "the failed push must not have recorded its token"
    );
}

/// How every holder in [`zombie_between_read_and_write`] reads the stock
/// it writes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// `FencedRedis::read`: check and claim, then read.
    Fenced,
    /// `FencedRedis::get`: no fence.
    Plain,
}

/// What the story saw.
struct Story {
    zombie: FencingToken,
    newer: FencingToken,
    /// The zombie's sale of 3, written after the newer holder read.
    zombie_write: Result<(), Error>,
    final_stock: Option<String>,
}

/// The read-modify-write zombie on real locks: A takes the lock, reads the
/// stock (100) and stalls until its lock has expired; B takes the lock
/// (the next token) and reads the stock; A wakes and writes its sale of 3
/// (97); B writes its sale of 1 (99).
async fn zombie_between_read_and_write(
    lock_urls: Vec<String>,
    storage_url: &str,
    reading: Reading,
) -> Story {
    let manager = common::fenced(
        lock_urls,
        Duration::from_secs(1),
        Fencing::CounterNode { node: 0 },
    );
    let storage = FencedRedis::new(storage_url).expect("valid url");
    let name = resource("rmw-zombie");
    let key = format!("{name}:stock");
    let read = |fence: Fence| {
        let (storage, key) = (&storage, &key);
        async move {
            let value = match reading {
                Reading::Fenced => storage.read(&fence, key).await,
                Reading::Plain => storage.get(key).await,
            };
            let value = value.expect("the read").expect("stocked");
            value.parse::<u32>().expect("a number")
        }
    };
    storage
        .set(&fence(&name, 0), &key, "100")
        .await
        .expect("opening stock");

    let a = manager.lock(&name).await.expect("free");
    let a_fence = a.fence().expect("fencing on");
    let a_stock = read(a_fence.clone()).await;
    // A stalls: its lock expires meanwhile, and B gets the next one.
    tokio::time::sleep_until(a.valid_until()).await;
    assert!(!a.is_valid());
    let b = manager
        .lock(&name)
        .wait(Duration::from_secs(5))
        .await
        .expect("A's lock expired");
    let b_fence = b.fence().expect("fencing on");
    assert!(b_fence.token() > a_fence.token());
    let b_stock = read(b_fence.clone()).await;
    assert_eq!((a_stock, b_stock), (100, 100), "nobody has written yet");
    // A wakes before B writes.
    let zombie_write = storage.set(&a_fence, &key, (a_stock - 3).to_string()).await;
    storage
        .set(&b_fence, &key, (b_stock - 1).to_string())
        .await
        .expect("B, the holder, writes");
    b.release().await.expect("held");
    drop(a);
    Story {
        zombie: a_fence.token(),
        newer: b_fence.token(),
        zombie_write,
        final_stock: storage.get(&key).await.expect("get"),
    }
}

/// The fix: B's fenced read raised the highest token to B's, so A's write
/// is refused although B had not written yet; the stock is B's sale alone,
/// the only one acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_read_refuses_a_zombies_write_before_the_readers_own() {
    let (lock_nodes, storage_node) = (cluster(3), cluster(1));
    let story =
        zombie_between_read_and_write(lock_nodes.urls(), &storage_node.urls()[0], Reading::Fenced)
            .await;
    match story.zombie_write {
        Err(Error::FencedOut {
            offered, highest, ..
        }) => assert_eq!((offered, highest), (story.zombie, story.newer)),
        other => panic!(
            "the zombie (token {}) wrote after the fenced read of token {}: {other:?}",
            story.zombie, story.newer
        ),
    }
    assert_eq!(
        story.final_stock.as_deref(),
        Some("99"),
        "100 - B's sale of 1"
    );
}

/// The control, why the fenced read is needed: with the plain `get`, A's
/// write passes the fence (no higher token has written yet), and B's
/// write, computed from what B read before it, erases it: A's sale of 3 was
/// acknowledged and is lost (99, not 96), although every write passed the
/// fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_plain_read_the_zombies_acknowledged_write_is_lost() {
    let (lock_nodes, storage_node) = (cluster(3), cluster(1));
    let story =
        zombie_between_read_and_write(lock_nodes.urls(), &storage_node.urls()[0], Reading::Plain)
            .await;
    assert!(
        story.zombie_write.is_ok(),
        "the zombie's write was refused without a fenced read (has `get` started to claim?): \
         {:?}",
        story.zombie_write
    );
    assert_eq!(
        story.final_stock.as_deref(),
        Some("99"),
        "B's write overwrites A's acknowledged one"
    );
}

/// A fenced read is refused like a write, claims the resource for its
/// token (and only on success), and compares tokens exactly.
#[tokio::test]
async fn a_fenced_read_checks_then_claims() {
    let storage_node = cluster(1);
    let storage = FencedRedis::new(&storage_node.urls()[0]).expect("valid url");
    let name = resource("fenced-read");
    let (key, log) = (format!("{name}:value"), format!("{name}:log"));

    assert_eq!(
        storage.read(&fence(&name, 5), &key).await.expect("read"),
        None
    );
    assert_eq!(
        storage.highest_token(&name).await.expect("highest"),
        Some(token(5)),
        "a read of an absent key claims too"
    );
    match storage.read(&fence(&name, 3), &key).await {
        Err(Error::FencedOut {
            offered, highest, ..
        }) => assert_eq!((offered, highest), (token(3), token(5))),
        other => panic!("token 3 read after 5 claimed: {other:?}"),
    }
    assert!(matches!(
        storage.set(&fence(&name, 4), &key, "from 4").await,
        Err(Error::FencedOut { .. })
    ));
    // The claimant reads and writes again with its token.
    storage
        .set(&fence(&name, 5), &key, "from 5")
        .await
        .expect("equal token");
    assert_eq!(
        storage
            .read(&fence(&name, 5), &key)
            .await
            .expect("read")
            .as_deref(),
        Some("from 5")
    );
    // Lists: read whole, under the same rule.
    storage
        .push(&fence(&name, 5), &log, "one")
        .await
        .expect("push");
    storage
        .push(&fence(&name, 5), &log, "two")
        .await
        .expect("push");
    assert_eq!(
        storage
            .read_list(&fence(&name, 6), &log)
            .await
            .expect("read"),
        ["one", "two"]
    );
    assert!(matches!(
        storage.read_list(&fence(&name, 5), &log).await,
        Err(Error::FencedOut { .. })
    ));
    assert!(matches!(
        storage.push(&fence(&name, 5), &log, "three").await,
        Err(Error::FencedOut { .. })
    ));
    // A read of the wrong type fails whole: it claims nothing.
    assert!(storage.read(&fence(&name, 9), &log).await.is_err());
    assert!(storage.read_list(&fence(&name, 9), &key).await.is_err());
    assert_eq!(
        storage.highest_token(&name).await.expect("highest"),
        Some(token(6)),
        "a failed read must not have claimed"
    );
    // Exact up to u64::MAX (Lua numbers would see 2^53 + 1 as 2^53).
    let big = (1u64 << 53) + 1;
    storage.read(&fence(&name, big), &key).await.expect("read");
    assert!(matches!(
        storage.read(&fence(&name, big - 1), &key).await,
        Err(Error::FencedOut { highest, .. }) if highest == token(big)
    ));
    storage
        .read(&fence(&name, u64::MAX), &key)
        .await
        .expect("read");
    assert_eq!(
        storage.highest_token(&name).await.expect("highest"),
        Some(token(u64::MAX))
    );
    assert!(matches!(
        storage.read(&fence(&name, u64::MAX - 1), &key).await,
        Err(Error::FencedOut { highest, .. }) if highest == token(u64::MAX)
    ));
}

/// A data key in the fence's bookkeeping namespace is refused by every
/// call, before any I/O: with a delete of `quorumlock:fenced:<resource>`
/// accepted, the highest-token record was gone and an older token passed.
#[tokio::test]
async fn data_keys_in_the_fences_namespace_are_refused() {
    let storage_node = cluster(1);
    let storage = FencedRedis::new(&storage_node.urls()[0]).expect("valid url");
    let name = resource("namespace");
    let data = format!("{name}:data");
    storage
        .set(&fence(&name, 2), &data, "from 2")
        .await
        .expect("write");

    let own = format!("{FENCED_TOKEN_PREFIX}{name}");
    let other = format!("{FENCED_TOKEN_PREFIX}{}", resource("other"));
    for key in [own.as_str(), other.as_str(), FENCED_TOKEN_PREFIX] {
        let f = fence(&name, 2);
        let outcomes: [(&str, Result<(), Error>); 7] = [
            ("set", storage.set(&f, key, "x").await),
            ("delete", storage.delete(&f, key).await),
            ("push", storage.push(&f, key, "x").await),
            ("read", storage.read(&f, key).await.map(drop)),
            ("read_list", storage.read_list(&f, key).await.map(drop)),
            ("get", storage.get(key).await.map(drop)),
            ("list", storage.list(key).await.map(drop)),
        ];
        for (call, outcome) in outcomes {
            match outcome {
                Err(Error::InvalidArgument {
                    argument: "key",
                    reason,
                }) => assert!(
                    reason.contains(FENCED_TOKEN_PREFIX)
                        && reason.contains("another prefix")
                        && reason.contains("highest_token"),
                    "{call}({key}): the reason should say what is wrong and how to fix it: \
                     {reason}"
                ),
                other => panic!("{call}({key}) was not refused: {other:?}"),
            }
        }
    }
    // The record is intact: token 1 is still refused, token 2's data stands.
    assert_eq!(
        storage.highest_token(&name).await.expect("highest"),
        Some(token(2))
    );
    assert!(matches!(
        storage.set(&fence(&name, 1), &data, "from 1").await,
        Err(Error::FencedOut { .. })
    ));
    assert_eq!(
        storage.get(&data).await.expect("get").as_deref(),
        Some("from 2")
    );
    // Only the namespace itself: look-alike keys are data.
    for key in [
        format!("{name}:{FENCED_TOKEN_PREFIX}x"),
        "quorumlock:fencedx".to_owned(),
        "quorumlock:fence:x".to_owned(),
    ] {
        storage
            .set(&fence(&name, 2), &key, "v")
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
    }
}
