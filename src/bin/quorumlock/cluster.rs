//! `quorumlock cluster`: local redis-server nodes in the foreground.

use std::path::PathBuf;

use clap::Args;
use quorumlock::testkit::{ClusterOptions, TestCluster};

use crate::{Failure, StopSignals, exit};

#[derive(Args)]
pub struct ClusterArgs {
    /// How many nodes to start.
    #[arg(short = 'n', long, default_value_t = 5)]
    count: usize,
    /// Port of the first node; the others follow it.
    #[arg(long, default_value_t = 7001)]
    port: u16,
    /// Directory for the nodes' data (kept). Default: a temporary one,
    /// deleted on exit.
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub async fn cluster(args: ClusterArgs) -> Result<u8, Failure> {
    if args.count == 0 {
        return Err(Failure::new(exit::USAGE, "--count must be at least 1"));
    }
    // Watch for signals before anyone can learn our nodes and signal us.
    let mut stop = StopSignals::install()?;
    let options = ClusterOptions {
        first_port: Some(args.port),
        dir: args.dir.clone(),
        ..ClusterOptions::default()
    };
    let n = args.count;
    let cluster = tokio::task::spawn_blocking(move || TestCluster::start_with(n, &options))
        .await
        .map_err(|e| Failure::new(exit::ERROR, format!("cluster start failed: {e}")))??;
    println!("export QUORUMLOCK_NODES={}", cluster.urls().join(","));
    eprintln!(
        "{n} redis-server nodes running (AOF appendfsync always{}); Ctrl-C or SIGTERM stops them",
        args.dir
            .as_ref()
            .map(|d| format!(", data in {}", d.display()))
            .unwrap_or_default()
    );
    // Supervise: a node that ends on its own ends the cluster, non-zero,
    // rather than leave a cluster that is quietly one node short.
    let mut check = tokio::time::interval(SUPERVISE_EVERY);
    let ended = loop {
        tokio::select! {
            () = stop.either() => break None,
            _ = check.tick() => {
                if let Some(ended) = cluster.ended() {
                    break Some(ended);
                }
            }
        }
    };
    let urls = cluster.urls();
    eprintln!("stopping");
    tokio::task::spawn_blocking(move || cluster.shutdown())
        .await
        .map_err(|e| Failure::new(exit::ERROR, format!("cluster stop failed: {e}")))?;
    match ended {
        None => Ok(0),
        Some((i, status)) => Err(Failure::new(
            exit::ERROR,
            format!(
                "node {i} ({}) ended on its own ({status}); the others were stopped",
                urls[i]
            ),
        )),
    }
}

/// How often `cluster` looks whether a node ended.
const SUPERVISE_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
