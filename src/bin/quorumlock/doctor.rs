//! `quorumlock doctor`: checks, node by node and for the set, that the
//! settings the lock's safety depends on are in place.

use std::net::IpAddr;
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use tokio::time::Instant;

use crate::probe::{Probe, field};
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Pass,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// The node, or `None` for checks of the whole set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub check: &'static str,
    pub level: Level,
    pub detail: String,
}

/// What was read from one node; `None` where it could not be read.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    pub name: String,
    pub unreachable: Option<String>,
    pub latency: Option<Duration>,
    pub version: Option<String>,
    pub run_id: Option<String>,
    pub appendonly: Option<String>,
    pub appendfsync: Option<String>,
    pub maxmemory_policy: Option<String>,
    pub maxmemory: Option<u64>,
    pub role: Option<String>,
    pub replicas: Option<u64>,
    pub ip: Option<IpAddr>,
    /// The node's clock rate against ours (1.0 = same speed).
    pub clock_rate: Option<f64>,
}

fn finding(node: &NodeFacts, check: &'static str, level: Level, detail: String) -> Finding {
    Finding {
        node: Some(node.name.clone()),
        check,
        level,
        detail,
    }
}

/// The checks of one node (pure).
pub fn check_node(node: &NodeFacts, drift_factor: f64) -> Vec<Finding> {
    use Level::{Fail, Pass, Warn};
    if let Some(why) = &node.unreachable {
        return vec![finding(node, "reachable", Fail, why.clone())];
    }
    let mut out = Vec::new();
    let latency = node.latency.unwrap_or_default();
    out.push(finding(
        node,
        "reachable",
        Pass,
        format!("PING {:.2} ms", latency.as_secs_f64() * 1e3),
    ));
    out.push(match node.version.as_deref().map(parse_version) {
        Some(Some(v)) if v >= (6, 0, 0) => finding(
            node,
            "version",
            Pass,
            format!("Redis {}.{}.{}", v.0, v.1, v.2),
        ),
        Some(Some(v)) if v >= (2, 6, 12) => finding(
            node,
            "version",
            Warn,
            format!(
                "Redis {}.{}.{} is old; 6.0 or later is tested",
                v.0, v.1, v.2
            ),
        ),
        Some(Some(v)) => finding(
            node,
            "version",
            Fail,
            format!("Redis {}.{}.{} lacks SET NX PX (2.6.12+)", v.0, v.1, v.2),
        ),
        _ => finding(
            node,
            "version",
            Warn,
            "unknown (INFO server unreadable)".into(),
        ),
    });
    out.push(match (node.appendonly.as_deref(), node.appendfsync.as_deref()) {
        (Some("yes"), Some("always")) => finding(node, "persistence", Pass, "appendonly yes, appendfsync always".into()),
        (Some("yes"), Some(fsync)) => finding(
            node,
            "persistence",
            Warn,
            format!(
                "appendfsync {fsync}: a crash can lose the last writes, so a restarted node may \
                 have forgotten a lock it granted; use appendfsync always, or restart a crashed \
                 node only after the longest TTL (fencing counters need always)"
            ),
        ),
        (Some("no"), _) => finding(
            node,
            "persistence",
            Warn,
            "appendonly no: a restarted node forgets every lock and counter; enable AOF with \
             appendfsync always, or restart a crashed node only after the longest TTL (not \
             enough for fencing counters)"
                .into(),
        ),
        _ => finding(node, "persistence", Warn, "unknown (CONFIG GET unavailable)".into()),
    });
    out.push(match node.maxmemory_policy.as_deref() {
        Some("noeviction") => finding(node, "eviction", Pass, "maxmemory-policy noeviction".into()),
        Some(policy) => finding(
            node,
            "eviction",
            Fail,
            format!(
                "maxmemory-policy {policy}: an evicted lock key is a lock granted twice, and every \
                 lock key carries a TTL, so even the volatile-* policies can evict a held lock; \
                 set noeviction"
            ),
        ),
        None => finding(
            node,
            "eviction",
            Warn,
            "unknown (CONFIG GET unavailable)".into(),
        ),
    });
    if let Some(limit) = node.maxmemory {
        let detail = if limit == 0 {
            "maxmemory 0 (no limit)".to_owned()
        } else {
            format!("maxmemory {limit} bytes: when full, lock attempts fail (safely)")
        };
        out.push(finding(node, "memory", Pass, detail));
    }
    out.push(match (node.role.as_deref(), node.replicas.unwrap_or(0)) {
        (Some("master"), 0) => finding(node, "replication", Pass, "independent master".into()),
        (Some("master"), n) => finding(
            node,
            "replication",
            Warn,
            format!("{n} replica(s): a failover to a replica can lose a granted lock; the lock needs no replicas"),
        ),
        (Some(role), _) => finding(
            node,
            "replication",
            Fail,
            format!("role {role}: lock nodes must be independent masters"),
        ),
        (None, _) => finding(node, "replication", Warn, "unknown (INFO replication unreadable)".into()),
    });
    out.push(match node.clock_rate {
        Some(rate) => {
            let error = (rate - 1.0).abs();
            let detail = format!(
                "runs {:+.3} % against this machine (drift factor {} %)",
                (rate - 1.0) * 100.0,
                drift_factor * 100.0
            );
            let level = if error <= drift_factor / 2.0 {
                Pass
            } else if error <= drift_factor {
                Warn
            } else {
                Fail
            };
            finding(node, "clock rate", level, detail)
        }
        None => finding(node, "clock rate", Warn, "unknown (TIME unreadable)".into()),
    });
    out
}

/// Checks of the set of nodes as a whole (pure).
pub fn check_set(nodes: &[NodeFacts]) -> Vec<Finding> {
    use Level::{Fail, Pass, Warn};
    let set = |check, level, detail: String| Finding {
        node: None,
        check,
        level,
        detail,
    };
    let mut out = Vec::new();
    let n = nodes.len();
    out.push(if n < 3 {
        set(
            "node count",
            Warn,
            format!("{n} node(s): no node may fail; use 5 (or at least 3)"),
        )
    } else if n.is_multiple_of(2) {
        set(
            "node count",
            Warn,
            format!(
                "{n} nodes tolerate no more failures than {}; use an odd number",
                n - 1
            ),
        )
    } else {
        set(
            "node count",
            Pass,
            format!(
                "{n} nodes tolerate {} failures",
                n - quorumlock::quorum::quorum(n)
            ),
        )
    });
    let mut duplicate = false;
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            if a.run_id.is_some() && a.run_id == b.run_id {
                duplicate = true;
                out.push(set(
                    "independence",
                    Fail,
                    format!(
                        "{} and {} are the same Redis process (same run_id)",
                        a.name, b.name
                    ),
                ));
            } else if a.ip.is_some() && a.ip == b.ip && !a.ip.is_some_and(|ip| ip.is_loopback()) {
                duplicate = true;
                out.push(set(
                    "independence",
                    Warn,
                    format!(
                        "{} and {} are on the same host; they fail together",
                        a.name, b.name
                    ),
                ));
            }
        }
    }
    let on_loopback = nodes
        .iter()
        .filter(|n| n.ip.is_some_and(|ip| ip.is_loopback()))
        .count();
    if !duplicate {
        out.push(if on_loopback > 1 {
            set(
                "independence",
                Warn,
                format!("{on_loopback} nodes on this machine: fine for tests, not for production"),
            )
        } else {
            set(
                "independence",
                Pass,
                "separate processes on separate hosts".into(),
            )
        });
    }
    out
}

/// Semantic version numbers of `7.0.15`-like text.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

async fn gather(url: &str, interval: Duration) -> NodeFacts {
    let mut facts = NodeFacts {
        name: url.trim_start_matches("redis://").to_owned(),
        ..NodeFacts::default()
    };
    if let Ok(client) = redis::Client::open(url)
        && let redis::ConnectionAddr::Tcp(host, port) = client.get_connection_info().addr()
        && let Ok(mut addrs) = tokio::net::lookup_host((host.as_str(), *port)).await
    {
        facts.ip = addrs.next().map(|a| a.ip());
    }
    let probe = match Probe::connect(url).await {
        Ok(probe) => probe,
        Err(e) => {
            facts.unreachable = Some(e);
            return facts;
        }
    };
    facts.name = probe.name.clone();
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
    facts.latency = Some(pings[1]);
    if let Ok(server) = probe.info("server").await {
        facts.version = field(&server, "redis_version").map(str::to_owned);
        facts.run_id = field(&server, "run_id").map(str::to_owned);
    }
    if let Ok(replication) = probe.info("replication").await {
        facts.role = field(&replication, "role").map(str::to_owned);
        facts.replicas = field(&replication, "connected_slaves").and_then(|v| v.parse().ok());
    }
    facts.appendonly = probe.config("appendonly").await;
    facts.appendfsync = probe.config("appendfsync").await;
    facts.maxmemory_policy = probe.config("maxmemory-policy").await;
    facts.maxmemory = probe.config("maxmemory").await.and_then(|v| v.parse().ok());
    facts.clock_rate = clock_rate(&probe, interval).await.ok();
    facts
}

/// The node's clock rate against ours: the change of its `TIME` over the
/// change of our monotonic clock, each sample taken mid-request.
async fn clock_rate(probe: &Probe, interval: Duration) -> Result<f64, String> {
    async fn sample(probe: &Probe) -> Result<(f64, Instant), String> {
        let before = Instant::now();
        let (secs, micros): (u64, u64) = probe.query(&redis::cmd("TIME")).await?;
        let after = Instant::now();
        Ok((
            secs as f64 + micros as f64 / 1e6,
            before + (after - before) / 2,
        ))
    }
    let (server0, local0) = sample(probe).await?;
    tokio::time::sleep(interval).await;
    let (server1, local1) = sample(probe).await?;
    let local = (local1 - local0).as_secs_f64();
    if local <= 0.0 {
        return Err("no time passed".into());
    }
    Ok((server1 - server0) / local)
}

pub async fn doctor(args: DoctorArgs) -> Result<u8, Failure> {
    if !(0.0..1.0).contains(&args.drift_factor) {
        return Err(Failure::new(
            exit::USAGE,
            "--drift-factor must be in [0, 1)",
        ));
    }
    let facts = futures::future::join_all(
        args.nodes
            .nodes
            .iter()
            .map(|url| gather(url, args.clock_interval)),
    )
    .await;
    let mut findings: Vec<Finding> = facts
        .iter()
        .flat_map(|f| check_node(f, args.drift_factor))
        .collect();
    findings.extend(check_set(&facts));
    let overall = findings
        .iter()
        .map(|f| f.level)
        .max()
        .unwrap_or(Level::Pass);
    if args.json {
        #[derive(Serialize)]
        struct Report<'a> {
            overall: Level,
            findings: &'a [Finding],
        }
        let text = serde_json::to_string_pretty(&Report {
            overall,
            findings: &findings,
        })
        .map_err(|e| Failure::new(exit::ERROR, e.to_string()))?;
        println!("{text}");
    } else {
        println!("{:<22} {:<13} {:<5} detail", "node", "check", "level");
        for f in &findings {
            let level = match f.level {
                Level::Pass => "pass",
                Level::Warn => "WARN",
                Level::Fail => "FAIL",
            };
            println!(
                "{:<22} {:<13} {level:<5} {}",
                f.node.as_deref().unwrap_or("(all nodes)"),
                f.check,
                f.detail
            );
        }
        println!(
            "overall: {}",
            match overall {
                Level::Pass => "PASS",
                Level::Warn => "WARN",
                Level::Fail => "FAIL",
            }
        );
    }
    Ok(if overall == Level::Fail {
        exit::FAILED
    } else {
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy(name: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            latency: Some(Duration::from_micros(200)),
            version: Some("7.0.15".into()),
            run_id: Some(format!("run-{name}")),
            appendonly: Some("yes".into()),
            appendfsync: Some("always".into()),
            maxmemory_policy: Some("noeviction".into()),
            maxmemory: Some(0),
            role: Some("master".into()),
            replicas: Some(0),
            ip: Some("10.0.0.1".parse().expect("ip")),
            clock_rate: Some(1.0001),
            ..NodeFacts::default()
        }
    }

    fn level_of(findings: &[Finding], check: &str) -> Level {
        findings
            .iter()
            .find(|f| f.check == check)
            .map(|f| f.level)
            .expect("check present")
    }

    #[test]
    fn node_checks_grade_each_setting() {
        let table: Vec<(&str, NodeFacts, &str, Level)> = vec![
            (
                "healthy persistence",
                healthy("a"),
                "persistence",
                Level::Pass,
            ),
            (
                "everysec",
                NodeFacts {
                    appendfsync: Some("everysec".into()),
                    ..healthy("a")
                },
                "persistence",
                Level::Warn,
            ),
            (
                "no aof",
                NodeFacts {
                    appendonly: Some("no".into()),
                    ..healthy("a")
                },
                "persistence",
                Level::Warn,
            ),
            (
                "allkeys-lru",
                NodeFacts {
                    maxmemory_policy: Some("allkeys-lru".into()),
                    ..healthy("a")
                },
                "eviction",
                Level::Fail,
            ),
            (
                "volatile-ttl",
                NodeFacts {
                    maxmemory_policy: Some("volatile-ttl".into()),
                    ..healthy("a")
                },
                "eviction",
                Level::Fail,
            ),
            (
                "replica",
                NodeFacts {
                    role: Some("slave".into()),
                    ..healthy("a")
                },
                "replication",
                Level::Fail,
            ),
            (
                "has replicas",
                NodeFacts {
                    replicas: Some(1),
                    ..healthy("a")
                },
                "replication",
                Level::Warn,
            ),
            (
                "clock within half",
                NodeFacts {
                    clock_rate: Some(1.004),
                    ..healthy("a")
                },
                "clock rate",
                Level::Pass,
            ),
            (
                "clock within drift",
                NodeFacts {
                    clock_rate: Some(0.992),
                    ..healthy("a")
                },
                "clock rate",
                Level::Warn,
            ),
            (
                "clock beyond drift",
                NodeFacts {
                    clock_rate: Some(1.02),
                    ..healthy("a")
                },
                "clock rate",
                Level::Fail,
            ),
            (
                "old redis",
                NodeFacts {
                    version: Some("2.6.10".into()),
                    ..healthy("a")
                },
                "version",
                Level::Fail,
            ),
            (
                "unreachable",
                NodeFacts {
                    unreachable: Some("refused".into()),
                    ..healthy("a")
                },
                "reachable",
                Level::Fail,
            ),
        ];
        for (case, facts, check, expected) in table {
            assert_eq!(
                level_of(&check_node(&facts, 0.01), check),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn set_checks_find_shared_processes_and_hosts() {
        let five: Vec<NodeFacts> = (0..5)
            .map(|i| NodeFacts {
                ip: Some(format!("10.0.0.{i}").parse().expect("ip")),
                ..healthy(&i.to_string())
            })
            .collect();
        assert!(check_set(&five).iter().all(|f| f.level == Level::Pass));

        let mut twice = five.clone();
        twice[1].run_id = twice[0].run_id.clone();
        assert_eq!(level_of(&check_set(&twice), "independence"), Level::Fail);

        let mut same_host = five.clone();
        same_host[2].ip = same_host[3].ip;
        assert_eq!(
            level_of(&check_set(&same_host), "independence"),
            Level::Warn
        );

        assert_eq!(level_of(&check_set(&five[..4]), "node count"), Level::Warn);
    }
}
