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
    // settings: a bare manager (plain SET NX PX, no guard, no retries) on the wire under test; each caller passes its timeout
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
        // New connections to nodes 1 and 2, proven by a lock seen there
        // (a round decided before a node's connection is ready sends it
        // nothing, so it may take more than one), then time for anything
        // re-sent to land. Each lock seen on a node is one SET there.
        let direct: Vec<String> = (0..3)
            .map(|i| cluster.direct_url(i).expect("url"))
            .collect();
        let mut seen = [0u64; 3];
        for _ in 0..10 {
            let next = manager
                .lock(&resource("after"))
                .no_wait()
                .await
                .expect("the nodes are back");
            for i in 1..3 {
                let held = common::eventually(Duration::from_secs(1), || {
                    common::stored_value(&direct[i], next.resource()).as_deref()
                        == Some(next.value())
                })
                .await;
                seen[i] += u64::from(held);
            }
            next.release().await.expect("released");
            if seen[1] > 0 && seen[2] > 0 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        for i in 1..3 {
            let url = &direct[i];
            assert!(
                seen[i] > 0,
                "{wire:?}: no lock after the fault reached node {i}"
            );
            let sets = common::command_calls(url, "set");
            assert_eq!(
                sets, seen[i],
                "{wire:?}: node {i} ran {sets} SETs since the fault; only the {} lock(s) after \
                 it seen there should have reached it (the broken attempt's SET was sent again)",
                seen[i]
            );
            let mut conn = connection(url).await;
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

/// Three proxied nodes, a lock held on them, and two other servers that
/// know the scripts, to which the proxies of nodes 0 and 1 send every new
/// stream but redis-rs' (those begin with `CLIENT SETINFO`), as a
/// round-robin or changing DNS name could. Counted, the other servers
/// would grant a second holder.
struct TwoServersBehindOneName {
    cluster: TestCluster,
    others: TestCluster,
    name: String,
    held: quorumlock::Lock,
    /// Connections each other server had received before the detours.
    before: Vec<u64>,
}

impl TwoServersBehindOneName {
    async fn start() -> Self {
        let cluster = TestCluster::start_proxied(3).expect("cluster");
        let others = TestCluster::start(2).expect("the other servers");
        let name = resource("two-servers");
        // Without fencing: every node answers alike (a counter node's
        // refusal would decide the round on its own).
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
            let pick: quorumlock::testkit::FirstBytes =
                Arc::new(|first: &[u8]| !first.windows(b"SETINFO".len()).any(|w| w == b"SETINFO"));
            cluster
                .proxy(i)
                .expect("proxied")
                .set_detour(Some((pick, address_of(url))));
        }
        Self {
            cluster,
            others,
            name,
            held,
            before,
        }
    }

    /// Fails the test unless the detours took streams to the other
    /// servers (ours, to count, is one; the detour's are the rest).
    async fn assert_detoured(&self) {
        for (url, &before) in self.others.urls().iter().zip(&self.before) {
            let after = connections_received(url).await;
            assert!(
                after > before + 1,
                "the detour took no stream to {url} ({before} connections before, {after} \
                 after): the attack did not run"
            );
        }
    }
}

/// Attack (a name that leads to two servers): the guard observes a new
/// connection's server over redis-rs' stream, so the lock requests' own
/// stream must not reach another one; a connection whose streams reach
/// different servers is refused. Narrow wire only: on redis-rs the
/// requests share the observed stream.
#[tokio::test]
async fn lock_requests_reach_only_an_observed_server() {
    let attack = TwoServersBehindOneName::start().await;
    // The first holder keeps nodes 0 and 1 (a majority); node 2, the one
    // not detoured, grants the second too. No node refuses, so the round
    // is decided by the failures and names them, whichever answers first
    // (with a refusal it was decided as contended when node 2 answered
    // before the detoured connects were refused: ci20, under disk load).
    let key = quorumlock::internals::key_of(quorumlock::internals::KeyKind::Lock, &attack.name);
    let _: i64 = redis::cmd("DEL")
        .arg(&key)
        .query(&mut common::connect(
            &attack.cluster.direct_url(2).expect("node 2"),
        ))
        .expect("DEL on node 2");
    // Time for the connects to finish under a loaded disk: a request that
    // gives up on its connection first leaves the attack unrun (the
    // mutant suite's run of this test under a disk-sync load, ci24).
    let second = builder(attack.cluster.urls())
        .fencing(Fencing::Off)
        .wire(Wire::Narrow)
        .unavailable_retry(Backoff::none())
        // timing: long enough for the connects under a loaded disk (below)
        .node_timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(3))
        .build()
        .expect("valid");
    let outcome = second.lock(&attack.name).no_wait().await;
    attack.assert_detoured().await;
    let refused = match &outcome {
        Ok(lock) => panic!(
            "a second holder got in through servers its guard never observed while the first \
             holds the lock: {lock:?}"
        ),
        Err(error) => error,
    };
    // Refused because a detoured node's connection was found to reach two
    // servers, not for any other reason.
    let errors = match refused {
        quorumlock::Error::QuorumUnavailable { errors, .. } => errors.as_slice(),
        _ => &[],
    };
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("reach different servers")),
        "refused, but no node's connection was refused for reaching two servers: {refused}"
    );
    // Cleanup only: with node 2's key gone, the release may find the lock
    // on too few nodes (its own new streams are detoured too).
    let _ = attack.held.release().await;
}

/// The same attack when the observation on connect times out: the
/// connection then opens (quarantined until an observation succeeds),
/// without the check that its streams reach one server. The observation
/// that lets the node count again goes over redis-rs' stream, so the
/// lock requests must too, on that connection.
#[tokio::test]
async fn lock_requests_reach_only_an_observed_server_after_a_slow_connect() {
    let attack = TwoServersBehindOneName::start().await;
    // Requests to nodes 0 and 1 take longer than the connect bound. The
    // detours read each new stream's first bytes before they pass them
    // on, without delay: redis-rs' handshake is quick, the observation
    // after it (and the check of the two streams) is not.
    for i in 0..2 {
        attack
            .cluster
            .proxy(i)
            .expect("proxied")
            .set_latency_to_node(quorumlock::testkit::Delay::fixed(Duration::from_millis(
                1200,
            )));
    }
    let second = builder(attack.cluster.urls())
        .fencing(Fencing::Off)
        .wire(Wire::Narrow)
        .connect_timeout(Duration::from_secs(1))
        .unavailable_retry(Backoff::none())
        .build()
        .expect("valid");
    let first = second.lock(&attack.name).no_wait().await;
    assert!(
        first.is_err(),
        "a lock while no node is observed: {first:?}"
    );
    // The connects go on past the attempt's deadline, until their bound.
    let timed_out = common::eventually(Duration::from_secs(5), || {
        second.quarantined_nodes().len() >= 2
    })
    .await;
    let quarantined = second.quarantined_nodes();
    assert!(
        timed_out,
        "the connects' observations did not time out, so the attack did not run: the lock \
         gave {first:?}; quarantined: {quarantined:?}; health: {:?}",
        second.health()
    );
    for i in 0..2 {
        attack
            .cluster
            .proxy(i)
            .expect("proxied")
            .set_latency_to_node(Default::default());
    }
    // The nodes are observed again in the background (once per clock
    // interval) and count again: then the lock is refused, held by the
    // first holder on the servers observed.
    let until = Instant::now() + Duration::from_secs(8);
    let mut last = first;
    while Instant::now() < until {
        last = second.lock(&attack.name).no_wait().await;
        match &last {
            Ok(_) => break,
            Err(quorumlock::Error::Contended { .. }) => break,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    attack.assert_detoured().await;
    assert!(
        matches!(last, Err(quorumlock::Error::Contended { .. })),
        "after a slow connect, a second holder got in through servers its guard never \
         observed (or the nodes never counted again) while the first holds the lock: \
         {last:?} (quarantined: {:?})",
        second.quarantined_nodes()
    );
    attack.held.release().await.expect("released");
}
