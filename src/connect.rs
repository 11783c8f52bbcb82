//! How node URLs become Redis clients: parsed without connecting, as they
//! are or with TLS settings (feature `tls`) for `rediss://` URLs, each
//! named by an address that is safe to log. A `redis+cluster://` (or
//! `rediss+cluster://`) URL names one member that is a Redis Cluster by
//! some of its nodes; its other nodes are reached with the same user,
//! password and TLS settings.

use crate::address::without_password;
use crate::hot_wire::{Target, Wire};

/// A node address that parsed.
#[derive(Debug, Clone)]
pub(crate) struct NodeSpec {
    /// The server; for a cluster member, its first seed node.
    pub(crate) client: redis::Client,
    /// `host:port` (or socket path): a name safe to log, without password.
    pub(crate) name: String,
    /// How the hot-path wire reaches it; `None`: lock requests go through
    /// redis-rs.
    pub(crate) hot: Option<Target>,
    /// For a member that is a Redis Cluster: how to reach its nodes.
    pub(crate) cluster: Option<ClusterSpec>,
}

/// How to reach the nodes of a member that is a Redis Cluster.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSpec {
    /// The clients of the nodes the URL named, to learn the slot map from.
    pub(crate) seeds: Vec<redis::Client>,
    url: ClusterUrl,
    connect: Connect,
}

impl ClusterSpec {
    /// The client of the member's node at `address` (`host:port`, as the
    /// cluster announces it), with the URL's user, password and TLS.
    pub(crate) fn client_for(&self, address: &str) -> Result<redis::Client, String> {
        self.connect.client(&self.url.node_url(address))
    }

    /// As [`client_for`](Self::client_for), with how the hot-path wire
    /// reaches that node: for a shard master that serves lock requests.
    pub(crate) fn master_at(
        &self,
        address: &str,
    ) -> Result<(redis::Client, Option<Target>), String> {
        let client = self.client_for(address)?;
        let hot = self.connect.hot_target(&client)?;
        Ok((client, hot))
    }
}

/// A `redis+cluster://[user:password@]host:port[,host:port…]` URL (or
/// `rediss+cluster://`), taken apart: the nodes it names, and how to name
/// any node of that cluster with its scheme, user and password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterUrl {
    /// `host:port` of each node the URL names.
    pub seeds: Vec<String>,
    /// `redis` or `rediss`.
    scheme: &'static str,
    /// `user:password@`, or empty.
    userinfo: String,
}

impl ClusterUrl {
    /// `url` taken apart if it is a cluster URL; `None` if it is another
    /// kind of URL; an error (without the password) if it is a bad one.
    pub fn parse(url: &str) -> Option<Result<Self, String>> {
        let (scheme, rest) = match url.split_once("://") {
            Some(("redis+cluster", rest)) => ("redis", rest),
            Some(("rediss+cluster", rest)) => ("rediss", rest),
            _ => return None,
        };
        let shown = without_password(url);
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if !matches!(path.trim_start_matches('/'), "" | "0") {
            return Some(Err(format!(
                "`{shown}`: a Redis Cluster has only database 0; drop `/{path}` from the URL"
            )));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
            None => (String::new(), authority),
        };
        let seeds: Vec<String> = hosts.split(',').map(|a| a.trim().to_owned()).collect();
        if seeds.iter().any(String::is_empty) {
            return Some(Err(format!(
                "`{shown}` names no node or an empty one; expected \
                 redis+cluster://host:port,host:port"
            )));
        }
        Some(Ok(Self {
            seeds,
            scheme,
            userinfo,
        }))
    }

    /// The plain URL (`redis://` or `rediss://`, with the user and
    /// password) of the cluster's node at `address` (`host:port`).
    pub fn node_url(&self, address: &str) -> String {
        format!("{}://{}{address}", self.scheme, self.userinfo)
    }
}

/// Whether node connections set `TCP_NODELAY` unless told otherwise:
/// measured in docs/performance.md ("Socket options"), on loopback and
/// behind a proxy that adds latency.
pub(crate) const DEFAULT_NODELAY: bool = true;

/// How node URLs become clients: as they are, or with TLS settings
/// (feature `tls`) for `rediss://` URLs; every one with the same socket
/// options.
#[derive(Debug, Clone)]
pub(crate) struct Connect {
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<crate::tls::Tls>,
    /// `TCP_NODELAY` on every connection to a node.
    pub(crate) nodelay: bool,
    /// What carries the lock requests.
    pub(crate) wire: Wire,
    /// The hot-path wire's TLS settings, made once and shared by every
    /// node and shard master: reading the system's roots blocks, and
    /// shard masters are met while locks are taken.
    #[cfg(feature = "tls")]
    pub(crate) secured: std::sync::Arc<std::sync::OnceLock<Result<crate::tls::Secured, String>>>,
}

impl Default for Connect {
    fn default() -> Self {
        Self {
            #[cfg(feature = "tls")]
            tls: None,
            nodelay: DEFAULT_NODELAY,
            wire: Wire::default(),
            #[cfg(feature = "tls")]
            secured: Default::default(),
        }
    }
}

impl Connect {
    fn client(&self, url: &str) -> Result<redis::Client, String> {
        Ok(with_nodelay(self.client_as_given(url)?, self.nodelay))
    }

    /// How the hot-path wire reaches `client`'s node, if it carries the
    /// lock requests there.
    pub(crate) fn hot_target(&self, client: &redis::Client) -> Result<Option<Target>, String> {
        if self.wire != Wire::Narrow {
            return Ok(None);
        }
        #[cfg(feature = "tls")]
        {
            let secured = match client.get_connection_info().addr() {
                // `#insecure` TLS stays on redis-rs (see `Target::of`).
                redis::ConnectionAddr::TcpTls {
                    insecure: false, ..
                } => Some(self.secured()?),
                _ => None,
            };
            Ok(Target::of(client, secured.as_ref()))
        }
        #[cfg(not(feature = "tls"))]
        Ok(Target::of(client))
    }

    /// These settings, with TLS settings for the hot-path wire of their own
    /// (not those a clone made for an earlier build, maybe with other
    /// `Tls`).
    pub(crate) fn unshared(self) -> Self {
        Self {
            #[cfg(feature = "tls")]
            secured: Default::default(),
            ..self
        }
    }

    /// The hot-path wire's TLS settings, made on first use.
    #[cfg(feature = "tls")]
    fn secured(&self) -> Result<crate::tls::Secured, String> {
        self.secured
            .get_or_init(|| self.tls.clone().unwrap_or_default().secured())
            .clone()
    }

    fn client_as_given(&self, url: &str) -> Result<redis::Client, String> {
        // redis-rs reads `valkeys://` as `rediss://`.
        let secure = url.starts_with("rediss://") || url.starts_with("valkeys://");
        #[cfg(feature = "tls")]
        if let (true, Some(tls)) = (secure, &self.tls) {
            return tls.client(url);
        }
        #[cfg(not(feature = "tls"))]
        if secure {
            return Err(format!(
                "`{}` is a TLS URL (rediss://); build quorumlock with its `tls` feature",
                without_password(url)
            ));
        }
        redis::Client::open(url).map_err(|e| {
            format!(
                "cannot parse node URL `{}`: {e}; expected redis://host:port",
                without_password(url)
            )
        })
    }
}

/// `client` with `TCP_NODELAY` set to `nodelay` (the TLS settings, the
/// user and the database are kept).
pub(crate) fn with_nodelay(client: redis::Client, nodelay: bool) -> redis::Client {
    let info = client.get_connection_info();
    if info.tcp_settings().nodelay() == nodelay {
        return client;
    }
    let settings = info.tcp_settings().clone().set_nodelay(nodelay);
    redis::Client::open(info.clone().set_tcp_settings(settings))
        // A connection info that opened a client opens one again.
        .unwrap_or(client)
}

/// Parses a Redis URL without connecting.
pub(crate) fn parse_node_url(url: &str, connect: &Connect) -> Result<NodeSpec, String> {
    if let Some(spec) = parse_cluster_url(url, connect)? {
        return Ok(spec);
    }
    let client = connect.client(url)?;
    let name = client.get_connection_info().addr().to_string();
    let hot = connect.hot_target(&client)?;
    Ok(NodeSpec {
        client,
        name,
        hot,
        cluster: None,
    })
}

/// The member a `redis+cluster://` URL names, if `url` is one: a Redis
/// Cluster reached through the nodes it names. Named `cluster(host:port,…)`.
fn parse_cluster_url(url: &str, connect: &Connect) -> Result<Option<NodeSpec>, String> {
    let Some(parsed) = ClusterUrl::parse(url) else {
        return Ok(None);
    };
    let parsed = parsed?;
    // Made now, while the settings are validated, rather than when the
    // first shard master is met.
    #[cfg(feature = "tls")]
    if parsed.scheme == "rediss" && connect.wire == Wire::Narrow {
        connect.secured()?;
    }
    let mut spec = ClusterSpec {
        seeds: Vec::with_capacity(parsed.seeds.len()),
        url: parsed,
        connect: connect.clone(),
    };
    for address in spec.url.seeds.clone() {
        let seed = spec
            .client_for(&address)
            .map_err(|reason| format!("in `{}`: {reason}", without_password(url)))?;
        spec.seeds.push(seed);
    }
    let names: Vec<String> = spec
        .seeds
        .iter()
        .map(|seed| seed.get_connection_info().addr().to_string())
        .collect();
    Ok(Some(NodeSpec {
        client: spec.seeds[0].clone(),
        name: format!("cluster({})", names.join(",")),
        // Each shard master gets its own (`ClusterSpec::master_at`).
        hot: None,
        cluster: Some(spec),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_url_names_one_member_by_its_seeds() {
        let spec = parse_node_url(
            "redis+cluster://app:s3cret@127.0.0.1:7001,127.0.0.1:7002",
            &Connect::default(),
        )
        .expect("parses");
        assert_eq!(spec.name, "cluster(127.0.0.1:7001,127.0.0.1:7002)");
        let cluster = spec.cluster.expect("a cluster member");
        assert_eq!(cluster.seeds.len(), 2);
        let learned = cluster.client_for("10.0.0.7:7010").expect("a client");
        let info = learned.get_connection_info();
        assert_eq!(info.addr().to_string(), "10.0.0.7:7010");
        assert_eq!(info.redis_settings().username(), Some("app"));
        assert_eq!(info.redis_settings().password(), Some("s3cret"));
    }

    #[test]
    fn bad_cluster_urls_say_what_is_wrong_without_the_password() {
        for (url, says) in [
            ("redis+cluster://u:pw@h:1/3", "only database 0"),
            ("redis+cluster://u:pw@h:1,,h:2", "empty one"),
            ("redis+cluster://", "empty one"),
        ] {
            let error = parse_node_url(url, &Connect::default()).expect_err(url);
            assert!(error.contains(says), "{url}: {error}");
            assert!(!error.contains("pw"), "{url}: {error}");
        }
        assert!(parse_node_url("redis+cluster://h:1/0", &Connect::default()).is_ok());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_valkeys_url_takes_the_tls_settings_on_both_streams() {
        let certificates = crate::testkit::TestCertificates::generate().expect("certificates");
        let connect = Connect {
            tls: Some(crate::tls::Tls::new().ca_pem(certificates.ca_pem())),
            ..Connect::default()
        };
        for url in ["rediss://127.0.0.1:7001", "valkeys://127.0.0.1:7001"] {
            let spec = parse_node_url(url, &connect).expect(url);
            assert!(
                matches!(
                    spec.client.get_connection_info().addr(),
                    redis::ConnectionAddr::TcpTls {
                        tls_params: Some(_),
                        ..
                    }
                ),
                "{url}: redis-rs was not given the CA: {:?}",
                spec.client.get_connection_info().addr()
            );
            assert!(
                spec.hot.is_some(),
                "{url}: the lock requests do not take the hot-path wire"
            );
        }
    }
}
