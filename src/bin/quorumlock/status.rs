//! `quorumlock status R`: each node's view of a resource, then the quorum's.

use std::time::Duration;

use clap::Args;
use serde::Serialize;

use quorumlock::internals::judge::DataSetKeys;
use quorumlock::internals::{ClusterUrl, facts_from_info, judge, slot};

use crate::members::{read_cluster, shown};
use crate::probe::Probe;
use crate::{Failure, NodeArgs, exit};

#[derive(Args)]
pub struct StatusArgs {
    /// The resource to inspect.
    resource: String,
    #[command(flatten)]
    nodes: NodeArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Drift factor to compute the validity with, as clients do.
    #[arg(long, default_value_t = quorumlock::DEFAULT_DRIFT_FACTOR)]
    drift_factor: f64,
    /// The clients' quarantine window (their longest TTL), to tell which
    /// nodes their node guard does not count yet.
    #[arg(long, default_value = crate::DEFAULT_TTL.as_str(), value_parser = crate::duration)]
    quarantine_window: Duration,
    /// Exit 1 unless a quorum holds the resource (for scripts: `status
    /// --held NAME && …`).
    #[arg(long)]
    held: bool,
}

/// One node's view of the resource.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeView {
    pub node: String,
    pub reachable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The lock value stored, if any (`N readers` for a read lock).
    pub holder: Option<String>,
    /// Remaining TTL of the lock key, in milliseconds.
    pub ttl_ms: Option<u64>,
    /// The resource's fencing counter on this node.
    pub counter: Option<u64>,
    /// Why clients' node guard does not count this node, if it does not
    /// (from its settings and uptime; clocks are judged by `doctor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
}

/// What a majority of nodes says.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum QuorumView {
    /// One value is stored on at least a quorum of nodes.
    Held {
        holder: String,
        nodes: usize,
        /// How long a quorum still stores it, less the drift allowance.
        validity_ms: u64,
    },
    /// At least a quorum of reachable nodes store nothing.
    Free { nodes: usize },
    /// Neither: holders disagree, or too many nodes are unreachable.
    Split,
}

/// The quorum's view from the nodes' views (pure).
pub fn quorum_view(views: &[NodeView], drift_factor: f64) -> QuorumView {
    let needed = quorumlock::internals::quorum(views.len());
    let reachable: Vec<&NodeView> = views.iter().filter(|v| v.reachable).collect();
    let mut holders: Vec<&str> = reachable
        .iter()
        .filter_map(|v| v.holder.as_deref())
        .collect();
    holders.sort_unstable();
    holders.dedup();
    for holder in holders {
        let mut ttls: Vec<u64> = reachable
            .iter()
            .filter(|v| v.holder.as_deref() == Some(holder))
            .map(|v| v.ttl_ms.unwrap_or(0))
            .collect();
        if ttls.len() >= needed {
            // The lock stands while `needed` nodes keep it: until the
            // needed-th longest remaining TTL runs out.
            ttls.sort_unstable_by(|a, b| b.cmp(a));
            let standing = Duration::from_millis(ttls[needed - 1]);
            let drift = quorumlock::internals::drift(standing, drift_factor);
            return QuorumView::Held {
                holder: holder.to_owned(),
                nodes: ttls.len(),
                validity_ms: standing.saturating_sub(drift).as_millis() as u64,
            };
        }
    }
    let free = reachable.iter().filter(|v| v.holder.is_none()).count();
    if free >= needed {
        QuorumView::Free { nodes: free }
    } else {
        QuorumView::Split
    }
}

#[derive(Serialize)]
struct Report<'a> {
    resource: &'a str,
    key: String,
    quorum: usize,
    nodes: &'a [NodeView],
    view: &'a QuorumView,
}

pub async fn status(args: StatusArgs) -> Result<u8, Failure> {
    // The library's rules for a name (not empty, no leading `}`).
    if let Err(bad) = quorumlock::internals::check_resource(&args.resource) {
        return Err(Failure::new(exit::USAGE, bad.to_string()));
    }
    let key = quorumlock::internals::lock_key(&args.resource);
    let fence = quorumlock::internals::fence_key(&args.resource);
    let views = futures::future::join_all(
        args.nodes
            .urls()
            .iter()
            .map(|url| inspect_member(url, &args.nodes, &key, &fence, args.quarantine_window)),
    )
    .await;
    if views.iter().all(|v| !v.reachable) {
        let errors: Vec<String> = views.iter().filter_map(|v| v.error.clone()).collect();
        return Err(Failure::new(
            exit::ERROR,
            format!("no node is reachable: {}", errors.join("; ")),
        ));
    }
    let view = quorum_view(&views, args.drift_factor);
    let report = Report {
        resource: &args.resource,
        key,
        quorum: quorumlock::internals::quorum(views.len()),
        nodes: &views,
        view: &view,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::new(exit::ERROR, e.to_string()))?;
        println!("{text}");
    } else {
        print_table(&report);
    }
    if args.held && !matches!(view, QuorumView::Held { .. }) {
        return Ok(exit::FAILED);
    }
    Ok(0)
}

/// What the member at `url` holds of `key`: the server itself, or for a
/// `redis+cluster://` member the shard master serving the key's slot.
async fn inspect_member(
    url: &str,
    nodes: &NodeArgs,
    key: &str,
    fence: &str,
    window: Duration,
) -> NodeView {
    let cluster = match ClusterUrl::parse(url) {
        None => return inspect(url, nodes, DataSetKeys::standalone(), key, fence, window).await,
        Some(parsed) => parsed,
    };
    let view = match cluster {
        Ok(cluster) => read_cluster(&cluster, nodes).await,
        Err(error) => Err(error),
    };
    let failed = |error: String| NodeView {
        error: Some(error),
        ..unreachable(url)
    };
    let view = match view {
        Ok(view) => view,
        Err(error) => return failed(error),
    };
    let Some(master) = view.master_for(slot(key)) else {
        return failed(format!("no master serves slot {} (CLUSTERDOWN)", slot(key)));
    };
    let mut node = inspect(master, nodes, view.data_set_of(master), key, fence, window).await;
    node.node = view.shard_name(&node.node);
    node
}

/// A view of the node at `url` before anything is known of it.
fn unreachable(url: &str) -> NodeView {
    NodeView {
        node: shown(url),
        reachable: false,
        error: None,
        holder: None,
        ttl_ms: None,
        counter: None,
        quarantined: None,
    }
}

async fn inspect(
    url: &str,
    nodes: &NodeArgs,
    data_set: DataSetKeys,
    key: &str,
    fence: &str,
    window: Duration,
) -> NodeView {
    let mut view = unreachable(url);
    let probe = match Probe::connect(url, nodes).await {
        Ok(probe) => probe.with_data_set(data_set),
        Err(error) => {
            view.error = Some(error);
            return view;
        }
    };
    view.node = probe.name.clone();
    let read = async {
        // A read lock is a sorted set of readers, not a value.
        let kind: String = probe.query(redis::cmd("TYPE").arg(key)).await?;
        let holder: Option<String> = if kind == "zset" {
            // Entries expire by node time; the next script drops them.
            let (seconds, micros): (u64, u64) = probe.query(&redis::cmd("TIME")).await?;
            let now_ms = seconds * 1000 + micros / 1000;
            let readers: u64 = probe
                .query(
                    redis::cmd("ZCOUNT")
                        .arg(key)
                        .arg(format!("({now_ms}"))
                        .arg("+inf"),
                )
                .await?;
            Some(format!("{readers} readers"))
        } else {
            probe.query(redis::cmd("GET").arg(key)).await?
        };
        let ttl: i64 = probe.query(redis::cmd("PTTL").arg(key)).await?;
        let counter: Option<u64> = probe.query(redis::cmd("GET").arg(fence)).await?;
        Ok::<_, String>((holder, ttl, counter))
    };
    match read.await {
        Ok((holder, ttl, counter)) => {
            view.reachable = true;
            view.holder = holder;
            view.ttl_ms = u64::try_from(ttl).ok();
            view.counter = counter;
        }
        Err(error) => view.error = Some(error),
    }
    view.quarantined = guard_view(&probe, window).await;
    view
}

/// What a client meeting the node now would make of it: quarantined for
/// its settings, or for a possible loss of writes less than `window` ago.
async fn guard_view(probe: &Probe, window: Duration) -> Option<String> {
    let info: String = probe.query(&redis::cmd("INFO")).await.ok()?;
    let mut facts = facts_from_info(&probe.name, &info);
    facts.appendfsync = probe.config("appendfsync").await;
    facts.dataset = probe.data_set().await;
    if let Some(reason) = judge::settings_fault(&facts) {
        return Some(format!("{}: {reason}", reason.label()));
    }
    let loss = judge::first_sight(&facts, window)?;
    let left = match loss.at {
        judge::LostAt::Ago(ago) => window.saturating_sub(ago),
        judge::LostAt::Now => window,
    };
    Some(format!(
        "{}: {left:.1?} more ({})",
        loss.reason.label(),
        loss.reason
    ))
}

/// The first 12 characters (not bytes: a foreign value may be any UTF-8).
fn short(value: &str) -> String {
    let mut chars = value.chars();
    let head: String = chars.by_ref().take(12).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

fn print_table(report: &Report<'_>) {
    println!(
        "resource {} (key {}), {} nodes, quorum {}",
        report.resource,
        report.key,
        report.nodes.len(),
        report.quorum
    );
    println!(
        "{:<24} {:<10} {:<14} {:>10} {:>8}",
        "node", "reachable", "holder", "ttl", "counter"
    );
    for v in report.nodes {
        let reachable = if v.reachable { "yes" } else { "NO" };
        let holder = v.holder.as_deref().map_or("-".to_owned(), short);
        let ttl = v
            .ttl_ms
            .map_or("-".to_owned(), |ms| format!("{:.1}s", ms as f64 / 1000.0));
        let counter = v.counter.map_or("-".to_owned(), |c| c.to_string());
        println!(
            "{:<24} {reachable:<10} {holder:<14} {ttl:>10} {counter:>8}",
            v.node
        );
        if let Some(error) = &v.error {
            println!("{:<24} error: {error}", "");
        }
        if let Some(why) = &v.quarantined {
            println!("{:<24} QUARANTINED by clients' node guard: {why}", "");
        }
    }
    match report.view {
        QuorumView::Held {
            holder,
            nodes,
            validity_ms,
        } => println!(
            "quorum: HELD by {} on {nodes} of {} nodes; validity as a client would compute it: {:.1}s",
            short(holder),
            report.nodes.len(),
            *validity_ms as f64 / 1000.0
        ),
        QuorumView::Free { nodes } => {
            println!(
                "quorum: FREE ({nodes} of {} nodes hold nothing)",
                report.nodes.len()
            )
        }
        QuorumView::Split => println!(
            "quorum: SPLIT (no value on a quorum, and no quorum free: contention in \
             progress, or too many nodes unreachable)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(holder: Option<&str>, ttl_ms: u64) -> NodeView {
        NodeView {
            node: "n".into(),
            reachable: true,
            error: None,
            holder: holder.map(str::to_owned),
            ttl_ms: holder.map(|_| ttl_ms),
            counter: None,
            quarantined: None,
        }
    }

    fn down() -> NodeView {
        NodeView {
            reachable: false,
            ..node(None, 0)
        }
    }

    #[test]
    fn holders_are_shortened_by_characters() {
        assert_eq!(short("0123456789abcdef"), "0123456789ab…");
        assert_eq!(short("short"), "short");
        assert_eq!(short("ééééééééééééé"), "éééééééééééé…");
    }

    #[test]
    fn the_quorum_view_follows_the_majority() {
        let a = Some("a");
        let table = [
            (
                vec![
                    node(a, 9000),
                    node(a, 8000),
                    node(a, 7000),
                    node(None, 0),
                    down(),
                ],
                // The 3rd longest TTL (7000) minus drift (70 + 2).
                QuorumView::Held {
                    holder: "a".into(),
                    nodes: 3,
                    validity_ms: 6928,
                },
            ),
            (
                vec![
                    node(None, 0),
                    node(None, 0),
                    node(None, 0),
                    node(a, 5000),
                    down(),
                ],
                QuorumView::Free { nodes: 3 },
            ),
            (
                vec![
                    node(a, 5000),
                    node(a, 5000),
                    node(Some("b"), 5000),
                    node(None, 0),
                    down(),
                ],
                QuorumView::Split,
            ),
            (
                vec![node(None, 0), node(None, 0), down(), down(), down()],
                QuorumView::Split,
            ),
        ];
        for (views, expected) in table {
            assert_eq!(quorum_view(&views, 0.01), expected);
        }
    }
}
