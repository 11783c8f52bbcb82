//! TLS on real servers: nodes serving a TLS port with certificates made
//! at test time (no key is checked in). Locks, extensions, releases,
//! waiting and fencing work over `rediss://`; a client that trusts another
//! CA gets a typed error at once; a server that requires client
//! certificates takes only clients that present one.
#![cfg(feature = "tls")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{builder, resource};
use quorumlock::testkit::{ClusterOptions, TestCertificates, TestCluster, TlsNodes};
use quorumlock::{
    Error, Fence, FencedRedis, Fencing, FencingToken, LockManager, NodeErrorKind, Tls,
};
use tokio::time::Instant;

fn tls_cluster(n: usize, require_client_cert: bool) -> (TestCluster, Arc<TestCertificates>) {
    let certificates = Arc::new(TestCertificates::generate().expect("certificates"));
    let options = ClusterOptions {
        tls: Some(TlsNodes {
            certificates: Arc::clone(&certificates),
            require_client_cert,
        }),
        ..ClusterOptions::default()
    };
    let cluster = TestCluster::start_with(n, &options).expect("a TLS cluster");
    (cluster, certificates)
}

fn trusting(certificates: &TestCertificates) -> Tls {
    Tls::new().ca_pem(certificates.ca_pem())
}

fn manager(urls: Vec<String>, tls: Tls, fencing: Fencing) -> LockManager {
    builder(urls)
        .fencing(fencing)
        .tls(tls)
        .unavailable_retry(quorumlock::Backoff::none())
        .build()
        .expect("valid settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_waits_and_fencing_work_over_tls() {
    let (cluster, certificates) = tls_cluster(3, false);
    let urls = cluster.tls_urls().expect("TLS ports");
    assert!(
        urls.iter().all(|url| url.starts_with("rediss://")),
        "{urls:?}"
    );
    for fencing in [Fencing::CounterNode { node: 0 }, Fencing::Quorum] {
        let manager = manager(urls.clone(), trusting(&certificates), fencing);
        let r = resource("tls");
        let mut lock = manager.lock(&r).await.expect("lock over TLS");
        let token = lock.token().expect("fencing on");
        lock.extend(Duration::from_secs(10))
            .await
            .expect("extend over TLS");
        let waiting = tokio::spawn({
            let (manager, r) = (manager.clone(), r.clone());
            async move { manager.lock(&r).wait(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        lock.release().await.expect("release over TLS");
        let next = waiting
            .await
            .expect("no panic")
            .expect("woken over TLS and acquired");
        assert!(next.token().expect("fencing on") > token, "{fencing:?}");
        next.release().await.expect("release");
        assert!(manager.quarantined_nodes().is_empty());
        assert!(manager.settle().await);
    }

    // Fenced storage over TLS.
    let (storage_node, storage_certificates) = tls_cluster(1, false);
    let storage_url = storage_node.tls_urls().expect("TLS port").remove(0);
    let storage =
        FencedRedis::with_tls(&storage_url, trusting(&storage_certificates)).expect("valid URL");
    let manager = manager(urls, trusting(&certificates), Fencing::default());
    let lock = manager.lock("tls-order").await.expect("free");
    storage
        .set(
            &lock.fence().expect("fencing on"),
            "tls-order:state",
            "paid",
        )
        .await
        .expect("a fenced write over TLS");
    let stale = Fence::new("tls-order", FencingToken::new(0)).expect("a name");
    assert!(matches!(
        storage.set(&stale, "tls-order:state", "void").await,
        Err(Error::FencedOut { .. })
    ));
    lock.release().await.expect("release");
}

/// The node errors of a failed acquisition.
fn node_errors(error: &Error) -> Vec<quorumlock::NodeError> {
    match error {
        Error::QuorumUnavailable { errors, .. } => errors.clone(),
        other => panic!("expected the nodes to fail, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_trusts_another_ca_fails_at_once_with_a_typed_error() {
    let (cluster, _) = tls_cluster(3, false);
    let stranger = TestCertificates::generate().expect("another CA");
    let manager = manager(
        cluster.tls_urls().expect("TLS ports"),
        trusting(&stranger),
        Fencing::Off,
    );
    let started = Instant::now();
    let error = manager
        .lock(&resource("tls-wrong-ca"))
        .no_wait()
        .await
        .expect_err("the nodes' certificates are not trusted");
    let took = started.elapsed();
    let errors = node_errors(&error);
    assert!(
        !errors.is_empty()
            && errors.iter().all(|e| matches!(&e.kind,
                NodeErrorKind::Connect(why) if why.to_lowercase().contains("certificate"))),
        "{error}"
    );
    // Bounded by the node timeout (500 ms in the test settings), not a hang.
    assert!(took < Duration::from_secs(3), "took {took:?}: {error}");
    assert!(error.is_unavailable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_takes_only_clients_with_a_certificate() {
    let (cluster, certificates) = tls_cluster(3, true);
    let urls = cluster.tls_urls().expect("TLS ports");
    let anonymous = manager(urls.clone(), trusting(&certificates), Fencing::Off);
    let error = anonymous
        .lock(&resource("mtls-anonymous"))
        .no_wait()
        .await
        .expect_err("a client without a certificate is refused");
    assert!(!node_errors(&error).is_empty(), "{error}");

    let identified = manager(
        urls,
        trusting(&certificates)
            .client_cert_pem(certificates.client_cert_pem())
            .client_key_pem(certificates.client_key_pem()),
        Fencing::default(),
    );
    let lock = identified
        .lock(&resource("mtls"))
        .await
        .expect("a client with a certificate is taken");
    assert!(lock.token().is_some());
    lock.release().await.expect("release over mutual TLS");
}

/// A client certificate without its key (or the other way round) is a
/// typed error when the manager or the storage client is built, naming
/// what is missing, whatever the URLs' scheme; it never reaches a node.
#[test]
fn half_a_client_identity_is_refused_at_build() {
    let certificates = TestCertificates::generate().expect("certificates");
    let halves = [
        (
            "certificate",
            trusting(&certificates).client_cert_pem(certificates.client_cert_pem()),
        ),
        (
            "key",
            trusting(&certificates).client_key_pem(certificates.client_key_pem()),
        ),
    ];
    for scheme in ["rediss", "redis"] {
        let urls = [1, 2, 3].map(|port| format!("{scheme}://127.0.0.1:{port}"));
        for (given, tls) in &halves {
            // settings: the builder's TLS check is the subject; nothing connects
            let built = LockManager::builder()
                .nodes(urls.clone())
                .tls(tls.clone())
                .build();
            match built {
                Err(Error::InvalidConfig {
                    setting: "tls",
                    reason,
                }) => {
                    assert!(
                        reason.contains(&format!("a client {given} without")),
                        "{reason}"
                    )
                }
                other => panic!("{scheme}: a client {given} alone: {other:?}"),
            }
            let storage = FencedRedis::with_tls(&urls[0], tls.clone());
            assert!(
                matches!(&storage, Err(Error::InvalidArgument { argument: "tls", reason })
                    if reason.contains("without")),
                "{scheme}: storage with a client {given} alone: {storage:?}"
            );
        }
    }
}
