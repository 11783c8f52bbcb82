//! An operator's view: who holds a lock (with the description its holder
//! gave), a force-unlock of a stuck holder, which learns of it at its next
//! extension, and fencing counters shared by a hash tag.
//!
//!     cargo run --example operator
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes.

use std::time::Duration;

use quorumlock::testkit::local_or_env;
use quorumlock::{FenceCounters, LockManager};

#[tokio::main]
async fn main() -> quorumlock::Result<()> {
    // Kept to the end: a local cluster lives as long as its `NodeSet`.
    let nodes = local_or_env(5)?;
    let manager = LockManager::builder()
        .nodes(nodes.urls.clone())
        .ttl(Duration::from_secs(3))
        .build()?;

    // A job takes its lock, says who it is, and gets stuck.
    let stuck = manager
        .lock("example:nightly-report")
        .holder("report job on host-a, pid 4242")
        .await?
        .keep_alive()?;
    let holding = manager.holders("example:nightly-report").await?;
    for holder in &holding.holders {
        println!(
            "held by {:?} on {} of {} nodes, valid for {:?} more",
            holder.description.as_deref().unwrap_or("(no description)"),
            holder.nodes,
            holding.nodes,
            holder.valid_for.unwrap_or_default()
        );
    }

    // The operator breaks it; the next holder's token is higher.
    let broken = manager.force_unlock(&holding).await?;
    println!(
        "broken on {} of {} nodes; the stuck holder's token is at most {:?}",
        broken.deleted, broken.nodes, broken.counter
    );
    let lost = tokio::time::timeout(Duration::from_secs(3), stuck.lost()).await;
    match lost {
        Ok(reason) => println!("the stuck holder learns of it: {reason}"),
        Err(_) => println!("the stuck holder did not learn of it within 3 s"),
    }
    let next = manager.lock("example:nightly-report").no_wait().await?;
    println!("the next holder's token: {}", next.fence()?.token());
    next.release().await?;

    // One counter per tag instead of one per entity.
    let shared = LockManager::builder()
        .nodes(nodes.urls.clone())
        .fence_counters(FenceCounters::PerHashTag)
        .build()?;
    for order in 1..=3 {
        let lock = shared.lock(&format!("{{orders}}:{order}")).await?;
        println!("order {order}: token {}", lock.fence()?.token());
        lock.release().await?;
    }
    manager.settle().await;
    shared.settle().await;
    Ok(())
}
