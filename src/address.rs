//! Which node addresses name the same server, decided without network
//! I/O, so that one server cannot be counted twice towards a quorum.
//!
//! Compared: the port, and the host as far as it resolves locally. Every
//! loopback address (`127.0.0.0/8`, `::1`, `localhost`, `*.localhost`,
//! the unspecified `0.0.0.0` / `::`) is one host, since a server on
//! loopback usually listens on all of them; other IP literals compare by
//! value (IPv4-mapped IPv6 as IPv4); names listed in `/etc/hosts` compare
//! by each address listed for them, and also by name; other names by name
//! alone, case-insensitively (no DNS lookup: `build()` does no network
//! I/O). Unix sockets compare by path.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::PathBuf;

use redis::ConnectionAddr;

/// One way of naming a server; two addresses name the same server when
/// they share one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ServerKey {
    Loopback(u16),
    Ip(IpAddr, u16),
    Name(String, u16),
    Unix(PathBuf),
}

/// `/etc/hosts`, as (address, names) lines.
pub(crate) type HostsFile = Vec<(IpAddr, Vec<String>)>;

/// Reads `/etc/hosts`; empty when it cannot be read.
pub(crate) fn system_hosts() -> HostsFile {
    std::fs::read_to_string("/etc/hosts")
        .map(|text| parse_hosts(&text))
        .unwrap_or_default()
}

/// Parses the hosts(5) format: an address, then names; `#` comments.
pub(crate) fn parse_hosts(text: &str) -> HostsFile {
    text.lines()
        .filter_map(|line| {
            let line = line.split('#').next().unwrap_or("");
            let mut fields = line.split_whitespace();
            let ip = fields.next()?.parse().ok()?;
            let names: Vec<String> = fields.map(normalise_name).collect();
            (!names.is_empty()).then_some((ip, names))
        })
        .collect()
}

/// Every key that names the server at `addr`.
pub(crate) fn server_keys(addr: &ConnectionAddr, hosts: &HostsFile) -> HashSet<ServerKey> {
    let (host, port) = match addr {
        ConnectionAddr::Tcp(host, port) => (host.as_str(), *port),
        ConnectionAddr::TcpTls { host, port, .. } => (host.as_str(), *port),
        ConnectionAddr::Unix(path) => {
            let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            return HashSet::from([ServerKey::Unix(path)]);
        }
        // A kind of address added to redis-rs later: compare as written.
        other => return HashSet::from([ServerKey::Name(other.to_string(), 0)]),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return HashSet::from([ip_key(ip, port)]);
    }
    let name = normalise_name(host);
    if name == "localhost" || name.ends_with(".localhost") {
        return HashSet::from([ServerKey::Loopback(port)]);
    }
    let mut keys: HashSet<ServerKey> = hosts
        .iter()
        .filter(|(_, names)| names.contains(&name))
        .map(|&(ip, _)| ip_key(ip, port))
        .collect();
    keys.insert(ServerKey::Name(name, port));
    keys
}

fn ip_key(ip: IpAddr, port: u16) -> ServerKey {
    let ip = ip.to_canonical();
    if ip.is_loopback() || ip.is_unspecified() {
        ServerKey::Loopback(port)
    } else {
        ServerKey::Ip(ip, port)
    }
}

fn normalise_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// `url` with any password replaced, for messages.
pub(crate) fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_never_show_a_password() {
        assert_eq!(
            without_password("rediss://app:s3cret@db:6380/0"),
            "rediss://app:***@db:6380/0"
        );
        assert_eq!(without_password("redis://:s3cret@db"), "redis://:***@db");
        assert_eq!(without_password("redis://db:6379"), "redis://db:6379");
    }

    fn tcp(host: &str, port: u16) -> ConnectionAddr {
        ConnectionAddr::Tcp(host.to_owned(), port)
    }

    fn same(a: &ConnectionAddr, b: &ConnectionAddr, hosts: &HostsFile) -> bool {
        !server_keys(a, hosts).is_disjoint(&server_keys(b, hosts))
    }

    #[test]
    fn addresses_that_name_one_server_match() {
        let hosts = parse_hosts(
            "127.0.0.1 localhost\n# a comment\n10.0.0.5  redis-a redis-a.lan # trailing\n\
             ::1 ip6-localhost\nnot-an-ip name\n",
        );
        let table = [
            (tcp("localhost", 7001), tcp("127.0.0.1", 7001), true),
            (tcp("LOCALHOST.", 7001), tcp("[::1]", 7001), true),
            (tcp("127.0.0.2", 7001), tcp("::ffff:127.0.0.1", 7001), true),
            (tcp("0.0.0.0", 7001), tcp("localhost", 7001), true),
            (tcp("redis-a", 7001), tcp("10.0.0.5", 7001), true),
            (tcp("Redis-A.lan", 7001), tcp("redis-a", 7001), true),
            (tcp("::ffff:10.0.0.5", 7001), tcp("10.0.0.5", 7001), true),
            (tcp("db.example", 7001), tcp("DB.example.", 7001), true),
            (tcp("localhost", 7001), tcp("127.0.0.1", 7002), false),
            (tcp("10.0.0.5", 7001), tcp("10.0.0.6", 7001), false),
            (tcp("redis-a", 7001), tcp("redis-b", 7001), false),
            (tcp("db.example", 7001), tcp("10.0.0.5", 7001), false),
            (
                ConnectionAddr::Unix("/tmp/a.sock".into()),
                ConnectionAddr::Unix("/tmp/b.sock".into()),
                false,
            ),
        ];
        for (a, b, expected) in table {
            assert_eq!(same(&a, &b, &hosts), expected, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn hosts_lines_without_names_or_with_bad_addresses_are_skipped() {
        assert_eq!(parse_hosts("10.0.0.1\nbogus host\n\n").len(), 0);
    }
}
