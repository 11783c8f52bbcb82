//! No Docker engine runs on our machines, so the compose file is checked by
//! reading it: five Redis 7 services on distinct host ports 7001–7005, each
//! persisting every write, with a health check and no shared data.

use std::collections::HashSet;

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

        let health = strings(&service["healthcheck"]["test"]);
        assert!(health.contains(&"ping".to_owned()), "{name}: {health:?}");

        for volume in strings(&service["volumes"]) {
            let source = volume.split(':').next().expect("volume source").to_owned();
            assert!(volumes.insert(source), "{name}: data volume shared");
        }
    }
    assert_eq!(host_ports.len(), 5);
}
