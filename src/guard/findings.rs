//! `quorumlock doctor`'s findings: the judge's rules (`judge.rs`) graded
//! for an operator, node by node and for the set. A `Fail` is exactly a
//! reason the run-time guard quarantines for. Only the testkit and the
//! command line use it.

use std::time::Duration;

use super::judge::{
    LayoutScan, Loss, LostAt, NodeFacts, QuarantineReason, first_sight, settings_fault,
};

/// The grade of a doctor finding.
///
/// ```
/// use quorumlock::internals::judge::Level;
///
/// assert!(Level::Pass < Level::Warn && Level::Warn < Level::Fail);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Fine.
    Pass,
    /// Works, but weakens a guarantee or is unknown.
    Warn,
    /// Breaks a rule the lock's safety rests on: the guard quarantines
    /// the node for it.
    Fail,
}

/// One check's result, for one node or for the whole set.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::judge::{NodeFacts, check_node};
///
/// let mut facts = NodeFacts::named("127.0.0.1:7001");
/// facts.unreachable = Some("connection refused".into());
/// for finding in check_node(&facts, 0.01, Duration::from_secs(10)) {
///     println!("{:?} {}: {}", finding.level, finding.check, finding.detail);
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// The node, or `None` for checks of the whole set.
    pub node: Option<String>,
    /// The check's name, e.g. `persistence`.
    pub check: &'static str,
    /// Its grade.
    pub level: Level,
    /// What was seen, and what to do about it.
    pub detail: String,
}

fn finding(node: &NodeFacts, check: &'static str, level: Level, detail: String) -> Finding {
    Finding {
        node: Some(node.name.clone()),
        check,
        level,
        detail,
    }
}

/// The doctor's checks of one node. `window` is the quarantine window
/// clients use (their longest TTL): a node younger than that which does
/// not persist every write is one they do not count yet.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::judge::{Level, NodeFacts, check_node};
///
/// let mut facts = NodeFacts::named("127.0.0.1:7001");
/// facts.unreachable = Some("connection refused".into());
/// let findings = check_node(&facts, 0.01, Duration::from_secs(10));
/// assert_eq!((findings[0].check, findings[0].level), ("reachable", Level::Fail));
/// ```
pub fn check_node(node: &NodeFacts, drift_factor: f64, window: Duration) -> Vec<Finding> {
    use Level::{Fail, Pass, Warn};
    if let Some(why) = &node.unreachable {
        return vec![finding(node, "reachable", Fail, why.clone())];
    }
    let latency = node.latency.unwrap_or_default();
    let mut out = vec![finding(
        node,
        "reachable",
        Pass,
        format!("PING {:.2} ms", latency.as_secs_f64() * 1e3),
    )];
    out.push(check_version(node));
    out.push(if node.persists_every_write() {
        finding(
            node,
            "persistence",
            Pass,
            "appendonly yes, appendfsync always".into(),
        )
    } else if node.appendonly.is_none() && node.appendfsync.is_none() {
        finding(
            node,
            "persistence",
            Warn,
            "unknown (CONFIG GET unavailable): clients assume it does not persist every write \
             and quarantine it after each restart"
                .into(),
        )
    } else {
        finding(
            node,
            "persistence",
            Warn,
            format!(
                "{}: a restarted node may have forgotten locks it granted, so clients do not \
                 count it until it has run for their longest TTL; use appendfsync always with \
                 no-appendfsync-on-rewrite no \
                 (fencing counters need it)",
                node.persistence()
            ),
        )
    });
    if let Some(Loss { reason, at }) = first_sight(node, window) {
        let left = match at {
            LostAt::Ago(ago) => window.saturating_sub(ago),
            LostAt::Now => window,
        };
        out.push(finding(
            node,
            "restart",
            Fail,
            format!(
                "{reason}; clients that meet it now quarantine it for {left:.1?} more (window \
                 {window:?})"
            ),
        ));
    }
    out.push(match (settings_fault(node), node.maxmemory_policy.as_deref()) {
        (Some(reason @ QuarantineReason::Evicts { .. }), _) => {
            finding(node, "eviction", Fail, reason.to_string())
        }
        (_, Some("noeviction")) => {
            finding(node, "eviction", Pass, "maxmemory-policy noeviction".into())
        }
        (_, Some(policy)) => finding(
            node,
            "eviction",
            Warn,
            format!(
                "maxmemory-policy {policy} evicts nothing while maxmemory is 0, but would evict \
                 lock keys (every one has a TTL) once a limit is set; set noeviction"
            ),
        ),
        (_, None) => finding(
            node,
            "eviction",
            Warn,
            "unknown (maxmemory_policy unreadable)".into(),
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
    out.push(
        match (settings_fault(node), node.role.as_deref(), node.replicas) {
            (Some(reason @ QuarantineReason::Replica { .. }), _, _) => {
                finding(node, "replication", Fail, reason.to_string())
            }
            (_, Some(_), Some(n)) if n > 0 => finding(
                node,
                "replication",
                Warn,
                format!(
                    "{n} replica(s): a failover to a replica can lose a granted lock; the lock \
                     needs no replicas"
                ),
            ),
            (_, Some(_), _) => finding(node, "replication", Pass, "independent master".into()),
            (_, None, _) => finding(
                node,
                "replication",
                Warn,
                "unknown (INFO replication unreadable)".into(),
            ),
        },
    );
    out.push(check_clock(node, drift_factor));
    if let Some(scan) = &node.old_layout {
        out.push(check_layout(node, scan));
    }
    out
}

/// Old-layout lock or waiter keys mean clients of an older quorumlock
/// still hold or wait for locks: they and this version do not exclude each
/// other on names without a `{…}` tag, so the upgrade must wait until they
/// are gone. Only a scan that saw every key may pass.
fn check_layout(node: &NodeFacts, scan: &Result<LayoutScan, String>) -> Finding {
    let (level, detail) = match scan {
        Err(why) => (
            Level::Warn,
            format!("cannot look for keys of the older layout ({why}); SCAN is needed"),
        ),
        Ok(LayoutScan {
            found: 0,
            complete: true,
        }) => (
            Level::Pass,
            "no lock or waiter key of the older layout".to_owned(),
        ),
        Ok(LayoutScan {
            found: 0,
            complete: false,
        }) => (
            Level::Warn,
            "no key of the older layout among those scanned, but the scan stopped at its bound \
             before the end of this node's keys; look again, or by hand (SCAN MATCH \
             quorumlock:lock:*)"
                .to_owned(),
        ),
        Ok(LayoutScan { found, .. }) => (
            Level::Fail,
            format!(
                "{found} lock or waiter key(s) of the layout before hash tags \
                 (quorumlock:lock:<name>, quorumlock:waiters:<name>, …): clients of an older \
                 quorumlock hold or wait for locks that this version does not see; stop them \
                 and let their locks end (release, or one TTL) before starting new clients"
            ),
        ),
    };
    finding(node, "layout", level, detail)
}

fn check_version(node: &NodeFacts) -> Finding {
    use Level::{Fail, Pass, Warn};
    match node.version.as_deref().map(parse_version) {
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
    }
}

fn check_clock(node: &NodeFacts, drift_factor: f64) -> Finding {
    use Level::{Fail, Pass, Warn};
    let Some(rate) = node.clock_rate else {
        return finding(node, "clock rate", Warn, "unknown (TIME unreadable)".into());
    };
    let detail = format!(
        "runs {:+.3} % against this machine (drift factor {} %)",
        (rate - 1.0) * 100.0,
        drift_factor * 100.0
    );
    if let Some(fault) = node.clock_fault {
        let reason = QuarantineReason::from(fault);
        return finding(node, "clock rate", Fail, format!("{detail}: {reason}"));
    }
    // Within the bounds the guard allows; the estimate may still be close
    // to the edge.
    let level = if (rate - 1.0).abs() <= drift_factor / 2.0 {
        Pass
    } else {
        Warn
    };
    finding(node, "clock rate", level, detail)
}

/// The doctor's checks of the set of nodes as a whole.
///
/// ```
/// use quorumlock::internals::judge::{Level, NodeFacts, check_set};
///
/// let nodes: Vec<NodeFacts> = (1..=2).map(|i| NodeFacts::named(format!("127.0.0.1:700{i}"))).collect();
/// let findings = check_set(&nodes);
/// // Two nodes tolerate no failure: the doctor says so.
/// assert!(findings.iter().any(|f| f.level != Level::Pass), "{findings:?}");
/// ```
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
                n - crate::quorum::quorum(n)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::judge::{ClockFault, Reported};

    fn healthy(name: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            latency: Some(Duration::from_micros(200)),
            version: Some("7.0.15".into()),
            run_id: Some(format!("run-{name}")),
            uptime: Some(Reported::whole_seconds(3600)),
            appendonly: Some(true),
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

    fn level_of(findings: &[Finding], check: &str) -> Option<Level> {
        findings.iter().find(|f| f.check == check).map(|f| f.level)
    }

    #[test]
    fn node_checks_grade_each_setting() {
        use Level::{Fail, Pass, Warn};
        let young_everysec = NodeFacts {
            appendfsync: Some("everysec".into()),
            uptime: Some(Reported::whole_seconds(3)),
            ..healthy("a")
        };
        let table: Vec<(&str, NodeFacts, &str, Option<Level>)> = vec![
            ("persistent", healthy("a"), "persistence", Some(Pass)),
            (
                "persistent: no restart finding",
                healthy("a"),
                "restart",
                None,
            ),
            (
                "everysec",
                NodeFacts {
                    appendfsync: Some("everysec".into()),
                    ..healthy("a")
                },
                "persistence",
                Some(Warn),
            ),
            (
                "old everysec node is counted",
                NodeFacts {
                    appendfsync: Some("everysec".into()),
                    ..healthy("a")
                },
                "restart",
                None,
            ),
            ("young everysec", young_everysec, "restart", Some(Fail)),
            (
                "no aof",
                NodeFacts {
                    appendonly: Some(false),
                    ..healthy("a")
                },
                "persistence",
                Some(Warn),
            ),
            (
                "allkeys-lru with a limit",
                NodeFacts {
                    maxmemory_policy: Some("allkeys-lru".into()),
                    maxmemory: Some(1 << 20),
                    ..healthy("a")
                },
                "eviction",
                Some(Fail),
            ),
            (
                "volatile-ttl with a limit",
                NodeFacts {
                    maxmemory_policy: Some("volatile-ttl".into()),
                    maxmemory: Some(1 << 20),
                    ..healthy("a")
                },
                "eviction",
                Some(Fail),
            ),
            (
                "allkeys-lru without a limit",
                NodeFacts {
                    maxmemory_policy: Some("allkeys-lru".into()),
                    ..healthy("a")
                },
                "eviction",
                Some(Warn),
            ),
            (
                "replica",
                NodeFacts {
                    role: Some("slave".into()),
                    ..healthy("a")
                },
                "replication",
                Some(Fail),
            ),
            (
                "has replicas",
                NodeFacts {
                    replicas: Some(1),
                    ..healthy("a")
                },
                "replication",
                Some(Warn),
            ),
            (
                "clock within half",
                NodeFacts {
                    clock_rate: Some(1.004),
                    ..healthy("a")
                },
                "clock rate",
                Some(Pass),
            ),
            (
                "clock near the edge",
                NodeFacts {
                    clock_rate: Some(0.992),
                    ..healthy("a")
                },
                "clock rate",
                Some(Warn),
            ),
            (
                "clock judged faulty",
                NodeFacts {
                    clock_rate: Some(2.0),
                    clock_fault: Some(ClockFault::Rate { rate_milli: 2000 }),
                    ..healthy("a")
                },
                "clock rate",
                Some(Fail),
            ),
            (
                "old redis",
                NodeFacts {
                    version: Some("2.6.10".into()),
                    ..healthy("a")
                },
                "version",
                Some(Fail),
            ),
            (
                "unreachable",
                NodeFacts {
                    unreachable: Some("refused".into()),
                    ..healthy("a")
                },
                "reachable",
                Some(Fail),
            ),
        ];
        for (case, facts, check, expected) in table {
            assert_eq!(
                level_of(&check_node(&facts, 0.01, Duration::from_secs(10)), check),
                expected,
                "{case}"
            );
        }
    }

    /// A `Fail` is exactly a reason the guard quarantines for.

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
        assert_eq!(
            level_of(&check_set(&twice), "independence"),
            Some(Level::Fail)
        );

        let mut same_host = five.clone();
        same_host[2].ip = same_host[3].ip;
        assert_eq!(
            level_of(&check_set(&same_host), "independence"),
            Some(Level::Warn)
        );

        assert_eq!(
            level_of(&check_set(&five[..4]), "node count"),
            Some(Level::Warn)
        );
    }
}
