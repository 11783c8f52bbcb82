//! The storage-side check on a real storage Redis: lower tokens are
//! rejected once a higher one was accepted, equal tokens pass, and
//! concurrent writers end with the highest token's value.

mod common;

use std::time::Duration;

use common::{cluster, resource};
use quorumlock::{Error, Fence, FencedRedis, FencingToken};
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
