//! Take a lock on a five-node cluster, print its validity, release it.
//!
//!     cargo run --example quickstart
//!
//! Uses the nodes in QUORUMLOCK_NODES (comma-separated redis:// URLs) when
//! set; otherwise starts five local redis-server processes for the run.

use std::time::Duration;

use quorumlock::LockManager;
use quorumlock::testkit::local_or_env;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    if let Err(error) = run().await {
        eprintln!("quickstart failed: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), quorumlock::Error> {
    let nodes = local_or_env(5)?;
    match &nodes.cluster {
        Some(_) => println!("started a local cluster: {}", nodes.urls.join(", ")),
        None => println!("using QUORUMLOCK_NODES: {}", nodes.urls.join(", ")),
    }

    let manager = LockManager::builder()
        .nodes(nodes.urls.clone())
        .ttl(Duration::from_secs(10))
        .build()?;
    // At startup: connected now, the first lock does not spend its node
    // timeout connecting; an error here names every node that cannot serve.
    manager.connect().await?;

    let lock = manager.lock("quickstart:order:123").await?;
    println!(
        "acquired `{}` on a quorum of {} of {} nodes; valid for another {:?}",
        lock.resource(),
        manager.quorum(),
        nodes.urls.len(),
        lock.remaining()
    );

    // The protected work goes here, finishing well within lock.remaining().

    lock.release().await?;
    // The release returned once a quorum deleted the lock; before a process
    // exits, let the slower nodes finish too.
    manager.settle().await;
    println!("released");
    Ok(())
}
