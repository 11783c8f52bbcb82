//! Members named by `redis+cluster://` URLs, as `status` and `doctor` see
//! them: the shard masters that serve their slots, from `CLUSTER SLOTS` of
//! the first named node that answers, and what each master's replicas
//! would do on their own.

use quorumlock::internals::judge::{DataSetKeys, Finding, Level};
use quorumlock::internals::{ClusterUrl, cluster_masters};

use crate::NodeArgs;
use crate::probe::Probe;

/// A cluster member as read now.
pub struct ClusterView {
    /// `cluster(host:port,…)`, as the library names the member.
    pub name: String,
    /// `(first slot, last slot, plain URL of its master)`, lowest first.
    pub ranges: Vec<(u16, u16, String)>,
    url: ClusterUrl,
}

impl ClusterView {
    /// The master serving `slot`, as a plain URL.
    pub fn master_for(&self, slot: u16) -> Option<&str> {
        self.ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, url)| url.as_str())
    }

    /// Each master once, with where the guard keeps its mark there (a slot
    /// of its first range, as the clients choose it).
    pub fn masters(&self) -> Vec<(&str, DataSetKeys)> {
        let mut masters: Vec<(&str, DataSetKeys)> = Vec::new();
        for (first, _, url) in &self.ranges {
            if !masters.iter().any(|(known, _)| known == url) {
                masters.push((url, DataSetKeys::in_slot(*first)));
            }
        }
        masters
    }

    /// Where the guard keeps its mark on the master at `master`.
    pub fn data_set_of(&self, master: &str) -> DataSetKeys {
        self.masters()
            .into_iter()
            .find(|(url, _)| *url == master)
            .map_or_else(DataSetKeys::standalone, |(_, keys)| keys)
    }

    /// How the member's shard masters are named in reports.
    pub fn shard_name(&self, probe_name: &str) -> String {
        format!("{}/{probe_name}", self.name)
    }

    /// How many slots are served.
    pub fn served(&self) -> usize {
        self.ranges
            .iter()
            .map(|(first, last, _)| usize::from(last - first) + 1)
            .sum()
    }
}

/// `url` without its scheme and password, for a report.
pub fn shown(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.rsplit_once('@')
        .map_or(rest, |(_, hosts)| hosts)
        .to_owned()
}

/// Reads the slot map of the cluster `url` names.
pub async fn read_cluster(url: &ClusterUrl, nodes: &NodeArgs) -> Result<ClusterView, String> {
    let mut errors = Vec::new();
    for seed in &url.seeds {
        let probe = match Probe::connect(&url.node_url(seed), nodes).await {
            Ok(probe) => probe,
            Err(error) => {
                errors.push(error);
                continue;
            }
        };
        let host = seed
            .rsplit_once(':')
            .map_or(seed.as_str(), |(host, _)| host);
        let read = probe
            .query::<redis::Value>(redis::cmd("CLUSTER").arg("SLOTS"))
            .await
            .and_then(|reply| cluster_masters(&reply, host));
        match read {
            Ok(ranges) => {
                return Ok(ClusterView {
                    name: format!("cluster({})", url.seeds.join(",")),
                    ranges: ranges
                        .into_iter()
                        .map(|(first, last, address)| (first, last, url.node_url(&address)))
                        .collect(),
                    url: url.clone(),
                });
            }
            Err(error) => errors.push(format!("{}: {error}", probe.name)),
        }
    }
    Err(format!(
        "no node of the cluster told its slot map: {}",
        errors.join("; ")
    ))
}

/// What `doctor` says of a cluster member as a whole: whether every slot
/// is served, and, per shard master: its `cluster-node-timeout` (clients
/// add it to their quarantine window), and, with replicas, whether those
/// fail over on their own (`cluster-replica-no-failover no`) and whether
/// they persist every write (a replica that takes over is a lock node).
pub async fn cluster_findings(view: &ClusterView, nodes: &NodeArgs) -> Vec<Finding> {
    let mut out = Vec::new();
    let served = view.served();
    let masters = view.masters();
    out.push(Finding {
        node: Some(view.name.clone()),
        check: "slots",
        level: if served == 16_384 {
            Level::Pass
        } else {
            Level::Fail
        },
        detail: format!(
            "{} shard master(s) serve {served} of 16384 slots{}",
            masters.len(),
            if served == 16_384 {
                ""
            } else {
                ": locks of unserved slots fail on this member (CLUSTERDOWN)"
            }
        ),
    });
    for (master, _) in masters {
        let Ok(probe) = Probe::connect(master, nodes).await else {
            continue;
        };
        let name = view.shard_name(&probe.name);
        out.push(node_timeout_finding(
            &name,
            probe.config("cluster-node-timeout").await,
        ));
        let info: String = match probe.query(redis::cmd("INFO").arg("replication")).await {
            Ok(info) => info,
            Err(_) => continue,
        };
        let replicas = replica_addresses(&info);
        out.push(acknowledgement_finding(&name, replicas.len()));
        if replicas.is_empty() {
            out.push(Finding {
                node: Some(name),
                check: "failover",
                level: Level::Pass,
                detail: "no replicas: no failover can hand its slots to a copy".into(),
            });
            continue;
        }
        let mut automatic = Vec::new();
        let mut unpersisted = Vec::new();
        for replica in &replicas {
            let (setting, persistence) =
                match Probe::connect(&view.url.node_url(replica), nodes).await {
                    Ok(probe) => (
                        probe.config("cluster-replica-no-failover").await,
                        (
                            probe.config("appendonly").await,
                            probe.config("appendfsync").await,
                        ),
                    ),
                    Err(_) => (None, (None, None)),
                };
            if persistence != (Some("yes".to_owned()), Some("always".to_owned())) {
                unpersisted.push(format!(
                    "{replica} (appendonly {}, appendfsync {})",
                    persistence.0.as_deref().unwrap_or("unreadable"),
                    persistence.1.as_deref().unwrap_or("unreadable")
                ));
            }
            if setting.as_deref() != Some("yes") {
                automatic.push(format!(
                    "{replica} ({})",
                    setting.map_or("setting unreadable".to_owned(), |s| format!(
                        "no-failover {s}"
                    ))
                ));
            }
        }
        out.push(replica_persistence_finding(
            &name,
            replicas.len(),
            &unpersisted,
        ));
        out.push(if automatic.is_empty() {
            Finding {
                node: Some(name),
                check: "failover",
                level: Level::Pass,
                detail: format!(
                    "{} replica(s), none fails over on its own (cluster-replica-no-failover \
                     yes); fail over by hand with CLUSTER FAILOVER (never FORCE or TAKEOVER)",
                    replicas.len()
                ),
            }
        } else {
            Finding {
                node: Some(name),
                check: "failover",
                level: Level::Warn,
                detail: format!(
                    "replicas that fail over on their own: {}. Locks stay safe (clients \
                     quarantine a promoted replica for the window), but a fencing counter \
                     the copy lacks can go back: with fencing on, set \
                     cluster-replica-no-failover yes on every replica",
                    automatic.join(", ")
                ),
            }
        });
    }
    out
}

/// The `acknowledgement` finding of a shard master with `replicas`
/// replicas: its writes count once a replica acknowledged them, so with
/// one a dead or paused replica stops its locks.
fn acknowledgement_finding(name: &str, replicas: usize) -> Finding {
    let (level, detail) = match replicas {
        0 => (
            Level::Pass,
            "no replica: nothing to wait for (a master that dies takes its locks with it \
             until it is back)"
                .to_owned(),
        ),
        1 => (
            Level::Warn,
            "one replica: every lock write waits for its acknowledgement (WAIT), so while it \
             is dead or paused this shard's locks are unavailable; give the shard a second \
             replica"
                .to_owned(),
        ),
        n => (
            Level::Pass,
            format!(
                "{n} replicas: a lock write counts once one of them acknowledged it (WAIT); keep \
                 them on other hosts than their master (one frozen with it could acknowledge \
                 its late writes after another took over)"
            ),
        ),
    };
    Finding {
        node: Some(name.to_owned()),
        check: "acknowledgement",
        level,
        detail,
    }
}

/// The `node-timeout` finding of a shard master: the value clients add to
/// their quarantine window (a master cut off from its cluster grants that
/// long after its replica took over), or a warning when it cannot be read.
fn node_timeout_finding(name: &str, setting: Option<String>) -> Finding {
    match setting.as_deref().and_then(|ms| ms.parse::<u64>().ok()) {
        Some(ms) => Finding {
            node: Some(name.to_owned()),
            check: "node-timeout",
            level: Level::Pass,
            detail: format!(
                "cluster-node-timeout {ms} ms: clients' quarantine window is their longest TTL \
                 plus this (a master cut off from its cluster grants that long after its \
                 replica took over); a failed-over shard is out that long too"
            ),
        },
        None => Finding {
            node: Some(name.to_owned()),
            check: "node-timeout",
            level: Level::Warn,
            detail: "cluster-node-timeout unreadable (CONFIG GET refused?): clients cannot add it \
                     to their quarantine window; set quarantine_window to the longest TTL plus \
                     it, or allow +config|get"
                .into(),
        },
    }
}

/// The `replica-persistence` finding of a shard master with `replicas`:
/// a replica that takes over is a lock node, and must persist every write
/// as its master does (`unpersisted` names those that do not).
fn replica_persistence_finding(name: &str, replicas: usize, unpersisted: &[String]) -> Finding {
    if unpersisted.is_empty() {
        Finding {
            node: Some(name.to_owned()),
            check: "replica-persistence",
            level: Level::Pass,
            detail: format!(
                "{replicas} replica(s), each with appendonly yes and appendfsync always"
            ),
        }
    } else {
        Finding {
            node: Some(name.to_owned()),
            check: "replica-persistence",
            level: Level::Warn,
            detail: format!(
                "replicas that do not persist every write: {}. One that takes over is a lock \
                 node: after a crash it comes back without what it acknowledged (clients \
                 quarantine it, but its fencing counters can go back); set appendonly yes \
                 and appendfsync always on every replica",
                unpersisted.join(", ")
            ),
        }
    }
}

/// `ip:port` of each replica that `INFO replication` of a master lists
/// (`slave0:ip=…,port=…,state=online,…`).
fn replica_addresses(info: &str) -> Vec<String> {
    info.lines()
        .filter(|line| line.starts_with("slave") && line.contains(":ip="))
        .filter_map(|line| {
            let fields = line.split_once(':')?.1;
            let field = |name: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            };
            Some(format!("{}:{}", field("ip")?, field("port")?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_are_read_from_info() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
                    slave0:ip=127.0.0.1,port=7004,state=online,offset=10,lag=0\r\n\
                    slave1:ip=10.0.0.2,port=7005,state=wait_bgsave,offset=0,lag=0\r\n\
                    master_failover_state:no-failover\r\n";
        assert_eq!(replica_addresses(info), ["127.0.0.1:7004", "10.0.0.2:7005"]);
    }
}
