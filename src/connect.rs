//! How node URLs become Redis clients: parsed without connecting, as they
//! are or with TLS settings (feature `tls`) for `rediss://` URLs, each
//! named by an address that is safe to log.

use crate::address::without_password;

/// A node address that parsed.
#[derive(Debug, Clone)]
pub(crate) struct NodeSpec {
    pub(crate) client: redis::Client,
    /// `host:port` (or socket path): a name safe to log, without password.
    pub(crate) name: String,
}

/// How node URLs become clients: as they are, or with TLS settings
/// (feature `tls`) for `rediss://` URLs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Connect {
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<crate::tls::Tls>,
}

impl Connect {
    fn client(&self, url: &str) -> Result<redis::Client, String> {
        let secure = url.starts_with("rediss://");
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

/// Parses a Redis URL without connecting.
pub(crate) fn parse_node_url(url: &str, connect: &Connect) -> Result<NodeSpec, String> {
    let client = connect.client(url)?;
    let name = client.get_connection_info().addr().to_string();
    Ok(NodeSpec { client, name })
}
