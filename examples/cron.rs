//! At most once per interval: four hosts' schedulers fire the same job
//! every 300 ms, out of phase; each asks with `no_wait` and
//! `at_least(1 s)`, so the job runs about once a second, on whichever host
//! got there first, and the others skip it.
//!
//!     cargo run --example cron
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes.

use std::time::Duration;

use quorumlock::testkit::local_or_env;
use quorumlock::{Error, LockManager};
use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_secs(1);

#[tokio::main]
async fn main() {
    // Kept to the end: a local cluster lives as long as its `NodeSet`.
    let nodes = local_or_env(5).expect("nodes");
    let urls = nodes.urls.clone();
    let start = Instant::now();
    let hosts: Vec<_> = (0..4u64)
        .map(|host| {
            let manager = LockManager::builder()
                .nodes(urls.clone())
                .build()
                .expect("valid settings");
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(75 * host)).await;
                while start.elapsed() < Duration::from_millis(3500) {
                    let ran = manager
                        .lock("cron:report")
                        .no_wait()
                        .at_least(INTERVAL)
                        .run(|_lease| async {
                            println!(
                                "{:>5} ms  host {host} runs the job",
                                start.elapsed().as_millis()
                            );
                        })
                        .await;
                    match ran {
                        Ok(()) | Err(Error::Contended { .. }) => {}
                        Err(other) => {
                            eprintln!("host {host}: {other}");
                            std::process::exit(1);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            })
        })
        .collect();
    for host in hosts {
        host.await.expect("no panic");
    }
}
