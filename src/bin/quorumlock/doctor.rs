//! `quorumlock doctor`: checks, node by node and for the set, that the
//! settings the lock's safety depends on are in place. The checks are the
//! library's ([`quorumlock::internals::judge`]), the ones every client's node
//! guard applies: a FAIL is a node that clients do not count.

use std::time::Duration;

use clap::Args;
use serde::Serialize;
use tokio::time::Instant;

use quorumlock::internals::judge::DataSetKeys;
use quorumlock::internals::judge::fsync_policy;
use quorumlock::internals::judge::{
    self, ClockFault, ClockSample, Finding, LayoutScan, Level, NodeFacts, check_node, check_set,
};
use quorumlock::internals::{ClusterUrl, facts_from_info, is_old_layout_key};

use crate::members::{cluster_findings, read_cluster, shown};
use crate::probe::Probe;
use crate::{Failure, NodeArgs, exit};

#[derive(Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    nodes: NodeArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The drift factor clients use; clock rates are judged against it.
    #[arg(long, default_value_t = quorumlock::DEFAULT_DRIFT_FACTOR)]
    drift_factor: f64,
    /// How long to compare the nodes' clocks with ours.
    #[arg(long, default_value = "500ms", value_parser = crate::duration)]
    clock_interval: Duration,
    /// The clients' quarantine window (their longest TTL): a node younger
    /// than this that does not fsync every write is not counted yet.
    #[arg(long, default_value = crate::DEFAULT_TTL.as_str(), value_parser = crate::duration)]
    quarantine_window: Duration,
}

/// A finding as printed: the library's, in a serializable form.
#[derive(Debug, Clone, Serialize)]
struct Row {
    /// The node, or `None` for checks of the whole set.
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    check: &'static str,
    level: &'static str,
    detail: String,
}

impl From<Finding> for Row {
    fn from(finding: Finding) -> Self {
        Self {
            node: finding.node,
            check: finding.check,
            level: level_name(finding.level),
            detail: finding.detail,
        }
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Pass => "pass",
        Level::Warn => "warn",
        Level::Fail => "fail",
    }
}

/// The facts of the member at `url` (the server, or each shard master of
/// a `redis+cluster://` member), and what is found of the member as a
/// whole (a cluster's slots and failover settings).
async fn examine(url: &str, args: &DoctorArgs) -> (Vec<NodeFacts>, Vec<Finding>) {
    let gather_one = |url: String, data_set| async move {
        gather(
            &url,
            &args.nodes,
            data_set,
            args.clock_interval,
            args.drift_factor,
        )
        .await
    };
    let cluster = match ClusterUrl::parse(url) {
        None => {
            return (
                vec![gather_one(url.to_owned(), DataSetKeys::standalone()).await],
                vec![],
            );
        }
        Some(parsed) => parsed,
    };
    let view = match cluster {
        Ok(cluster) => read_cluster(&cluster, &args.nodes).await,
        Err(error) => Err(error),
    };
    let view = match view {
        Ok(view) => view,
        Err(error) => {
            let mut facts = NodeFacts::named(shown(url));
            facts.unreachable = Some(error);
            return (vec![facts], vec![]);
        }
    };
    let masters = view.masters();
    let mut facts = futures::future::join_all(
        masters
            .iter()
            .map(|(master, data_set)| gather_one((*master).to_owned(), data_set.clone())),
    )
    .await;
    for fact in &mut facts {
        fact.name = view.shard_name(&fact.name);
    }
    (facts, cluster_findings(&view, &args.nodes).await)
}

async fn gather(
    url: &str,
    nodes: &NodeArgs,
    data_set: DataSetKeys,
    interval: Duration,
    drift_factor: f64,
) -> NodeFacts {
    let mut facts = NodeFacts::named(url.trim_start_matches("redis://"));
    let mut ip = None;
    if let Ok(client) = nodes.client(url)
        && let redis::ConnectionAddr::Tcp(host, port) = client.get_connection_info().addr()
        && let Ok(mut addrs) = tokio::net::lookup_host((host.as_str(), *port)).await
    {
        ip = addrs.next().map(|a| a.ip());
    }
    let probe = match Probe::connect(url, nodes).await {
        Ok(probe) => probe.with_data_set(data_set),
        Err(e) => {
            facts.unreachable = Some(e);
            facts.ip = ip;
            return facts;
        }
    };
    let mut pings = Vec::new();
    for _ in 0..3 {
        match probe.ping().await {
            Ok(rtt) => pings.push(rtt),
            Err(e) => {
                facts.unreachable = Some(e);
                return facts;
            }
        }
    }
    pings.sort();
    // The same reading of INFO as the clients' guard makes on connect.
    if let Ok(text) = probe.query::<String>(&redis::cmd("INFO")).await {
        facts = facts_from_info(&probe.name, &text);
    } else {
        facts.name = probe.name.clone();
    }
    facts.ip = ip;
    facts.latency = Some(pings[1]);
    // As the clients' guard reads it: `always` skipped during rewrites is
    // not `always`.
    facts.appendfsync = probe
        .query::<redis::Value>(
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("appendfsync")
                .arg("no-appendfsync-on-rewrite"),
        )
        .await
        .ok()
        .and_then(|reply| fsync_policy(Some(&reply)));
    facts.dataset = probe.data_set().await;
    if facts.appendonly.is_none() {
        facts.appendonly = probe.config("appendonly").await.map(|v| v == "yes");
    }
    facts.old_layout = Some(old_layout(&probe).await);
    if let Ok((rate, fault)) = clock_rate(&probe, interval, drift_factor).await {
        facts.clock_rate = Some(rate);
        facts.clock_fault = fault;
    }
    facts
}

/// Scan calls (of `COUNT 1000`) the doctor makes per node looking for lock
/// keys of the older layout: bounded, so a big node is never held long.
const LAYOUT_SCAN_CALLS: usize = 100;

/// The lock and waiter keys of the layout before hash tags the node holds,
/// as far as `LAYOUT_SCAN_CALLS` calls of `SCAN` see, and whether they saw
/// every key.
async fn old_layout(probe: &Probe) -> Result<LayoutScan, String> {
    let mut cursor = 0u64;
    let mut found = 0;
    for _ in 0..LAYOUT_SCAN_CALLS {
        // Names as bytes: a key that is not UTF-8 (no client of ours writes
        // one) must not fail the scan.
        let (next, keys): (u64, Vec<Vec<u8>>) = probe
            .query(
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg("quorumlock:*")
                    .arg("COUNT")
                    .arg(1000),
            )
            .await?;
        found += keys
            .iter()
            .filter(|key| is_old_layout_key(&String::from_utf8_lossy(key)))
            .count() as u64;
        cursor = next;
        if cursor == 0 {
            return Ok(LayoutScan {
                found,
                complete: true,
            });
        }
    }
    Ok(LayoutScan {
        found,
        complete: false,
    })
}

/// The node's clock rate against ours (the change of its `TIME` over the
/// change of our monotonic clock, each sample taken mid-request), and the
/// guard's verdict on the two samples for `drift_factor`.
async fn clock_rate(
    probe: &Probe,
    interval: Duration,
    drift_factor: f64,
) -> Result<(f64, Option<ClockFault>), String> {
    async fn sample(probe: &Probe) -> Result<ClockSample, String> {
        let sent = Instant::now();
        let (secs, micros): (u64, u64) = probe.query(&redis::cmd("TIME")).await?;
        Ok(ClockSample {
            server_us: secs * 1_000_000 + micros,
            sent,
            received: Instant::now(),
        })
    }
    let first = sample(probe).await?;
    tokio::time::sleep(interval).await;
    let second = sample(probe).await?;
    let mid = |s: &ClockSample| s.sent + (s.received - s.sent) / 2;
    let local = (mid(&second) - mid(&first)).as_secs_f64();
    if local <= 0.0 {
        return Err("no time passed".into());
    }
    let server = (second.server_us as f64 - first.server_us as f64) / 1e6;
    Ok((
        server / local,
        judge::clock_fault(&first, &second, drift_factor),
    ))
}

pub async fn doctor(args: DoctorArgs) -> Result<u8, Failure> {
    if !(0.0..1.0).contains(&args.drift_factor) {
        return Err(Failure::new(
            exit::USAGE,
            "--drift-factor must be in [0, 1)",
        ));
    }
    let members =
        futures::future::join_all(args.nodes.urls().iter().map(|url| examine(url, &args))).await;
    let mut findings: Vec<Finding> = Vec::new();
    for (facts, about_member) in &members {
        findings.extend(
            facts
                .iter()
                .flat_map(|f| check_node(f, args.drift_factor, args.quarantine_window)),
        );
        findings.extend(about_member.iter().cloned());
    }
    // The set is one of members: a cluster counts once (its first master
    // stands for it, e.g. against a process named twice).
    let representatives: Vec<NodeFacts> = members
        .iter()
        .filter_map(|(facts, _)| facts.first().cloned())
        .collect();
    findings.extend(check_set(&representatives));
    if let Some(first) = args.nodes.urls().first()
        && ClusterUrl::parse(first).is_some_and(|parsed| parsed.is_ok())
    {
        findings.push(Finding {
            node: Some(shown(first)),
            check: "counter-node",
            level: Level::Warn,
            detail: "node 0, the fencing counter node of the default settings (and of `run`), \
                     is a Redis Cluster member: each of its tokens waits for a replica's \
                     acknowledgement, and a failover of its shard sends tokens through the \
                     other nodes (a second round trip) until the promoted master counts; list a \
                     standalone node first, or pick one with Fencing::CounterNode { node }"
                .into(),
        });
    }
    let overall = findings
        .iter()
        .map(|f| f.level)
        .max()
        .unwrap_or(Level::Pass);
    let rows: Vec<Row> = findings.into_iter().map(Row::from).collect();
    if args.json {
        #[derive(Serialize)]
        struct Report<'a> {
            overall: &'static str,
            findings: &'a [Row],
        }
        let text = serde_json::to_string_pretty(&Report {
            overall: level_name(overall),
            findings: &rows,
        })
        .map_err(|e| Failure::new(exit::ERROR, e.to_string()))?;
        println!("{text}");
    } else {
        println!("{:<22} {:<13} {:<5} detail", "node", "check", "level");
        for row in &rows {
            let level = match row.level {
                "pass" => "pass".to_owned(),
                other => other.to_uppercase(),
            };
            println!(
                "{:<22} {:<13} {level:<5} {}",
                row.node.as_deref().unwrap_or("(all nodes)"),
                row.check,
                row.detail
            );
        }
        println!("overall: {}", level_name(overall).to_uppercase());
    }
    Ok(if overall == Level::Fail {
        exit::FAILED
    } else {
        0
    })
}
