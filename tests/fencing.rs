//! Fencing tokens on a real cluster, in both token modes: they strictly
//! increase from holder to holder, survive extension, node faults and
//! restarts (a missing counter node: `tests/counter_failover.rs`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{builder, cluster, connect, resource};
use quorumlock::internals::fence_key;
use quorumlock::{Error, Fencing, FencingToken, LockManager};
use tokio::sync::Mutex;

const MODES: [Fencing; 2] = [Fencing::CounterNode { node: 0 }, Fencing::Quorum];

fn manager(urls: Vec<String>, fencing: Fencing) -> LockManager {
    builder(urls)
        .fencing(fencing)
        .build()
        .expect("valid settings")
}

/// Takes and releases the lock `times` times; returns the tokens in order.
async fn sequential_tokens(manager: &LockManager, name: &str, times: usize) -> Vec<FencingToken> {
    let mut tokens = Vec::new();
    for _ in 0..times {
        let lock = manager
            .lock(name)
            .await
            .unwrap_or_else(|e| panic!("lock: {e}"));
        tokens.push(lock.token().expect("fencing is on"));
        lock.release().await.expect("release");
    }
    tokens
}

fn assert_strictly_increasing(tokens: &[FencingToken], what: &str) {
    for pair in tokens.windows(2) {
        assert!(pair[0] < pair[1], "{what}: {} then {}", pair[0], pair[1]);
    }
}

#[tokio::test]
async fn default_mode_is_counter_node_zero_and_off_has_no_token() {
    let cluster = cluster(3);
    let plain = builder(cluster.urls())
        .fencing(Fencing::Off)
        .build()
        .expect("valid");
    let lock = plain.lock(&resource("off")).await.expect("lock");
    assert_eq!(lock.token(), None);
    lock.release().await.expect("release");

    assert_eq!(Fencing::default(), Fencing::CounterNode { node: 0 });
    let default = builder(cluster.urls()).build().expect("valid");
    let name = resource("default");
    let before = micros_since_1970();
    let lock = default.lock(&name).await.expect("lock");
    let token = lock.token().expect("a token").get();
    let counter: u64 = redis::cmd("GET")
        .arg(fence_key(&name))
        .query(&mut connect(&cluster.url(0).expect("node 0")))
        .expect("counter on node 0");
    assert_eq!(counter, token, "node 0 keeps the token it issued");
    // The first token is node 0's clock in microseconds (same host here).
    assert!(
        token >= before && token <= micros_since_1970(),
        "first token {token}, not the counter node's clock (from {before})"
    );
    lock.release().await.expect("release");
}

fn micros_since_1970() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

/// A counter that lost increments (a crash without `appendfsync always`;
/// here the data set wiped, the worst case) must not issue a token it
/// issued before: tokens used to start again from 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_that_lost_its_increments_never_repeats_a_token() {
    let cluster = cluster(3);
    let trusting = |fencing| {
        // The restart's quarantine is not the subject.
        common::trust_unpersisted(builder(cluster.urls()))
            .fencing(fencing)
            .build()
            .expect("valid")
    };
    for fencing in MODES {
        let name = resource("lost-increments");
        let manager = trusting(fencing);
        let before = sequential_tokens(&manager, &name, 3).await;
        for i in 0..cluster.len() {
            cluster
                .restart_with(i, &quorumlock::testkit::Restart::wiped())
                .expect("restart");
        }
        let fresh = trusting(fencing);
        let after = sequential_tokens(&fresh, &name, 3).await;
        let tokens: Vec<_> = before.iter().chain(&after).copied().collect();
        assert_strictly_increasing(&tokens, &format!("{fencing:?} across a lost counter"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_increase_in_holder_order_in_both_modes() {
    let cluster = cluster(5);
    for fencing in MODES {
        let name = resource("order");
        let tokens = sequential_tokens(&manager(cluster.urls(), fencing), &name, 10).await;
        assert_strictly_increasing(&tokens, &format!("{fencing:?} sequential"));

        // Contended: each holder appends its token while it holds the lock,
        // so the log's order is the order of the holders.
        let log = Arc::new(Mutex::new(tokens));
        let mut tasks = Vec::new();
        for _ in 0..6 {
            let manager = builder(cluster.urls())
                .fencing(fencing)
                .build()
                .expect("valid");
            let (log, name) = (Arc::clone(&log), name.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let lock = manager.lock(&name).await.expect("eventually acquired");
                    log.lock().await.push(lock.token().expect("fencing is on"));
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    lock.release().await.expect("release");
                }
            }));
        }
        for task in tasks {
            task.await.expect("no panic");
        }
        let tokens = log.lock().await.clone();
        assert_eq!(tokens.len(), 70);
        assert_strictly_increasing(&tokens, &format!("{fencing:?} contended"));
    }
}

#[tokio::test]
async fn extending_keeps_the_token() {
    let cluster = cluster(5);
    for fencing in MODES {
        let manager = manager(cluster.urls(), fencing);
        let mut lock = manager.lock(&resource("extend")).await.expect("lock");
        let token = lock.token();
        assert!(token.is_some());
        lock.extend(Duration::from_secs(8)).await.expect("extend");
        assert_eq!(lock.token(), token, "{fencing:?}");
        lock.release().await.expect("release");
    }
}

#[tokio::test]
async fn quorum_mode_works_with_two_nodes_down_including_node_zero() {
    let cluster = cluster(5);
    let manager = manager(cluster.urls(), Fencing::Quorum);
    let name = resource("quorum-faults");
    let before = sequential_tokens(&manager, &name, 3).await;

    cluster.kill(0).expect("kill");
    cluster.kill(2).expect("kill");
    let after = sequential_tokens(&manager, &name, 5).await;
    let all: Vec<_> = before.into_iter().chain(after).collect();
    assert_strictly_increasing(&all, "across the failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_nodes_keep_their_counters() {
    let cluster = cluster(5);
    let counter_mode = manager(cluster.urls(), Fencing::CounterNode { node: 0 });
    let quorum_mode = manager(cluster.urls(), Fencing::Quorum);
    let (counted, voted) = (resource("restart-counter"), resource("restart-quorum"));
    let first_counted = sequential_tokens(&counter_mode, &counted, 3).await;
    let first_voted = sequential_tokens(&quorum_mode, &voted, 3).await;

    // Every node crashes (SIGKILL) and comes back from its AOF.
    for i in 0..5 {
        cluster.restart(i).expect("restart");
    }
    let stored: u64 = redis::cmd("GET")
        .arg(fence_key(&counted))
        .query(&mut connect(&cluster.url(0).expect("node 0")))
        .expect("counter survived");
    assert_eq!(stored, first_counted[2].get());

    let then_counted = sequential_tokens(&counter_mode, &counted, 2).await;
    let then_voted = sequential_tokens(&quorum_mode, &voted, 2).await;
    assert!(then_counted[0] > first_counted[2], "{then_counted:?}");
    assert!(then_voted[0] > first_voted[2], "{then_voted:?}");
}

/// Sets `resource`'s fencing counter to `value` on every node.
fn set_counters(urls: &[String], resource: &str, value: &str) {
    for url in urls {
        let _: () = redis::cmd("SET")
            .arg(fence_key(resource))
            .arg(value)
            .query(&mut connect(url))
            .unwrap_or_else(|e| panic!("SET counter on {url}: {e}"));
    }
}

/// Counters beyond 2^53 are not exact as Lua numbers (doubles); tokens
/// must still strictly increase there, in both modes.
#[tokio::test]
async fn tokens_increase_exactly_beyond_two_to_the_53() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    // 2^53 + 1 is the first integer a double cannot hold.
    let previous: u64 = (1 << 53) + 1;
    for fencing in MODES {
        let manager = manager(urls.clone(), fencing);
        let name = resource("big-counter");
        set_counters(&urls, &name, &previous.to_string());
        let tokens = sequential_tokens(&manager, &name, 3).await;
        assert!(
            tokens[0].get() > previous,
            "{fencing:?}: token {} after a counter of {previous}",
            tokens[0]
        );
        assert_strictly_increasing(&tokens, &format!("{fencing:?} beyond 2^53"));
        // Exactly one more in quorum mode. From a counter node whose
        // counter runs far ahead of its clock (as this one does), one above
        // it stored on the others (a second round: see
        // `counter_node_token`), so two more; an attempt retried on a
        // loaded machine adds one or two each: a few more at most.
        let most = match fencing {
            Fencing::CounterNode { .. } => previous + 8,
            _ => previous + 1,
        };
        assert!(
            (previous + 1..=most).contains(&tokens[0].get()),
            "{fencing:?}: token {} after {previous}, {} more",
            tokens[0],
            tokens[0].get() - previous
        );
    }
}

/// A counter that is no number, or that cannot grow any more, is a typed
/// error naming the key, and the attempt leaves no lock key behind.
#[tokio::test]
async fn an_unusable_counter_is_a_clear_error_and_leaves_no_key() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let cases = [
        (Fencing::CounterNode { node: 0 }, "not-a-number"),
        (Fencing::CounterNode { node: 0 }, "9223372036854775807"),
        (Fencing::Quorum, "12abc"),
        (Fencing::Quorum, "18446744073709551615"),
        (Fencing::CounterNode { node: 0 }, "a list"),
    ];
    for (fencing, counter) in cases {
        let manager = manager(urls.clone(), fencing);
        let name = resource("bad-counter");
        if counter == "a list" {
            for url in &urls {
                let _: () = redis::cmd("RPUSH")
                    .arg(fence_key(&name))
                    .arg("x")
                    .query(&mut connect(url))
                    .expect("RPUSH");
            }
        } else {
            set_counters(&urls, &name, counter);
        }
        let result = manager.lock(&name).no_wait().await;
        let error = result.expect_err("an unusable counter cannot issue a token");
        let text = error.to_string();
        let shown = if counter == "a list" {
            "WRONGTYPE"
        } else {
            counter
        };
        assert!(
            text.contains(&fence_key(&name)) && text.contains(shown),
            "{fencing:?} with counter {counter:?}: the error should name the key and what it \
             holds: {error:?}"
        );
        assert!(
            !matches!(
                error,
                Error::Contended { .. } | Error::QuorumUnavailable { .. }
            ),
            "{fencing:?} with counter {counter:?}: not contention, not an unavailable node: \
             {error:?}"
        );
        manager.settle().await;
        assert!(
            common::nothing_left(&urls, &name),
            "{fencing:?} with counter {counter:?}: the attempt left keys: {:?}",
            common::lock_entries(&urls, &name)
        );
    }
}

/// Quorum fencing's second round finds our key gone (deleted between the
/// rounds): that is not contention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_gone_between_the_quorum_rounds_is_not_contention() {
    let cluster = quorumlock::testkit::TestCluster::start_proxied(5)
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    let slow = quorumlock::testkit::Delay::fixed(Duration::from_millis(40));
    for i in 0..5 {
        cluster
            .proxy(i)
            .expect("proxied")
            .set_latency_to_client(slow);
    }
    let direct: Vec<String> = (0..5)
        .map(|i| cluster.direct_url(i).expect("index"))
        .collect();
    let manager = manager(cluster.urls(), Fencing::Quorum);
    let name = resource("vanishing");
    // Deletes the lock key on every node as soon as it appears, while the
    // first round's replies are still held back by the proxies.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deleter = {
        let (stop, direct, key) = (
            Arc::clone(&stop),
            direct.clone(),
            quorumlock::internals::lock_key(&name),
        );
        std::thread::spawn(move || {
            let mut conns: Vec<_> = direct.iter().map(|url| connect(url)).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for conn in &mut conns {
                    let _: () = redis::cmd("DEL").arg(&key).query(conn).expect("DEL");
                }
            }
        })
    };
    let result = manager.lock(&name).no_wait().await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    deleter.join().expect("deleter");
    match result {
        Err(Error::Contended { .. }) => {
            panic!("our own key vanishing between the rounds was reported as contention")
        }
        Err(error) => eprintln!("reported as: {error}"),
        Ok(lock) => panic!("a lock whose keys were deleted was granted: {lock:?}"),
    }
}

/// `SCRIPT FLUSH` on every node.
fn flush_scripts(urls: &[String]) {
    for url in urls {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut connect(url))
            .expect("SCRIPT FLUSH");
    }
}

/// A node that lost its script cache (SCRIPT FLUSH, or a restart met while
/// loading) answers NOSCRIPT: nothing ran there. The request is sent once
/// more within its round after the scripts are loaded again, so the node
/// is up and the lock is granted; nothing is left behind its release.
/// (Without the retry, the counter node's first answer was a failure though
/// every node was up.)
#[tokio::test]
async fn a_flushed_script_cache_costs_no_attempt() {
    let cluster = cluster(5);
    let urls = cluster.urls();
    let manager = manager(urls.clone(), Fencing::CounterNode { node: 0 });
    // Connect (and load the scripts) first, then flush them.
    let mut tokens = sequential_tokens(&manager, &resource("warm"), 1).await;
    flush_scripts(&urls[..1]);
    let name = resource("noscript");
    let first = manager.lock(&name).no_wait().await;
    let lock = first.unwrap_or_else(|error| {
        panic!("every node is up and the scripts can be loaded again; got {error}")
    });
    tokens.push(lock.token().expect("fencing is on"));
    lock.release().await.expect("release");
    manager.settle().await;
    assert!(
        common::nothing_left(&urls, &name),
        "keys left after a NOSCRIPT attempt: {:?}",
        common::lock_entries(&urls, &name)
    );
    tokens.extend(sequential_tokens(&manager, &name, 2).await);
    assert_strictly_increasing(&tokens, "across SCRIPT FLUSH");
}

/// Scripts flushed on every node while a lock is held: its extension and
/// its release each run once more after loading them, and succeed. (Without
/// the retry the extension failed with `QuorumUnavailable` while the lock
/// was valid.)
#[tokio::test]
async fn an_extension_and_a_release_survive_a_flushed_script_cache() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let manager = manager(urls.clone(), Fencing::CounterNode { node: 0 });
    let name = resource("flushed-while-held");
    let mut lock = manager.lock(&name).await.expect("lock");
    flush_scripts(&urls);
    lock.extend(Duration::from_secs(10))
        .await
        .unwrap_or_else(|error| panic!("a valid lock's extension failed: {error}"));
    flush_scripts(&urls);
    lock.release()
        .await
        .unwrap_or_else(|error| panic!("release failed: {error}"));
    manager.settle().await;
    assert!(
        common::nothing_left(&urls, &name),
        "keys left after the release: {:?}",
        common::lock_entries(&urls, &name)
    );
}

/// A fencing counter that someone gave an expiry (`PEXPIRE`) loses it at
/// its next use: left to run out, the counter would start again from the
/// node's clock, below the tokens it issued. (Without the repair the
/// second token here was below the first.)
#[tokio::test]
async fn a_counter_given_an_expiry_keeps_counting() {
    let cluster = cluster(3);
    let urls = cluster.urls();
    let manager = manager(urls.clone(), Fencing::CounterNode { node: 0 });
    let name = resource("expiring-counter");
    let mut tokens = sequential_tokens(&manager, &name, 1).await;
    // Far ahead of the node's clock (as after tokens raised by a faster
    // clock), and set to expire by someone else.
    let ahead = tokens[0].get() + 1_000_000_000_000;
    let _: () = redis::cmd("SET")
        .arg(fence_key(&name))
        .arg(ahead)
        .arg("PX")
        .arg(400)
        .query(&mut connect(&urls[0]))
        .expect("SET");
    tokens.extend(sequential_tokens(&manager, &name, 1).await);
    let left: i64 = redis::cmd("PTTL")
        .arg(fence_key(&name))
        .query(&mut connect(&urls[0]))
        .expect("PTTL");
    assert_eq!(left, -1, "the counter kept an expiry ({left} ms left)");
    tokio::time::sleep(Duration::from_millis(600)).await;
    tokens.extend(sequential_tokens(&manager, &name, 1).await);
    assert!(
        tokens[1].get() > ahead,
        "tokens: {tokens:?}; counter set to {ahead}"
    );
    assert_strictly_increasing(&tokens, "across the counter's expiry");
}

/// A request that met NOSCRIPT is sent once more only while its round is
/// open. Here the attempt is refused (nodes 0-2 are held by someone else)
/// while node 4 reloads the scripts; the rollback goes to node 4 and runs.
/// A second send after that would set our key behind the rollback: an
/// orphan for a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_not_sent_again_once_its_round_is_decided() {
    let cluster = quorumlock::testkit::TestCluster::start_proxied(5)
        .unwrap_or_else(|e| panic!("cannot start a proxied cluster: {e}"));
    let manager = builder(cluster.urls())
        .ttl(Duration::from_secs(10))
        // timing: a long timeout keeps the slowed request's round open until the test has decided it
        .node_timeout(Duration::from_secs(2))
        .fencing(Fencing::Quorum)
        .build()
        .expect("valid settings");
    // Connected, the scripts loaded.
    sequential_tokens(&manager, &resource("warm"), 1).await;
    let name = resource("closed-round");
    for node in 0..3 {
        common::cluster::held_briefly_by_someone_else(
            &cluster.direct_url(node).expect("node"),
            &quorumlock::internals::lock_key(&name),
            20_000,
        );
    }
    let node_4 = cluster.direct_url(4).expect("node");
    flush_scripts(std::slice::from_ref(&node_4));
    // Node 4 answers NOSCRIPT at 200 ms and loads the scripts at once (its
    // replies are late, not its work); the refusals decide the round at
    // 300 ms, and the rollback then finds the scripts there and runs; the
    // second send would follow it at 400 ms.
    let late = |node: usize, ms: u64| {
        cluster
            .proxy(node)
            .expect("proxied")
            .set_latency_to_client(quorumlock::testkit::Delay::fixed(Duration::from_millis(ms)));
    };
    late(4, 200);
    for node in 0..3 {
        late(node, 300);
    }
    let attempt = manager.lock(&name).no_wait().await;
    assert!(
        matches!(attempt, Err(Error::Contended { .. })),
        "held on three of five nodes: {attempt:?}"
    );
    // Node 4's NOSCRIPT, the reload and what would follow, all well
    // within the round's 2 s bound.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    manager.settle().await;
    assert_eq!(
        common::lock_entry(&node_4, &name),
        None,
        "a request sent again after its round was decided left a key behind its rollback"
    );
}
