//! The testkit's fault proxy does what each fault says, and locks behave
//! through it: a slow node is not waited for.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use quorumlock::testkit::{Delay, TestCluster};

fn open(url: &str) -> TcpStream {
    let stream = TcpStream::connect(url.trim_start_matches("redis://")).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream
}

/// Sends PING; returns how long PONG took, or None if none came in `limit`.
fn ping(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    stream.set_read_timeout(Some(limit)).expect("timeout");
    let started = Instant::now();
    stream.write_all(b"PING\r\n").ok()?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).ok()?;
    assert_eq!(&reply, b"+PONG\r\n");
    Some(started.elapsed())
}

fn proxied(n: usize) -> TestCluster {
    TestCluster::start_proxied(n).unwrap_or_else(|e| panic!("cannot start the cluster: {e}"))
}

#[test]
fn each_fault_does_what_it_says() {
    let cluster = proxied(1);
    let proxy = cluster.proxy(0).expect("proxied");
    let url = cluster.url(0).expect("url");
    assert_ne!(url, cluster.direct_url(0).expect("url"));
    let mut stream = open(&url);
    assert!(
        ping(&mut stream, Duration::from_secs(2)).is_some(),
        "healthy"
    );

    // Latency, per direction.
    let ms = Duration::from_millis;
    proxy.set_latency_to_node(Delay::fixed(ms(60)));
    proxy.set_latency_to_client(Delay::fixed(ms(40)));
    let rtt = ping(&mut stream, Duration::from_secs(2)).expect("slow but answered");
    assert!(rtt >= ms(100), "rtt {rtt:?}");
    proxy.heal();

    // Unresponsive: held, not lost.
    proxy.set_unresponsive(true);
    assert!(ping(&mut stream, ms(300)).is_none(), "no answer while held");
    proxy.set_unresponsive(false);
    let mut late = [0u8; 7];
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    stream
        .read_exact(&mut late)
        .expect("the held reply arrives");
    assert_eq!(&late, b"+PONG\r\n");

    // Refusing new connections leaves established ones alone.
    proxy.set_refuse_new(true);
    let mut refused = open(&url);
    assert!(
        ping(&mut refused, ms(500)).is_none(),
        "new connection refused"
    );
    assert!(ping(&mut stream, Duration::from_secs(2)).is_some());
    proxy.set_refuse_new(false);

    // Dropping connections ends established ones; new ones work.
    proxy.drop_connections();
    let mut buffer = [0u8; 1];
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    assert!(
        matches!(stream.read(&mut buffer), Ok(0) | Err(_)),
        "the connection was closed"
    );
    let mut fresh = open(&url);
    assert!(ping(&mut fresh, Duration::from_secs(2)).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_node_is_not_waited_for() {
    let cluster = proxied(5);
    let manager = common::builder(cluster.urls())
        // timing: a slowed node's delay, below this, must not be waited for
        .node_timeout(Duration::from_secs(1))
        .build()
        .expect("valid");
    let name = common::resource("slow-node");
    // Node 4, not the counter node: a quorum of fast nodes decides.
    let slow = Delay::fixed(Duration::from_millis(400));
    cluster.proxy(4).expect("proxied").set_latency(slow);
    for _ in 0..5 {
        let started = Instant::now();
        let lock = manager.lock(&name).await.expect("a fast quorum");
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(400),
            "waited for the slow node: {took:?}"
        );
        lock.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_waits_for_releases_on_slow_nodes() {
    let cluster = proxied(5);
    // The slowed node answers 2 s late, well after the others even when
    // their fsyncs crawl under a busy disk; the bound is longer still.
    let manager = common::builder(cluster.urls())
        // timing: the slowed node answers 2 s late: the timeout is longer still
        .node_timeout(Duration::from_secs(3))
        .build()
        .expect("valid");
    let name = common::resource("settle");
    // The release can return before the slowed node only if a quorum of
    // the others held the key: with 5 nodes, 4 holders. A node whose
    // connection was not ready when the acquisition was decided never got
    // the SET (likely on a fresh manager under a busy disk), so warm every
    // connection first (which also preloads the scripts, making the slowed
    // release one round trip), then take the lock until 4 nodes hold it.
    let holders = |value: &str| -> Vec<usize> {
        (0..cluster.len())
            .filter(|&i| {
                let direct = cluster.direct_url(i).expect("url");
                common::stored_value(&direct, &name).as_deref() == Some(value)
            })
            .collect()
    };
    for warm in 0..3 {
        let name = common::resource(&format!("settle-warm-{warm}"));
        manager
            .lock(&name)
            .await
            .expect("free")
            .release()
            .await
            .expect("release");
    }
    assert!(manager.settle().await, "warm-up settled");
    let mut attempt = 0;
    let (lock, value, held_by) = loop {
        attempt += 1;
        let lock = manager.lock(&name).await.expect("free");
        let value = lock.value().to_owned();
        let held_by = holders(&value);
        if held_by.len() >= 4 {
            break (lock, value, held_by);
        }
        assert!(
            attempt < 10,
            "only nodes {held_by:?} held the key in 10 tries"
        );
        lock.release().await.expect("release");
        assert!(manager.settle().await, "settled between tries");
    };
    let slowed = *held_by.last().expect("4 holders");
    let slow = Delay::fixed(Duration::from_secs(2));
    cluster
        .proxy(slowed)
        .expect("proxied")
        .set_latency_to_node(slow);
    lock.release().await.expect("release");
    let direct = cluster.direct_url(slowed).expect("url");
    assert_eq!(
        common::stored_value(&direct, &name).as_deref(),
        Some(value.as_str()),
        "release returned before the slow node deleted"
    );
    manager.settle().await;
    assert_eq!(common::stored_value(&direct, &name), None, "settled");
}
