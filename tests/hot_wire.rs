//! The hot-path wire on real servers: the lock requests take their own
//! connection (also over TLS, with a client certificate); a request is
//! never sent twice, also across a reconnect; a connection that breaks
//! fails the requests in flight on it at once, not at their deadline; the
//! requests reach only a server the node guard observed.
//! Each test runs on both wires: what the narrow wire promises is what
//! redis-rs gave.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{builder, resource};
use quorumlock::testkit::TestCluster;
use quorumlock::{Backoff, Fencing, LockManager, NodeGuard, Wire};
use tokio::time::Instant;

const WIRES: [Wire; 2] = [Wire::Narrow, Wire::RedisRs];

async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// The clients connected to the node `probe` leads to, other than `probe`
/// itself and pub/sub subscribers.
async fn clients_of(probe: &redis::aio::MultiplexedConnection) -> usize {
    let mut conn = probe.clone();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter(|line| !line.contains("cmd=client|list") && !line.contains("flags=P"))
        .count()
}

/// `INFO section` of the node at `url`.
async fn info(url: &str, section: &str) -> String {
    let mut conn = connection(url).await;
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await
        .expect("INFO")
}

/// How many `SET` commands the node at `url` ran since its stats were
/// reset.
async fn sets_run(url: &str) -> u64 {
    info(url, "commandstats")
        .await
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_set:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

#[tokio::test]
async fn lock_requests_take_their_own_connection_on_the_narrow_wire() {
    let cluster = TestCluster::start(3).expect("cluster");
    let mut probes = Vec::new();
    for url in cluster.urls() {
        probes.push((url.clone(), connection(&url).await));
    }
    for (wire, expected) in [(Wire::Narrow, 2), (Wire::RedisRs, 1)] {
        let manager = builder(cluster.urls()).wire(wire).build().expect("valid");
        let lock = manager
            .lock(&resource("own-connection"))
            .no_wait()
            .await
            .expect("free");
        lock.release().await.expect("released");
        for (url, probe) in &probes {
            let seen = clients_of(probe).await;
            assert_eq!(
                seen, expected,
                "{wire:?}: {url} has {seen} connections from the manager, expected {expected}"
            );
        }
        drop(manager);
        // The next manager's count starts from nothing.
        let deadline = Instant::now() + Duration::from_secs(10);
        for (url, probe) in &probes {
            while clients_of(probe).await != 0 {
                assert!(
                    Instant::now() < deadline,
                    "{url} kept a dropped manager's connections"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// A plain `SET NX PX` lock (fencing and the guard off, no retries), on
/// three nodes behind proxies.
fn plain(urls: Vec<String>, wire: Wire, node_timeout: Duration) -> LockManager {
    LockManager::builder()
        .nodes(urls)
        .wire(wire)
        .fencing(Fencing::Off)
        .node_guard(NodeGuard::disabled())
        .unavailable_retry(Backoff::none())
        .node_timeout(node_timeout)
        .ttl(Duration::from_secs(60))
        .build()
        .expect("valid")
}

#[tokio::test]
async fn a_broken_connection_fails_its_requests_at_once_and_sends_none_again() {
    let cluster = TestCluster::start_proxied(3).expect("cluster");
    for wire in WIRES {
        let node_timeout = Duration::from_secs(20);
        let manager = Arc::new(plain(cluster.urls(), wire, node_timeout));
        // Connected and warm.
        let warm = manager
            .lock(&resource("warm"))
            .no_wait()
            .await
            .expect("free");
        warm.release().await.expect("released");
        for i in 1..3 {
            let mut conn = connection(&cluster.direct_url(i).expect("url")).await;
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut conn)
                .await
                .expect("RESETSTAT");
            cluster.proxy(i).expect("proxied").set_unresponsive(true);
        }
        let name = resource("broken");
        let attempt = tokio::spawn({
            let (manager, name) = (Arc::clone(&manager), name.clone());
            async move {
                let started = Instant::now();
                let outcome = manager.lock(&name).no_wait().await.map(|_| ());
                (outcome, started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        for i in 1..3 {
            // The held bytes go with the connections.
            cluster.proxy(i).expect("proxied").drop_connections();
        }
        let (outcome, took) = attempt.await.expect("the attempt ran");
        assert!(
            outcome.is_err(),
            "{wire:?}: a lock granted by one node of three"
        );
        assert!(
            took < node_timeout / 2,
            "{wire:?}: the attempt ended {took:?} after it began, not when its connections \
             broke (its deadline was {node_timeout:?})"
        );
        for i in 1..3 {
            cluster.proxy(i).expect("proxied").heal();
        }
        // A new connection, then time for anything re-sent to land.
        let next = manager
            .lock(&resource("after"))
            .no_wait()
            .await
            .expect("the nodes are back");
        next.release().await.expect("released");
        tokio::time::sleep(Duration::from_millis(300)).await;
        for i in 1..3 {
            let url = cluster.direct_url(i).expect("url");
            let sets = sets_run(&url).await;
            assert_eq!(
                sets, 1,
                "{wire:?}: node {i} ran {sets} SETs since the fault; only the lock after it \
                 should have reached it (the broken attempt's SET was sent again)"
            );
            let mut conn = connection(&url).await;
            let key = quorumlock::internals::lock_key(&name);
            let left: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .expect("GET");
            assert_eq!(
                left, None,
                "{wire:?}: node {i} holds the broken attempt's key"
            );
        }
    }
}

/// The address a test URL (`redis://127.0.0.1:PORT`) leads to.
fn address_of(url: &str) -> std::net::SocketAddr {
    let port = url.rsplit(':').next().expect("a port");
    format!("127.0.0.1:{port}").parse().expect("an address")
}

/// Connections the node at `url` has accepted since it started.
async fn connections_received(url: &str) -> u64 {
    info(url, "stats")
        .await
        .lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .map_or(0, |count| count.trim().parse().expect("a count"))
}

/// Attack (a name that leads to two servers): the guard observes a new
/// connection's server over redis-rs' stream, so the lock requests' own
/// stream must not reach another one. Two of three node names lead to
/// two servers each, as a round-robin or changing DNS name could: the old
/// ones, where a holder's keys are, and others that know the scripts and
/// have a data set of their own. A new client's redis-rs streams reach the
/// old servers (and observe them); its other streams reach the others.
/// Counted, the others would grant a second holder; a connection whose
/// streams reach different servers is refused. Narrow wire only: on
/// redis-rs the requests share the observed stream.
#[tokio::test]
async fn lock_requests_reach_only_an_observed_server() {
    let cluster = TestCluster::start_proxied(3).expect("cluster");
    let others = TestCluster::start(2).expect("the other servers");
    let name = resource("two-servers");
    // Without fencing: every node answers alike (a counter node's refusal
    // would decide the round on its own).
    let holder = builder(cluster.urls())
        .fencing(Fencing::Off)
        .build()
        .expect("valid");
    let held = holder
        .lock(&name)
        .ttl(Duration::from_secs(30))
        .no_wait()
        .await
        .expect("free");
    let elsewhere = builder(others.urls())
        .fencing(Fencing::Off)
        .build()
        .expect("valid");
    let other = elsewhere
        .lock(&resource("elsewhere"))
        .no_wait()
        .await
        .expect("free");
    other.release().await.expect("released");
    let mut before = Vec::new();
    for (i, url) in others.urls().iter().enumerate() {
        before.push(connections_received(url).await);
        // redis-rs' streams begin with `CLIENT SETINFO`; every other
        // stream goes to the other server.
        let pick: quorumlock::testkit::FirstBytes =
            Arc::new(|first: &[u8]| !first.windows(b"SETINFO".len()).any(|w| w == b"SETINFO"));
        cluster
            .proxy(i)
            .expect("proxied")
            .set_detour(Some((pick, address_of(url))));
    }
    let second = builder(cluster.urls())
        .fencing(Fencing::Off)
        .wire(Wire::Narrow)
        .unavailable_retry(Backoff::none())
        .build()
        .expect("valid");
    let outcome = second.lock(&name).no_wait().await;
    for (url, before) in others.urls().iter().zip(before) {
        let after = connections_received(url).await;
        // Ours, to count, is one; the detour's are the rest.
        assert!(
            after > before + 1,
            "the detour took no stream to {url} ({before} connections before, {after} after): \
             the attack did not run"
        );
    }
    assert!(
        outcome.is_err(),
        "a second holder got in through servers its guard never observed while the first \
         holds the lock: {outcome:?}"
    );
    held.release().await.expect("released");
}
