//! What the nodes keep per resource locked once: lock and release `n`
//! distinct resources (default 1 000 000, like per-entity names such as
//! `order:123`) with default settings on five local nodes without an
//! append-only file, then read each node's memory and keys; then move
//! every node's clock past a fencing counter's life (`COUNTER_LIFE`, an
//! hour) and read them again.
//!
//!     cargo bench --bench memory -- [n] [tasks]
//!
//! Prints, per node and summed: `used_memory` and keys (with and without
//! an expiry) before, after the locks, and after the counters' life; and
//! the bytes per resource. Default 32 tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use quorumlock::internals::COUNTER_LIFE;
use quorumlock::testkit::{ClusterOptions, TestCluster};
use quorumlock::{LockManager, NodeGuard};

/// One node's memory and keys, as `INFO` reports them.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    used_memory: i64,
    keys: i64,
    expiring: i64,
}

impl Usage {
    fn read(url: &str) -> Usage {
        let client = redis::Client::open(url).expect("node URL");
        let mut connection = client.get_connection().expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .arg("keyspace")
            .query(&mut connection)
            .expect("INFO");
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let mut usage = Usage {
            used_memory: field("used_memory")
                .and_then(|v| v.parse().ok())
                .expect("used_memory"),
            ..Usage::default()
        };
        // db0:keys=3,expires=1,avg_ttl=0
        if let Some(db0) = field("db0") {
            for part in db0.split(',') {
                match part.split_once('=') {
                    Some(("keys", n)) => usage.keys = n.parse().expect("keys"),
                    Some(("expires", n)) => usage.expiring = n.parse().expect("expires"),
                    _ => {}
                }
            }
        }
        usage
    }

    fn of_all(urls: &[String]) -> Vec<Usage> {
        urls.iter().map(|url| Usage::read(url)).collect()
    }
}

fn print(stage: &str, usages: &[Usage]) {
    let total = usages.iter().fold(Usage::default(), |sum, u| Usage {
        used_memory: sum.used_memory + u.used_memory,
        keys: sum.keys + u.keys,
        expiring: sum.expiring + u.expiring,
    });
    println!("{stage}:");
    for (i, u) in usages.iter().enumerate() {
        println!(
            "  node {i}: used_memory {:>12} B, keys {:>9} ({:>9} without expiry)",
            u.used_memory,
            u.keys,
            u.keys - u.expiring
        );
    }
    println!(
        "  all:    used_memory {:>12} B, keys {:>9} ({:>9} without expiry)",
        total.used_memory,
        total.keys,
        total.keys - total.expiring
    );
}

fn per_resource(before: &[Usage], after: &[Usage], n: usize) -> f64 {
    let grown: i64 = after
        .iter()
        .zip(before)
        .map(|(a, b)| a.used_memory - b.used_memory)
        .sum();
    grown as f64 / n as f64
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let n: usize = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let tasks: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(32);
    let cluster = TestCluster::start_with(
        5,
        &ClusterOptions {
            extra_args: vec!["--appendonly".into(), "no".into()],
            fake_clocks: true,
            ..ClusterOptions::default()
        },
    )
    .expect("start 5 nodes");
    let urls = cluster.urls();
    // Default settings; nodes without an append-only file are trusted at
    // once here (nothing restarts).
    let manager = LockManager::builder()
        .nodes(urls.clone())
        .node_guard(NodeGuard::default().trust_restarts())
        .build()
        .expect("valid settings");
    // One lock first: connections made and nodes observed.
    manager
        .lock("memory:warm-up")
        .wait(Duration::from_secs(10))
        .await
        .expect("warm-up lock")
        .release()
        .await
        .expect("release");
    assert!(manager.settle().await);
    let before = Usage::of_all(&urls);
    print("before", &before);

    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let manager = manager.clone();
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    // A per-entity name, as `order:123` is.
                    let name = format!("order:{i}");
                    let lock = manager
                        .lock(&name)
                        .wait(Duration::from_secs(10))
                        .await
                        .unwrap_or_else(|e| panic!("lock {name}: {e}"));
                    lock.release()
                        .await
                        .unwrap_or_else(|e| panic!("release {name}: {e}"));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
    assert!(manager.settle().await);
    let took = started.elapsed();
    println!(
        "{n} distinct resources locked and released once each, {tasks} tasks, in {:.1} s",
        took.as_secs_f64()
    );
    let after = Usage::of_all(&urls);
    print("after the locks", &after);
    println!(
        "per resource: {:.1} B over the five nodes",
        per_resource(&before, &after, n)
    );

    // Past the counters' life: every node's clock an hour and a minute on,
    // then Redis' own expiry cycle (10 times a second) clears them.
    for i in 0..urls.len() {
        cluster
            .step_clock(i, COUNTER_LIFE + Duration::from_secs(60), true)
            .expect("step the clock");
    }
    let expire_started = Instant::now();
    let mut later = Usage::of_all(&urls);
    while later.iter().map(|u| u.keys).sum::<i64>() > before.iter().map(|u| u.keys).sum::<i64>()
        && expire_started.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
        later = Usage::of_all(&urls);
    }
    print(
        &format!(
            "an hour later ({:.1} s of Redis' expiry cycle)",
            expire_started.elapsed().as_secs_f64()
        ),
        &later,
    );
    println!(
        "per resource, an hour later: {:.1} B over the five nodes",
        per_resource(&before, &later, n)
    );
}
