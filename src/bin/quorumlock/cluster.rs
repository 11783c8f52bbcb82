//! `quorumlock cluster`: local redis-server nodes in the foreground.

use std::path::PathBuf;

use clap::Args;
use quorumlock::testkit::{ClusterMember, ClusterOptions, TestCluster};

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
    /// Make each member a Redis Cluster of this many shard masters (at
    /// least 3; free ports, temporary data), for trying
    /// `redis+cluster://` members (docs/scaling-out.md).
    #[arg(long, value_name = "MASTERS", conflicts_with_all = ["port", "dir"])]
    shards: Option<usize>,
}

pub async fn cluster(args: ClusterArgs) -> Result<u8, Failure> {
    if args.count == 0 {
        return Err(Failure::new(exit::USAGE, "--count must be at least 1"));
    }
    // Watch for signals before anyone can learn our nodes and signal us.
    let mut stop = StopSignals::install()?;
    if let Some(shards) = args.shards {
        return cluster_members(args.count, shards, &mut stop).await;
    }
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

/// `count` members, each a local Redis Cluster of `shards` masters, until
/// a signal, or until one of their processes ends on its own.
async fn cluster_members(
    count: usize,
    shards: usize,
    stop: &mut StopSignals,
) -> Result<u8, Failure> {
    if shards < 3 {
        return Err(Failure::new(
            exit::USAGE,
            "--shards must be at least 3 (what redis-cli --cluster create accepts)",
        ));
    }
    let members = tokio::task::spawn_blocking(move || {
        (0..count)
            .map(|_| ClusterMember::start(shards, 0))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| Failure::new(exit::ERROR, format!("cluster start failed: {e}")))??;
    let urls = members
        .iter()
        .map(ClusterMember::url)
        .collect::<Result<Vec<_>, _>>()?;
    println!("export QUORUMLOCK_NODES={}", urls.join(","));
    eprintln!(
        "{count} members, each a Redis Cluster of {shards} masters (AOF appendfsync always); \
         Ctrl-C or SIGTERM stops them"
    );
    let mut check = tokio::time::interval(SUPERVISE_EVERY);
    let ended = loop {
        tokio::select! {
            () = stop.either() => break None,
            _ = check.tick() => {
                let ended = members.iter().enumerate().find_map(|(m, member)| {
                    member.nodes().ended().map(|(i, status)| (m, i, status))
                });
                if ended.is_some() {
                    break ended;
                }
            }
        }
    };
    eprintln!("stopping");
    tokio::task::spawn_blocking(move || drop(members))
        .await
        .map_err(|e| Failure::new(exit::ERROR, format!("cluster stop failed: {e}")))?;
    match ended {
        None => Ok(0),
        Some((m, i, status)) => Err(Failure::new(
            exit::ERROR,
            format!(
                "node {i} of member {m} ({}) ended on its own ({status}); the others were stopped",
                urls[m]
            ),
        )),
    }
}

/// How often `cluster` looks whether a node ended.
const SUPERVISE_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
