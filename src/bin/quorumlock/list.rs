//! `quorumlock list [PREFIX]`: the locks held now, with their holders,
//! validity and waiters. Lock keys are found with `SCAN` (never `KEYS`:
//! each call looks at `--scan-count` keys, so a node is never blocked
//! long), at most `--max-scans` calls per server; each resource found is
//! then read as `status` reads it, and kept if a quorum holds it.

use std::collections::BTreeSet;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use quorumlock::internals::{ClusterUrl, KeyKind, NAMESPACE, parse_key};
use serde::Serialize;

use crate::members::read_cluster;
use crate::probe::Probe;
use crate::status::{HolderView, holder_views, shown_holder};
use crate::{Failure, NodeArgs, exit};

#[derive(Args)]
pub struct ListArgs {
    /// Only resources whose name starts with this.
    #[arg(default_value = "")]
    prefix: String,
    #[command(flatten)]
    nodes: NodeArgs,
    /// Bound on each node's reply.
    #[arg(long, default_value = crate::DEFAULT_NODE_TIMEOUT.as_str(), value_parser = crate::duration)]
    node_timeout: std::time::Duration,
    /// At most this many resources are read and shown (sorted by name).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Keys each SCAN call looks at (its COUNT).
    #[arg(long, default_value_t = 1000)]
    scan_count: u64,
    /// At most this many SCAN calls per server; beyond, the list says it
    /// is incomplete.
    #[arg(long, default_value_t = 1000)]
    max_scans: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Drift factor to compute the validity with, as clients do.
    #[arg(long, default_value_t = quorumlock::DEFAULT_DRIFT_FACTOR)]
    drift_factor: f64,
}

/// One held resource.
#[derive(Serialize)]
struct Row {
    resource: String,
    holders: Vec<HolderView>,
    waiters: u64,
    counter: Option<u64>,
}

/// What the scans found.
#[derive(Serialize)]
struct Listing {
    locks: Vec<Row>,
    /// Lock keys found on any server (held or not by a quorum), up to the
    /// limit.
    resources_seen: usize,
    /// SCAN calls made, over every server.
    scans: usize,
    /// Whether a server had more keys than `--max-scans` calls reached, or
    /// more resources matched than `--limit`.
    incomplete: bool,
    /// Resources whose holders could not be read by a quorum.
    failures: Vec<String>,
    /// Lock keys skipped because their names are not UTF-8 (no client of
    /// quorumlock writes one; a resource name is text).
    not_utf8: usize,
}

pub async fn list(args: ListArgs) -> Result<u8, Failure> {
    if args.scan_count == 0 || args.max_scans == 0 {
        return Err(Failure::new(
            exit::USAGE,
            "--scan-count and --max-scans must be at least 1",
        ));
    }
    let mut found = BTreeSet::new();
    let mut scans = 0;
    let mut incomplete = false;
    let mut reached = 0;
    let mut not_utf8 = 0;
    for url in args.nodes.urls() {
        for server in servers(&url, &args.nodes).await {
            let Ok(probe) = Probe::connect(&server, &args.nodes).await else {
                continue;
            };
            let scan = scan_locks(&probe, &args, &mut found).await;
            scans += scan.calls;
            not_utf8 += scan.not_utf8;
            incomplete |= !scan.finished;
            reached += usize::from(scan.ok);
        }
    }
    if reached == 0 {
        return Err(Failure::new(exit::ERROR, "no node could be scanned"));
    }
    let resources_seen = found.len();
    incomplete |= found.len() > args.limit;
    let names: Vec<String> = found.into_iter().take(args.limit).collect();
    let manager = args
        .nodes
        .builder()?
        .node_timeout(args.node_timeout)
        .drift_factor(args.drift_factor)
        .build()?;
    let mut failures = Vec::new();
    let rows: Vec<Option<Row>> = futures::stream::iter(names)
        .map(|resource| {
            let manager = &manager;
            async move { (manager.holders(&resource).await, resource) }
        })
        .buffered(16)
        .map(|(holding, resource)| match holding {
            Ok(holding) if !holding.holders.is_empty() => Some(Row {
                holders: holder_views(&holding),
                waiters: holding.waiters,
                counter: holding.counter,
                resource,
            }),
            Ok(_) => None,
            Err(error) => {
                failures.push(format!("{resource}: {error}"));
                None
            }
        })
        .collect()
        .await;
    let listing = Listing {
        locks: rows.into_iter().flatten().collect(),
        resources_seen,
        scans,
        incomplete,
        failures,
        not_utf8,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&listing)
            .map_err(|e| Failure::new(exit::ERROR, e.to_string()))?;
        println!("{text}");
    } else {
        print_table(&listing);
    }
    Ok(0)
}

/// The servers that hold a member's keys: the server itself, or each
/// shard master of a Redis Cluster.
async fn servers(url: &str, nodes: &NodeArgs) -> Vec<String> {
    match ClusterUrl::parse(url) {
        None => vec![url.to_owned()],
        Some(Ok(cluster)) => match read_cluster(&cluster, nodes).await {
            Ok(view) => view
                .masters()
                .into_iter()
                .map(|(master, _)| master.to_owned())
                .collect(),
            Err(_) => Vec::new(),
        },
        Some(Err(_)) => Vec::new(),
    }
}

struct Scan {
    calls: usize,
    finished: bool,
    ok: bool,
    /// Keys matched whose names are not UTF-8: skipped, and counted.
    not_utf8: usize,
}

/// Adds the resources of the lock keys on `probe`'s server that match the
/// prefix to `found`, in at most `--max-scans` SCAN calls.
async fn scan_locks(probe: &Probe, args: &ListArgs, found: &mut BTreeSet<String>) -> Scan {
    // Both layouts' lock keys (`quorumlock:{name}:lock`,
    // `quorumlock:lock:name`), and little else.
    let pattern = format!("{NAMESPACE}*lock*");
    let mut cursor: u64 = 0;
    let mut scan = Scan {
        calls: 0,
        finished: false,
        ok: false,
        not_utf8: 0,
    };
    while scan.calls < args.max_scans {
        // Key names as bytes: one that is not UTF-8 must not fail the
        // whole call and hide every lock behind it.
        let reply: Result<(u64, Vec<Vec<u8>>), String> = probe
            .query(
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(args.scan_count),
            )
            .await;
        scan.calls += 1;
        let Ok((next, keys)) = reply else {
            return scan;
        };
        scan.ok = true;
        for key in keys {
            let Ok(key) = String::from_utf8(key) else {
                scan.not_utf8 += 1;
                continue;
            };
            if let Some((KeyKind::Lock, resource)) = parse_key(&key)
                && resource.starts_with(&args.prefix)
            {
                found.insert(resource.to_owned());
            }
        }
        if next == 0 {
            scan.finished = true;
            break;
        }
        cursor = next;
    }
    scan
}

fn print_table(listing: &Listing) {
    for failure in &listing.failures {
        eprintln!("not read: {}", crate::printable(failure));
    }
    if listing.not_utf8 > 0 {
        eprintln!(
            "not read: {} key(s) matching quorumlock's lock keys whose names are not UTF-8 \
             (not written by quorumlock, whose resource names are text)",
            listing.not_utf8
        );
    }
    println!(
        "{:<32} {:<10} {:<32} {:>10} {:>8}",
        "resource", "kind", "holder", "validity", "waiters"
    );
    for row in &listing.locks {
        for holder in &row.holders {
            let validity = holder.valid_for_ms.map_or("no expiry".to_owned(), |ms| {
                format!("{:.1?}", Duration::from_millis(ms))
            });
            println!(
                "{:<32} {:<10} {:<32} {validity:>10} {:>8}",
                crate::printable(&row.resource),
                holder.kind,
                shown_holder(&holder.value),
                row.waiters
            );
        }
    }
    println!(
        "{} held of {} resources seen ({} SCAN calls){}",
        listing.locks.len(),
        listing.resources_seen,
        listing.scans,
        if listing.incomplete {
            "; INCOMPLETE: raise --limit or --max-scans"
        } else {
            ""
        }
    );
}
