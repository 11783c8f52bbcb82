//! The command line with a member that is a Redis Cluster
//! (`redis+cluster://`, its nodes after it in the comma-separated list):
//! `run` takes the lock through it, `status` reads the shard master of the
//! resource's slot, and `doctor` checks every shard master and says
//! whether replicas would fail over on their own.

mod common;

use std::future::IntoFuture;
use std::process::Command;

use quorumlock::testkit::{ClusterMember, TestCluster};

fn quorumlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_quorumlock"));
    command.env_remove("QUORUMLOCK_NODES");
    command
}

fn json(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let output = quorumlock().args(args).output().expect("runs");
    let report = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?} printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code(), report)
}

/// The findings of check `check` in a doctor report.
fn findings_of(report: &serde_json::Value, check: &str) -> Vec<serde_json::Value> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["check"] == check)
        .cloned()
        .collect()
}

/// The `failover` findings of a doctor report, as (node, level).
fn failover_levels(report: &serde_json::Value) -> Vec<(String, String)> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["check"] == "failover")
        .map(|f| {
            (
                f["node"].as_str().unwrap_or_default().to_owned(),
                f["level"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn run_status_and_doctor_see_through_a_cluster_member() {
    let member = ClusterMember::start(3, 1).expect("a 3-shard cluster with replicas");
    let standalone = TestCluster::start(2).expect("two standalone nodes");
    let cluster_url = member.url().expect("a URL");
    let nodes = format!("{cluster_url},{}", standalone.urls().join(","));

    let run = quorumlock()
        .args([
            "run",
            "--nodes",
            &nodes,
            "--node-timeout",
            "500ms",
            "job:{7}",
            "--",
            "true",
        ])
        .output()
        .expect("runs");
    assert_eq!(
        run.status.code(),
        Some(0),
        "run through a cluster member: {}",
        String::from_utf8_lossy(&run.stderr)
    );

    // A lock held: status finds it on the shard master of its slot.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let urls = vec![
        cluster_url.clone(),
        standalone.urls()[0].clone(),
        standalone.urls()[1].clone(),
    ];
    let manager = common::builder(urls).build().expect("valid settings");
    let lock = runtime
        .block_on(manager.lock("invoice:7").into_future())
        .expect("lock");
    let (_, report) = json(&["status", "invoice:7", "--json", "--nodes", &nodes]);
    let members = report["nodes"].as_array().expect("nodes");
    assert_eq!(members.len(), 3, "{report}");
    let on_cluster = &members[0];
    assert!(
        on_cluster["node"]
            .as_str()
            .is_some_and(|n| n.starts_with("cluster(") && n.contains(")/127.0.0.1:")),
        "{report}"
    );
    assert_eq!(on_cluster["holders"][0][0], lock.value(), "{report}");
    assert!(on_cluster.get("quarantined").is_none(), "{report}");
    assert_eq!(report["view"]["state"], "held", "{report}");
    runtime.block_on(lock.release()).expect("release");

    // Doctor: each shard master checked; replicas that fail over on their
    // own are a warning, until they are told not to.
    let doctor = |nodes: &str| {
        json(&[
            "doctor",
            "--json",
            "--clock-interval",
            "100ms",
            "--quarantine-window",
            "0s",
            "--nodes",
            nodes,
        ])
    };
    let (code, report) = doctor(&nodes);
    assert_eq!(code, Some(0), "{report}");
    let persistence = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| {
            f["check"] == "persistence"
                && f["node"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("cluster("))
        })
        .count();
    assert_eq!(persistence, 3, "every shard master is checked: {report}");
    let slots = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["check"] == "slots")
        .unwrap_or_else(|| panic!("no slots finding: {report}"));
    assert_eq!(slots["level"], "pass", "{report}");
    let levels = failover_levels(&report);
    assert_eq!(levels.len(), 3, "{report}");
    assert!(
        levels.iter().all(|(_, level)| level == "warn"),
        "{levels:?}"
    );
    for url in member.nodes().urls() {
        let mut conn = common::connect(&url);
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-replica-no-failover")
            .arg("yes")
            .query(&mut conn)
            .expect("CONFIG SET");
    }
    let (_, report) = doctor(&nodes);
    let levels = failover_levels(&report);
    assert!(
        levels.len() == 3 && levels.iter().all(|(_, level)| level == "pass"),
        "{levels:?}"
    );
    // Each shard master's node timeout (what clients add to their window),
    // and its replicas' persistence: a replica that takes over is a lock
    // node.
    let node_timeouts = findings_of(&report, "node-timeout");
    assert!(
        node_timeouts.len() == 3
            && node_timeouts.iter().all(|f| f["level"] == "pass"
                && f["detail"].as_str().is_some_and(|d| d.contains("1000 ms"))),
        "{node_timeouts:?}"
    );
    let levels = |report: &serde_json::Value| -> Vec<String> {
        findings_of(report, "replica-persistence")
            .iter()
            .map(|f| f["level"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(levels(&report), ["pass"; 3], "{report}");
    let replica = member
        .nodes()
        .urls()
        .into_iter()
        .find(|url| {
            let mut conn = common::connect(url);
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut conn)
                .expect("INFO");
            info.contains("role:slave")
        })
        .expect("a replica");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendfsync")
        .arg("everysec")
        .query(&mut common::connect(&replica))
        .expect("CONFIG SET");
    let (_, report) = doctor(&nodes);
    let mut seen = levels(&report);
    seen.sort();
    assert_eq!(seen, ["pass", "pass", "warn"], "{report}");

    // A cluster URL whose nodes do not answer: a clear failure, no hang.
    let (code, report) = doctor("redis+cluster://127.0.0.1:1,127.0.0.1:2");
    assert_eq!(code, Some(1), "{report}");
    assert!(report.to_string().contains("slot map"), "{report}");
}

/// `quorumlock cluster --shards 3 -n 3`: three members, each a local
/// three-shard Redis Cluster, printed as one `QUORUMLOCK_NODES` line that
/// `run` takes as it is; SIGTERM stops every node.
#[test]
fn cluster_starts_members_that_are_clusters() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let mut child = quorumlock()
        .args(["cluster", "--count", "3", "--shards", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("first line");
    let nodes = line
        .trim()
        .strip_prefix("export QUORUMLOCK_NODES=")
        .unwrap_or_else(|| panic!("printed {line:?}"))
        .to_owned();
    assert_eq!(nodes.matches("redis+cluster://").count(), 3, "{nodes}");
    let run = quorumlock()
        .args(["run", "--node-timeout", "500ms", "job", "--", "true"])
        .env("QUORUMLOCK_NODES", &nodes)
        .output()
        .expect("runs");
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal");
    assert_eq!(child.wait().expect("exits").code(), Some(0));
    let first = nodes
        .trim_start_matches("redis+cluster://")
        .split(',')
        .next()
        .expect("an address")
        .to_owned();
    let client = redis::Client::open(format!("redis://{first}")).expect("url");
    assert!(
        client
            .get_connection_with_timeout(std::time::Duration::from_millis(300))
            .is_err(),
        "{first} still up after `cluster` ended"
    );
}
