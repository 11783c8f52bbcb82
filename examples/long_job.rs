//! A job that runs longer than the lock's TTL, kept alive two ways.
//!
//!     cargo run --example long_job
//!
//! 1. `with_lock`: the closure runs while a watchdog extends the lock; if
//!    the lock were lost, the closure would be cancelled and `Lost` returned.
//! 2. `keep_alive`: the same by hand, for code that cannot be a closure,
//!    racing the work against `lost()` in `tokio::select!`.
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes.
//! `RUST_LOG=quorumlock=debug` shows the acquire / extend / release spans.

use std::time::Duration;

use quorumlock::testkit::local_or_env;
use quorumlock::{Error, Lease, LockManager};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    if let Err(error) = run().await {
        eprintln!("long_job failed: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Error> {
    let nodes = local_or_env(5)?;
    let manager = LockManager::builder()
        .nodes(nodes.urls.clone())
        .ttl(Duration::from_secs(1)) // extended every 333 ms
        .max_hold(Duration::from_secs(60))
        .build()?;

    // 1. Scoped: the lock lives exactly as long as the closure.
    let batches = manager
        .lock("reports:nightly")
        .run(|lease| async move {
            let mut done = 0;
            for batch in 1..=5 {
                process(batch, &lease).await;
                done += 1;
            }
            done
        })
        .await?;
    println!("with_lock: {batches} batches done, lock released");

    // 2. By hand: keep the lock alive while the work runs, stop on loss.
    let keep = manager.lock("reports:weekly").await?.keep_alive()?;
    let lease = keep.lease();
    tokio::select! {
        lost = keep.lost() => {
            // The work future below was dropped: nothing after its current
            // `.await` ran. Anything it wrote must carry the token.
            return Err(lost);
        }
        () = async {
            for batch in 1..=3 {
                process(batch, &lease).await;
            }
        } => {}
    }
    println!(
        "keep_alive: done after {} extensions, releasing",
        lease.extensions()
    );
    keep.release().await
}

/// One slice of the job: 600 ms, so five of them take three TTLs.
async fn process(batch: u32, lease: &Lease) {
    tokio::time::sleep(Duration::from_millis(600)).await;
    println!(
        "  batch {batch} of {} under token {}: {} extensions so far, valid for {:?} more",
        lease.resource(),
        lease.token().map_or("-".to_owned(), |t| t.to_string()),
        lease.extensions(),
        lease.remaining()
    );
}
