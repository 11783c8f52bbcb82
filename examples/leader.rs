//! Leader election: three candidates campaign for one role; each leader
//! works a few steps, fencing its writes with its term, then resigns, and
//! the next in line leads. An observer follows who leads without
//! campaigning.
//!
//!     cargo run --example leader
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes.

use std::time::Duration;

use quorumlock::LockManager;
use quorumlock::testkit::local_or_env;
use tokio::time::Instant;

const ROLE: &str = "example-scheduler";

#[tokio::main]
async fn main() -> quorumlock::Result<()> {
    // Kept to the end: a local cluster lives as long as its `NodeSet`.
    let nodes = local_or_env(5)?;
    let start = Instant::now();
    let at = move || format!("{:>5} ms", start.elapsed().as_millis());

    let observer_manager = LockManager::builder().nodes(nodes.urls.clone()).build()?;
    let mut observer = observer_manager.election(ROLE).observe();
    let observing = tokio::spawn(async move {
        loop {
            match observer.changed().await {
                Ok(Some(leader)) => println!(
                    "{}  observer: led by {}",
                    at(),
                    leader.candidate.unwrap_or_default()
                ),
                Ok(None) => println!("{}  observer: nobody leads", at()),
                Err(error) => println!("{}  observer: {error}", at()),
            }
        }
    });

    let candidates: Vec<_> = ["host-a", "host-b", "host-c"]
        .into_iter()
        .map(|name| {
            let manager = LockManager::builder()
                .nodes(nodes.urls.clone())
                .build()
                .expect("valid settings");
            tokio::spawn(async move {
                let election = manager.election(ROLE);
                let leadership = election.campaign(name).await?;
                let fence = leadership.fence()?;
                println!("{}  {name}: leading in term {}", at(), leadership.term());
                for step in 0..3 {
                    if !leadership.is_leader() {
                        println!("{}  {name}: deposed", at());
                        return Ok(());
                    }
                    // The leader's work goes here, each write checked
                    // against `fence` by the storage.
                    let _ = (step, &fence);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                println!("{}  {name}: resigns", at());
                leadership.resign().await?;
                manager.settle().await;
                Ok::<(), quorumlock::Error>(())
            })
        })
        .collect();
    for candidate in candidates {
        candidate.await.expect("no panic")?;
    }
    // The last resignation leaves nobody leading: the observer says so,
    // then stops.
    tokio::time::sleep(Duration::from_millis(200)).await;
    observing.abort();
    Ok(())
}
