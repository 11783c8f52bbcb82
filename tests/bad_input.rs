//! Bad input across the public API, one table: each case must give its
//! typed error, quickly (no hang), without a panic, and leave nothing on
//! the nodes.
//!
//! Some misuse cannot be written at all: a lock is consumed by `release`,
//! so using or extending it afterwards does not compile (see the
//! `compile_fail` example on `Lock::release`), and resources are `&str`, so
//! non-UTF-8 names cannot be passed.

mod common;

use quorumlock::internals::judge::{DATA_SET_KEY, DATA_SET_SEQ_KEY};

use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::pin::Pin;
use std::time::Duration;

use quorumlock::testkit::TestCluster;
use quorumlock::{
    Backoff, Error, Fence, FencedRedis, Fencing, FencingToken, LockManager, NodeErrorKind,
};

type Case = (
    &'static str,
    Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>,
    Box<dyn Fn(&Error) -> bool>,
);

fn build(builder: quorumlock::LockManagerBuilder) -> Result<LockManager, Error> {
    builder.build()
}

fn argument(name: &'static str) -> Box<dyn Fn(&Error) -> bool> {
    Box::new(move |e| matches!(e, Error::InvalidArgument { argument, .. } if *argument == name))
}

fn setting(name: &'static str) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::InvalidConfig { setting, .. } if *setting == name)
}

/// A TCP server that answers anything with bytes no Redis would send.
fn garbage_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("redis://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buffer = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 || stream.write_all(b"?!garbage\x00\xff\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

fn node_failed_with(e: &Error, wanted: fn(&NodeErrorKind) -> bool) -> bool {
    match e {
        Error::QuorumUnavailable { errors, .. } => errors.iter().any(|n| wanted(&n.kind)),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_its_typed_error() {
    let cluster = common::cluster(3);
    let urls = cluster.urls();
    let locked = TestCluster::start_with_args(1, &["--requirepass", "s3cret"]).expect("cluster");
    let garbage = garbage_server();
    let base = || common::builder(urls.clone());
    let manager = base().build().expect("valid");

    // (name, the call, whether its error is the expected one)
    let invalid_settings: Vec<(&str, quorumlock::LockManagerBuilder, &'static str)> = vec![
        // settings: the builder's own check (no nodes) is the subject
        ("no nodes", LockManager::builder(), "nodes"),
        ("unparsable URL", base().node("redis://[::1"), "nodes"),
        (
            "not a redis URL",
            base().node("http://127.0.0.1:80"),
            "nodes",
        ),
        ("duplicate node", base().node(urls[0].clone()), "nodes"),
        ("zero TTL", base().ttl(Duration::ZERO), "ttl"),
        (
            "huge TTL",
            base().ttl(Duration::from_secs(u64::MAX / 2)),
            "ttl",
        ),
        (
            "TTL within node_timeout",
            base().ttl(Duration::from_millis(200)),
            "ttl",
        ),
        (
            "NaN drift factor",
            base().drift_factor(f64::NAN),
            "drift_factor",
        ),
        (
            "counter node out of range",
            base().fencing(Fencing::CounterNode { node: 3 }),
            "fencing",
        ),
        (
            "extend_every longer than the TTL",
            base().extend_every(Duration::from_secs(60)),
            "extend_every",
        ),
        ("zero max_hold", base().max_hold(Duration::ZERO), "max_hold"),
    ];
    let mut cases: Vec<Case> = Vec::new();
    for (name, builder, wanted) in invalid_settings {
        cases.push((
            name,
            Box::pin(async move { build(builder).map(drop) }),
            Box::new(setting(wanted)),
        ));
    }

    let m = manager.clone();
    cases.push((
        "empty resource",
        Box::pin(async move { m.lock("").await.map(drop) }),
        argument("resource"),
    ));
    let m = manager.clone();
    cases.push((
        "resource name with a newline",
        Box::pin(async move { m.lock("orders\nfake-row").await.map(drop) }),
        argument("resource"),
    ));
    let m = manager.clone();
    cases.push((
        "resource name of a megabyte",
        Box::pin(async move { m.lock(&"x".repeat(1 << 20)).await.map(drop) }),
        argument("resource"),
    ));
    let m = manager.clone();
    cases.push((
        "huge TTL on a call",
        Box::pin(async move { m.lock("r").ttl(Duration::MAX).await.map(drop) }),
        argument("ttl"),
    ));
    let m = manager.clone();
    cases.push((
        "sub-millisecond TTL on a call",
        Box::pin(async move {
            m.lock("r")
                .ttl(Duration::from_micros(500))
                .no_wait()
                .await
                .map(drop)
        }),
        argument("ttl"),
    ));
    let not_redis = common::builder(vec![garbage.clone()])
        .unavailable_retry(Backoff::none())
        .build()
        .expect("valid");
    cases.push((
        "a node that is not Redis",
        Box::pin(async move { not_redis.lock("r").await.map(drop) }),
        Box::new(|e| {
            node_failed_with(e, |k| {
                matches!(k, NodeErrorKind::Connect(_) | NodeErrorKind::Redis(_))
            })
        }),
    ));
    let no_password = common::builder(locked.urls())
        .unavailable_retry(Backoff::none())
        .build()
        .expect("valid");
    cases.push((
        "a node that needs a password",
        Box::pin(async move { no_password.lock("r").await.map(drop) }),
        Box::new(|e| {
            // Said first, not buried in a quarantine text.
            node_failed_with(e, |k| {
                k.to_string()
                    .starts_with("cannot connect: authentication required")
            })
        }),
    ));
    let wrong_password = common::builder(vec![
        locked
            .url(0)
            .expect("url")
            .replace("redis://", "redis://:wrong@"),
    ])
    .unavailable_retry(Backoff::none())
    .build()
    .expect("valid");
    cases.push((
        "a wrong password",
        Box::pin(async move { wrong_password.lock("r").await.map(drop) }),
        Box::new(|e| {
            node_failed_with(e, |k| {
                k.to_string()
                    .starts_with("cannot connect: authentication failed")
            })
        }),
    ));
    cases.push((
        "storage: unparsable URL",
        Box::pin(async { FencedRedis::new("redis://[::1").map(drop) }),
        argument("url"),
    ));
    cases.push((
        "storage: a fence for an empty resource name",
        Box::pin(async { Fence::new("", FencingToken::new(1)).map(drop) }),
        argument("resource"),
    ));
    let storage = FencedRedis::new(&urls[0]).expect("valid url");
    cases.push((
        "storage: a data key in the fence's bookkeeping namespace",
        Box::pin(async move {
            let fence = Fence::new("fence-namespace", FencingToken::new(1))?;
            storage
                .delete(&fence, "quorumlock:fenced:fence-namespace")
                .await
        }),
        argument("key"),
    ));
    // A read lock's fence and a multi-resource lock's unnamed fence do
    // not compile (the `kind` module's compile_fail doctest).
    let m = manager.clone();
    cases.push((
        "storage: a fence for a resource the lock does not hold",
        Box::pin(async move {
            let both = m.lock_many(["fence-a", "fence-b"]).await?;
            let stranger = both.fence_for("fence-c").map(drop);
            both.release().await?;
            stranger
        }),
        argument("resource"),
    ));
    // Work that could not be kept alive is refused before the lock is
    // asked for: no key, no fencing counter, no queue entry (checked below).
    let m = manager.clone();
    cases.push((
        "run with a TTL too short to keep alive",
        Box::pin(async move {
            // Above the round trips' 500 ms, below an extension's
            // TTL/3 + 500 ms.
            m.lock("run-short")
                .ttl(Duration::from_millis(700))
                .run(|_lease| async {})
                .await
        }),
        argument("extend_every"),
    ));
    let m = manager.clone();
    cases.push((
        "run_or_fallback with a TTL too short to keep alive",
        Box::pin(async move {
            m.read("run-short")
                .ttl(Duration::from_millis(700))
                .run_or_fallback(|_lease| async {}, || async {})
                .await
                .map(drop)
        }),
        argument("extend_every"),
    ));
    let m = manager.clone();
    cases.push((
        "keep_alive outside a tokio runtime",
        Box::pin(async move {
            let lock = m.lock("outside-runtime").await?;
            let handed_over = std::thread::spawn(move || lock.keep_alive().map(drop));
            let result = handed_over.join().expect("no panic");
            // The dropped lock could not release outside a runtime.
            let _ = m.lock("outside-runtime").ttl(Duration::from_secs(1)).await;
            result
        }),
        Box::new(|e| matches!(e, Error::NoRuntime)),
    ));

    assert!(cases.len() >= 12, "{} cases", cases.len());
    for (name, call, expected) in cases {
        let result = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .unwrap_or_else(|_| panic!("{name}: hung"));
        match result {
            Err(error) => {
                eprintln!("{name}: {error}");
                assert!(expected(&error), "{name}: unexpected error {error:?}");
                assert!(!error.to_string().is_empty());
            }
            Ok(()) => panic!("{name}: accepted"),
        }
    }
    // Nothing written on the nodes, but by the runtime case, which took a
    // lock on purpose before misusing it, the fence cases, whose locks
    // leave their fencing counters, and the node guard's mark of each
    // node's data set.
    for url in &urls {
        let mut conn = common::connect(url);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("quorumlock:*")
            .query(&mut conn)
            .expect("KEYS");
        assert!(
            keys.iter().all(|k| k.contains("outside-runtime")
                || (k.ends_with("}:fence") && k.contains("{fence-"))
                || [DATA_SET_KEY, DATA_SET_SEQ_KEY].contains(&k.as_str())),
            "{url} holds {keys:?}"
        );
    }
}

/// docs/guide.md's error table has a row for every variant of `Error`
/// (it lacked `SplitVote` and `SplitView`).
#[test]
fn the_guide_lists_every_error_variant() {
    let root = env!("CARGO_MANIFEST_DIR");
    let source = std::fs::read_to_string(format!("{root}/src/error.rs")).expect("src/error.rs");
    let guide = std::fs::read_to_string(format!("{root}/docs/guide.md")).expect("docs/guide.md");
    let body = source
        .split("pub enum Error {")
        .nth(1)
        .and_then(|rest| rest.split("\n}\n").next())
        .expect("the Error enum");
    let variants: Vec<&str> = body
        .lines()
        .filter_map(|line| line.strip_prefix("    "))
        .filter(|line| line.starts_with(|c: char| c.is_ascii_uppercase()))
        .filter_map(|line| line.split([' ', '(', ',', '{']).next())
        .collect();
    assert!(variants.len() > 10, "variants read: {variants:?}");
    let missing: Vec<&&str> = variants
        .iter()
        .filter(|variant| !guide.contains(&format!("| `{variant}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/guide.md's error table has no row for {missing:?}"
    );
}
