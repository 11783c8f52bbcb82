//! No Docker engine runs on our machines, so the compose files are checked
//! by reading them: five Redis 7 services on distinct host ports 7001–7005,
//! each persisting every write, with a health check and no shared data;
//! and five members that are three-shard Redis Clusters. The five nodes'
//! health check (`docker/healthcheck.sh`), which marks a new cluster's
//! nodes new, runs here against real nodes.

mod common;

use std::collections::HashSet;
use std::process::Command;

use quorumlock::HealthState;

use yaml_rust2::{Yaml, YamlLoader};

/// Resolves YAML merge keys (`<<: *anchor`), as docker compose does.
fn merged(service: &Yaml) -> Yaml {
    let Yaml::Hash(fields) = service else {
        return service.clone();
    };
    let mut out = yaml_rust2::yaml::Hash::new();
    if let Some(Yaml::Hash(base)) = fields.get(&Yaml::String("<<".into())) {
        out.extend(base.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    for (key, value) in fields {
        if key.as_str() != Some("<<") {
            out.insert(key.clone(), value.clone());
        }
    }
    Yaml::Hash(out)
}

fn strings(node: &Yaml) -> Vec<String> {
    match node {
        Yaml::Array(items) => items
            .iter()
            .map(|item| match item {
                Yaml::String(s) => s.clone(),
                Yaml::Integer(i) => i.to_string(),
                other => panic!("unexpected list item {other:?}"),
            })
            .collect(),
        Yaml::String(s) => s.split_whitespace().map(str::to_owned).collect(),
        other => panic!("expected a list or a string, got {other:?}"),
    }
}

/// The value following `flag` in a redis-server command line.
fn flag_value<'a>(command: &'a [String], flag: &str) -> Option<&'a str> {
    let at = command.iter().position(|arg| arg == flag)?;
    command.get(at + 1).map(String::as_str)
}

#[test]
fn compose_file_defines_five_persistent_independent_nodes() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docker/docker-compose.yml");
    let text = std::fs::read_to_string(path).expect("docker/docker-compose.yml exists");
    let docs = YamlLoader::load_from_str(&text).expect("valid YAML");
    let services = docs[0]["services"].as_hash().expect("a `services` mapping");
    assert_eq!(services.len(), 5, "five nodes");

    let mut host_ports = HashSet::new();
    let mut volumes = HashSet::new();
    for (name, service) in services {
        let name = name.as_str().expect("service name");
        let service = merged(service);

        let image = service["image"].as_str().expect("an image");
        assert!(image.starts_with("redis:7"), "{name}: image {image}");

        let command = strings(&service["command"]);
        assert_eq!(command[0], "redis-server", "{name}");
        assert_eq!(flag_value(&command, "--appendonly"), Some("yes"), "{name}");
        assert_eq!(
            flag_value(&command, "--appendfsync"),
            Some("always"),
            "{name}"
        );
        assert_eq!(
            flag_value(&command, "--maxmemory-policy"),
            Some("noeviction"),
            "{name}"
        );
        assert!(
            !command
                .iter()
                .any(|arg| arg == "--replicaof" || arg == "--slaveof"),
            "{name}: nodes must be independent masters"
        );

        let ports = strings(&service["ports"]);
        assert_eq!(ports.len(), 1, "{name}: one published port");
        let published: Vec<&str> = ports[0].split(':').collect();
        assert_eq!(published.len(), 3, "{name}: host-ip:host-port:6379");
        assert_eq!(published[0], "127.0.0.1", "{name}: loopback only");
        assert_eq!(published[2], "6379", "{name}");
        let port: u16 = published[1].parse().expect("numeric host port");
        assert!((7001..=7005).contains(&port), "{name}: port {port}");
        assert!(host_ports.insert(port), "{name}: port {port} used twice");

        // The health check is the script, mounted read-only from beside
        // the file, told every node of the cluster.
        let health = strings(&service["healthcheck"]["test"]);
        assert_eq!(
            health,
            ["CMD", "sh", "/quorumlock/healthcheck.sh"],
            "{name}: {health:?}"
        );
        let mounts = strings(&service["volumes"]);
        assert!(
            mounts.contains(&"./healthcheck.sh:/quorumlock/healthcheck.sh:ro".to_owned()),
            "{name}: {mounts:?}"
        );
        let peers = service["environment"]["QUORUMLOCK_PEERS"]
            .as_str()
            .expect("QUORUMLOCK_PEERS");
        let mut named: Vec<&str> = peers.split_whitespace().collect();
        let mut every: Vec<String> = services
            .keys()
            .filter_map(Yaml::as_str)
            .map(|service| format!("{service}:6379"))
            .collect();
        named.sort_unstable();
        every.sort_unstable();
        assert_eq!(named, every, "{name}: QUORUMLOCK_PEERS names every node");

        for volume in mounts.iter().filter(|m| !m.ends_with(":ro")) {
            let source = volume.split(':').next().expect("volume source").to_owned();
            assert!(volumes.insert(source), "{name}: data volume shared");
        }
    }
    assert_eq!(host_ports.len(), 5);
    assert!(
        std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docker/healthcheck.sh"
        ))
        .is_file()
    );
}

/// Runs the compose file's health check for the node at `me`, with `peers`
/// as the cluster; its exit code.
fn health_check(me: &str, peers: &[String]) -> i32 {
    let status = Command::new("sh")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docker/healthcheck.sh"
        ))
        .env("QUORUMLOCK_SELF", me)
        .env("QUORUMLOCK_PEERS", peers.join(" "))
        .status()
        .expect("sh runs the health check");
    status.code().expect("an exit code")
}

/// `host:port` of each node of a test cluster.
fn addresses(urls: &[String]) -> Vec<String> {
    urls.iter()
        .map(|url| url.trim_start_matches("redis://").to_owned())
        .collect()
}

/// The node guard's mark on a node, read directly.
fn mark_on(url: &str) -> Option<String> {
    redis::cmd("GET")
        .arg("quorumlock:node")
        .query(&mut common::connect(url))
        .expect("GET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_check_marks_a_new_clusters_nodes_and_never_one_back_empty_in_a_served_one() {
    let cluster = common::cluster(3);
    let urls = cluster.urls();
    let peers = addresses(&urls);
    // Nodes as docker starts them: just started, empty, no mark (the
    // testkit's own mark taken off).
    for url in &urls {
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut common::connect(url))
            .expect("FLUSHALL");
    }
    // A peer that cannot be reached: no verdict on the cluster yet.
    let mut unreachable = peers.clone();
    unreachable.push("127.0.0.1:1".into());
    assert_eq!(health_check(&peers[0], &unreachable), 1);
    assert_eq!(mark_on(&urls[0]), None, "marked beside an unreachable peer");
    // A node that does not persist every write is never marked new: a
    // cluster of them all restarted at once would look new.
    let fsync = |policy: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "appendfsync", policy])
            .query(&mut common::connect(&urls[0]))
            .expect("CONFIG SET");
    };
    fsync("everysec");
    assert_eq!(health_check(&peers[0], &peers), 0, "healthy, unmarked");
    assert_eq!(mark_on(&urls[0]), None, "marked without appendfsync always");
    fsync("always");

    for me in &peers {
        assert_eq!(health_check(me, &peers), 0, "{me}");
    }
    for url in &urls {
        let mark = mark_on(url).unwrap_or_default();
        assert!(mark.ends_with(" new 0"), "{url}: mark {mark:?}");
    }
    let manager = common::with_defaults(urls.clone());
    let health = manager.connect().await.expect("a new cluster, marked");
    assert_eq!(health.state, HealthState::Healthy, "{health:?}");
    manager
        .lock(&common::resource("first"))
        .no_wait()
        .await
        .expect("the first lock on a new cluster")
        .release()
        .await
        .expect("release");

    // Node 2 loses its disk: back empty in a cluster that served. The
    // check does not mark it, and clients keep it out for the window.
    cluster
        .restart_with(2, &quorumlock::testkit::Restart::wiped())
        .expect("restart empty");
    assert_eq!(mark_on(&urls[2]), None);
    assert_eq!(health_check(&peers[2], &peers), 0, "healthy, unmarked");
    assert_eq!(mark_on(&urls[2]), None, "a node back empty was marked new");
    let fresh = common::with_defaults(urls.clone());
    let health = fresh.connect().await.expect("two of three serve");
    assert_eq!(
        (health.state, health.nodes_up),
        (HealthState::Degraded, 2),
        "{health:?}"
    );
    let quarantined = fresh.quarantined_nodes();
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    let why = quarantined[0].1.to_string();
    assert!(
        why.contains("empty data set") && why.contains("A new cluster's first start"),
        "{why}"
    );
}

/// The compose file of five members that are Redis Clusters: fifteen
/// shard masters, each persisting every write, never evicting, on its own
/// host port and volume, no replicas; five one-shot services, each
/// creating one member from exactly its three masters; and the
/// `QUORUMLOCK_NODES` line of its header naming each member once.
#[test]
fn cluster_compose_file_defines_five_independent_three_shard_members() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docker/docker-compose.clusters.yml"
    );
    let text = std::fs::read_to_string(path).expect("docker/docker-compose.clusters.yml exists");
    let docs = YamlLoader::load_from_str(&text).expect("valid YAML");
    let services = docs[0]["services"].as_hash().expect("a `services` mapping");
    let mut node_ports: Vec<u16> = Vec::new();
    let mut volumes = HashSet::new();
    let mut created: Vec<Vec<u16>> = Vec::new();
    for (name, service) in services {
        let name = name.as_str().expect("service name");
        let service = merged(service);
        assert!(
            service["image"]
                .as_str()
                .is_some_and(|i| i.starts_with("redis:7")),
            "{name}"
        );
        assert_eq!(service["network_mode"].as_str(), Some("host"), "{name}");
        let command = strings(&service["command"]);
        if name.ends_with("-create") {
            let script = command.last().expect("a script");
            let ports: Vec<u16> = script
                .split_whitespace()
                .skip_while(|word| *word != "create")
                .skip(1)
                .take_while(|word| word.starts_with("127.0.0.1:"))
                .map(|address| {
                    address
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.parse().ok())
                        .expect("a port")
                })
                .collect();
            assert!(
                !script.contains("--cluster-replicas"),
                "{name}: no replicas"
            );
            assert_eq!(ports.len(), 3, "{name}: {script}");
            let depends: Vec<&str> = service["depends_on"]
                .as_hash()
                .expect("depends_on")
                .keys()
                .filter_map(Yaml::as_str)
                .collect();
            assert_eq!(depends.len(), 3, "{name} waits for its masters");
            created.push(ports);
            continue;
        }
        assert_eq!(command[0], "redis-server", "{name}");
        assert_eq!(
            flag_value(&command, "--cluster-enabled"),
            Some("yes"),
            "{name}"
        );
        assert_eq!(flag_value(&command, "--appendonly"), Some("yes"), "{name}");
        assert_eq!(
            flag_value(&command, "--appendfsync"),
            Some("always"),
            "{name}"
        );
        assert_eq!(
            flag_value(&command, "--maxmemory-policy"),
            Some("noeviction"),
            "{name}"
        );
        let port: u16 = flag_value(&command, "--port")
            .and_then(|p| p.parse().ok())
            .expect("a --port");
        assert!(
            !node_ports.contains(&port),
            "{name}: port {port} used twice"
        );
        node_ports.push(port);
        let health = strings(&service["healthcheck"]["test"]);
        assert!(health.contains(&port.to_string()), "{name}: {health:?}");
        for volume in strings(&service["volumes"]) {
            let source = volume.split(':').next().expect("volume source").to_owned();
            assert!(volumes.insert(source), "{name}: data volume shared");
        }
    }
    assert_eq!(node_ports.len(), 15, "fifteen shard masters");
    assert_eq!(created.len(), 5, "five members");
    let mut every: Vec<u16> = created.iter().flatten().copied().collect();
    every.sort_unstable();
    node_ports.sort_unstable();
    assert_eq!(every, node_ports, "each master in exactly one member");

    let line = text
        .lines()
        .find_map(|l| {
            l.trim_start_matches('#')
                .trim_start()
                .strip_prefix("export QUORUMLOCK_NODES=")
        })
        .expect("the header's QUORUMLOCK_NODES line");
    let members: Vec<&str> = line.split("redis+cluster://").skip(1).collect();
    assert_eq!(members.len(), 5, "{line}");
    for (member, ports) in members.iter().zip(&created) {
        for address in member.trim_end_matches(',').split(',') {
            let port: u16 = address
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("a port");
            assert!(
                ports.contains(&port),
                "{address} is not a node of its member {ports:?}"
            );
        }
    }
}
