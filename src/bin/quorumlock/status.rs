//! `quorumlock status R`: each node's view of a resource, then the quorum's.

use std::time::Duration;

use clap::Args;
use serde::Serialize;

use quorumlock::internals::holding::{
    NodeHolding, NodeKind, combine, description_of, inspect_invocation,
};
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
    /// What the lock key holds: `none`, `exclusive`, `readers` or `other`
    /// (a key of a type no lock writes).
    pub kind: &'static str,
    /// Each holder's value and its time left in ms (`null`: no expiry).
    pub holders: Vec<(String, Option<u64>)>,
    /// The resource's fencing counter on this node.
    pub counter: Option<u64>,
    /// Live waiters queued on this node.
    pub waiters: u64,
    /// Why clients' node guard does not count this node, if it does not
    /// (from its settings and uptime; clocks are judged by `doctor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
    /// What the node said, for the quorum's view.
    #[serde(skip)]
    pub holding: Option<NodeHolding>,
}

/// What a quorum of nodes says (the library's view, as clients compute it).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QuorumView {
    /// `held` (a quorum stores a holder), `free` (a quorum stores
    /// nothing) or `split` (neither: contention in progress, or too many
    /// nodes unreachable).
    pub state: &'static str,
    pub holders: Vec<HolderView>,
    /// The highest fencing counter the nodes store.
    pub counter: Option<u64>,
    /// Live waiters, on the node with the most.
    pub waiters: u64,
}

/// One holder a quorum agrees on.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HolderView {
    /// `exclusive` or `reader`.
    pub kind: &'static str,
    pub description: Option<String>,
    pub value: String,
    /// How long a quorum still keeps it, less the drift allowance (`null`:
    /// no expiry).
    pub valid_for_ms: Option<u64>,
    pub nodes: usize,
}

/// The quorum's view from the nodes' views.
pub fn quorum_view(resource: &str, views: &[NodeView], drift_factor: f64) -> QuorumView {
    let answers: Vec<Option<NodeHolding>> = views.iter().map(|v| v.holding.clone()).collect();
    let holding = combine(resource, &answers, drift_factor);
    let state = if !holding.holders.is_empty() {
        "held"
    } else if holding.free {
        "free"
    } else {
        "split"
    };
    QuorumView {
        state,
        holders: holder_views(&holding),
        counter: holding.counter,
        waiters: holding.waiters,
    }
}

/// The holders a quorum agrees on, as reports show them.
pub fn holder_views(holding: &quorumlock::Holding) -> Vec<HolderView> {
    holding
        .holders
        .iter()
        .map(|holder| HolderView {
            kind: match holder.kind {
                quorumlock::HolderKind::Reader => "reader",
                _ => "exclusive",
            },
            description: holder.description.clone(),
            value: holder.value.clone(),
            valid_for_ms: holder.valid_for.map(|left| left.as_millis() as u64),
            nodes: holder.nodes,
        })
        .collect()
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
    let views = futures::future::join_all(
        args.nodes
            .urls()
            .iter()
            .map(|url| inspect_member(url, &args.nodes, &args.resource, args.quarantine_window)),
    )
    .await;
    if views.iter().all(|v| !v.reachable) {
        let errors: Vec<String> = views.iter().filter_map(|v| v.error.clone()).collect();
        return Err(Failure::new(
            exit::ERROR,
            format!("no node is reachable: {}", errors.join("; ")),
        ));
    }
    let view = quorum_view(&args.resource, &views, args.drift_factor);
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
    if args.held && view.state != "held" {
        return Ok(exit::FAILED);
    }
    Ok(0)
}

/// What the member at `url` holds of `key`: the server itself, or for a
/// `redis+cluster://` member the shard master serving the key's slot.
async fn inspect_member(url: &str, nodes: &NodeArgs, resource: &str, window: Duration) -> NodeView {
    let key = quorumlock::internals::lock_key(resource);
    let cluster = match ClusterUrl::parse(url) {
        None => {
            return inspect(url, nodes, DataSetKeys::standalone(), resource, window).await;
        }
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
    let Some(master) = view.master_for(slot(&key)) else {
        return failed(format!(
            "no master serves slot {} (CLUSTERDOWN)",
            slot(&key)
        ));
    };
    let mut node = inspect(master, nodes, view.data_set_of(master), resource, window).await;
    node.node = view.shard_name(&node.node);
    node
}

/// A view of the node at `url` before anything is known of it.
fn unreachable(url: &str) -> NodeView {
    NodeView {
        node: shown(url),
        reachable: false,
        error: None,
        kind: "none",
        holders: Vec::new(),
        counter: None,
        waiters: 0,
        quarantined: None,
        holding: None,
    }
}

async fn inspect(
    url: &str,
    nodes: &NodeArgs,
    data_set: DataSetKeys,
    resource: &str,
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
    let reply: Result<redis::Value, String> = probe.invoke(&inspect_invocation(resource)).await;
    match reply.and_then(|reply| {
        NodeHolding::from_reply(&reply).ok_or_else(|| format!("unexpected reply {reply:?}"))
    }) {
        Ok(holding) => {
            view.reachable = true;
            view.kind = match holding.kind {
                NodeKind::None => "none",
                NodeKind::Exclusive => "exclusive",
                NodeKind::Readers => "readers",
                _ => "other",
            };
            view.holders = holding.entries.clone();
            view.counter = holding.counter;
            view.waiters = holding.waiters;
            view.holding = Some(holding);
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

/// How a holder is shown: its description, else its value shortened.
pub fn shown_holder(value: &str) -> String {
    match description_of(value) {
        Some(description) => crate::printable(description).into_owned(),
        None => crate::printable(&short(value)).into_owned(),
    }
}

fn print_table(report: &Report<'_>) {
    println!(
        "resource {} (key {}), {} nodes, quorum {}",
        crate::printable(report.resource),
        crate::printable(&report.key),
        report.nodes.len(),
        report.quorum
    );
    println!(
        "{:<24} {:<10} {:<24} {:>10} {:>18} {:>8}",
        "node", "reachable", "holder", "ttl", "counter", "waiters"
    );
    for v in report.nodes {
        let reachable = if v.reachable { "yes" } else { "NO" };
        let holder = match (v.kind, v.holders.as_slice()) {
            ("readers", readers) => format!("{} readers", readers.len()),
            ("other", _) => "(foreign key)".to_owned(),
            (_, [(value, _)]) => shown_holder(value),
            _ => "-".to_owned(),
        };
        let ttl = match v.holders.as_slice() {
            [(_, Some(ms)), ..] => format!("{:.1}s", *ms as f64 / 1000.0),
            [(_, None), ..] => "none".to_owned(),
            [] => "-".to_owned(),
        };
        let counter = v.counter.map_or("-".to_owned(), |c| c.to_string());
        println!(
            "{:<24} {reachable:<10} {holder:<24} {ttl:>10} {counter:>18} {:>8}",
            v.node, v.waiters
        );
        if let Some(error) = &v.error {
            println!("{:<24} error: {}", "", crate::printable(error));
        }
        if let Some(why) = &v.quarantined {
            println!("{:<24} QUARANTINED by clients' node guard: {why}", "");
        }
    }
    let view = report.view;
    let total = report.nodes.len();
    match view.state {
        "held" => {
            for holder in &view.holders {
                let validity = holder.valid_for_ms.map_or("no expiry".to_owned(), |ms| {
                    format!("{:.1}s", ms as f64 / 1000.0)
                });
                println!(
                    "quorum: HELD ({}) by {} on {} of {total} nodes; validity as a client would \
                     compute it: {validity}",
                    holder.kind,
                    shown_holder(&holder.value),
                    holder.nodes,
                );
            }
        }
        "free" => println!("quorum: FREE (a quorum of {total} nodes hold nothing)"),
        _ => println!(
            "quorum: SPLIT (no holder on a quorum, and no quorum free: contention in \
             progress, or too many nodes unreachable)"
        ),
    }
    if view.waiters > 0 {
        println!("waiters: {}", view.waiters);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_are_shortened_by_characters() {
        assert_eq!(short("0123456789abcdef"), "0123456789ab…");
        assert_eq!(short("short"), "short");
        assert_eq!(short("ééééééééééééé"), "éééééééééééé…");
    }

    #[test]
    fn a_holder_is_shown_by_its_description() {
        let value = "0123456789abcdef0123456789abcdef:host-a pid 7";
        assert_eq!(shown_holder(value), "host-a pid 7");
        assert_eq!(shown_holder("0123456789abcdef0123"), "0123456789ab…");
    }
}
