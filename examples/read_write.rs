//! Readers and writers of a shared catalog: readers share the read lock
//! and check, with the read lock's token, that no writer came in while
//! they read (the version they see is never above their token); writers take
//! the write lock in turn (`write_within`: queued, so the stream of readers
//! cannot starve them) and stamp each version with their token.
//!
//!     cargo run --example read_write
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes; the
//! catalog lives on the first node, behind `FencedRedis`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use quorumlock::testkit::local_or_env;
use quorumlock::{Error, FencedRedis, LockManager};

#[tokio::main]
async fn main() {
    // Kept until the end: dropping the set stops local nodes.
    let nodes = local_or_env(5).expect("nodes");
    match run(
        &nodes.urls,
        quorumlock::DEFAULT_NODE_TIMEOUT,
        Duration::from_secs(2),
    )
    .await
    {
        Ok(report) => println!(
            "{} reads (up to {} at once), {} writes; {} reads saw a newer version than their lock",
            report.reads, report.most_readers, report.writes, report.newer_than_lock
        ),
        Err(error) => {
            eprintln!("read_write failed: {error}");
            std::process::exit(1);
        }
    }
}

/// What the run did.
pub struct Report {
    pub reads: usize,
    pub writes: usize,
    /// The most readers that held the read lock at once.
    pub most_readers: usize,
    /// Reads that saw a version written under a token above the read
    /// lock's: a writer that got in while they read.
    pub newer_than_lock: usize,
}

/// `node_timeout`: the default (50 ms) suits a dedicated cluster; the tests
/// pass more, for a machine whose disk another process keeps busy.
pub async fn run(
    urls: &[String],
    node_timeout: Duration,
    run_for: Duration,
) -> Result<Report, Error> {
    let catalog = format!("example:catalog:{}", std::process::id());
    let stop = tokio::time::Instant::now() + run_for;
    let reading = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let newer_than_lock = Arc::new(AtomicUsize::new(0));
    // Each task is its own client: a manager, and the catalog's storage.
    let client = || -> Result<(LockManager, FencedRedis), Error> {
        let manager = LockManager::builder()
            .nodes(urls.to_vec())
            .node_timeout(node_timeout)
            .build()?;
        Ok((manager, FencedRedis::new(&urls[0])?))
    };
    let mut writers = Vec::new();
    for _ in 0..2 {
        let (manager, storage) = client()?;
        let catalog = catalog.clone();
        writers.push(tokio::spawn(async move {
            let mut writes = 0;
            while tokio::time::Instant::now() < stop {
                let lock = manager.lock(&catalog).wait(Duration::from_secs(30)).await?;
                let token = lock.token().expect("fencing is on by default");
                // The version is the writer's token: readers compare theirs.
                storage
                    .set(&lock.fence()?, &catalog, token.to_string())
                    .await?;
                lock.release().await?;
                writes += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok::<usize, Error>(writes)
        }));
    }
    let mut readers = Vec::new();
    for _ in 0..6 {
        let (manager, storage) = client()?;
        let (catalog, reading, most_readers, newer_than_lock) = (
            catalog.clone(),
            Arc::clone(&reading),
            Arc::clone(&most_readers),
            Arc::clone(&newer_than_lock),
        );
        readers.push(tokio::spawn(async move {
            let mut reads = 0;
            while tokio::time::Instant::now() < stop {
                let lock = manager.read(&catalog).wait(Duration::from_secs(30)).await?;
                let now_reading = reading.fetch_add(1, Ordering::SeqCst) + 1;
                most_readers.fetch_max(now_reading, Ordering::SeqCst);
                // The read lock's token is that of the latest write lock
                // (or of a write attempt that failed after it): every
                // writer after this read lock gets a larger one.
                let token = lock.writer_token().expect("fencing is on by default").get();
                let version: u64 = storage
                    .get(&catalog)
                    .await?
                    .and_then(|text| text.parse().ok())
                    .unwrap_or(0);
                if version > token {
                    newer_than_lock.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                reading.fetch_sub(1, Ordering::SeqCst);
                lock.release().await?;
                reads += 1;
            }
            Ok::<usize, Error>(reads)
        }));
    }
    let (mut reads, mut writes) = (0, 0);
    for writer in writers {
        writes += writer.await.expect("no panic")?;
    }
    for reader in readers {
        reads += reader.await.expect("no panic")?;
    }
    Ok(Report {
        reads,
        writes,
        most_readers: most_readers.load(Ordering::SeqCst),
        newer_than_lock: newer_than_lock.load(Ordering::SeqCst),
    })
}
